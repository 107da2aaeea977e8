"""Far segments lent through the pool's lending path, and back after a lender restart.

A sequence whose home is this test process ("home") keeps its oldest KV on a worker with a
daemon that is a member of the pool's ledger (a private Redis). Attached: the worker
advertises its daemon and the home puts each segment's chunks there as lent to it
(ReservePut's borrower, durable); appended (the default): the worker puts each appended
piece there as lent to the home (lent_chunks.py). Either way the ledger's entry for the
daemon counts them in `lent_bytes` and the worker holds them for home
(DescribeLending.held_for, DGFM's debt). The lender worker is killed (-9) and started
again on its port, with the same daemon: the next decode steps find their segments gone
(NOT_FOUND), re-attach them from the daemon (digests checked) and go on within 1e-4 of
the plain forward, recomputing nothing. Releasing the sequence deletes the chunks: the
ledger counts nothing lent. When the daemon lost the chunks meanwhile, a restarted lender
cannot re-attach: the sequence recomputes, or (no other peer here) fails UNAVAILABLE;
never a wrong token. A daemon past its lending limits refuses an append: the home goes to
the next peer, then fails UNAVAILABLE naming the limits. A home killed (-9) mid-turn
leaves nothing lent once its segments are idle for their TTL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
import torch
from far_kv_checks import decode, lending, lent_bytes, plain_greedy, run_turn
from polling import poll
from running_daemon import MiB, running_daemon
from running_workers import running_workers
from transformers import AutoModelForCausalLM, PreTrainedModel

from attnstore.kvstore_client import KVStoreClient
from attnstore.server.ports import free_port
from attnstore.worker.v1 import micro_attention_pb2 as mpb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.attach import ChunkAttacher
from inference_worker.dist_attention.context import ContextUnavailable, LongContext
from inference_worker.dist_attention.remote import RemoteSegment, peer_channel
from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.dist_attention.wire import to_wire
from inference_worker.launcher import WorkerProcess
from inference_worker.model_store import LoadedModel
from kvstore_daemon.launcher import DaemonProcess

PROMPT_TOKENS, NEW_TOKENS, LOCAL_TOKENS, SEGMENT_TOKENS, CHUNK_TOKENS = 150, 8, 48, 40, 16
KV_BYTES_PER_TOKEN = 3 * 2 * 2 * 16 * 4  # the tiny Llama: layers x K,V x kv_heads x head_dim x fp32
CHUNK_HEADER_BYTES = 4096  # a generous bound on one chunk's bytes beyond its K and V
REFUSES = {"pool_max_lent_fraction": 0.0}  # a daemon that lends nothing
PIECE_TOKENS = 512  # 32 chunks of 12 KiB of KV each (and a header): 384-512 KiB lent
# A lending ceiling of 700 KiB of the 64 MiB SSD: one piece fits, two do not (the daemon
# checks each chunk of a put counting the ones before it); small DRAM blocks to stage 32
# chunks. Borrowed chunks are replaced (the default), but not those of a held segment.
ONE_PIECE = {"pool_max_lent_fraction": 0.7 / 64, "dram_block_bytes": 64 * 1024}


def lender_settings(daemon: DaemonProcess, *, attach: bool = True, **limits: object) -> dict[str, object]:
    """A worker lending through `daemon` (micro_attention `limits`), advertising it for
    attaching when `attach` (else homes append to it)."""
    address = f"127.0.0.1:{free_port()}"
    advertised = {"advertise_kvstore_address": daemon.address} if attach else {}
    return {"listen_address": address, "kvstore_address": daemon.address, "chunk_tokens": CHUNK_TOKENS,
            "micro_attention": limits, "long_context": {"advertise_address": address, **advertised}}  # fmt: skip


def running_lender(root: Path, tiny_model: LoadedModel, daemon: DaemonProcess, *, attach: bool = True,
                     **limits: object):  # fmt: skip
    return running_workers(
        root, tiny_model.model_dir, {"lender": lender_settings(daemon, attach=attach, **limits)}
    )


def long_context(
    model: PreTrainedModel, room: dict[str, int], daemon: DaemonProcess | None = None
) -> LongContext:
    """A sequence homed here over the peers of `room` (tokens each may hold): attaching
    through `daemon` (the one peer's), else appending."""
    channels = {address: peer_channel(address) for address in room}
    attacher = None
    if daemon is not None:
        attacher = ChunkAttacher(None, None, chunk_tokens=CHUNK_TOKENS, timeout_seconds=10)
        [(address, channel)] = channels.items()
        attacher.learn(address, lending(channel))
        assert attacher.daemons == {address: daemon.address}
    return LongContext(DistributedRunner(model), channels, lambda: room, local_tokens=LOCAL_TOKENS,
                       segment_tokens=SEGMENT_TOKENS, chunk_tokens=CHUNK_TOKENS, home="home", attacher=attacher)  # fmt: skip


@contextmanager
def daemon_in_the_ledger(redis_url: str, root: Path) -> Iterator[DaemonProcess]:
    """A daemon heartbeating into the pool's ledger (`redis_url`), lending nothing yet."""
    ledger = {"pool_redis_url": redis_url, "pool_heartbeat_seconds": 0.5}
    with running_daemon(root, dram_bytes=64 * MiB, ssd_bytes=64 * MiB, settings=ledger) as daemon:
        poll(lambda: lent_bytes(redis_url, daemon) == 0, "the daemon in the ledger, lending nothing")
        yield daemon


def held(worker: WorkerProcess) -> int:
    with peer_channel(worker.address) as channel:
        return lending(channel).held_bytes


def restart(worker: WorkerProcess, channel: grpc.Channel) -> None:
    """kill -9, then started again on its port; back once the home's channel reconnects."""
    worker.kill9()
    worker.start()
    grpc.channel_ready_future(channel).result(timeout=30)


@pytest.mark.parametrize("attach", [True, False], ids=["attached", "appended"])
def test_segments_are_lent_through_the_ledger_and_reattached_after_a_restart(
    pool: tuple[str, Path], tiny_model: LoadedModel, attach: bool
) -> None:
    """Attached by the home, or appended (the default: the lender puts them in its daemon)."""
    redis_url, root = pool
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    with (
        daemon_in_the_ledger(redis_url, root) as daemon,
        running_lender(root, tiny_model, daemon, attach=attach) as started,
    ):
        worker = started["lender"]
        context = long_context(model, {worker.address: 400}, daemon if attach else None)
        prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(7))
        logits = decode(model, context, context.prefill(prompt.tolist(), NEW_TOKENS), steps=2)
        remote = [p for p in context.places if isinstance(p, RemoteSegment)]
        assert len(remote) == 3 and all(p.attached is not None for p in remote)
        debt = sum(p.nbytes for p in remote)
        chunks = sum(len(p.attached.keys) for p in remote if p.attached is not None)
        channel = context.channels[worker.address]
        assert {(e.home, e.bytes) for e in lending(channel).held_for} == {("home", debt)}
        # the ledger counts the chunks as lent: the KV, plus each chunk's header
        poll(lambda: debt < lent_bytes(redis_url, daemon) <= debt + chunks * CHUNK_HEADER_BYTES,
             "the attached chunks counted as lent in the ledger")  # fmt: skip

        restart(worker, channel)
        assert lending(channel).held_bytes == 0  # it forgot them
        logits = decode(model, context, logits, steps=3)  # re-attached at the first call
        assert context.recomputations == 0 and context.lost == set()
        assert {(e.home, e.bytes) for e in lending(channel).held_for} == {("home", debt)}

        context.close()  # released: the lender deletes the chunks it was lent
        assert lending(channel).held_bytes == 0
        poll(lambda: lent_bytes(redis_url, daemon) == 0, "nothing lent once the segments are released")


def test_a_lender_that_cannot_reattach_fails_unavailable_never_wrong(
    pool: tuple[str, Path], tiny_model: LoadedModel
) -> None:
    """The lender's daemon no longer has the chunks (evicted; here deleted) when the
    restarted lender worker is asked to re-attach them: the peer is lost, and with no peer
    left the step fails UNAVAILABLE instead of answering without that KV."""
    _, root = pool
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    with (
        running_daemon(root, dram_bytes=64 * MiB, ssd_bytes=64 * MiB) as daemon,
        running_lender(root, tiny_model, daemon) as started,
    ):
        worker = started["lender"]
        context = long_context(model, {worker.address: 400}, daemon)
        prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(8))
        logits = decode(model, context, context.prefill(prompt.tolist(), NEW_TOKENS), steps=1)
        with KVStoreClient(daemon.address) as client:
            for segment in context.places:
                if isinstance(segment, RemoteSegment) and segment.attached is not None:
                    assert client.delete(context.chunk_namespace, segment.attached.keys) > 0
        restart(worker, context.channels[worker.address])
        with pytest.raises(ContextUnavailable):
            context.decode(int(torch.argmax(logits)))
        assert context.lost == {worker.address}


def test_the_chunks_of_a_silent_homes_segments_are_deleted_with_them(
    pool: tuple[str, Path], tiny_model: LoadedModel
) -> None:
    """A home that stops calling (died): its attached segments are dropped as idle at the
    lender's next append, and their chunks deleted from the daemon, which stops counting
    them as lent."""
    _, root = pool
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    idle_seconds = 2.0
    with (
        running_daemon(root, dram_bytes=64 * MiB, ssd_bytes=64 * MiB) as daemon,
        running_lender(root, tiny_model, daemon, segment_idle_ttl_seconds=idle_seconds) as started,
        KVStoreClient(daemon.address) as client,
    ):
        worker = started["lender"]
        context = long_context(model, {worker.address: 400}, daemon)
        prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(10))
        context.prefill(prompt.tolist(), NEW_TOKENS)
        attached = [p.attached for p in context.places if isinstance(p, RemoteSegment) and p.attached]
        assert len(attached) == 3
        for chunks in attached:
            assert client.lookup(context.chunk_namespace, chunks.keys).prefix_length == len(chunks.keys)
        time.sleep(idle_seconds + 0.5)  # the home goes silent past the idle TTL
        stub = micro_attention_pb2_grpc.MicroAttentionStub(context.channels[worker.address])
        kv = to_wire(torch.zeros(3, 1, 2, 16))
        stub.AppendKV(
            mpb.AppendKVRequest(segment_id="other", start_position=0, keys=kv, values=kv), timeout=10
        )
        assert lending(context.channels[worker.address]).held_bytes == 2 * 3 * 2 * 16 * 4  # only the new one
        for chunks in attached:
            assert client.lookup(context.chunk_namespace, chunks.keys).prefix_length == 0


def test_a_lender_killed_and_restarted_mid_turn_never_changes_a_token(
    pool: tuple[str, Path], tiny_model: LoadedModel
) -> None:
    """Through ExecuteTurn: a worker whose pool holds 64 tokens places a 200-token prompt's
    oldest KV on its only peer, attached through the peer's daemon. Once the peer holds
    some, the peer worker is killed (-9) and started again on its port. The turn answers
    with the greedy tokens of plain forwards (its calls wait for the restarting peer and
    re-attach), or fails UNAVAILABLE; never other tokens."""
    _, root = pool
    prompt = torch.randint(0, 300, (200,), generator=torch.Generator().manual_seed(9)).tolist()
    max_tokens = 40
    with (
        running_daemon(root, dram_bytes=64 * MiB, ssd_bytes=64 * MiB) as daemon,
        running_lender(root, tiny_model, daemon) as lenders,
    ):
        lender = lenders["lender"]
        home = {"kv_memory_bytes": 64 * KV_BYTES_PER_TOKEN,
                "long_context": {"peers": [lender.address], "segment_tokens": SEGMENT_TOKENS,
                                 "peer_timeout_seconds": 120}}  # fmt: skip
        with running_workers(root, tiny_model.model_dir, {"home": home}) as homes:
            outcome: dict[str, object] = {}
            turn = threading.Thread(
                target=run_turn, args=(homes["home"].address, prompt, max_tokens, outcome)
            )
            turn.start()
            channel = peer_channel(lender.address)
            poll(lambda: lending(channel).held_bytes > 0, "the lender holding part of the turn's KV")
            restart(lender, channel)
            turn.join(timeout=300)
            assert not turn.is_alive()
        if "error" in outcome:
            error = outcome["error"]
            assert isinstance(error, grpc.RpcError) and error.code() is grpc.StatusCode.UNAVAILABLE, error
            return
        model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
        assert outcome["tokens"] == plain_greedy(model, prompt, max_tokens)
        assert "far_segment_attached" in homes["home"].log_path.read_text()
        assert lending(channel).held_bytes == 0  # released after the turn


def test_a_lending_limit_refuses_then_the_next_peer_then_unavailable(
    tmp_path: Path, tiny_model: LoadedModel
) -> None:
    """The peer with the most room sits on a daemon that lends nothing: it refuses the first
    segment and keeps none of it; the context goes to the other peer, logits within 1e-4.
    With only refusing peers the context fails UNAVAILABLE naming the lending limits."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    with (
        running_daemon(tmp_path / "a", dram_bytes=64 * MiB, ssd_bytes=64 * MiB, settings=REFUSES) as refusing,
        running_daemon(tmp_path / "b", dram_bytes=64 * MiB, ssd_bytes=64 * MiB) as lending_daemon,
        running_workers(tmp_path, tiny_model.model_dir,
                        {"full": lender_settings(refusing, attach=False), "open": lender_settings(lending_daemon, attach=False)}) as started,
    ):  # fmt: skip
        full, open_ = started["full"], started["open"]
        prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(12))
        context = long_context(model, {full.address: 500, open_.address: 400})
        decode(model, context, context.prefill(prompt.tolist(), NEW_TOKENS), steps=2)
        assert context.lost == {full.address}
        assert {p.address for p in context.places if isinstance(p, RemoteSegment)} == {open_.address}
        assert held(full) == 0 and held(open_) > 0
        context.close()

        context = long_context(model, {full.address: 500})
        with pytest.raises(ContextUnavailable, match="lending limits"):
            context.prefill(prompt.tolist(), NEW_TOKENS)
        assert held(full) == 0


def test_a_home_killed_mid_turn_leaves_nothing_lent_after_the_idle_ttl(
    pool: tuple[str, Path], tiny_model: LoadedModel
) -> None:
    """A worker whose pool holds 256 tokens places a long turn's oldest KV on its peer and is
    killed (-9) while it decodes: no ReleaseKV ever comes, and no other call; the lender drops
    the segments once idle for their TTL, and the ledger counts nothing lent."""
    redis_url, root = pool
    ledger = {"pool_redis_url": redis_url, "pool_heartbeat_seconds": 0.5}
    prompt = torch.randint(0, 300, (600,), generator=torch.Generator().manual_seed(13)).tolist()
    with (
        running_daemon(root, dram_bytes=64 * MiB, ssd_bytes=64 * MiB, settings=ledger) as daemon,
        running_workers(root, tiny_model.model_dir,
                        {"lender": lender_settings(daemon, attach=False, segment_idle_ttl_seconds=8.0)}) as lenders,
    ):  # fmt: skip
        lender = lenders["lender"]
        home = {"kv_memory_bytes": 256 * KV_BYTES_PER_TOKEN,
                "long_context": {"peers": [lender.address], "segment_tokens": SEGMENT_TOKENS}}  # fmt: skip
        with running_workers(root, tiny_model.model_dir, {"home": home}) as homes:
            outcome: dict[str, object] = {}
            turn = threading.Thread(target=run_turn, args=(homes["home"].address, prompt, 200, outcome))
            turn.start()
            poll(lambda: held(lender) > 0, "the home's far KV on the lender")
            homes["home"].kill9()  # its far prefill, near prefill and 200 steps are still ahead
            turn.join(timeout=60)
            assert "error" in outcome  # the turn died with its home
            assert held(lender) > 0
        poll(lambda: lent_bytes(redis_url, daemon) > 0, "the dead home's far KV lent in the ledger")
        poll(lambda: held(lender) == 0, "the dead home's segments dropped as idle", timeout_seconds=30)
        poll(lambda: lent_bytes(redis_url, daemon) == 0, "nothing lent after the home died")


def test_an_append_past_the_lending_limits_drops_the_whole_segment(
    tmp_path: Path, tiny_model: LoadedModel
) -> None:
    """The first piece of a segment fits the daemon's lending ceiling, the second does not:
    RESOURCE_EXHAUSTED, and the worker keeps nothing of the segment, its first piece's
    chunks deleted from the daemon too (nothing lent for KV nobody holds)."""
    piece_tokens = PIECE_TOKENS
    with (
        running_daemon(tmp_path, dram_bytes=64 * MiB, ssd_bytes=64 * MiB, settings=ONE_PIECE) as daemon,
        running_lender(tmp_path, tiny_model, daemon, attach=False) as started,
        KVStoreClient(daemon.address) as client,
        peer_channel(started["lender"].address) as channel,
    ):
        stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
        kv = to_wire(torch.randn(3, piece_tokens, 2, 16))
        first = stub.AppendKV(
            mpb.AppendKVRequest(segment_id="s", start_position=0, keys=kv, values=kv, home="home"), timeout=30
        )
        assert first.chunk_keys and lending(channel).held_bytes > 0
        assert client.lookup(first.chunk_namespace, first.chunk_keys).prefix_length == len(first.chunk_keys)
        with pytest.raises(grpc.RpcError) as refused:
            stub.AppendKV(mpb.AppendKVRequest(segment_id="s", start_position=piece_tokens, keys=kv, values=kv,
                                              home="home"), timeout=30)  # fmt: skip
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "lending limits" in refused.value.details()
        assert lending(channel).held_bytes == 0
        assert client.lookup(first.chunk_namespace, first.chunk_keys).prefix_length == 0


def test_a_lender_refuses_a_loan_rather_than_replace_a_held_segments_chunks(
    tmp_path: Path, tiny_model: LoadedModel
) -> None:
    """A lender whose daemon replaces borrowed chunks (the default) and has room for one
    segment: a second segment is refused (RESOURCE_EXHAUSTED: its home goes to the next
    peer) and the first keeps every chunk, pinned while it is held; released, the second
    fits. A lender worker killed (-9) stops renewing its pins: once they lapse, its
    orphaned chunks are replaced by a newer loan."""
    idle_seconds = 8.0  # pins last 4 sweeps of a quarter of it: 8 s
    with (
        running_daemon(tmp_path, dram_bytes=64 * MiB, ssd_bytes=64 * MiB, settings=ONE_PIECE) as daemon,
        running_lender(tmp_path, tiny_model, daemon, attach=False, segment_idle_ttl_seconds=idle_seconds) as started,
        KVStoreClient(daemon.address) as client,
        peer_channel(started["lender"].address) as channel,
    ):  # fmt: skip
        stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
        kv = to_wire(torch.randn(3, PIECE_TOKENS, 2, 16))

        def append(segment_id: str) -> mpb.AppendKVResponse:
            request = mpb.AppendKVRequest(
                segment_id=segment_id, start_position=0, keys=kv, values=kv, home="home"
            )
            return stub.AppendKV(request, timeout=30)

        first = append("a")
        with pytest.raises(grpc.RpcError) as refused:
            append("b")
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "lending limits" in refused.value.details()
        assert client.lookup(first.chunk_namespace, first.chunk_keys).prefix_length == len(first.chunk_keys)
        assert lending(channel).held_bytes == 2 * len(kv.data)  # "a" alone: its K and V

        stub.ReleaseKV(mpb.ReleaseKVRequest(segment_id="a"), timeout=10)
        # Released, "a"'s chunks are replaced as "b"'s arrive; under load the daemon can still
        # be moving some of them at the first put ("... in progress"), refused as a home would
        # see it: it tries again (one CI-like run at load 10-11 did).
        second = _append_when_room(append, "b", "the released segment's room")
        assert client.lookup(first.chunk_namespace, first.chunk_keys).prefix_length == 0

        started["lender"].kill9()  # "b" stays in the daemon, pinned until its lease lapses
        started["lender"].start()
        grpc.channel_ready_future(channel).result(timeout=30)
        _append_when_room(append, "c", "a newer loan replacing the dead worker's chunks")
        assert client.lookup(second.chunk_namespace, second.chunk_keys).prefix_length < len(second.chunk_keys)


def _append_when_room(
    append: Callable[[str], mpb.AppendKVResponse], segment_id: str, what: str
) -> mpb.AppendKVResponse:
    """`segment_id` appended once the lender's daemon takes it: a loan refused for room
    (RESOURCE_EXHAUSTED) is tried again, for up to a minute."""
    answers: list[mpb.AppendKVResponse] = []

    def appended() -> bool:
        try:
            answers.append(append(segment_id))
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            return False
        return True

    poll(appended, what, timeout_seconds=60)
    return answers[0]
