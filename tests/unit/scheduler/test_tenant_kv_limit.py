"""The per-tenant KV limit: a turn that would take a tenant's sessions past
max_kv_bytes_per_tenant is refused with RESOURCE_EXHAUSTED; other tenants are not affected."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attnstore.errors import ResourceExhausted
from attnstore_scheduler.hint_pusher import HintPusher
from attnstore_scheduler.job_queue import JobQueue
from attnstore_scheduler.session_store import EmbeddedSessionStore
from attnstore_scheduler.sessions import Sessions
from attnstore_scheduler.settings import HintSettings
from attnstore_scheduler.worker_registry import WorkerRegistry

KV_BYTES_PER_TOKEN = 256


def sessions(limit: int | None) -> Sessions:
    registry = WorkerRegistry(
        max_turns_per_worker=1, health_interval_seconds=1, health_timeout_seconds=1, daemon_timeout_seconds=1
    )
    pusher = HintPusher(JobQueue(1), registry.hint_targets, HintSettings())
    return Sessions(
        EmbeddedSessionStore(1.0), registry, pusher, max_sessions_per_tenant=10, max_kv_bytes_per_tenant=limit
    )


async def test_a_turn_past_the_tenants_kv_limit_is_refused() -> None:
    limited = sessions(limit=1000 * KV_BYTES_PER_TOKEN)
    first = await limited.create("acme", "", 60)
    assert await limited.store.save(replace(first, token_ids=tuple(range(600))))
    second = await limited.create("acme", "", 60)

    await limited.check_kv_budget(second, 400, KV_BYTES_PER_TOKEN)  # 600 + 400: just fits
    with pytest.raises(ResourceExhausted, match=r"tenant 'acme' would hold 256256 bytes .* limit of 256000"):
        await limited.check_kv_budget(second, 401, KV_BYTES_PER_TOKEN)
    # The session's own history is not counted twice: growing the first one to 1000 fits.
    await limited.check_kv_budget(await limited.get("acme", first.session_id), 1000, KV_BYTES_PER_TOKEN)
    other = await limited.create("globex", "", 60)
    await limited.check_kv_budget(other, 1000, KV_BYTES_PER_TOKEN)

    await limited.delete("acme", first.session_id)  # deleting frees the budget
    await limited.check_kv_budget(second, 1000, KV_BYTES_PER_TOKEN)


async def test_no_limit_by_default() -> None:
    unlimited = sessions(limit=None)
    session = await unlimited.create("acme", "", 60)
    await unlimited.check_kv_budget(session, 10**9, KV_BYTES_PER_TOKEN)
