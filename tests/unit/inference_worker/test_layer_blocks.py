"""A decoder layer's blocks around attention in one C call each (layer_blocks.c) against the
torch composition of the ops they fuse: with and without biases, row counts that fill one and
two register tiles, sizes that fill and do not fill their panels, one and two threads, the
machine's build and one without AVX-512; a row gives the same bits alone and batched; bad
inputs refused; the paged runner uses them at the panel kernel's rows and matches transformers
with them and without; and the fallback when they are forced unavailable."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from c_builds import C_BUILDS, assert_forced_unavailable, built_kernel
from paged_batch import run_batch

from inference_worker.cpu_linear import _onednn_unavailable
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.layer_blocks import (
    SOURCE,
    UNAVAILABLE_VARIABLE,
    AttentionPool,
    LayerBlocks,
    LayerWeights,
    load_layer_blocks,
    random_layer,
    reference_post_attention,
    reference_pre_attention,
)
from inference_worker.engine.model_runner import PagedModelRunner
from inference_worker.engine.panel_linear import MAX_ROWS, MIN_ROWS
from inference_worker.engine.sequence import Sequence
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import load_model

RELATIVE_TOLERANCE = 1e-5  # sums in another order than oneDNN's
POOL_BLOCKS, POOL_BLOCK_TOKENS = 12, 4


@pytest.fixture(scope="module", params=C_BUILDS)  # the portable loop too
def blocks(request: pytest.FixtureRequest) -> LayerBlocks:
    return built_kernel(request.param, SOURCE, LayerBlocks, load_layer_blocks)


@pytest.fixture
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def geometry(heads: int, kv_heads: int, head_dim: int) -> ModelGeometry:
    return ModelGeometry(num_layers=1, heads=heads, kv_heads=kv_heads, head_dim=head_dim, max_positions=64,
                         vocab_size=1)  # fmt: skip


def inputs(
    shape: ModelGeometry, width: int, rows: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
    """hidden [rows, width], attention output [rows, heads * D], cos and sin, an empty pool
    [K/V, kv_heads, blocks, B, D] and distinct slots [rows]."""
    hidden = torch.randn(rows, width, generator=generator)
    attn = torch.randn(rows, shape.heads * shape.head_dim, generator=generator)
    rotary = tuple(torch.randn(rows, 1, shape.head_dim, generator=generator) for _ in range(2))
    pool = torch.zeros(2, shape.kv_heads, POOL_BLOCKS, POOL_BLOCK_TOKENS, shape.head_dim)
    slots = torch.randperm(POOL_BLOCKS * POOL_BLOCK_TOKENS, generator=generator)[:rows]
    return hidden, attn, rotary, pool, slots  # type: ignore[return-value]  # two rotary tensors


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert float((got - want).abs().max()) <= RELATIVE_TOLERANCE * float(want.abs().max())


# (heads, kv_heads, head_dim, width, intermediate): SmolLM2's proportions; sizes that are not
# whole panels or vectors (40 + 2 x 20 q/k/v outputs, 40 inputs; 40 intermediate columns: SiLU's
# two vectors of 16 and 8 columns after them)
SHAPES = [(4, 2, 16, 64, 128), (4, 2, 10, 40, 40)]


@pytest.mark.parametrize("rows", [MIN_ROWS, 14, 15, MAX_ROWS])  # 14: one tile of registers; 15: 8 + 7
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("threads", [1, 2], indirect=True)
def test_match_the_torch_composition(
    blocks: LayerBlocks, rows: int, shape: tuple[int, ...], bias: bool, threads: int
) -> None:
    generator = torch.Generator().manual_seed(rows)
    heads, kv_heads, dim, width, intermediate = shape
    layer = geometry(heads, kv_heads, dim)
    weights, plain = random_layer(layer, width, intermediate, generator, bias=bias)
    hidden, attn, rotary, pool, slots = inputs(layer, width, rows, generator)
    attention_pool = AttentionPool(pool[0], pool[1], slots, rotary)
    want = reference_pre_attention(weights, plain, hidden, rotary)
    got = blocks.pre_attention(weights, hidden, attention_pool)
    for mine, theirs in zip(got, want, strict=True):
        assert_close(mine, theirs)
    written = pool.view(2, kv_heads, -1, dim)[:, :, slots].transpose(1, 2)  # [K/V, rows, kv_heads, D]
    assert torch.equal(written[0], got[1]) and torch.equal(written[1], got[2])
    assert pool.count_nonzero() == written.count_nonzero()  # nothing outside the slots
    post = blocks.post_attention(weights, attn, hidden)
    assert_close(post, reference_post_attention(weights, plain, attn, hidden))
    # the next layer's pre_attention on the output, in the same call: the same bits as the two calls
    following, _ = random_layer(layer, width, intermediate, generator, bias=bias)
    joined, qkv = blocks.between_layers(weights, attn, hidden, following, attention_pool)
    assert torch.equal(joined, post)
    separate = blocks.pre_attention(following, post, attention_pool)
    assert all(torch.equal(a, b) for a, b in zip(qkv, separate, strict=True))


def test_a_row_gives_the_same_bits_alone_and_batched(blocks: LayerBlocks) -> None:
    generator = torch.Generator().manual_seed(5)
    layer = geometry(9, 3, 64)  # SmolLM2-135M's heads: 576 wide
    weights, _ = random_layer(layer, 576, 1536, generator)
    hidden, attn, rotary, pool, slots = inputs(layer, 576, 16, generator)
    batched_pre = blocks.pre_attention(weights, hidden, AttentionPool(pool[0], pool[1], slots, rotary))
    batched_post = blocks.post_attention(weights, attn, hidden)
    for rows in (slice(0, 3), slice(3, 16), slice(5, 9)):
        part = AttentionPool(pool[0], pool[1], slots[rows], tuple(t[rows].contiguous() for t in rotary))  # type: ignore[arg-type]
        alone = blocks.pre_attention(weights, hidden[rows], part)
        assert all(torch.equal(a, b[rows]) for a, b in zip(alone, batched_pre, strict=True))
        assert torch.equal(blocks.post_attention(weights, attn[rows], hidden[rows]), batched_post[rows])


def test_bad_inputs_are_refused(blocks: LayerBlocks) -> None:
    generator = torch.Generator().manual_seed(6)
    layer = geometry(4, 2, 16)
    weights, _ = random_layer(layer, 64, 128, generator)
    hidden, attn, rotary, pool, slots = inputs(layer, 64, MAX_ROWS + 1, generator)
    with pytest.raises(ValueError, match="rows"):
        blocks.post_attention(weights, attn, hidden)
    with pytest.raises(ValueError, match="rows"):
        blocks.pre_attention(weights, hidden, AttentionPool(pool[0], pool[1], slots, rotary))
    few: tuple[torch.Tensor, torch.Tensor] = tuple(t[:4].contiguous() for t in rotary)  # type: ignore[assignment]
    outside = AttentionPool(pool[0], pool[1], torch.tensor([0, 1, 2, 48]), few)
    with pytest.raises(ValueError, match="outside the pool"):
        blocks.pre_attention(weights, hidden[:4], outside)
    with pytest.raises(ValueError, match="outside the pool"):
        blocks.between_layers(weights, attn[:4], hidden[:4], weights, outside)
    assert pool.count_nonzero() == 0  # nothing written
    with pytest.raises(ValueError, match="slots"):
        blocks.pre_attention(weights, hidden[:4], AttentionPool(pool[0], pool[1], slots[:3], few))
    with pytest.raises(ValueError, match="a row per hidden row"):
        blocks.post_attention(weights, attn[:4], hidden[:5])


def test_run_only_fp32_cpu_rows_from_min_to_max_rows() -> None:
    assert LayerBlocks.runs(torch.randn(MIN_ROWS, 8)) and LayerBlocks.runs(torch.randn(MAX_ROWS, 8))
    assert not LayerBlocks.runs(torch.randn(MIN_ROWS - 1, 8))
    assert not LayerBlocks.runs(torch.randn(MAX_ROWS + 1, 8))
    assert not LayerBlocks.runs(torch.randn(4, 8).bfloat16())
    assert not LayerBlocks.runs(torch.randn(8, 4).t())


def test_forced_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_forced_unavailable(monkeypatch, load_layer_blocks, UNAVAILABLE_VARIABLE, "torch")


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: q, k, v with biases
def test_the_runner_uses_them_and_matches_transformers(
    tiny_model_dir: Callable[..., Path], family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four prompts prefilled in chunks of 8 (27, 17, 4 rows a step) and decoded together (4 rows):
    every step runs the blocks (the first layer's pre_attention, one call between each two
    layers, the last layer's post_attention), and gives transformers' logits (1e-4) and greedy
    tokens, with the blocks and with a call per op (the same logits to 1e-5)."""
    model = load_model(tiny_model_dir(family), torch.float32, "cpu").model
    if _onednn_unavailable(torch.float32) is not None:
        pytest.skip("oneDNN's fp32 inner product is unavailable on this CPU: the linears have no panels")
    assert all(LayerWeights.of(layer, ModelGeometry.of(model.config)) for layer in model.model.layers)
    assert load_layer_blocks()[0] is not None  # its probe's call before the count
    calls: list[tuple[str, int]] = []
    for name in ("pre_attention", "post_attention", "between_layers"):
        original = getattr(LayerBlocks, name)

        def counted(self: LayerBlocks, weights: LayerWeights, x: torch.Tensor, *args: Any, _name: str = name,
                    _original: Callable[..., Any] = original) -> Any:  # fmt: skip
            calls.append((_name, x.shape[0]))
            return _original(self, weights, x, *args)

        monkeypatch.setattr(LayerBlocks, name, counted)
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (3, 9, 16, 20)]
    results = {}
    for layer_blocks in (True, False):
        kv = PagedKV(ModelGeometry.of(model.config), 40, 4, torch.float32, torch.device("cpu"))
        runner = PagedModelRunner(model, kv, layer_blocks=layer_blocks)
        assert runner.layer_blocks_choice.kernel == ("layer-blocks-c" if layer_blocks else "torch")
        seqs = [Sequence.of(list(prompt)) for prompt in prompts]
        results[layer_blocks] = (
            run_batch(runner, BlockPool(40, 4), seqs, chunk_tokens=8, decode_steps=8),
            seqs,
        )
    steps = [3 + 8 + 8 + 8, 1 + 8 + 8, 4] + [4] * 8  # the prefill's three steps, then decodes
    between = ["between_layers"] * (model.config.num_hidden_layers - 1)
    assert calls == [(name, rows) for rows in steps for name in ("pre_attention", *between, "post_attention")]
    (with_blocks, seqs), (without, plain_seqs) = results[True], results[False]
    assert [seq.token_ids for seq in seqs] == [seq.token_ids for seq in plain_seqs]
    with torch.no_grad():
        for seq, mine, theirs in zip(seqs, with_blocks, without, strict=True):
            prompt_tokens = len(seq) - (len(mine) - 1)
            for step, (got, other) in enumerate(zip(mine, theirs, strict=True)):
                tokens = torch.tensor([seq.token_ids[: prompt_tokens + step]])
                want = model(input_ids=tokens).logits[0, -1].float()
                torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
                torch.testing.assert_close(got, other, atol=1e-5, rtol=0)
