"""The C decode kernel's entry point with log-sum-exp (DistAttention merges a far
sequence's pool part with its far partials): the output is the plain entry point's, bit
for bit, and each head's log-sum-exp of its scaled scores is torch's within 1e-5 (fp32),
over scattered block tables, ragged lengths, grouped heads and sliding windows."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_decode_kernel import BLOCK_TOKENS, BLOCKS, kernel  # noqa: F401 (the fixture)

from inference_worker.engine.attention import DecodeTables
from inference_worker.engine.decode_kernel import DecodeAttention

SCALE = 0.3


def reference_lse(
    q: torch.Tensor, k: torch.Tensor, table: list[int], n: int, window: int | None
) -> torch.Tensor:
    """[heads]: logsumexp of q's scaled scores over the first n tokens of `table` (the last `window`)."""
    kv_heads, _, _, dim = k.shape
    keys = k[:, table].reshape(kv_heads, -1, dim)[:, :n].double()
    keys = keys[:, max(0, n - window) if window else 0 :]
    group = q.shape[0] // kv_heads
    scores = torch.einsum("hgd,htd->hgt", q.double().view(kv_heads, group, dim), keys) * SCALE
    return torch.logsumexp(scores, dim=-1).reshape(-1)


# (dtype, LSE tolerance) x sliding window x (query heads, KV heads)
CASES = list(
    itertools.product([(torch.float32, 1e-5), (torch.bfloat16, 1e-4)], [None, 7], [(6, 2), (4, 4), (3, 1)])
)


@pytest.mark.parametrize(("precision", "window", "grouping"), CASES)
def test_lse_matches_torch_and_the_output_the_plain_entry_point(
    kernel: DecodeAttention,  # noqa: F811
    precision: tuple[torch.dtype, float],
    window: int | None,
    grouping: tuple[int, int],
) -> None:
    (dtype, tolerance), (heads, kv_heads) = precision, grouping
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads + 1)
    dim = 16
    k = (3 * torch.randn(kv_heads, BLOCKS, BLOCK_TOKENS, dim, generator=generator)).to(dtype)
    v = torch.randn(kv_heads, BLOCKS, BLOCK_TOKENS, dim, generator=generator).to(dtype)
    lengths = [1, 3, 4, 5, 8, 13, 22, 37]
    order = torch.randperm(BLOCKS, generator=generator).tolist()
    tables = [[order.pop() for _ in range(-(-n // BLOCK_TOKENS))] for n in lengths]
    q = torch.randn(len(lengths) + 2, heads, dim, generator=generator).to(dtype)
    rows = torch.randperm(q.shape[0], generator=generator)[: len(lengths)].tolist()
    decode = DecodeTables.of(list(zip(rows, tables, lengths, strict=True)), torch.device("cpu"))
    plain, with_lse = torch.zeros_like(q), torch.zeros_like(q)
    lse = torch.full((len(lengths), heads), float("nan"))
    kernel(q, k, v, plain, decode.rows, decode.tables, decode.lens, scale=SCALE, window=window)
    kernel(q, k, v, with_lse, decode.rows, decode.tables, decode.lens, scale=SCALE, window=window, lse=lse)
    assert torch.equal(plain, with_lse)
    for index, (row, table, n) in enumerate(zip(rows, tables, lengths, strict=True)):
        want = reference_lse(q[row], k, table, n, window)
        assert (lse[index].double() - want).abs().max().item() <= tolerance, (row, n)


def test_lse_of_the_wrong_shape_or_type_is_refused(kernel: DecodeAttention) -> None:  # noqa: F811
    q, k = torch.randn(2, 4, 8), torch.zeros(2, 2, BLOCK_TOKENS, 8)
    decode = DecodeTables.of([(0, [0], 1), (1, [1], 2)], torch.device("cpu"))
    for lse in (torch.empty(2, 3), torch.empty(1, 4), torch.empty(2, 4, dtype=torch.float64)):
        with pytest.raises(ValueError, match="lse must be fp32"):
            kernel(q, k, k, torch.empty_like(q), decode.rows, decode.tables, decode.lens,
                   scale=1.0, window=None, lse=lse)  # fmt: skip
