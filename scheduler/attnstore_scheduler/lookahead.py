"""Look-ahead planning (AttentionStore's scheduler-aware caching), pure and synchronous.

Walking the queue's predicted order per node, the KV bytes of the jobs add up; a job is in
  - the prefetch window while the running total fits in the node's DRAM budget
    (AttentionStore: DRAM capacity / KV bytes per session): PREFETCH, so the daemon loads
    its chunks from SSD into DRAM before the job runs and keeps them there;
  - the eviction window while it fits in DRAM + SSD: PROTECT, so the daemon keeps its
    chunks stored and evicts chunks no hint mentions first;
  - beyond both: EVICT_FIRST. Those jobs run after the whole store's worth of KV has been
    served, so their KV could not stay until then anyway; giving it up first leaves the
    room to the jobs that run sooner (AttentionStore evicts what lies outside the window).
The queue position of every hint counts that node's jobs from 0 (runs next); the daemon
evicts protected chunks needed last first. A chunk shared by several jobs (a common
prefix) is counted and hinted once, at its earliest job. Jobs without a node (no
affinity yet) or without stored chunks produce no hints.

Jobs already running are left out: the daemon's read leases keep their KV while workers
load it, and hinting it afterwards would hold it in DRAM at the expense of the next jobs'
prefetches (on the Mooncake replay of `make bench-hitrate`, 86% of lookahead's hits came
from DRAM with the running jobs at the head of the window, 94% without them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from attnstore.kvstore_client import HintAction
from attnstore_scheduler.job_queue import QueuedJob

# Room left for the chunks running jobs write and for the daemon's watermarks (it demotes
# above 95% DRAM fill, down to 85%).
DEFAULT_DRAM_BUDGET_FRACTION = 0.8
DEFAULT_SSD_BUDGET_FRACTION = 0.9


@dataclass(frozen=True)
class NodeCapacity:
    """What one node's daemon can hold (from its Stats)."""

    dram_bytes: int
    ssd_bytes: int


class HintEntry(NamedTuple):
    """One entry of a Hint call; a tuple, as AsyncKVStoreClient.hint takes it."""

    keys: tuple[bytes, ...]
    action: HintAction
    queue_position: int
    next_use_seconds: float = 0.0  # PREDICT only: seconds to the predicted use (session_activity.py)


@dataclass
class NodePlan:
    """The hints for one node's daemon and the window sizes they came from."""

    hints: dict[bytes, list[HintEntry]] = field(default_factory=dict)  # by namespace
    prefetch_jobs: int = 0  # jobs in the prefetch window
    protect_jobs: int = 0  # jobs in the eviction window beyond the prefetch window
    evict_first_jobs: int = 0  # jobs beyond the eviction window

    @property
    def hinted_keys(self) -> int:
        return sum(len(entry.keys) for entries in self.hints.values() for entry in entries)


def plan_hints(
    order: Iterable[QueuedJob],
    capacities: Mapping[str, NodeCapacity],
    *,
    dram_budget_fraction: float = DEFAULT_DRAM_BUDGET_FRACTION,
    ssd_budget_fraction: float = DEFAULT_SSD_BUDGET_FRACTION,
) -> dict[str, NodePlan]:
    """The hints for every node in `capacities`, from `order` (next to run first). A node
    with no hinted job gets an empty plan, so a pusher replaces its earlier window with
    nothing."""
    plans = {node: NodePlan() for node in capacities}
    totals = dict.fromkeys(capacities, 0.0)  # KV bytes of the window so far, per node
    seen: dict[str, set[bytes]] = {node: set() for node in capacities}
    for job in order:
        if job.node not in plans or not job.chunk_keys:
            continue
        plan, capacity = plans[job.node], capacities[job.node]
        new_keys = tuple(key for key in job.chunk_keys if key not in seen[job.node])
        seen[job.node].update(new_keys)
        position = plan.prefetch_jobs + plan.protect_jobs + plan.evict_first_jobs
        totals[job.node] += job.kv_bytes * len(new_keys) / len(job.chunk_keys)
        if totals[job.node] <= capacity.dram_bytes * dram_budget_fraction:
            action = HintAction.PREFETCH
            plan.prefetch_jobs += 1
        elif (
            totals[job.node]
            <= capacity.dram_bytes * dram_budget_fraction + capacity.ssd_bytes * ssd_budget_fraction
        ):
            action = HintAction.PROTECT
            plan.protect_jobs += 1
        else:
            action = HintAction.EVICT_FIRST
            plan.evict_first_jobs += 1
        if new_keys:
            plan.hints.setdefault(job.namespace, []).append(HintEntry(new_keys, action, position))
    return plans
