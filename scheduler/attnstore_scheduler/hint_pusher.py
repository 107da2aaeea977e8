"""Pushes the look-ahead plan to every node's KV-store daemon as the queue changes.

Each push plans from the queue's predicted order (lookahead.plan_hints) and sends
every node, per namespace, `Hint(replace=true)` with
its whole window, so stale hints vanish with the next push (a namespace that drops out
of a node's window is sent an empty replace). Pushes are rate-limited: after one push
the next waits `min_interval_seconds`, and the changes in between coalesce into it.
Without changes a push still repeats every `refresh_seconds`, because the daemon lets
hints expire (its hint TTL) so that a silent scheduler stops steering eviction. Chunks
the scheduler releases (`release`: the one KV releaser, which Sessions is given) are
hinted EVICT_FIRST within the same pushes for `release_seconds`.

Every call names this replica as its `source`, so a replace forgets only this replica's
hints and several scheduler replicas can steer one daemon. With a `SessionActivity` (the
predictive policy) a push also sends, at most every `predict_interval_seconds`, the
predictions for every live session (PREDICT with seconds to its next use; DECLINE for
ended ones) under the source `<source>/predict`: a window of the whole population is
large (every live chain), so it is sent less often than the queue's, and as another
source the queue's replaces leave it alone. Between two, each push adds (no replace)
the predictions of the sessions that changed (a turn started or ended, an expectation, an
end), so a turn's fresh chunks are predicted at once. A queued job's hint beats a prediction of the
same key in the daemon (the most urgent hint wins). With a `SchemaProtection`, registered
schemas' module chunks are sent PROTECT under `<source>/schemas`, replaced whole when a
schema is registered or deleted and at least every refresh (schema_protection.py).

A daemon that cannot be reached is logged and counted, never raised: its hints are
retried by the next push, and every other node is still served.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import grpc
import structlog

from attnstore.kvstore_client import AsyncKVStoreClient, HintAction, HintResult
from attnstore_scheduler.job_queue import JobQueue
from attnstore_scheduler.lookahead import HintEntry, NodeCapacity, NodePlan, plan_hints
from attnstore_scheduler.schema_protection import SCHEMAS_SOURCE_SUFFIX, SchemaProtection
from attnstore_scheduler.session_activity import SessionActivity
from attnstore_scheduler.settings import HintSettings

log = structlog.get_logger("attnstore_scheduler.hints")

PREDICTION_SOURCE_SUFFIX = "/predict"

_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class HintClient(Protocol):
    """The part of AsyncKVStoreClient the pusher uses."""

    async def hint(
        self,
        namespace: bytes,
        entries: Sequence[tuple[Sequence[bytes], HintAction, int, float]],
        *,
        replace: bool = False,
        ttl_seconds: int = 0,
        source: str = "",
    ) -> HintResult: ...


class HintTarget(Protocol):
    """One node's daemon, as the scheduler's registry knows it."""

    @property
    def node(self) -> str: ...

    @property
    def client(self) -> HintClient: ...

    @property
    def capacity(self) -> NodeCapacity | None:
        """None until the daemon's capacities are known: the node gets no hints."""
        ...


async def capacity_from_stats(client: AsyncKVStoreClient) -> NodeCapacity:
    """A daemon's tier capacities, read from its Stats."""
    stats = await client.stats()
    return NodeCapacity(dram_bytes=stats.dram.capacity_bytes, ssd_bytes=stats.ssd.capacity_bytes)


@dataclass
class PushReport:
    nodes_pushed: list[str] = field(default_factory=list)
    nodes_failed: list[str] = field(default_factory=list)  # at least one Hint call failed
    hinted_keys: int = 0  # keys sent
    prefetches_started: int = 0  # SSD-to-DRAM promotions the daemons started


class HintPusher:
    def __init__(
        self,
        queue: JobQueue,
        targets: Callable[[], Iterable[HintTarget]],
        settings: HintSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        activity: SessionActivity | None = None,
        source: str = "",
        protection: SchemaProtection | None = None,
    ) -> None:
        """`targets()` is read at every push (the registry's live nodes); `activity`, when
        given, adds the predictions of every live session; `source` names this replica;
        `protection`, registered schemas' module chunks to keep PROTECT."""
        self._activity = activity
        self._protection = protection
        self._next_protection = float("-inf")
        self._source = source
        self._predict_interval = settings.predict_interval_seconds
        self._next_prediction = float("-inf")
        self._queue = queue
        self._targets = targets
        self._min_interval = settings.min_interval_seconds
        self._refresh = settings.refresh_seconds
        self._ttl = settings.ttl_seconds
        self._release_seconds = settings.release_seconds
        self._max_keys = settings.max_keys_per_call
        self._clock = clock
        self._changed = asyncio.Event()
        self._last_push = float("-inf")
        self._namespaces: dict[
            tuple[str, str], set[bytes]
        ] = {}  # per (node, source): namespaces it may hold hints of
        self._released: dict[tuple[str, bytes], dict[bytes, float]] = {}  # (node, namespace) -> key -> until
        self.pushes = 0
        self.failures: Counter[str] = Counter()  # failed Hint calls per node
        queue.add_listener(self.notify)
        if activity is not None:
            activity.add_listener(self.notify)
        if protection is not None:
            protection.add_listener(self.notify)

    def notify(self) -> None:
        """Something the plan depends on changed (the queue calls this itself)."""
        self._changed.set()

    def release(self, node: str, namespace: bytes, keys: Iterable[bytes]) -> None:
        """Chunks no session needs any more (deleted, expired, moved): the pushes to `node`
        hint them EVICT_FIRST for `release_seconds`. They ride along with the window because
        a hint sent on its own would be wiped by the next replace. A key that a queued job
        needs keeps that job's hint."""
        until = self._clock() + self._release_seconds
        self._released.setdefault((node, namespace), {}).update(dict.fromkeys(keys, until))
        self.notify()

    async def run(self) -> None:
        """Pushes on changes, rate-limited, and at least every refresh interval; until cancelled."""
        while True:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=self._refresh)
            except TimeoutError:
                pass  # nothing changed: refresh before the daemons' hints expire
            delay = self._last_push + self._min_interval - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            self._changed.clear()  # before planning: a change during the push triggers the next
            await self.push()

    async def push(self) -> PushReport:
        """Plans and pushes now, to every target with known capacities."""
        self._last_push = self._clock()
        self.pushes += 1
        targets = {t.node: t for t in self._targets() if t.capacity is not None}
        capacities = {node: t.capacity for node, t in targets.items() if t.capacity is not None}
        plans = plan_hints(self._queue.snapshot(), capacities)
        self._add_released(plans)
        batches = [(self._source, plans, True)]
        now = self._clock()
        if self._activity is not None and (now >= self._next_prediction or self._activity.changed):
            whole = now >= self._next_prediction
            if whole:
                self._next_prediction = now + self._predict_interval
            predicted = self._activity.predictions(now, changed_only=not whole)
            batches.append(
                (
                    self._source + PREDICTION_SOURCE_SUFFIX,
                    {
                        node: NodePlan(hints=predicted.get(node, {}))
                        for node in capacities
                        if whole or node in predicted
                    },
                    whole,
                )
            )
        if self._protection is not None and (self._protection.changed or now >= self._next_protection):
            self._protection.changed = False
            self._next_protection = now + self._refresh
            batches.append(
                (
                    self._source + SCHEMAS_SOURCE_SUFFIX,
                    {node: NodePlan(hints=self._protection.hints(node)) for node in capacities},
                    True,
                )
            )
        report = PushReport()
        for source, batch, replace in batches:
            outcomes = await asyncio.gather(
                *(self._push_node(targets[node], plan, source, replace) for node, plan in batch.items())
            )
            for node, (ok, started) in zip(batch, outcomes, strict=True):
                if source == self._source:
                    (report.nodes_pushed if ok else report.nodes_failed).append(node)
                elif not ok and node not in report.nodes_failed:
                    report.nodes_failed.append(node)
                report.hinted_keys += batch[node].hinted_keys if ok else 0
                report.prefetches_started += started
        return report

    def _add_released(self, plans: dict[str, NodePlan]) -> None:
        now = self._clock()
        for (node, namespace), keys in list(self._released.items()):
            live = {key: until for key, until in keys.items() if until > now}
            if not live:
                del self._released[node, namespace]
                continue
            self._released[node, namespace] = live
            if node not in plans:
                continue
            entries = plans[node].hints.setdefault(namespace, [])
            needed = {key for entry in entries for key in entry.keys}  # a queued job's hint wins
            if spare := tuple(key for key in live if key not in needed):
                entries.append(HintEntry(spare, HintAction.EVICT_FIRST, 0))

    async def _push_node(
        self, target: HintTarget, plan: NodePlan, source: str, replace: bool
    ) -> tuple[bool, int]:
        """Replaces `source`'s hints on the node namespace by namespace (or, not `replace`,
        adds to them); (all calls succeeded, prefetches started)."""
        ok, started = True, 0
        known = self._namespaces.get((target.node, source), set())
        stale = known - plan.hints.keys() if replace else set()
        namespaces = [*plan.hints, *sorted(stale)]
        failed: set[bytes] = set()
        for index, namespace in enumerate(namespaces):
            try:
                for call, entries in enumerate(split_entries(plan.hints.get(namespace, []), self._max_keys)):
                    result = await target.client.hint(
                        namespace,
                        entries,
                        replace=replace and call == 0,
                        ttl_seconds=self._ttl,
                        source=source,
                    )
                    started += result.prefetches_started
            except (grpc.aio.AioRpcError, TimeoutError, OSError) as exc:
                ok = False
                failed.add(namespace)
                self.failures[target.node] += 1
                code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
                log.warning(
                    "hint_push_failed",
                    node=target.node,
                    namespace=namespace.hex(),
                    error=code.name if code else type(exc).__name__,
                )
                if code is None or code in _UNREACHABLE:  # the daemon is down: skip its other namespaces
                    failed.update(namespaces[index + 1 :])
                    break
        # Failed ones are cleared next time; an addition only adds namespaces.
        self._namespaces[target.node, source] = set(plan.hints) | failed | (set() if replace else known)
        return ok, started


def split_entries(entries: Sequence[HintEntry], max_keys: int) -> list[list[HintEntry]]:
    """`entries` cut into calls of at most `max_keys` keys, in order; at least one call
    (an empty one replaces a namespace's hints with none)."""
    calls: list[list[HintEntry]] = [[]]
    room = max_keys
    for entry in entries:
        keys = entry.keys
        while keys:
            if room == 0:
                calls.append([])
                room = max_keys
            part, keys = keys[:room], keys[room:]
            calls[-1].append(entry._replace(keys=part))
            room -= len(part)
    return calls
