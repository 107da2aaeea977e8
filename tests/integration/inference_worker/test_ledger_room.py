"""Lenders of a long context chosen through the pool's ledger (ledger_room.py): each peer
worker reports the ledger id of the daemon it lends through (DescribeLending.pool_daemon,
from its daemon's Stats.pool_address), and the home caps that peer's room by what the
ledger (a private Redis, real daemons heartbeating into it) says the daemon may lend. A
lender whose daemon has no room in the ledger is never tried; a stale entry (its daemon
killed within the ledger's TTL) costs one refusal, then the next peer, logits within
1e-4 of the plain forward; once the TTL passes the ledger forgets it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from far_kv_checks import decode, lending, lent_bytes
from polling import poll
from running_daemon import MiB, running_daemon
from running_workers import running_workers
from test_attach_pool import NEW_TOKENS, PROMPT_TOKENS, REFUSES, lender_settings, long_context
from transformers import AutoModelForCausalLM, PreTrainedModel

from inference_worker.dist_attention.ledger_room import LedgerRoom
from inference_worker.dist_attention.remote import RemoteSegment, peer_channel
from inference_worker.model_store import LoadedModel
from kvstore_daemon.launcher import DaemonProcess

KV_BYTES_PER_TOKEN = 3 * 2 * 2 * 16 * 4  # the tiny Llama: layers x K,V x kv_heads x head_dim x fp32
WORKER_ROOM = {"full": 500, "open": 400}  # tokens each lender worker may hold: "full" first by its own room


def ledger_rooms(ledger: LedgerRoom, workers: dict[str, str]) -> dict[str, int]:
    """The home's room per lender worker address, as LongTurns.peer_room_tokens makes it."""
    room, daemons = {}, {}
    for name, address in workers.items():
        with peer_channel(address) as channel:
            daemons[address] = lending(channel).pool_daemon
        room[address] = WORKER_ROOM[name]
    return ledger.cap(room, daemons, KV_BYTES_PER_TOKEN)


def run_placed(model: PreTrainedModel, room: dict[str, int], seed: int) -> tuple[set[str], set[str]]:
    """A long context over `room`, decoded 2 steps (each within 1e-4); the peers it lost and
    the peers holding its segments."""
    context = long_context(model, room)
    prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(seed))
    decode(model, context, context.prefill(prompt.tolist(), NEW_TOKENS), steps=2)
    placed = {p.address for p in context.places if isinstance(p, RemoteSegment)}
    lost = set(context.lost)
    context.close()
    return lost, placed


@contextmanager
def two_lenders(
    pool: tuple[str, Path], tiny_model: LoadedModel, heartbeat_seconds: float, full_limits: dict[str, object]
) -> Iterator[tuple[DaemonProcess, dict[str, str]]]:
    """Lender workers "full" and "open", each on its own daemon in the ledger ("full"'s
    with `full_limits`): "full"'s daemon, and the workers' addresses once both daemons
    are in the ledger."""
    redis_url, root = pool
    ledger = {"pool_redis_url": redis_url, "pool_heartbeat_seconds": heartbeat_seconds}
    with (
        running_daemon(root / "a", dram_bytes=64 * MiB, ssd_bytes=64 * MiB, settings={**ledger, **full_limits}) as full,
        running_daemon(root / "b", dram_bytes=64 * MiB, ssd_bytes=64 * MiB, settings=ledger) as open_,
        running_workers(root, tiny_model.model_dir, {"full": lender_settings(full, attach=False),
                                                     "open": lender_settings(open_, attach=False)}) as started,
    ):  # fmt: skip
        for daemon in (full, open_):
            poll(lambda d=daemon: lent_bytes(redis_url, d) >= 0, "the daemon in the ledger")
        yield full, {name: started[name].address for name in WORKER_ROOM}


@pytest.fixture
def model(tiny_model: LoadedModel) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()


def test_a_lender_with_no_room_in_the_ledger_is_not_chosen(
    pool: tuple[str, Path], tiny_model: LoadedModel, model: PreTrainedModel
) -> None:
    with two_lenders(pool, tiny_model, 0.5, REFUSES) as (full_daemon, workers):
        with peer_channel(workers["full"]) as channel:
            assert lending(channel).pool_daemon == full_daemon.address
        assert ledger_rooms(LedgerRoom(None, timeout_seconds=10), workers) == {
            workers[n]: t for n, t in WORKER_ROOM.items()
        }

        ledger = LedgerRoom(pool[0], timeout_seconds=10)
        room = ledger_rooms(ledger, workers)
        assert room == {workers["full"]: 0, workers["open"]: WORKER_ROOM["open"]}
        lost, placed = run_placed(model, room, seed=21)
        assert lost == set() and placed == {workers["open"]}  # "full" never tried: no refusal
        ledger.close()


def test_a_stale_ledger_entry_costs_one_refusal_then_the_next_peer(
    pool: tuple[str, Path], tiny_model: LoadedModel, model: PreTrainedModel
) -> None:
    with two_lenders(pool, tiny_model, 5.0, {}) as (
        dying,
        workers,
    ):  # forgotten 15 s after its last heartbeat
        ledger = LedgerRoom(pool[0], timeout_seconds=10)
        assert ledger_rooms(ledger, workers) == {workers[n]: t for n, t in WORKER_ROOM.items()}

        dying.kill9()  # its ledger entry stays until its TTL: the home still sees its room
        room = ledger_rooms(ledger, workers)
        assert room[workers["full"]] == WORKER_ROOM["full"]
        lost, placed = run_placed(model, room, seed=22)
        assert lost == {workers["full"]} and placed == {workers["open"]}  # one refusal, then the next peer

        poll(lambda: ledger_rooms(ledger, workers)[workers["full"]] == 0, "the dead daemon forgotten by the ledger",
             timeout_seconds=60)  # fmt: skip
        ledger.close()
