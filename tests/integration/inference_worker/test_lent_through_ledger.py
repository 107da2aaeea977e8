"""Appended far segments lent through the lender node's daemon: the pool's ledger shows
every one of them, a lending limit refuses (the home goes to the next peer, then fails
with a clear UNAVAILABLE), and a home killed with -9 leaves nothing lent after the idle TTL.

The lender workers here do not advertise their daemons (no attaching): the home appends
its segments (AppendKV), the default, and each lender puts what it is appended as chunks
lent to the home in its own daemon (lent_chunks.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from far_kv_checks import decode, lending, lent_bytes, run_turn
from polling import poll
from running_daemon import MiB, running_daemon
from running_workers import running_workers
from transformers import AutoModelForCausalLM, PreTrainedModel

from attnstore.server.ports import free_port
from inference_worker.dist_attention.context import ContextUnavailable, LongContext
from inference_worker.dist_attention.remote import RemoteSegment, peer_channel
from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.launcher import WorkerProcess
from inference_worker.model_store import LoadedModel
from kvstore_daemon.launcher import DaemonProcess

PROMPT_TOKENS, NEW_TOKENS, LOCAL_TOKENS, SEGMENT_TOKENS, CHUNK_TOKENS = 150, 8, 48, 40, 16
KV_BYTES_PER_TOKEN = 3 * 2 * 2 * 16 * 4  # the tiny Llama: layers x K,V x kv_heads x head_dim x fp32
CHUNK_HEADER_BYTES = 4096  # a generous bound on one chunk's bytes beyond its K and V
REFUSES = {"pool_max_lent_fraction": 0.0}  # a daemon that lends nothing


def lender_settings(daemon: DaemonProcess, **limits: object) -> dict[str, object]:
    """A worker lending through `daemon` that does not advertise it (no attaching)."""
    address = f"127.0.0.1:{free_port()}"
    return {"listen_address": address, "kvstore_address": daemon.address, "chunk_tokens": CHUNK_TOKENS,
            "micro_attention": limits, "long_context": {"advertise_address": address}}  # fmt: skip


def long_context(model: PreTrainedModel, room: dict[str, int]) -> LongContext:
    """A sequence homed here over the peers of `room` (tokens each may hold), appending."""
    return LongContext(DistributedRunner(model), {address: peer_channel(address) for address in room},
                       lambda: room, local_tokens=LOCAL_TOKENS, segment_tokens=SEGMENT_TOKENS,
                       chunk_tokens=CHUNK_TOKENS, home="home")  # fmt: skip


def held(worker: WorkerProcess) -> int:
    return lending(peer_channel(worker.address)).held_bytes


def test_appended_segments_are_in_the_ledger_and_reattached_after_a_restart(
    pool: tuple[str, Path], tiny_model: LoadedModel
) -> None:
    redis_url, root = pool
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    ledger = {"pool_redis_url": redis_url, "pool_heartbeat_seconds": 0.5}
    with running_daemon(root, dram_bytes=64 * MiB, ssd_bytes=64 * MiB, settings=ledger) as daemon:
        poll(lambda: lent_bytes(redis_url, daemon) == 0, "the daemon in the ledger, lending nothing")
        with running_workers(root, tiny_model.model_dir, {"lender": lender_settings(daemon)}) as started:
            worker = started["lender"]
            context = long_context(model, {worker.address: 400})
            prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(11))
            logits = decode(model, context, context.prefill(prompt.tolist(), NEW_TOKENS), steps=2)
            remote = [p for p in context.places if isinstance(p, RemoteSegment)]
            assert len(remote) == 3 and all(p.attached is not None for p in remote)  # lent as chunks
            debt = sum(p.nbytes for p in remote)
            chunks = sum(len(p.attached.keys) for p in remote if p.attached is not None)
            channel = context.channels[worker.address]
            assert {(e.home, e.bytes) for e in lending(channel).held_for} == {("home", debt)}
            poll(lambda: debt < lent_bytes(redis_url, daemon) <= debt + chunks * CHUNK_HEADER_BYTES,
                 "every appended segment counted as lent in the ledger")  # fmt: skip

            worker.kill9()  # the lender restarts: its segments come back from its daemon
            worker.start()
            logits = decode(model, context, logits, steps=2)
            assert context.recomputations == 0 and context.lost == set()
            assert {(e.home, e.bytes) for e in lending(channel).held_for} == {("home", debt)}

            context.close()
            assert held(worker) == 0
            poll(lambda: lent_bytes(redis_url, daemon) == 0, "nothing lent once the segments are released")


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
                        {"full": lender_settings(refusing), "open": lender_settings(lending_daemon)}) as started,
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
                        {"lender": lender_settings(daemon, segment_idle_ttl_seconds=5.0)}) as lenders,
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
