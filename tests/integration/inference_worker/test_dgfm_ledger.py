"""DGFM from the pool's ledger (pool_debts.py, lender_notice.py): worker processes with a
ledger (a private Redis) publish what they hold per borrower, whole and with a TTL. A
segment appended for a borrower shows as that edge with the bytes DescribeLending
reports, goes when released, and stays after the lender is killed -9 only until its TTL.
Two workers running long turns at once, each lending to the other, form a 2-cycle that
is read from the ledger (not gathered from the workers) and swapped home, with the same
greedy tokens as plain forwards."""

from __future__ import annotations

from pathlib import Path

import grpc
import redis
import torch
from polling import poll
from running_workers import running_workers
from test_dgfm_workers import KV_BYTES_PER_TOKEN, lending, run_turns_at_once

from attnstore.pool_debts import read_debts
from attnstore.server.ports import free_port
from attnstore.worker.v1 import micro_attention_pb2 as mpb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.wire import to_wire
from inference_worker.model_store import LoadedModel

LENDER_TTL_SECONDS = 3.0  # renewed every second: a killed lender's edges last 2-3 s


def debts(redis_url: str) -> dict[tuple[str, str], int]:
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        return read_debts(client)


def test_a_lenders_debts_follow_what_it_holds_and_expire_when_it_is_killed(
    pool: tuple[str, Path], tiny_model: LoadedModel
) -> None:
    redis_url, root = pool
    address = f"127.0.0.1:{free_port()}"
    settings = {"listen_address": address,
                "long_context": {"advertise_address": address, "pool_redis_url": redis_url,
                                 "lender_ttl_seconds": LENDER_TTL_SECONDS}}  # fmt: skip
    kv = to_wire(torch.randn(3, 16, 2, 16))  # the tiny Llama's layers, 16 tokens
    with running_workers(root, tiny_model.model_dir, {"lender": settings}) as started:
        with grpc.insecure_channel(address) as channel:
            stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
            for segment, home in (("s1", "home-a:1"), ("s2", "home-a:1"), ("s3", "home-b:1")):
                request = mpb.AppendKVRequest(
                    segment_id=segment, start_position=0, keys=kv, values=kv, home=home
                )
                stub.AppendKV(request, timeout=30)
            held = {entry.home: entry.bytes for entry in lending(address).held_for}
            assert held == {"home-a:1": 2 * 16 * KV_BYTES_PER_TOKEN, "home-b:1": 16 * KV_BYTES_PER_TOKEN}
            poll(lambda: debts(redis_url) == {(home, address): size for home, size in held.items()},
                 "the lender's held_for in the ledger")  # fmt: skip
            stub.ReleaseKV(mpb.ReleaseKVRequest(segment_id="s3"), timeout=10)
            poll(
                lambda: debts(redis_url) == {("home-a:1", address): held["home-a:1"]}, "a released debt gone"
            )
        started["lender"].kill9()
        assert debts(redis_url) == {("home-a:1", address): held["home-a:1"]}  # until its TTL
        poll(
            lambda: debts(redis_url) == {}, "the killed lender's debts gone after its TTL", timeout_seconds=30
        )


def test_a_two_cycle_is_read_from_the_ledger_and_swapped_home(
    pool: tuple[str, Path], tiny_model: LoadedModel
) -> None:
    redis_url, root = pool
    swapped, workers = run_turns_at_once(
        2, root, tiny_model.model_dir, min_swap_bytes=KV_BYTES_PER_TOKEN, redis_url=redis_url
    )
    assert swapped, "the cycle of debts was never swapped home"
    swaps = [line for w in workers for line in w.log_path.read_text().splitlines() if "dgfm_swap" in line]
    assert swaps and all("graph=ledger" in line for line in swaps), swaps
    assert debts(redis_url) == {}  # stopped cleanly: withdrawn
