"""Module KV read from the daemon is kept in the worker's memory (module_cache.py): the next
prompt is served from there (no read) with the answer of the encoding (both modules
re-positioned), only while the daemon still stores the module (an evicted one is encoded
again), never for another tenant; module_cache_bytes=0 reads every time."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import torch

from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.model_store import LoadedModel
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource, ModuleTurnInput, SamplingParams, TokenEvent, TurnStats
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(180)

CHUNK_TOKENS = 16
TIMEOUTS = {"module_read_timeout_seconds": 60.0, "layer_timeout_seconds": 60.0}  # loaded machines
SCHEMA = """<schema name="atlas">Atlas entries.
<module name="alps">The Alps stretch about 1,200 kilometres across eight countries; Mont Blanc
is their highest summit at 4,806 metres.</module>
<module name="andes">The Andes run along the western edge of South America for 7,000 kilometres.</module>
</schema>"""
PROMPT = '<prompt schema="atlas"><andes/><alps/> Which range is longer?</prompt>'  # both re-positioned


async def answer(engine: TurnEngine, source: KVSource) -> tuple[list[int], TurnStats]:
    events = [
        e
        async for e in engine.modules.run(
            ModuleTurnInput(SCHEMA, PROMPT, SamplingParams(max_tokens=10)), source
        )
    ]
    stats = events.pop()
    assert isinstance(stats, TurnStats)
    return [e.token_id for e in events if isinstance(e, TokenEvent)], stats


async def served_keys(engine: TurnEngine, source: KVSource) -> list[torch.Tensor]:
    """Each served module's layer-0 keys as the prompt is handed them (its reads finished)."""
    served = await engine.modules.server.serve(source, SCHEMA, PROMPT, 0)
    await engine.modules.server.store.drain()  # the reads end (and fill the cache)
    return [piece.module.kv[0][0] for piece in served.prompt.pieces]


@contextlib.asynccontextmanager
async def worker(
    model: LoadedModel, daemon: DaemonProcess, **settings: int
) -> AsyncIterator[tuple[AsyncKVStoreClient, TurnEngine, KVSource]]:
    """A turn engine on `daemon` (its client) and tenant-a's source."""
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS, **TIMEOUTS, **settings))
        yield client, engine, await engine.namespace_for(b"tenant-a")


async def test_a_module_read_once_is_served_from_memory_while_the_daemon_stores_it(
    tiny_model: LoadedModel, daemon: DaemonProcess
) -> None:
    async with worker(tiny_model, daemon) as (client, engine, source):
        encoded, stats = await answer(engine, source)
        assert stats.encoded_modules == 3
        await engine.modules.server.store.drain()
        read = await served_keys(engine, source)  # encodings do not fill the cache: read
        kept = await served_keys(engine, source)  # that read did: its very tensors, nothing read again
        assert all(a is b for a, b in zip(read, kept, strict=True))
        cached, stats = await answer(engine, source)
        assert cached == encoded and stats.encoded_modules == 0 and stats.reused_tokens == stats.module_tokens
        assert engine.modules.server.store.cache.used_bytes > 0

        keys = engine.modules.server.chunk_keys(source, SCHEMA)
        await client.delete(
            source.namespace, keys
        )  # evicted from the daemon: encoded, not served from memory
        again, stats = await answer(engine, source)
        assert again == encoded and stats.encoded_modules == 3
        await engine.modules.server.store.drain()

        other = await engine.namespace_for(b"tenant-b")  # another tenant never hits tenant-a's entries
        theirs, stats = await answer(engine, other)
        assert theirs == encoded and stats.encoded_modules == 3
        await engine.modules.server.store.drain()


async def test_without_a_cache_every_prompt_reads(tiny_model: LoadedModel, daemon: DaemonProcess) -> None:
    async with worker(tiny_model, daemon, module_cache_bytes=0) as (_, engine, source):
        first, _ = await answer(engine, source)
        await engine.modules.server.store.drain()
        first_read, second_read = await served_keys(engine, source), await served_keys(engine, source)
        assert all(a is not b and torch.equal(a, b) for a, b in zip(first_read, second_read, strict=True))
        read, stats = await answer(engine, source)
        assert (
            read == first and stats.encoded_modules == 0 and engine.modules.server.store.cache.used_bytes == 0
        )
