"""DistAttention across real worker processes on loopback ports standing for nodes: a
context that does not fit one worker's share keeps its oldest KV on two peer workers
(MicroAttention), and every logit matches the single-node forward (1e-4, fp32), with the
partials computed remotely and with the KV pulled; a peer killed mid-sequence makes the
sequence recompute its KV on the peer left (same logits), and when nothing is left the
turn fails UNAVAILABLE-kind (ContextUnavailable), never with a wrong answer. The service's
edge: malformed tensors (or a segment named twice) are INVALID_ARGUMENT, unknown segments NOT_FOUND, the lending caps
RESOURCE_EXHAUSTED; a segment can also come from chunks in the peer's own daemon."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from attnstore.kvstore_client import KVStoreClient
from attnstore.worker.v1 import micro_attention_pb2 as pb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.context import ContextUnavailable, LongContext
from inference_worker.dist_attention.cost_model import Mode
from inference_worker.dist_attention.partial import partial_attention
from inference_worker.dist_attention.placement import ContextTooLong
from inference_worker.dist_attention.remote import RemoteSegment, peer_channel
from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.dist_attention.wire import from_wire, to_wire
from inference_worker.kv_codec import encode_chunks
from inference_worker.launcher import WorkerProcess
from inference_worker.model_store import LoadedModel, default_model_dir, load_model
from kvstore_daemon.launcher import DaemonProcess

TOLERANCE = 1e-4
LIMITS = {"max_held_bytes": 4 << 20, "max_query_tokens": 64, "max_inflight_key_tokens": 4096}


@pytest.fixture(scope="module")
def model_dir(tiny_model: LoadedModel) -> Path:
    return tiny_model.model_dir


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[list[WorkerProcess]]:
    with two_workers(tmp_path_factory.mktemp("peers"), model_dir) as started:
        yield started


@pytest.fixture
def doomed_peers(tmp_path: Path, model_dir: Path) -> Iterator[list[WorkerProcess]]:
    """Peers of one test, which kills them."""
    with two_workers(tmp_path, model_dir) as started:
        yield started


@contextlib.contextmanager
def two_workers(tmp_path: Path, model_dir: Path) -> Iterator[list[WorkerProcess]]:
    started = []
    try:
        for name in ("peer-a", "peer-b"):
            worker = WorkerProcess(tmp_path / f"{name}.log", model_dir=model_dir,
                                   settings={"micro_attention": LIMITS, "listen_address": "127.0.0.1:0"})  # fmt: skip
            worker.start()
            started.append(worker)
        yield started
    finally:
        for worker in started:
            if worker.running:
                worker.stop()


def reference(model: PreTrainedModel, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].float()


def long_context(model: PreTrainedModel, peers: list[WorkerProcess], room: int = 200) -> LongContext:
    channels = {p.address: peer_channel(p.address) for p in peers}
    return LongContext(
        DistributedRunner(model), channels, lambda: {a: room for a in channels},
        local_tokens=48, segment_tokens=40, chunk_tokens=16, timeout_seconds=5.0,
    )  # fmt: skip


def decode_and_compare(
    model: PreTrainedModel, context: LongContext, prompt: list[int], steps: int, on_step=None
) -> None:
    logits = [context.prefill(prompt, max_new_tokens=steps + 1)]
    for step in range(steps):
        if on_step is not None:
            on_step(step)
        logits.append(context.decode(int(torch.argmax(logits[-1]))))
    expected = reference(model, context.token_ids)
    for index, got in enumerate(logits):
        assert (got - expected[len(prompt) - 1 + index]).abs().max() <= TOLERANCE


@pytest.mark.parametrize("mode", [None, Mode.PULL])
def test_context_across_three_workers_gives_single_node_logits(
    model_dir: Path, peers: list[WorkerProcess], mode: Mode | None
) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    context = long_context(model, peers)
    prompt = torch.randint(0, 300, (150,), generator=torch.Generator().manual_seed(1)).tolist()

    def force(step: int) -> None:
        for place in context.places:
            if isinstance(place, RemoteSegment):
                place.force = mode

    decode_and_compare(model, context, prompt, steps=4, on_step=force)
    remote = [p for p in context.places if isinstance(p, RemoteSegment)]
    assert {p.address for p in remote} == {w.address for w in peers}  # both peers hold KV
    assert sum(p.tokens for p in remote) == 150 + 5 - 48
    if mode is Mode.PULL:
        assert all(p.traffic.pulls > 0 for p in remote)
    else:
        assert all(p.traffic.remote_calls > 0 for p in remote)
    context.close()


class CallCounter(grpc.UnaryUnaryClientInterceptor):
    """Counts the unary calls a channel makes, by method name."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def intercept_unary_unary(self, continuation, details, request):
        self.calls[details.method.rsplit("/", 1)[-1]] += 1
        return continuation(details, request)


def test_one_partial_attention_call_per_peer_and_layer(model_dir: Path, peers: list[WorkerProcess]) -> None:
    """A peer holding two of the sequence's segments answers one PartialAttention per layer
    and step for both (merged there); a segment the cost model pulls is read instead, and
    the logits stay those of the single-node forward."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    counter = CallCounter()
    channels = {p.address: grpc.intercept_channel(peer_channel(p.address), counter) for p in peers}
    context = LongContext(
        DistributedRunner(model), channels, lambda: {a: 200 for a in channels},
        local_tokens=48, segment_tokens=40, chunk_tokens=16, timeout_seconds=5.0,
    )  # fmt: skip
    prompt = torch.randint(0, 300, (150,), generator=torch.Generator().manual_seed(6)).tolist()

    def force(step: int) -> None:
        if step == 0:
            remote = [p for p in context.places if isinstance(p, RemoteSegment)]
            for index, place in enumerate(remote):
                place.force = Mode.PULL if index == 0 else Mode.REMOTE
            counter.calls.clear()

    steps = 3
    decode_and_compare(model, context, prompt, steps=steps, on_step=force)
    remote = [p for p in context.places if isinstance(p, RemoteSegment)]
    holders = Counter(p.address for p in remote)
    assert len(holders) == 2 and max(holders.values()) >= 2  # a peer holds several segments
    assert counter.calls["PartialAttention"] == steps * model.config.num_hidden_layers * 2
    assert remote[0].traffic.pulls == steps * model.config.num_hidden_layers
    context.close()


def test_killed_peer_is_recomputed_elsewhere_or_fails_unavailable(
    model_dir: Path, doomed_peers: list[WorkerProcess]
) -> None:
    peers = doomed_peers
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    context = long_context(model, peers)
    prompt = torch.randint(0, 300, (120,), generator=torch.Generator().manual_seed(2)).tolist()
    decode_and_compare(model, context, prompt, steps=3, on_step=lambda step: step == 1 and peers[0].kill9())
    assert context.recomputations == 1 and context.lost == {peers[0].address}
    assert all(p.address == peers[1].address for p in context.places if isinstance(p, RemoteSegment))

    peers[1].kill9()
    with pytest.raises(ContextUnavailable, match="were lost"):
        context.decode(1)


def test_context_beyond_every_peer_is_refused(model_dir: Path, peers: list[WorkerProcess]) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with pytest.raises(ContextTooLong, match="peers have room for 20"):
        long_context(model, peers, room=10).prefill(list(range(100)), max_new_tokens=2)


def test_service_statuses(peers: list[WorkerProcess]) -> None:
    stub = micro_attention_pb2_grpc.MicroAttentionStub(peer_channel(peers[0].address))
    kv = to_wire(torch.zeros(3, 8, 2, 16))
    stub.AppendKV(pb.AppendKVRequest(segment_id="s", start_position=0, keys=kv, values=kv))
    query = pb.PartialAttentionRequest(segment_id="s", layer=0, queries=to_wire(torch.zeros(1, 4, 16)),
                                       query_positions=[8], scale=0.25)  # fmt: skip
    assert list(stub.PartialAttention(query).lse.shape) == [1, 4]
    cases = {
        grpc.StatusCode.INVALID_ARGUMENT: [
            pb.PartialAttentionRequest(segment_id="s", queries=pb.Tensor(shape=[1, 4, 16], dtype="float32", data=b"x"),
                                       query_positions=[8], scale=0.25),
            pb.PartialAttentionRequest(segment_id="s", queries=to_wire(torch.zeros(65, 4, 16)),
                                       query_positions=list(range(65)), scale=0.25),
            pb.PartialAttentionRequest(segment_id="s", queries=to_wire(torch.zeros(1, 3, 16)), query_positions=[8], scale=0.25),
            pb.PartialAttentionRequest(segment_id="s", queries=to_wire(torch.zeros(1, 4, 16)), query_positions=[8], scale=0),
            pb.PartialAttentionRequest(segment_id="s", more_segment_ids=["s"], queries=to_wire(torch.zeros(1, 4, 16)),
                                       query_positions=[8], scale=0.25),
        ],
        grpc.StatusCode.NOT_FOUND: [
            pb.PartialAttentionRequest(segment_id="nope", queries=to_wire(torch.zeros(1, 4, 16)), query_positions=[8], scale=0.25),
            pb.PartialAttentionRequest(segment_id="s", more_segment_ids=["nope"], queries=to_wire(torch.zeros(1, 4, 16)),
                                       query_positions=[8], scale=0.25),
        ],
        grpc.StatusCode.OUT_OF_RANGE: [pb.PartialAttentionRequest(segment_id="s", layer=3, queries=to_wire(torch.zeros(1, 4, 16)),
                                                                  query_positions=[8], scale=0.25)],
    }  # fmt: skip
    for code, requests in cases.items():
        for request in requests:
            with pytest.raises(grpc.RpcError) as caught:
                stub.PartialAttention(request)
            assert caught.value.code() is code, caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:  # a borrower no worker could be reached by
        stub.AppendKV(pb.AppendKVRequest(segment_id="s1", start_position=0, keys=kv, values=kv, home="a b:1"))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "home 'a b:1' is not a gRPC target" in caught.value.details()
    assert stub.DescribeLending(pb.DescribeLendingRequest()).kvstore_address == ""  # no daemon advertised
    big = to_wire(torch.zeros(3, 6000, 2, 16))  # K and V 4.6 MB: past the 4 MiB lent
    with pytest.raises(grpc.RpcError) as caught:
        stub.AppendKV(pb.AppendKVRequest(segment_id="s2", keys=big, values=big))
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    wide = to_wire(torch.zeros(1, 4100, 2, 16))  # more key tokens than the 4096 lent at once
    stub.AppendKV(pb.AppendKVRequest(segment_id="s3", keys=wide, values=wide))
    with pytest.raises(grpc.RpcError) as caught:
        stub.PartialAttention(pb.PartialAttentionRequest(segment_id="s3", queries=to_wire(torch.zeros(1, 4, 16)),
                                                         query_positions=[5000], scale=0.25))  # fmt: skip
    assert (
        caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "lent at once" in caught.value.details()
    )
    assert stub.ReleaseKV(pb.ReleaseKVRequest(segment_id="s")).released
    assert not stub.ReleaseKV(pb.ReleaseKVRequest(segment_id="s")).released


@pytest.mark.timeout(600)
def test_real_model_context_across_workers(peers: list[WorkerProcess]) -> None:
    """SmolLM2-135M (fp32, 30 layers, 3 KV heads) at home, its oldest 85 tokens' KV on the
    two peers: the same logits as transformers' forward over the whole sequence."""
    model = load_model(default_model_dir(), torch.float32, "cpu").model
    context = long_context(model, peers)
    prompt = torch.randint(0, 49000, (130,), generator=torch.Generator().manual_seed(3)).tolist()
    decode_and_compare(model, context, prompt, steps=2)
    assert sum(p.tokens for p in context.places if isinstance(p, RemoteSegment)) == 130 + 3 - 48
    context.close()


def test_segment_from_the_peers_daemon(tmp_path: Path, model_dir: Path, daemon: DaemonProcess) -> None:
    """Chunks the pool placed in a peer's daemon become a segment there (AttachChunks): its
    partials equal the ones computed here over the same KV, its borrower (`home`) is
    reported as owed those bytes (DGFM's graph) and an append naming another home is
    INVALID_ARGUMENT; a missing chunk is NOT_FOUND, a worker without a daemon answers
    FAILED_PRECONDITION."""
    namespace, chunk_tokens = bytes(range(16)), 8
    gen = torch.Generator().manual_seed(4)
    kv = [(torch.randn(2, 24, 16, generator=gen), torch.randn(2, 24, 16, generator=gen)) for _ in range(3)]
    keys = [bytes([i]) * 32 for i in range(3)]
    with KVStoreClient(daemon.address) as client:
        client.register_namespace(
            namespace, num_layers=3, kv_heads=2, head_dim=16, chunk_tokens=chunk_tokens, dtype="float32"
        )
        client.put_chunks(
            namespace, list(zip(keys, encode_chunks(namespace, keys, kv, chunk_tokens, 40), strict=True))
        )
    worker = WorkerProcess(tmp_path / "peer.log", model_dir=model_dir, kvstore_address=daemon.address,
                           settings={"listen_address": "127.0.0.1:0"})  # fmt: skip
    worker.start()
    try:
        stub = micro_attention_pb2_grpc.MicroAttentionStub(peer_channel(worker.address))
        attached = stub.AttachChunks(
            pb.AttachChunksRequest(segment_id="d", namespace=namespace, chunk_keys=keys, home="home:1")
        )
        assert (attached.segment_tokens, attached.start_position) == (24, 40)
        held_for = stub.DescribeLending(pb.DescribeLendingRequest()).held_for
        assert [(h.home, h.bytes) for h in held_for] == [("home:1", attached.held_bytes)]
        assert attached.held_bytes == 2 * 3 * 24 * 2 * 16 * 4  # K, V x layers x tokens x kv_heads x D x fp32
        with pytest.raises(grpc.RpcError) as caught:
            more = to_wire(torch.zeros(3, 1, 2, 16))
            stub.AppendKV(
                pb.AppendKVRequest(segment_id="d", start_position=64, keys=more, values=more, home="other:2")
            )
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "home:1" in caught.value.details()
        q, positions = torch.randn(2, 4, 16, generator=gen), torch.tensor([50, 70])
        reply = stub.PartialAttention(pb.PartialAttentionRequest(
            segment_id="d", layer=2, queries=to_wire(q), query_positions=positions.tolist(), scale=0.25
        ))  # fmt: skip
        k, v = kv[2]
        expected = partial_attention(
            q, k.transpose(0, 1), v.transpose(0, 1), positions, torch.arange(40, 64), scale=0.25
        )
        assert (from_wire(reply.output, "output", 3) - expected.out).abs().max() <= 1e-6
        assert (from_wire(reply.lse, "lse", 2) - expected.lse).abs().max() <= 1e-6
        with pytest.raises(grpc.RpcError) as caught:
            stub.AttachChunks(
                pb.AttachChunksRequest(segment_id="e", namespace=namespace, chunk_keys=[b"\xff" * 32])
            )
        assert caught.value.code() is grpc.StatusCode.NOT_FOUND, caught.value.details()
    finally:
        worker.stop()


def test_attach_without_a_daemon_is_a_failed_precondition(peers: list[WorkerProcess]) -> None:
    stub = micro_attention_pb2_grpc.MicroAttentionStub(peer_channel(peers[0].address))
    with pytest.raises(grpc.RpcError) as caught:
        stub.AttachChunks(pb.AttachChunksRequest(segment_id="x", namespace=bytes(16), chunk_keys=[b"k" * 32]))
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION


def test_peer_that_lost_its_segments_is_recomputed(model_dir: Path, peers: list[WorkerProcess]) -> None:
    """A peer that restarted (here: its segments released behind the sequence's back)
    answers NOT_FOUND: the sequence recomputes rather than attend without that KV."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    context = long_context(model, peers)
    prompt = torch.randint(0, 300, (110,), generator=torch.Generator().manual_seed(5)).tolist()

    def forget(step: int) -> None:
        if step == 0:
            stub = micro_attention_pb2_grpc.MicroAttentionStub(peer_channel(peers[1].address))
            for place in context.places:
                if isinstance(place, RemoteSegment) and place.address == peers[1].address:
                    assert stub.ReleaseKV(pb.ReleaseKVRequest(segment_id=place.segment_id)).released

    decode_and_compare(model, context, prompt, steps=2, on_step=forget)
    assert context.recomputations == 1 and context.lost == {peers[1].address}
    context.close()
