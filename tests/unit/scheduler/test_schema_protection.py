"""A registered schema's module chunks stay in DRAM under eviction pressure while it is
registered (SchemaProtection through the hint pusher, to a real daemon on the lookahead
policy), and are evicted like any chunk once it is deleted; the Schemas service protects
what a worker's EncodeSchema reported and drops it at DeleteSchema."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hint_daemon import NS, MiB, Target, hint_store, session_keys, tiers
from test_hint_pusher import NS2, RecordingClient, chunk

from attnstore.kvstore_client import AsyncKVStoreClient, HintAction, Tier
from attnstore.prompt_modules import DEFAULT_LIMITS
from attnstore_scheduler.hint_pusher import HintPusher
from attnstore_scheduler.job_queue import JobQueue
from attnstore_scheduler.lookahead import NodeCapacity
from attnstore_scheduler.schema_protection import SchemaProtection
from attnstore_scheduler.schema_store import EmbeddedSchemaStore
from attnstore_scheduler.schemas import Schemas
from attnstore_scheduler.settings import HintSettings
from attnstore_scheduler.worker_registry import WorkerRegistry

SCHEMA_SESSION = 0  # its four chunks stand in for one schema's module chunks


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[AsyncKVStoreClient]:
    async with hint_store(tmp_path, "lookahead") as kv:
        yield kv


async def fill(client: AsyncKVStoreClient, sessions: range) -> None:
    for session in sessions:
        await client.put_chunks(NS, {key: chunk(key) for key in session_keys(session)})


async def test_module_chunks_outlive_eviction_pressure_while_registered_and_go_after_delete(
    client: AsyncKVStoreClient,
) -> None:
    await fill(client, range(4))  # DRAM full (16 chunks); the schema's are the least recently used
    protection = SchemaProtection()
    pusher = HintPusher(
        JobQueue(8), lambda: [Target("up", client, NodeCapacity(MiB, 16 * MiB))], HintSettings(),
        protection=protection, source="s1",
    )  # fmt: skip
    protection.protect("t", "docs", "up", NS, session_keys(SCHEMA_SESSION))
    await pusher.push()

    await fill(client, range(4, 8))  # a whole DRAM of new chunks
    assert await tiers(client, SCHEMA_SESSION) == [Tier.DRAM] * 4
    assert await tiers(client, 1) == [Tier.SSD] * 4

    protection.drop("t", "docs")
    await pusher.push()  # replaces the namespace's schema hints with none
    await fill(client, range(8, 12))
    assert await tiers(client, SCHEMA_SESSION) == [Tier.SSD] * 4


async def test_schema_hints_are_pushed_on_change_and_at_every_refresh_under_their_own_source() -> None:
    now = [0.0]
    target = Target("up", RecordingClient(), NodeCapacity(MiB, 16 * MiB))
    protection = SchemaProtection()
    pusher = HintPusher(
        JobQueue(8), lambda: [target], HintSettings(refresh_seconds=5), clock=lambda: now[0],
        protection=protection, source="s1",
    )  # fmt: skip
    protection.protect("t", "docs", "up", NS, session_keys(1))
    protection.protect("t", "elsewhere", "down", NS, session_keys(2))  # another node's
    assert protection.changed
    await pusher.push()
    schema_calls = [a for a in target.client.actions if a]
    assert schema_calls == [dict.fromkeys(session_keys(1), HintAction.PROTECT)]
    assert not protection.changed

    target.client.actions.clear()
    now[0] += 1
    await pusher.push()  # nothing changed, before the refresh: the queue's window only
    assert not any(target.client.actions)
    now[0] += 5
    await pusher.push()  # the refresh: sent again before the daemon's hint TTL lets it lapse
    assert [a for a in target.client.actions if a] == [dict.fromkeys(session_keys(1), HintAction.PROTECT)]


async def test_delete_schema_drops_its_protection_and_only_its_own() -> None:
    protection = SchemaProtection()
    registry = WorkerRegistry(
        max_turns_per_worker=1, health_interval_seconds=1, health_timeout_seconds=1, daemon_timeout_seconds=5
    )
    schemas = Schemas(
        EmbeddedSchemaStore(), registry, DEFAULT_LIMITS, max_schemas_per_tenant=4, eager_encoding=False,
        encode_timeout_seconds=5, remember_node=lambda *_: None, protection=protection,
    )  # fmt: skip
    try:
        async for _ in schemas.register("t", '<schema name="desk"><module name="doc">text</module></schema>'):
            pass
        protection.protect("t", "desk", "up", NS, session_keys(1))
        protection.protect("other", "desk", "up", NS2, session_keys(2))
        protection.changed = False
        assert await schemas.delete("t", "desk")
        assert protection.changed and set(protection.hints("up")) == {NS2}
    finally:
        await registry.close()
