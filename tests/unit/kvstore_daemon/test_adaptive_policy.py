"""The SSD tier's online choice between the predictive order and LRU: where the predictive
order is wrong (it learned another workload) it must do about as well as LRU, where it is
right (the scheduler's predictions are) it must keep most of what it gains."""

from __future__ import annotations

import random
from collections.abc import Callable

from fake_clock import FakeClock

from kvstore_daemon.adaptive_policy import AdaptivePolicy
from kvstore_daemon.chunk_lives import HINT_CLASSES, REUSE_CLASSES, ChunkLives
from kvstore_daemon.eviction import EvictionPolicy, make_tier_policies
from kvstore_daemon.hints import HintAction, HintBook, HintSpec
from kvstore_daemon.hit_density import HitDensity
from kvstore_daemon.predictive_policy import PredictivePolicy

NS = b"n" * 16
CAPACITY = 40
PUSH_EVERY = 20  # requests between two full prediction pushes

Stream = list[bytes]
NEVER = 10**6


def _cyclic(keys: int = 60, rounds: int = 40) -> Stream:
    """A loop over more keys than fit: LRU evicts each key just before it comes back, MIN
    keeps most of a store's worth."""
    return [f"c{i}".encode() for _ in range(rounds) for i in range(keys)]


def _recent(requests: int = 2400, seed: int = 1) -> Stream:
    """Mostly re-reads of keys used lately, the rest new keys: recency is what predicts."""
    rng, stream, fresh = random.Random(seed), [], 0
    for _ in range(requests):
        if stream and rng.random() < 0.7:
            back = int(rng.expovariate(4 / CAPACITY)) % min(len(stream), 4 * CAPACITY)
            stream.append(stream[-1 - back])
        else:
            stream.append(f"r{fresh}".encode())
            fresh += 1
    return stream


def _next_uses(stream: Stream) -> list[int]:
    """For each request, the index of the same key's next request (NEVER if none)."""
    after, next_at = [NEVER] * len(stream), {}
    for index in range(len(stream) - 1, -1, -1):
        after[index] = next_at.get(stream[index], NEVER)
        next_at[stream[index]] = index
    return after


def _right(stream: Stream) -> Callable[[int], int]:
    after = _next_uses(stream)
    return lambda last: after[last]


def _tier(name: str, rate: float = 0.45, learner: HitDensity | None = None) -> tuple[EvictionPolicy, HintBook, FakeClock]:
    """The SSD's instance of a policy (the store's last tier); `learner`: what the
    predictive order learned before."""
    hints, clock = HintBook(), FakeClock()
    if learner is None:
        return make_tier_policies(name, hints, clock, rate)[1], hints, clock
    predictive = PredictivePolicy(hints, clock, ChunkLives(clock, learner))
    return (AdaptivePolicy(predictive, rate) if rate else predictive), hints, clock


def _hits(stream: Stream, tier: tuple[EvictionPolicy, HintBook, FakeClock],
          predict: Callable[[int], int] | None = None) -> int:
    """Hits of a tier of CAPACITY keys, one request per simulated second, the scheduler's
    predictions of every resident key pushed every PUSH_EVERY requests."""
    policy, hints, clock = tier
    last_use: dict[bytes, int] = {}
    hits = 0
    for index, key in enumerate(stream):
        clock.now = float(index)
        if predict is not None and index % PUSH_EVERY == 0:
            hints.apply(NS, [HintSpec([k], HintAction.PREDICT, 0, predict(last_use[k]) - index)
                             for k in last_use if k in policy], replace=True, ttl_seconds=NEVER, now=index)
        if key in policy:
            hits += 1
            policy.on_access(key)
        else:
            while len(policy) >= CAPACITY:
                policy.on_remove(next(policy.victims()))
            policy.on_insert(key)
        last_use[key] = index
    return hits


def _read_late_only(age_ticks: int = 2000, times: int = 20000) -> HitDensity:
    """A learner that saw every chunk read again at `age_ticks` and never sooner (another
    workload: counts halve only every DEFAULT_HALF_LIFE_EVENTS ends, so it holds a while)."""
    learner = HitDensity(REUSE_CLASSES * HINT_CLASSES)
    for cls in range(REUSE_CLASSES * HINT_CLASSES):
        for _ in range(times // (REUSE_CLASSES * HINT_CLASSES)):
            learner.hit(cls, age_ticks)
    return learner


def test_a_predictive_order_gone_wrong_costs_little_against_lru() -> None:
    """The workload changed: what the predictive order learned (reads come late) now keeps
    old keys and evicts the fresh ones a recency-driven stream reads."""
    stream = _recent()
    lru = _hits(stream, _tier("lru"))
    predictive = _hits(stream, _tier("predictive", rate=0, learner=_read_late_only()))
    adaptive = _hits(stream, _tier("predictive", learner=_read_late_only()))
    assert predictive < 0.85 * lru  # the order does mislead
    assert adaptive >= 0.95 * lru


def test_right_predictions_keep_most_of_their_gain_over_lru() -> None:
    stream = _cyclic()
    lru = _hits(stream, _tier("lru"))
    predictive = _hits(stream, _tier("predictive", rate=0), _right(stream))
    adaptive = _hits(stream, _tier("predictive"), _right(stream))
    assert predictive > lru + 0.3 * len(stream)  # a loop larger than the store: LRU hits nothing
    assert adaptive - lru >= 0.8 * (predictive - lru)


def test_the_order_whose_victim_is_stored_again_loses_weight() -> None:
    hints, clock = HintBook(), FakeClock()
    _, policy = make_tier_policies("predictive", hints, clock, 0.45)
    assert isinstance(policy, AdaptivePolicy)
    for clock.now, key in enumerate([b"far", b"soon"]):
        policy.on_insert(key)
    policy.on_access(b"far")  # LRU's victim: soon; the predictive order's: far
    hints.apply(NS, [HintSpec([b"far"], HintAction.PREDICT, 0, 1000.0), HintSpec([b"soon"], HintAction.PREDICT, 0, 1.0)],
                replace=True, ttl_seconds=60, now=clock.now)
    before = policy.weight
    victim = next(policy.victims())
    policy.on_remove(victim)
    policy.on_insert(victim)  # needed again: the order that chose it was wrong
    assert (policy.weight < before) if victim == b"far" else (policy.weight > before)
