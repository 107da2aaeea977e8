"""One replay of a workload against a real daemon on a simulated clock.

Turns arrive into the scheduler's JobQueue; `slots` workers serve them, each for the
turn's service time. A turn that starts Lookups its prompt's chunk keys (promote=true,
as a worker's read would: SSD hits move to DRAM) and records the hit prefix and the tier
of each hit chunk; when it completes it stores the chunks it had to compute. With
`push_hints`, the HintPusher plans from the waiting queue and pushes to the daemon after
it changes, at most once per `hint_interval_s` of simulated time. The daemon never sees
the simulated clock: only the order of calls matters to its policies, and its prefetches
run beside the replay in real time (they finish within a few calls; holding the replay
until they had finished changed the DRAM share of hits by 0.1 point in a trial).

With an `activity` (the predictive policy) the pusher also predicts every live session's
next use. The replay tells it only what a scheduler would know at that simulated moment:
a turn arriving (its session: the workload's id, or for the Mooncake trace one inferred
from the keys seen so far, online_sessions.py), a turn ending with the chain it stored,
and an application's DeleteSession (ShareGPT with end signals). Nothing else of the
workload reaches it (tests/unit/bench/test_predictive_replay.py checks that its pushes up
to a moment do not depend on what comes after).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from attnstore.kvstore_client import AsyncKVStoreClient, Tier
from attnstore_scheduler.hint_pusher import HintPusher
from attnstore_scheduler.job_queue import JobQueue, QueuedJob
from attnstore_scheduler.lookahead import NodeCapacity
from attnstore_scheduler.session_activity import SessionActivity
from attnstore_scheduler.settings import HintSettings
from bench.hitrate.online_sessions import ChainSessions
from bench.hitrate.optimal import Event, Lookup, Offer, optimal_hits_by_prefix
from bench.hitrate.workloads import CHUNK_BYTES, Workload, encode

NODE = "node0"
WINDOW_S = 600.0  # the per-window report: hits and the optimum per 10 simulated minutes (warm and cold apart)


@dataclass
class ReplayResult:
    turns: int = 0
    lookup_blocks: int = 0  # prompt chunks looked up
    hit_blocks: int = 0  # of them, in the stored prefix
    dram_hit_blocks: int = 0  # of the hits, found in DRAM
    ideal_hit_blocks: int = 0  # hits of a store that never evicts (same schedule)
    optimal_hit_blocks: int = 0  # hits of the offline optimum at this capacity (same schedule, optimal.py)
    waited_hit_blocks: int = 0  # hits of turns that waited a hint interval or more in the queue
    waited_dram_hit_blocks: int = 0  # of them, found in DRAM
    # Of the other turns' hits, those a DRAM could have held had it known which idle
    # sessions come back and picked among them at equal odds (equal_odds_dram_hits); None
    # where the workload has no sessions to tell (the Mooncake trace).
    started_dram_bound_hit_blocks: float | None = None
    stored_chunks: int = 0  # chunks the turns computed and stored
    hint_pushes: int = 0
    prefetches_started: int = 0
    put_refused: int = 0  # chunks the daemon had no room for
    queue_length_sum: int = 0  # sampled at every turn start
    queue_length_max: int = 0
    wait_s_sum: float = 0.0
    sim_seconds: float = 0.0
    capacity_chunks: int = 0  # DRAM + SSD
    daemon: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0
    # Per WINDOW_S of simulated time, by the turn's arrival: the optimum's hits are the
    # difference of its hits on the schedule's prefixes up to each window's end.
    window_lookup_blocks: list[int] = field(default_factory=list)
    window_hit_blocks: list[int] = field(default_factory=list)
    window_optimal_hit_blocks: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, float | int]:
        turns = max(self.turns, 1)
        store_rate = self.stored_chunks / max(self.sim_seconds, 1e-9)  # chunks per simulated second
        return {
            "hit_rate": _ratio(self.hit_blocks, self.lookup_blocks),
            "dram_share_of_hits": _ratio(self.dram_hit_blocks, self.hit_blocks),
            "ideal_hit_rate": _ratio(self.ideal_hit_blocks, self.lookup_blocks),
            "optimal_hit_rate": _ratio(self.optimal_hit_blocks, self.lookup_blocks),
            "waited_dram_share_of_hits": _ratio(self.waited_dram_hit_blocks, self.waited_hit_blocks),
            "waited_share_of_hits": _ratio(self.waited_hit_blocks, self.hit_blocks),
            "started_dram_share_of_hits": _ratio(
                self.dram_hit_blocks - self.waited_dram_hit_blocks, self.hit_blocks - self.waited_hit_blocks
            ),
            "started_dram_share_bound": None
            if self.started_dram_bound_hit_blocks is None
            else _ratio(self.started_dram_bound_hit_blocks, self.hit_blocks - self.waited_hit_blocks),
            "turns": self.turns,
            "lookup_blocks": self.lookup_blocks,
            "hit_blocks": self.hit_blocks,
            "dram_hit_blocks": self.dram_hit_blocks,
            "stored_chunks": self.stored_chunks,
            "hint_pushes": self.hint_pushes,
            "prefetches_started": self.prefetches_started,
            "put_refused": self.put_refused,
            "mean_queue_length": round(self.queue_length_sum / turns, 2),
            "max_queue_length": self.queue_length_max,
            "mean_wait_s": round(self.wait_s_sum / turns, 2),
            # How long the store takes to fill with new chunks: reuse further apart is lost by any policy.
            "store_turnover_s": round(self.capacity_chunks / store_rate, 1) if store_rate else None,
            "sim_seconds": round(self.sim_seconds, 1),
            "wall_seconds": round(self.wall_seconds, 1),
            "windows": [
                {
                    "start_s": i * WINDOW_S,
                    "lookup_blocks": looked,
                    "hit_rate": _ratio(hit, looked),
                    "optimal_hit_rate": _ratio(optimal, looked),
                }
                for i, (looked, hit, optimal) in enumerate(
                    zip(
                        self.window_lookup_blocks,
                        self.window_hit_blocks,
                        self.window_optimal_hit_blocks,
                        strict=True,
                    )
                )
            ],
            **self.daemon,
        }


def _ratio(part: float, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def equal_odds_dram_hits(hits: int, dram_chunks: int, others_chunks: int) -> float:
    """The expected DRAM hits of a turn that arrives unannounced when each idle session
    that comes back is as likely as any other to be next (exponential think times of one
    mean, as ShareGPT's here): a DRAM of `dram_chunks` holding only those sessions' chains
    (`others_chunks` besides the arriving one's `hits`) holds that share of them, however
    it picks. An upper bound: it knows who comes back, and gives no room to anything else."""
    return hits * min(1.0, dram_chunks / max(others_chunks + hits, 1))


@dataclass(frozen=True)
class _Target:
    """The one daemon, as the scheduler's registry would describe it to the pusher."""

    node: str
    client: AsyncKVStoreClient
    capacity: NodeCapacity


class Replay:
    def __init__(
        self,
        workload: Workload,
        kv: AsyncKVStoreClient,
        capacity: NodeCapacity,
        *,
        slots: int,
        push_hints: bool,
        hint_interval_s: float,
        on_turn_done: Callable[[], object],
        activity: SessionActivity | None = None,
        predict_interval_s: float = HintSettings().predict_interval_seconds,
    ) -> None:
        self.workload = workload
        self.kv = kv
        self.slots = slots
        self.hint_interval_s = hint_interval_s
        self.queue = JobQueue(max_length=workload.turns + 1)
        target = _Target(NODE, kv, capacity)
        self.activity = activity
        settings = HintSettings(predict_interval_seconds=predict_interval_s)
        self.pusher = (
            HintPusher(
                self.queue,
                lambda: [target],
                settings,
                clock=lambda: self.now,
                activity=activity,
                source="bench",
            )
            if push_hints or activity
            else None
        )
        self._chains = ChainSessions()
        self.result = ReplayResult(
            capacity_chunks=(capacity.dram_bytes + capacity.ssd_bytes) // CHUNK_BYTES,
            started_dram_bound_hit_blocks=0.0 if workload.session_ids else None,
        )
        self._dram_chunks = capacity.dram_bytes // CHUNK_BYTES
        # Sessions between turns that will come back (the workload's future: for the bound
        # alone) -> the chunks of the chain their last turn stored; and their sum.
        self._coming_back: dict[int, int] = {}
        self._coming_back_chunks = 0
        self.now = 0.0  # simulated seconds
        self._on_turn_done = on_turn_done
        self._events: list[tuple[float, int, Callable[[], Awaitable[None]]]] = []
        self._order = itertools.count()
        self._turn_of: dict[
            str, tuple[int, int, str]
        ] = {}  # job id -> (session, turn, the scheduler's session id)
        self._running: dict[str, int] = {}  # job id -> its hit prefix
        self._stored: set[bytes] = set()  # every key ever stored: the never-evicting store
        self._schedule: list[Event] = []  # what the store saw, in order, for the offline optimum
        self._window_starts: list[int] = []  # the index in _schedule of each window's first lookup
        self._dirty = False  # the queue changed since the last push
        self._last_push = float("-inf")
        self.queue.add_listener(self._changed)

    async def run(self) -> ReplayResult:
        started = time.monotonic()
        for number, session in enumerate(self.workload.sessions):
            self._at(session.arrival_s, lambda n=number: self._arrive(n, 0))
        while self._events:
            self.now, _, action = heapq.heappop(self._events)
            await action()
            await self._dispatch()
            await self._maybe_push()
        stats = await self.kv.stats()
        self.result.daemon = {
            "promotions": stats.promotions,
            "demotions": stats.demotions,
            "dram_evictions": stats.dram.evictions,
            "ssd_evictions": stats.ssd.evictions,
        }
        self.result.sim_seconds = self.now
        prefix_optima = optimal_hits_by_prefix(
            self._schedule,
            self.result.capacity_chunks,
            [*self._window_starts[1:], len(self._schedule)],
            admit_on_lookup=False,
        )
        self.result.optimal_hit_blocks = prefix_optima[-1]
        if self._window_starts:  # none without a lookup
            self.result.window_optimal_hit_blocks = [
                b - a for a, b in itertools.pairwise([0, *prefix_optima])
            ]
        self.result.wall_seconds = time.monotonic() - started
        return self.result

    def _at(self, when: float, action: Callable[[], Awaitable[None]]) -> None:
        heapq.heappush(self._events, (when, next(self._order), action))

    def _changed(self) -> None:
        self._dirty = True

    async def _arrive(self, session: int, turn: int) -> None:
        spec = self.workload.sessions[session].turns[turn]
        keys = spec.keys[: spec.prompt_blocks]
        job_id = f"{session}/{turn}"
        self._coming_back_chunks -= self._coming_back.pop(session, 0)
        session_id = str(session) if self.workload.session_ids else self._chains.session_for(keys)
        self._turn_of[job_id] = (session, turn, session_id)
        if self.activity is not None:
            self.activity.turn_started(session_id, NODE, self.workload.namespace, self.now)
        self.queue.push(
            QueuedJob(
                job_id=job_id,
                tenant="bench",
                session_id=str(session),
                priority=0,
                chunk_keys=keys,
                namespace=self.workload.namespace,
                kv_bytes=len(keys) * CHUNK_BYTES,
                node=NODE,
                enqueued_at=self.now,
            )
        )

    async def _dispatch(self) -> None:
        while len(self._running) < self.slots and len(self.queue):
            self.result.queue_length_sum += len(self.queue)
            self.result.queue_length_max = max(self.result.queue_length_max, len(self.queue))
            job = await self.queue.pop()
            waited = self.now - job.enqueued_at
            self.result.wait_s_sum += waited
            self._running[job.job_id] = await self._lookup(
                job.chunk_keys, waited >= self.hint_interval_s, job.enqueued_at
            )
            session, turn, _ = self._turn_of[job.job_id]
            self._at(
                self.now + self.workload.sessions[session].turns[turn].service_s,
                lambda j=job.job_id: self._complete(j),
            )

    async def _lookup(self, keys: tuple[bytes, ...], waited: bool, arrived_s: float) -> int:
        result = self.result
        result.turns += 1
        if not keys:
            return 0
        # The window of the turn's arrival (the trace's minutes), never one already left: the
        # queue starts turns in arrival order, and the optimum's prefixes need windows in order.
        window = max(int(arrived_s // WINDOW_S), len(result.window_lookup_blocks) - 1)
        while len(result.window_lookup_blocks) <= window:
            result.window_lookup_blocks.append(0)
            result.window_hit_blocks.append(0)
            self._window_starts.append(len(self._schedule))
        self._schedule.append(Lookup(keys))
        found = await self.kv.lookup(self.workload.namespace, keys, promote=True)
        in_dram = sum(1 for tier in found.tiers if tier is Tier.DRAM)
        result.lookup_blocks += len(keys)
        result.hit_blocks += found.prefix_length
        result.window_lookup_blocks[window] += len(keys)
        result.window_hit_blocks[window] += found.prefix_length
        result.dram_hit_blocks += in_dram
        result.ideal_hit_blocks += next(
            (i for i, key in enumerate(keys) if key not in self._stored), len(keys)
        )
        if waited:
            result.waited_hit_blocks += found.prefix_length
            result.waited_dram_hit_blocks += in_dram
        elif result.started_dram_bound_hit_blocks is not None:
            result.started_dram_bound_hit_blocks += equal_odds_dram_hits(
                found.prefix_length, self._dram_chunks, self._coming_back_chunks
            )
        return found.prefix_length

    async def _complete(self, job_id: str) -> None:
        session, turn, session_id = self._turn_of.pop(job_id)
        turns = self.workload.sessions[session].turns
        computed = turns[turn].keys[self._running.pop(job_id) :]
        # The optimum may keep any chunk of the turn, whatever this policy hit: one schedule for all.
        self._schedule.append(Offer(tuple((key, depth) for depth, key in enumerate(turns[turn].keys))))
        namespace, tokens = self.workload.namespace, self.workload.chunk_tokens
        if computed:
            put = await self.kv.put_chunks(
                namespace, {key: encode(namespace, key, tokens) for key in computed}
            )
            self.result.put_refused += len(put.no_space)
            self.result.stored_chunks += len(computed)
            self._stored.update(computed)
        self._on_turn_done()
        if self.activity is not None:
            self.activity.turn_ended(session_id, turns[turn].keys, self.now)
            self._dirty = True
        if turn + 1 < len(turns):
            self._coming_back[session] = len(turns[turn].keys)
            self._coming_back_chunks += len(turns[turn].keys)
            self._at(self.now + turns[turn + 1].think_s, lambda: self._arrive(session, turn + 1))
        elif (end_s := self.workload.sessions[session].end_s) is not None and self.activity is not None:
            self._at(self.now + end_s, lambda: self._end(session_id))

    async def _end(self, session_id: str) -> None:
        """The application's DeleteSession."""
        assert self.activity is not None
        self.activity.ended(session_id, self.now)
        self._dirty = True

    async def _maybe_push(self) -> None:
        if self.pusher is None or not self._dirty or self.now < self._last_push + self.hint_interval_s:
            return
        if self._events and self._events[0][0] == self.now:
            return  # more happens at this instant: push once it has
        self._dirty, self._last_push = False, self.now
        report = await self.pusher.push()
        self.result.hint_pushes += 1
        self.result.prefetches_started += report.prefetches_started
