"""This worker listed as a lender in the pool's ledger (pool_lenders.py), so long turns'
homes find it without naming it in their peers (long_turn.py, ledger_room.py), with what it
holds for each of them (pool_debts.py: the debt graph DGFM reads, dgfm.py).

    started with the server (long_context.pool_redis_url and advertise_address set, and
    micro_attention.max_held_bytes above 0)
        ──> every third of lender_ttl_seconds: publish {address, its daemon's ledger id, node}
            and its held_for (bytes per borrower), both with that TTL
        ──> every half DGFM period between: its held_for again if it changed
        ──> at a clean stop: withdrawn at once; killed: forgotten when the TTL passes

Decisions:
- Renewed every third of the TTL, so two lost renewals in a row (Redis slow, the loop
  busy) do not drop a live lender.
- held_for is written whole (absolute bytes), not as increments: a killed lender's edges
  expire with it, and a lost write is mended by the next.
- A change is published within half a DGFM period (the pool's workers share it), so the
  round after a swap plans from what the swap left, not from the debts it paid.
- A renewal Redis does not answer is logged and retried at the next period: a lender is
  still reachable through the peers lists, and its homes through the TTL'd entry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import redis
import redis.asyncio as aioredis
import structlog

from attnstore.pool_debts import publish_debts, withdraw_debts
from attnstore.pool_lenders import publish_lender, withdraw_lender
from inference_worker.dist_attention.limits import MicroAttentionLimits
from inference_worker.dist_attention.long_settings import LongContextSettings
from inference_worker.dist_attention.servicer import MicroAttentionServicer

log = structlog.get_logger("dist_attention.lender_notice")


class LenderNotice:
    def __init__(
        self,
        redis_url: str,
        address: str,
        node: str,
        pool_daemon: Callable[[], Awaitable[str]],
        held_for: Callable[[], dict[str, int]],
        ttl_seconds: float,
        check_seconds: float,
    ) -> None:
        """`address`: this worker's MicroAttention as other workers reach it; `node`: the one
        it runs on; `pool_daemon`: the ledger id of the daemon it lends through ("" for
        none), asked at each renewal; `held_for`: bytes it holds per borrower, checked every
        `check_seconds` (at most a third of the TTL) and published when changed."""
        self._client = aioredis.Redis.from_url(redis_url, socket_timeout=ttl_seconds / 3)
        self._address = address
        self._pool_daemon = pool_daemon
        self._held_for = held_for
        self._ttl_seconds = ttl_seconds
        self._check_seconds = min(check_seconds, ttl_seconds / 3)
        self._node = node
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="lender_notice")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        renew_at, published = loop.time(), None
        while True:
            held_for = self._held_for()
            try:
                if loop.time() >= renew_at:
                    await publish_lender(self._client, self._address, await self._pool_daemon(), self._node,
                                         self._ttl_seconds)  # fmt: skip
                    renew_at, published = loop.time() + self._ttl_seconds / 3, None
                if held_for != published:
                    await publish_debts(self._client, self._address, held_for, self._ttl_seconds)
                    published = held_for
            except redis.RedisError as exc:
                log.warning("lender_notice_failed", error=str(exc))
            await asyncio.sleep(self._check_seconds)

    async def close(self) -> None:
        """Stops renewing and leaves the ledger (a clean stop: no home tries this worker after)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await withdraw_lender(self._client, self._address)
            await withdraw_debts(self._client, self._address)
        except redis.RedisError as exc:
            log.warning("lender_withdraw_failed", error=str(exc))
        await self._client.aclose()


def lender_notice(
    settings: LongContextSettings, limits: MicroAttentionLimits, lending: MicroAttentionServicer
) -> LenderNotice | None:
    """This worker's notice, started (on the running loop), when it lends through a ledger
    (pool_redis_url) under a name others reach it by (advertise_address); else None. A
    worker that lends nothing (max_held_bytes 0) is not listed: homes would ask it for room
    at every placement and get none."""
    if settings.pool_redis_url is None or not settings.advertise_address or limits.max_held_bytes == 0:
        return None
    notice = LenderNotice(
        settings.pool_redis_url, settings.advertise_address, settings.pool_node_name, lending.pool_daemon,
        lending.held_for, settings.lender_ttl_seconds, settings.dgfm.period_seconds / 2,
    )  # fmt: skip
    notice.start()
    return notice
