"""Lenders proposed by the pool's ledger (pool_lenders.py, lender_notice.py): a home worker
with no peers list, only the ledger (a private Redis, a real daemon heartbeating into it),
serves turns longer than its KV pool on the lender workers the ledger lists. Without a
lender it refuses (RESOURCE_EXHAUSTED); a lender started after it is found without
configuration and the turn's greedy tokens equal plain forwards of the whole sequence; a
lender killed -9 is still listed until its TTL but gets nothing placed (the turn goes to
the other lender, same tokens) and then drops out; one stopped cleanly leaves at once; one
that lends nothing (max_held_bytes 0) is never listed.
The home reports the configured maximum context to the scheduler and refuses past it.
On the ledger alone: lenders proposed on the home's host first, then by their daemons'
room, never the home itself, at most `count`; an entry past its TTL leaves the index."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
import redis.asyncio as aioredis
import torch
from far_kv_checks import lent_bytes
from polling import poll
from running_daemon import MiB, running_daemon
from running_workers import running_workers
from test_long_turns import greedy_turn, held_bytes
from transformers import AutoModelForCausalLM

from attnstore.pool_ledger import DaemonEntry, LendingLimits, PoolLedger
from attnstore.pool_lenders import publish_lender, read_lenders, withdraw_lender
from attnstore.server.ports import free_port
from attnstore.worker.v1 import worker_pb2 as pb
from attnstore.worker.v1 import worker_pb2_grpc
from inference_worker.dist_attention.ledger_room import LedgerRoom
from inference_worker.launcher import WorkerProcess
from inference_worker.model_store import LoadedModel
from kvstore_daemon.launcher import DaemonProcess

KV_BYTES_PER_TOKEN = 3 * 2 * 2 * 16 * 4  # the tiny Llama: layers x K,V x kv_heads x head_dim x fp32
POOL_TOKENS, MAX_CONTEXT_TOKENS, PROMPT_TOKENS, NEW_TOKENS = 64, 300, 200, 8
LENDER_TTL_SECONDS = 10.0  # renewed every 3.3 s: a lender killed stays listed for 6.7-10 s


def lender(daemon: DaemonProcess, redis_url: str) -> dict[str, object]:
    """A lender worker's settings: it lends through `daemon` and lists itself in the ledger."""
    address = f"127.0.0.1:{free_port()}"
    return {"listen_address": address, "kvstore_address": daemon.address, "chunk_tokens": 16,
            "micro_attention": {"max_held_bytes": 4 << 20},
            "long_context": {"advertise_address": address, "pool_redis_url": redis_url,
                             "lender_ttl_seconds": LENDER_TTL_SECONDS}}  # fmt: skip


def listed(redis_url: str) -> set[str]:
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        return {entry.address for entry in read_lenders(client)}


def plain_greedy(model_dir: Path, prompt: list[int]) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generated: list[int] = []
    with torch.no_grad():  # greedy by plain forwards over the whole sequence
        for _ in range(NEW_TOKENS):
            generated.append(int(model(input_ids=torch.tensor([prompt + generated])).logits[0, -1].argmax()))
    return generated


@pytest.fixture
def home(pool: tuple[str, Path], tiny_model: LoadedModel) -> Iterator[tuple[WorkerProcess, DaemonProcess]]:
    """The home worker (no peers list, the ledger only) and the daemon lenders lend through."""
    redis_url, root = pool
    settings = {"pool_redis_url": redis_url, "pool_heartbeat_seconds": 0.5}
    with running_daemon(root / "d", dram_bytes=64 * MiB, ssd_bytes=64 * MiB, settings=settings) as daemon:
        poll(lambda: lent_bytes(redis_url, daemon) >= 0, "the daemon in the ledger")
        long_context = {
            "pool_redis_url": redis_url,
            "max_context_tokens": MAX_CONTEXT_TOKENS,
            "segment_tokens": 40,
        }
        with running_workers(root, tiny_model.model_dir, {"home": {
            "kv_memory_bytes": POOL_TOKENS * KV_BYTES_PER_TOKEN, "long_context": long_context}}) as started:  # fmt: skip
            yield started["home"], daemon


def test_lenders_are_found_in_the_ledger_and_dropped_after_their_ttl(
    pool: tuple[str, Path], tiny_model: LoadedModel, home: tuple[WorkerProcess, DaemonProcess]
) -> None:
    (redis_url, root), (worker, daemon) = pool, home
    prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(31)).tolist()
    expected = plain_greedy(tiny_model.model_dir, prompt)
    with grpc.insecure_channel(worker.address) as channel:
        card = worker_pb2_grpc.WorkerStub(channel).DescribeModel(pb.DescribeModelRequest(), timeout=10)
    assert card.max_turn_context_tokens == MAX_CONTEXT_TOKENS  # what the scheduler admits up to

    with pytest.raises(grpc.RpcError) as refused:  # no lender listed yet
        greedy_turn(worker.address, prompt, NEW_TOKENS)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "peers have room for 0" in (refused.value.details() or "")

    with running_workers(root, tiny_model.model_dir, {"a": lender(daemon, redis_url)}) as first:
        a = first["a"].address
        poll(lambda: listed(redis_url) == {a}, "the new lender in the ledger")
        tokens, stats = greedy_turn(worker.address, prompt, NEW_TOKENS)
        assert tokens == expected and stats.generated_tokens == NEW_TOKENS
        assert held_bytes(a) == 0  # released

        lends_none = {**lender(daemon, redis_url), "micro_attention": {"max_held_bytes": 0}}
        workers = {"b": lender(daemon, redis_url), "none": lends_none}
        with running_workers(root, tiny_model.model_dir, workers) as second:
            b = second["b"].address
            poll(
                lambda: listed(redis_url) == {a, b}, "both lenders in the ledger"
            )  # never the one lending none
            first["a"].kill9()
            assert a in listed(redis_url)  # listed until its TTL: asked, silent, given nothing
            tokens, _ = greedy_turn(worker.address, prompt, NEW_TOKENS)
            assert tokens == expected
            poll(
                lambda: listed(redis_url) == {b},
                "the killed lender dropped after its TTL",
                timeout_seconds=60,
            )
            tokens, _ = greedy_turn(worker.address, prompt, NEW_TOKENS)
            assert tokens == expected and held_bytes(b) == 0
            second["b"].stop()
            assert listed(redis_url) == set()  # a clean stop leaves at once
    turns = [line for line in worker.log_path.read_text().splitlines() if "long_context_turn" in line]
    assert len(turns) == 3 and a in turns[0] and all(b in t and a not in t for t in turns[1:]), turns

    with pytest.raises(grpc.RpcError) as refused:  # past the maximum: refused by name
        greedy_turn(worker.address, list(range(MAX_CONTEXT_TOKENS - 5)), NEW_TOKENS)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "long_context.max_context_tokens" in (refused.value.details() or "")


def test_lenders_come_by_node_then_by_their_daemons_room(pool: tuple[str, Path]) -> None:
    redis_url, here = pool[0], "node-a"
    limits = LendingLimits(own_floor_fraction=0.0, max_lent_fraction=1.0, replace_borrowed=False)
    lenders = [
        ("far-big:1", "d-big", "elsewhere"),
        ("far-small:1", "d-small", "elsewhere"),
        ("near:1", "d-small", here),
        ("home:1", "d-big", here),
        ("outside:1", "", "elsewhere"),  # lends outside the ledger
        ("gone-daemon:1", "d-gone", "elsewhere"),  # its daemon not in the ledger: no room at cap
    ]

    async def publish(entries: list[tuple[str, str, str]], ttl_seconds: float) -> None:
        client = aioredis.Redis.from_url(redis_url)
        ledger = PoolLedger(client, heartbeat_ttl_seconds=60.0, limits=limits)
        for daemon, free_bytes in (("d-small", 1 * MiB), ("d-big", 8 * MiB)):
            await ledger.heartbeat(DaemonEntry(daemon, "n", daemon, daemon, 8 * MiB, free_bytes, 0))
        for address, daemon, node in entries:
            await publish_lender(client, address, daemon, node, ttl_seconds)
        await withdraw_lender(client, "withdrawn:1")  # never listed: a no-op
        await client.aclose()

    asyncio.run(publish(lenders, ttl_seconds=60.0))
    ledger = LedgerRoom(redis_url, timeout_seconds=10, node=here)
    ranked = ["near:1", "far-big:1", "far-small:1", "gone-daemon:1", "outside:1"]
    assert ledger.lenders("home:1", count=16) == ranked  # never itself; no room in the ledger: last
    assert ledger.lenders("home:1", count=2) == ranked[:2]
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        found = {lender.address: lender for lender in read_lenders(client)}
        assert found["far-big:1"].lendable_bytes == 8 * MiB and found["far-small:1"].lendable_bytes == 1 * MiB
        assert found["outside:1"].lendable_bytes is found["gone-daemon:1"].lendable_bytes is None

        asyncio.run(publish([("short:1", "d-big", "elsewhere")], ttl_seconds=0.5))
        poll(lambda: "short:1" not in ledger.lenders("home:1", count=16), "the entry past its TTL dropped")
        assert "short:1" not in client.smembers("attnstore:pool:lenders")  # gone from the index too
        assert ledger.lenders("home:1", count=16) == ranked
    ledger.close()
