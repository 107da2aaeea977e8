"""A registered schema's module chunks stay in DRAM under eviction pressure while it is
registered (SchemaProtection through the hint pusher, to a real daemon on the lookahead
policy), and are evicted like any chunk once it is deleted; the Schemas service protects
what a worker's EncodeSchema reported and drops it at DeleteSchema."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hint_daemon import NS, MiB, Target, hint_store, session_keys, tiers
from test_hint_pusher import RecordingClient, chunk

from attnstore.kvstore_client import AsyncKVStoreClient, HintAction, Tier
from attnstore_scheduler.hint_pusher import HintPusher
from attnstore_scheduler.job_queue import JobQueue
from attnstore_scheduler.lookahead import NodeCapacity
from attnstore_scheduler.schema_protection import SchemaProtection
from attnstore_scheduler.settings import HintSettings

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
