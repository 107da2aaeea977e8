"""What a worker lends (held_kv.py) and how a borrower chooses remote or pull
(cost_model.py): appends must continue their segment, the bytes held are capped and
counted back on release, an idle segment is dropped (a dead borrower pins nothing), the
partial a peer computes equals the one computed here; the cost model starts remote, pulls
when pulling measured cheaper, and after a refusal."""

from __future__ import annotations

import pytest
import torch

from attnstore.errors import InvalidArgument, NotFound, OutOfRange, ResourceExhausted
from inference_worker.dist_attention.cost_model import CostModel, Mode
from inference_worker.dist_attention.held_kv import HeldKV
from inference_worker.dist_attention.limits import MicroAttentionLimits
from inference_worker.dist_attention.partial import partial_attention

KV_BYTES = 2 * 2 * 4 * 2 * 8 * 4  # K and V of 4 tokens, 2 layers, 2 heads of 8, fp32


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def kv(tokens: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, tokens, 2, 8, generator=gen), torch.randn(2, tokens, 2, 8, generator=gen)


def test_appends_continue_the_segment_and_partials_match_local_ones() -> None:
    held = HeldKV(MicroAttentionLimits())
    k, v = kv(8)
    held.append("s", 100, k[:, :4], v[:, :4])
    with pytest.raises(InvalidArgument, match="ends at position 104, not 105"):
        held.append("s", 105, k[:, 4:], v[:, 4:])
    one_head = torch.zeros(2, 4, 1, 8)
    with pytest.raises(InvalidArgument, match="does not fit"):
        held.append("s", 104, one_head, one_head)
    held.append("s", 104, k[:, 4:], v[:, 4:])
    q = torch.randn(3, 4, 8)
    positions = torch.tensor([103, 110, 111])
    lent = held.partial(["s"], 1, q, positions, scale=0.3, window=None)
    expected = partial_attention(q, k[1], v[1], positions, torch.arange(100, 108), scale=0.3)
    assert torch.equal(lent.partial.out, expected.out) and torch.equal(lent.partial.lse, expected.lse)
    with pytest.raises(OutOfRange):
        held.partial(["s"], 2, q, positions, scale=0.3, window=None)
    with pytest.raises(NotFound):
        held.partial(["t"], 0, q, positions, scale=0.3, window=None)
    assert [start for start, _, _ in held.read("s", 0, 3)] == [100, 103, 106]


def test_several_segments_in_one_call_merge_to_the_partial_over_their_union() -> None:
    """One call per peer and layer: a sequence's segments held here (not adjacent, in any
    order) give the partial over all their keys."""
    held = HeldKV(MicroAttentionLimits(max_inflight_key_tokens=10))
    k, v = kv(12, seed=3)
    held.append("old", 0, k[:, :4], v[:, :4])
    held.append("mid", 8, k[:, 8:], v[:, 8:])
    q, positions = torch.randn(2, 4, 8), torch.tensor([12, 13])
    lent = held.partial(["mid", "old"], 1, q, positions, scale=0.3, window=None)
    keys = torch.cat([torch.arange(0, 4), torch.arange(8, 12)])
    expected = partial_attention(q, k[1, keys], v[1, keys], positions, keys, scale=0.3)
    torch.testing.assert_close(lent.partial.out, expected.out, rtol=0, atol=1e-6)
    torch.testing.assert_close(lent.partial.lse, expected.lse, rtol=0, atol=1e-6)
    with pytest.raises(InvalidArgument, match="named twice"):
        held.partial(["old", "mid", "old"], 1, q, positions, scale=0.3, window=None)
    with pytest.raises(NotFound, match="'gone'"):
        held.partial(["old", "gone"], 1, q, positions, scale=0.3, window=None)
    held.append("more", 4, k[:, 4:8], v[:, 4:8])
    with pytest.raises(ResourceExhausted, match="lent at once"):  # 12 key tokens, 10 lent at once
        held.partial(["old", "mid", "more"], 1, q, positions, scale=0.3, window=None)


def test_held_bytes_are_capped_and_given_back() -> None:
    held = HeldKV(MicroAttentionLimits(max_held_bytes=2 * KV_BYTES))
    held.append("a", 0, *kv(4))
    held.append("b", 0, *kv(4))
    with pytest.raises(ResourceExhausted, match="bytes lent"):
        held.append("c", 0, *kv(4))
    assert held.release("a") and not held.release("a")
    held.append("c", 0, *kv(4))
    assert held.held_bytes == 2 * KV_BYTES


def test_every_call_refuses_an_empty_or_overlong_segment_id_before_looking() -> None:
    held = HeldKV(MicroAttentionLimits(max_segment_id_chars=8))
    held.append("a" * 8, 0, *kv(4))
    for bad, reason in (("", "is empty"), ("x" * 300_000, "300000 characters, more than 8")):
        with pytest.raises(InvalidArgument, match=reason):
            held.append(bad, 0, *kv(4))
        with pytest.raises(InvalidArgument, match=reason):
            list(held.read(bad, 0, 2))
        with pytest.raises(InvalidArgument, match=reason):
            held.layer_digests(bad)
        with pytest.raises(InvalidArgument, match=reason):
            held.release(bad)
    assert held.release("a" * 8)


def test_idle_segments_are_dropped() -> None:
    clock = Clock()
    held = HeldKV(MicroAttentionLimits(segment_idle_ttl_seconds=10), clock=clock)
    held.append("old", 0, *kv(4))
    held.append("used", 0, *kv(4))
    clock.now = 8
    held.partial(["used"], 0, torch.randn(1, 4, 8), torch.tensor([9]), scale=1.0, window=None)
    clock.now = 15
    held.append("new", 0, *kv(4))
    with pytest.raises(NotFound):
        held.partial(["old"], 0, torch.randn(1, 4, 8), torch.tensor([9]), scale=1.0, window=None)
    assert held.held_bytes == 2 * KV_BYTES


def test_debts_are_kept_by_borrower_and_own_recalled_kv_is_never_idle() -> None:
    clock = Clock()
    held = HeldKV(MicroAttentionLimits(segment_idle_ttl_seconds=10), node="me:1", clock=clock)
    k, v = kv(8)
    held.append("a", 0, k[:, :4], v[:, :4], home="a:1")
    with pytest.raises(InvalidArgument, match="belongs to home 'a:1', not 'b:1'"):
        held.append("a", 4, k[:, 4:], v[:, 4:], home="b:1")
    held.append("a", 4, k[:, 4:], v[:, 4:], home="a:1")
    held.append("b", 0, *kv(4), home="b:1")
    held.append("unnamed", 0, *kv(4))
    held.append("mine", 0, *kv(4), home="me:1")  # recalled by DGFM: not a debt
    assert held.held_for() == {"a:1": 2 * KV_BYTES, "b:1": KV_BYTES}
    clock.now = 15
    held.append("new", 0, *kv(4), home="b:1")  # drops the idle ones, never this worker's own
    assert held.held_for() == {"b:1": KV_BYTES} and held.held_bytes == 2 * KV_BYTES
    held.partial(["mine"], 0, torch.randn(1, 4, 8), torch.tensor([9]), scale=1.0, window=None)


def test_cost_model_starts_remote_pulls_when_cheaper_and_after_a_refusal() -> None:
    costs = CostModel(refusal_backoff_calls=2)
    assert costs.choose(kv_bytes=10**6) is Mode.REMOTE  # nothing measured
    costs.observe_transfer(10**9, 1.0)  # 1 GB/s (the upload)
    costs.observe_remote(call_seconds=0.010, compute_seconds=0.001)
    assert costs.choose(kv_bytes=100 * 10**6) is Mode.REMOTE  # pulling 100 MB: 0.1 s
    assert costs.choose(kv_bytes=1000) is Mode.REMOTE  # the same compute either way: remote
    costs.observe_remote(call_seconds=0.100, compute_seconds=0.091)  # the peer is loaded
    costs.observe_pull(10**6, 0.001, compute_seconds=0.001)
    assert costs.choose(kv_bytes=10**6) is Mode.PULL  # 1 MB, 1 ms to compute here
    assert costs.choose(kv_bytes=100 * 10**6) is Mode.REMOTE
    costs.observe_refusal()
    assert [costs.choose(10**9) for _ in range(3)] == [Mode.PULL, Mode.PULL, Mode.REMOTE]
