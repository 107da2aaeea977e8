"""DGFM's recall on real segments, logits checked: a sequence whose home is this test
process (its own HeldKV and DebtSwaps, named "home") keeps its oldest KV on a worker
process; the worker reports the debt by borrower (DescribeLending.held_for, from
AppendKV.home). Recalling it (ReadKV every layer, kept at home, released at the worker)
leaves the worker holding nothing and home holding as many bytes as the worker held, and
the sequence goes on decoding with logits within 1e-4 of the plain forward. A budget
smaller than the oldest segment moves nothing. A segment whose KV on the worker is no
longer the KV uploaded (re-created under its id) is never attended, pulled nor recalled:
each read checks the upload's digests, and the sequence recomputes (here, with no other
peer, fails UNAVAILABLE) instead of answering from it. The same recall holds for
segments attached through the worker's daemon (the home puts the chunks there, the worker
attaches them, AttachChunks, and reports the digests the home checks). RecallKV answers bad input with
INVALID_ARGUMENT, and FAILED_PRECONDITION on a worker with no advertised address; a
creditor nobody owes anything moves 0 bytes."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch
from far_kv_checks import decode, lending
from prometheus_client import REGISTRY
from running_daemon import MiB, running_daemon
from running_workers import running_workers
from transformers import AutoModelForCausalLM

from attnstore.errors import FailedPrecondition, InvalidArgument
from attnstore.kvstore_client import KVStoreClient
from attnstore.server.ports import free_port
from attnstore.worker.v1 import micro_attention_pb2 as pb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.attach import ChunkAttacher, segment_keys
from inference_worker.dist_attention.context import ContextUnavailable, LongContext
from inference_worker.dist_attention.cost_model import Mode
from inference_worker.dist_attention.dgfm import DebtSwaps
from inference_worker.dist_attention.held_kv import HeldKV
from inference_worker.dist_attention.limits import MicroAttentionLimits
from inference_worker.dist_attention.long_settings import DgfmSettings
from inference_worker.dist_attention.remote import (
    PeerChannels,
    PlaceLost,
    RemoteSegment,
    attend_on_peer,
    peer_channel,
)
from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.dist_attention.segment import RecalledSegment
from inference_worker.dist_attention.wire import to_wire
from inference_worker.launcher import WorkerProcess
from inference_worker.model_store import LoadedModel
from kvstore_daemon.launcher import DaemonProcess

PROMPT_TOKENS, NEW_TOKENS, LOCAL_TOKENS = 150, 6, 48


@pytest.fixture(scope="module")
def attaching_creditor(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: LoadedModel
) -> Iterator[tuple[WorkerProcess, DaemonProcess]]:
    """A worker with a daemon it advertises (long_context.advertise_kvstore_address)."""
    root, address = tmp_path_factory.mktemp("dgfm-attach"), f"127.0.0.1:{free_port()}"
    with running_daemon(root, dram_bytes=64 * MiB, ssd_bytes=64 * MiB) as daemon:
        settings = {"listen_address": address, "kvstore_address": daemon.address,
                    "long_context": {"advertise_address": address, "advertise_kvstore_address": daemon.address}}  # fmt: skip
        with running_workers(root, tiny_model.model_dir, {"node": settings}) as started:
            yield started["node"], daemon


@pytest.fixture(scope="module")
def creditor(tmp_path_factory: pytest.TempPathFactory, tiny_model: LoadedModel) -> Iterator[WorkerProcess]:
    address = f"127.0.0.1:{free_port()}"
    settings = {"listen_address": address, "long_context": {"advertise_address": address}}
    with running_workers(
        tmp_path_factory.mktemp("dgfm"), tiny_model.model_dir, {"node": settings}
    ) as started:
        yield started["node"]


def test_recalled_segments_come_home_with_identical_answers(
    creditor: WorkerProcess, tiny_model: LoadedModel
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    address = creditor.address
    channel = peer_channel(address)
    held = HeldKV(MicroAttentionLimits(), node="home")
    swaps = DebtSwaps(held, DgfmSettings(), PeerChannels(None), timeout_seconds=10)
    context = LongContext(DistributedRunner(model), {address: channel}, lambda: {address: 400},
                          local_tokens=LOCAL_TOKENS, segment_tokens=40, chunk_tokens=16, home="home")  # fmt: skip
    prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(3)).tolist()
    logits = decode(model, context, context.prefill(prompt, NEW_TOKENS), steps=2)
    remote = [p for p in context.places if isinstance(p, RemoteSegment)]
    lent = lending(channel)
    debt = (PROMPT_TOKENS + NEW_TOKENS - LOCAL_TOKENS) * model.config.num_hidden_layers * 2 * 2 * 16 * 4
    assert len(remote) == 3 and {(e.home, e.bytes) for e in lent.held_for} == {("home", debt)}
    assert lent.held_bytes == debt and lent.node == address

    counted = REGISTRY.get_sample_value("attnstore_worker_dgfm_recalled_bytes_total") or 0.0
    with swaps.live(context):
        assert swaps.recall(address, remote[0].nbytes - 1) == 0  # the oldest segment does not fit
        assert swaps.recall(address, debt) == debt
    assert REGISTRY.get_sample_value("attnstore_worker_dgfm_recalled_bytes_total") == counted + debt
    assert not any(isinstance(p, RemoteSegment) for p in context.places)
    assert sum(p.nbytes for p in context.places if isinstance(p, RecalledSegment)) == debt
    assert lending(channel).held_bytes == 0 and held.held_bytes == debt and held.held_for() == {}
    decode(model, context, logits, steps=3)
    context.close()
    assert held.held_bytes == 0


def test_attached_segments_are_recalled_with_identical_answers(
    attaching_creditor: tuple[WorkerProcess, DaemonProcess], tiny_model: LoadedModel
) -> None:
    """Every segment placed on a worker that advertises its daemon goes through it: its
    chunks are in that daemon, the worker holds them for home, and DGFM's recall brings them
    home between decode steps with the logits still within 1e-4 of the plain forward."""
    worker, daemon = attaching_creditor
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    address, channel = worker.address, peer_channel(worker.address)
    held = HeldKV(MicroAttentionLimits(), node="home")
    swaps = DebtSwaps(held, DgfmSettings(), PeerChannels(None), timeout_seconds=10)
    attacher = ChunkAttacher(None, None, chunk_tokens=16, timeout_seconds=10)
    attacher.learn(address, lending(channel))
    assert attacher.daemons == {address: daemon.address}
    context = LongContext(DistributedRunner(model), {address: channel}, lambda: {address: 400},
                          local_tokens=LOCAL_TOKENS, segment_tokens=40, chunk_tokens=16, home="home",
                          attacher=attacher)  # fmt: skip
    prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(5)).tolist()
    logits = decode(model, context, context.prefill(prompt, NEW_TOKENS), steps=2)
    remote = [p for p in context.places if isinstance(p, RemoteSegment)]
    assert len(remote) == 3
    with KVStoreClient(daemon.address) as client:  # each segment's chunks, in the worker's daemon
        for segment in remote:
            keys = segment_keys(context.chunk_namespace, prompt, segment.start, segment.stop, 16)
            assert client.lookup(context.chunk_namespace, keys).prefix_length == len(keys)
    debt = sum(segment.nbytes for segment in remote)
    assert {(e.home, e.bytes) for e in lending(channel).held_for} == {("home", debt)}

    with swaps.live(context):
        assert swaps.recall(address, debt) == debt  # read back through ReadKV, digests checked
    assert not any(isinstance(p, RemoteSegment) for p in context.places)
    assert lending(channel).held_bytes == 0 and held.held_bytes == debt
    decode(model, context, logits, steps=3)
    context.close()
    assert held.held_bytes == 0


def test_kv_changed_on_the_creditor_is_never_read(creditor: WorkerProcess, tiny_model: LoadedModel) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    address = creditor.address
    channel = peer_channel(address)
    swaps = DebtSwaps(
        HeldKV(MicroAttentionLimits(), node="home"), DgfmSettings(), PeerChannels(None), timeout_seconds=10
    )
    context = LongContext(DistributedRunner(model), {address: channel}, lambda: {address: 400},
                          local_tokens=LOCAL_TOKENS, segment_tokens=40, chunk_tokens=16, home="home")  # fmt: skip
    prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(4)).tolist()
    logits = context.prefill(prompt, NEW_TOKENS)
    oldest = context.places[0]
    assert isinstance(oldest, RemoteSegment)
    stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
    layers = [oldest.read_layer(layer) for layer in range(oldest.layers)]  # as uploaded: no complaint
    stub.ReleaseKV(pb.ReleaseKVRequest(segment_id=oldest.segment_id), timeout=10)
    other = torch.stack([k for k, _ in layers]) * 1.5  # the same shape and positions, other KV
    stub.AppendKV(pb.AppendKVRequest(segment_id=oldest.segment_id, start_position=oldest.start,
                                     keys=to_wire(other), values=to_wire(torch.stack([v for _, v in layers])),
                                     home="home"), timeout=10)  # fmt: skip

    with pytest.raises(PlaceLost, match="not the KV uploaded"):
        oldest.read_layer(0)
    q = torch.randn(1, model.config.num_attention_heads, layers[0][0].shape[-1])
    for mode in Mode:
        oldest.force = mode
        with pytest.raises(PlaceLost, match="not the KV uploaded"):
            attend_on_peer([oldest], 0, q, torch.tensor([PROMPT_TOKENS]), scale=0.25, window=None)
    with swaps.live(context):
        assert swaps.recall(address, 1 << 30) == 0  # the oldest segment stays where it is, unread
    assert context.places[0] is oldest
    with pytest.raises(ContextUnavailable):  # the only peer is lost: recomputing it does not fit
        context.decode(int(torch.argmax(logits)))
    context.close()
    assert lending(channel).held_bytes == 0


def test_recall_refuses_bad_input(creditor: WorkerProcess) -> None:
    swaps = DebtSwaps(
        HeldKV(MicroAttentionLimits(), node="home"), DgfmSettings(), PeerChannels(None), timeout_seconds=10
    )
    for creditor_name, max_bytes in (("", 1), ("home", 1), ("other:1", 0)):
        with pytest.raises(InvalidArgument):
            swaps.recall(creditor_name, max_bytes)
    off = DebtSwaps(HeldKV(MicroAttentionLimits()), DgfmSettings(), PeerChannels(None), timeout_seconds=10)
    with pytest.raises(FailedPrecondition, match="advertise_address"):
        off.recall("other:1", 1)
    stub = micro_attention_pb2_grpc.MicroAttentionStub(peer_channel(creditor.address))
    for creditor_name, max_bytes, says in (
        ("", 1, "not another worker"), (creditor.address, 1, "not another worker"), ("other:1", 0, "max_bytes"),
    ):  # fmt: skip
        with pytest.raises(grpc.RpcError) as refused:
            stub.RecallKV(pb.RecallKVRequest(creditor=creditor_name, max_bytes=max_bytes), timeout=10)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT and says in refused.value.details()
    no_debt = stub.RecallKV(pb.RecallKVRequest(creditor="other:1", max_bytes=1), timeout=10)
    assert no_debt.moved_bytes == 0  # no live sequence there has KV on it
