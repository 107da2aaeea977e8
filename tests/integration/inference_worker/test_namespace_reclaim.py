"""A worker and a real daemon whose namespace table is full (issue 26, point 1): the
daemon forgets an idle, empty namespace to make room, and the worker registers it again
before using it (it re-registers a namespace it has not used for a while), so the
tenant's next turn finds its namespace known instead of failing every call with
"unknown namespace" forever; a namespace the daemon refuses is named in the turn's stats."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from running_daemon import running_daemon

from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.model_store import LoadedModel
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource, SamplingParams, TurnInput, TurnStats
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024
IDLE_SECONDS = 0.2


@pytest.fixture
def one_namespace_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon that keeps one namespace, reclaimable after IDLE_SECONDS unused and empty."""
    settings = {"MAX_NAMESPACES": 1, "NAMESPACE_IDLE_SECONDS": IDLE_SECONDS}
    with running_daemon(tmp_path, dram_bytes=64 * MiB, ssd_bytes=64 * MiB, settings=settings) as process:
        yield process


async def known(client: AsyncKVStoreClient, source: KVSource) -> bool:
    try:
        await client.lookup(source.namespace, [bytes(32)])
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND and "unknown namespace" in (exc.details() or "")
        return False
    return True


async def test_a_namespace_the_daemon_reclaimed_is_registered_again_before_its_next_use(
    tiny_model: LoadedModel, one_namespace_daemon: DaemonProcess
) -> None:
    async with AsyncKVStoreClient(one_namespace_daemon.address) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=16))
        engine.namespaces.reregister_idle_seconds = IDLE_SECONDS  # the worker's 60 s, scaled down
        first = await engine.namespace_for(b"tenant-a")
        await asyncio.sleep(IDLE_SECONDS + 0.1)
        second = await engine.namespace_for(b"tenant-b")  # the daemon forgets tenant-a's namespace
        assert first.namespace != second.namespace
        assert (await known(client, first), await known(client, second)) == (False, True)

        await asyncio.sleep(IDLE_SECONDS + 0.1)
        assert await engine.namespaces.ensure_registered(first)  # tenant-a comes back
        assert (await known(client, first), await known(client, second)) == (True, False)
        assert (await client.stats()).namespaces_reclaimed == 2


async def turn_stats(engine: TurnEngine, source: KVSource) -> TurnStats:
    turn = TurnInput(prompt_token_ids=list(range(40)), sampling=SamplingParams(max_tokens=4))
    events = [event async for event in engine.run_turn(turn, source)]
    assert isinstance(events[-1], TurnStats)
    await engine.drain_saves()
    return events[-1]


async def test_a_refused_namespace_is_named_in_the_turns_stats(
    tiny_model: LoadedModel, one_namespace_daemon: DaemonProcess
) -> None:
    async with AsyncKVStoreClient(one_namespace_daemon.address) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=16))
        holder = await engine.namespace_for(b"tenant-a")
        stats = await turn_stats(engine, holder)  # its chunks keep the only slot taken
        assert stats.saved_chunks > 0 and stats.namespace_refused == ""

        refused = await engine.namespace_for(b"tenant-b")
        stats = await turn_stats(engine, refused)
        assert "maximum of 1 namespaces (max_namespaces)" in stats.namespace_refused
        assert stats.reused_tokens == 0
        assert (await client.stats()).namespaces_refused_table_full >= 1
