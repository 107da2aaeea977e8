"""The restore planner: which layers of a prefix come back by recomputation, by projecting
stored hidden states, or by loading stored KV, so that reading and computing finish
together (HCache's bubble-free schedule).

The model of a restore over `n` tokens and L layers, one IO channel and one compute stream:

    compute  recompute layers 0..r-1 (no reads needed) | project HIDDEN layer r, r+1, ...
    IO                 read HIDDEN layer r | r+1 | ... | read KV layers ... L-1

Hidden states are projected chunk by chunk (restore/loader.py): a layer's projection starts
once its first chunk is read and the previous computation is done, and ends no earlier
than one chunk's projection after its last chunk is read (both rates steady); the restore
ends when both channels are idle. `restore_seconds` plays that out layer by layer
(exact for this model, O(L)); the planners search the layer counts (O(L) per request,
O(L^2) for a storage plan), so "never slower than KV loading or full recomputation" holds
by construction: both are candidates whenever they are possible.

A mix of methods is chosen only when it beats the best single-method plan by `margin`
(modelled): a mix's time rests on the overlap of IO and compute, the part of the model most
sensitive to cost errors, and on a busy machine the measured costs swing by 2x (bench-restore:
a mix modelled 4% faster than KV loading took 3.5x as long after the disk's read rate jumped
between two runs). A single method's time is one cost, measured directly.

Costs come from the profiler (profiler.py), per token per layer, IO per tier.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from inference_worker.restore.storage_plan import StoragePlan

MIX_MARGIN = 0.05  # how much faster (modelled) a mix must be than the best single method
# A mix must also stay no slower than the best single method with all compute this many
# times dearer, and with the projection this many times cheaper: a shared machine's
# projection cost moves 1.3-2x within minutes either way. A mix balanced on one cost runs
# compute-bound at a dearer one (bench-restore, costs the median of the run's restores:
# planned at 36 us, a 1 GB/s mix projected at 45 us and took 1.23x KV loading's time) and
# IO-bound at a cheaper one, where it reads more than hidden states alone (a 0.1 GB/s
# `r0h11k1` took 1.08x hidden-only's time). 1.5, not 2: at 2 the 1k history's 0.1 GB/s mix
# would give up a fifth of its modelled gain (1.60x -> 1.41x KV loading) for swings above
# the 1.25x that run showed.
COMPUTE_SWING = 1.5
Candidate = TypeVar("Candidate")


@dataclass(frozen=True)
class TierCosts:
    """Reading one token's share of one layer from a tier."""

    kv_seconds: float  # its K and V
    hidden_seconds: float  # its input hidden states

    @classmethod
    def from_bandwidth(cls, bytes_per_second: float, kv_bytes: int, hidden_bytes: int) -> TierCosts:
        """`kv_bytes`, `hidden_bytes`: one token's K+V and hidden states of one layer."""
        return cls(kv_bytes / bytes_per_second, hidden_bytes / bytes_per_second)


@dataclass(frozen=True)
class RestoreCosts:
    project_seconds: float  # K and V of one token of one layer from its hidden states
    recompute_seconds: float  # one layer over one more token: the linear part
    recompute_pair_seconds: float  # ... the attention part, per (query, key) pair
    tiers: Mapping[str, TierCosts]

    def compute_scaled(self, factor: float) -> RestoreCosts:
        """These costs with all compute (projection and recomputation) `factor` times dearer."""
        return dataclasses.replace(
            self,
            project_seconds=self.project_seconds * factor,
            recompute_seconds=self.recompute_seconds * factor,
            recompute_pair_seconds=self.recompute_pair_seconds * factor,
        )

    def recompute_layer_seconds(self, tokens: int) -> float:
        """One layer over a causal prefix of `tokens` tokens."""
        return self.recompute_seconds * tokens + self.recompute_pair_seconds * tokens * (tokens + 1) / 2


@dataclass(frozen=True)
class RestorePlan:
    recompute_layers: int
    hidden_layers: int
    kv_layers: int
    estimated_seconds: float
    swung_seconds: tuple[float, ...] = ()  # estimated with compute dearer, projection cheaper (_swings)

    @classmethod
    def of(
        cls,
        storage: StoragePlan,
        recompute: int,
        estimated_seconds: float = 0.0,
        swung_seconds: tuple[float, ...] = (),
    ) -> RestorePlan:
        """Under `storage`, recompute layers [0, recompute) (at least its NONE layers); the
        rest as stored."""
        if not storage.recompute_layers <= recompute <= storage.num_layers:
            raise ValueError(f"plan {storage.name} cannot recompute {recompute} layers")
        stored_end = storage.recompute_layers + storage.hidden_layers  # where the KV layers begin
        kv = storage.num_layers - max(recompute, stored_end)
        return cls(recompute, max(stored_end - recompute, 0), kv, estimated_seconds, swung_seconds)

    @property
    def name(self) -> str:
        """e.g. "r2h10k12"; what the turn's stats and the metrics report."""
        return f"r{self.recompute_layers}h{self.hidden_layers}k{self.kv_layers}"

    @property
    def method(self) -> str:
        """recompute, kv, hidden, or mix."""
        used = [
            m
            for m, n in (
                ("recompute", self.recompute_layers),
                ("hidden", self.hidden_layers),
                ("kv", self.kv_layers),
            )
            if n
        ]
        return used[0] if len(used) == 1 else "mix"


def restore_seconds(
    costs: RestoreCosts,
    tier: str,
    tokens: int,
    recompute: int,
    hidden: int,
    kv: int,
    chunk_tokens: int = 0,
) -> float:
    """The modelled time to restore `tokens` tokens: layers [0, recompute) recomputed, the
    next `hidden` projected from hidden states, the last `kv` loaded (module docstring);
    projections by chunks of `chunk_tokens` (0: a layer at a time)."""
    io = costs.tiers[tier]
    chunk = min(chunk_tokens or tokens, tokens)
    compute_done = recompute * costs.recompute_layer_seconds(tokens)
    read_done = 0.0
    for _ in range(hidden):
        first_chunk_read = read_done + io.hidden_seconds * chunk
        read_done += io.hidden_seconds * tokens
        compute_done = max(
            max(compute_done, first_chunk_read) + costs.project_seconds * tokens,
            read_done + costs.project_seconds * chunk,
        )
    read_done += kv * io.kv_seconds * tokens
    return max(read_done, compute_done)


def _robust(
    timed: Sequence[tuple[float, tuple[float, ...], str, Candidate]], margin: float
) -> list[tuple[float, Candidate]]:
    """Of (modelled seconds, seconds under each swing of the costs, method, candidate): the
    mixes that beat every single method by `margin` and, under each swing, are still no
    slower than every single method is then, if any; else the single methods (module
    docstring)."""
    singles = [(seconds, swung, c) for seconds, swung, method, c in timed if method != "mix"]
    best = min((seconds for seconds, _, _ in singles), default=float("inf"))
    best_swung = [min(swung) for swung in zip(*(swung for _, swung, _ in singles), strict=True)]
    mixes = [
        (seconds, c)
        for seconds, swung, method, c in timed
        if method == "mix"
        and seconds * (1 + margin) < best
        and all(s <= b for s, b in zip(swung, best_swung, strict=True))
    ]
    return mixes or [(seconds, c) for seconds, _, c in singles]


def _swings(costs: RestoreCosts, swing: float) -> list[RestoreCosts]:
    """The costs a mix must also hold up under: all compute `swing` times dearer; the
    projection `swing` times cheaper (recomputation kept: cheaper too, it would make full
    recomputation beat the recomputation + hidden-state mixes of a slow-IO tier, where the
    projection's cost does not decide)."""
    return [
        costs.compute_scaled(swing),
        dataclasses.replace(costs, project_seconds=costs.project_seconds / swing),
    ]


def plan_restore(
    costs: RestoreCosts,
    storage: StoragePlan,
    tier: str,
    tokens: int,
    *,
    margin: float = MIX_MARGIN,
    chunk_tokens: int = 0,
    compute_swing: float = COMPUTE_SWING,
) -> RestorePlan:
    """The fastest restore of `tokens` stored tokens (in chunks of `chunk_tokens`, 0: one)
    under `storage`: recompute its NONE layers and possibly more (their stored forms are
    then not read), the rest as stored; a mix only if `margin` faster than the best single
    method and no slower than it with its compute `compute_swing` times dearer or its
    projection that much cheaper."""
    timed = []
    variants = [costs, *_swings(costs, compute_swing)]
    for recompute in range(storage.recompute_layers, storage.num_layers + 1):
        plan = RestorePlan.of(storage, recompute)
        seconds, *swung = (
            restore_seconds(c, tier, tokens, recompute, plan.hidden_layers, plan.kv_layers, chunk_tokens)
            for c in variants
        )
        timed.append(
            (seconds, tuple(swung), plan.method, RestorePlan.of(storage, recompute, seconds, tuple(swung)))
        )
    candidates = _robust(timed, margin)
    return min(candidates, key=lambda c: c[0])[1]  # the first (least recomputation) of equals


def plan_storage(
    costs: RestoreCosts,
    num_layers: int,
    tier: str,
    tokens: int,
    *,
    hidden_allowed: bool,
    margin: float = MIX_MARGIN,
    chunk_tokens: int = 0,
    compute_swing: float = COMPUTE_SWING,
) -> StoragePlan:
    """The storage plan whose restore from `tier` of a `tokens`-token history is fastest
    (a mix only if `margin` faster than the best single method); of plans within 1% of it,
    the one that stores the fewest bytes (hidden states and nothing before KV).
    `hidden_allowed` False (hidden states not smaller than KV): no HIDDEN layers."""
    timed: list[tuple[float, tuple[float, ...], str, StoragePlan]] = []
    for recompute in range(num_layers + 1):
        for hidden in range(num_layers - recompute + 1 if hidden_allowed else 1):
            plan = StoragePlan(num_layers, recompute, hidden)
            restore = plan_restore(
                costs,
                plan,
                tier,
                tokens,
                margin=margin,
                chunk_tokens=chunk_tokens,
                compute_swing=compute_swing,
            )
            timed.append((restore.estimated_seconds, restore.swung_seconds, restore.method, plan))
    candidates = _robust(timed, margin)
    fastest = min(seconds for seconds, _ in candidates)
    near = [plan for seconds, plan in candidates if seconds <= fastest * 1.01]
    return min(near, key=lambda plan: (plan.kv_layers, plan.hidden_layers))
