"""The restore planner's costs, measured at start on the worker's own model and device.

Compute: `project_kv` of one layer over `tokens` tokens gives the projection cost per
token; `recompute_layers` of one layer at two lengths gives the linear and the attention
(pairwise) parts of a layer's recomputation. IO: a tier's bandwidth (measured by timing a
real read of it, `measure_bandwidth`) turned into seconds per token per layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
from transformers import PreTrainedModel

from inference_worker.engine.model_runner import rotary_of
from inference_worker.model_geometry import ModelGeometry
from inference_worker.restore.hidden_states import project_kv, recompute_layers
from inference_worker.restore.planner import RestoreCosts, TierCosts


def _best_seconds(
    run: Callable[[], object], device: torch.device, repeats: int, warm_up: bool = True
) -> float:
    """The fastest of `repeats` timed runs after one warm-up (the least disturbed one)."""
    if warm_up:
        run()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return best


def profile_compute(
    model: PreTrainedModel, *, short_tokens: int = 256, long_tokens: int = 1024, repeats: int = 3
) -> tuple[float, float, float]:
    """(projection seconds per token per layer, recompute seconds per token per layer,
    recompute seconds per (query, key) pair per layer), measured on the model's device."""
    device = next(model.parameters()).device
    hidden_size = int(model.config.hidden_size)
    dtype = next(model.parameters()).dtype
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(model.config.vocab_size), (long_tokens,), generator=generator).to(device)
    positions = torch.arange(long_tokens, device=device)
    states = torch.randn(long_tokens, hidden_size, generator=generator).to(device=device, dtype=dtype)
    project = _best_seconds(lambda: project_kv(model, 0, states, positions), device, repeats) / long_tokens
    seconds = {
        n: _best_seconds(lambda n=n: recompute_layers(model, ids[:n], positions[:n], 1), device, repeats)
        for n in (short_tokens, long_tokens)
    }
    # t(n) = a n + b n (n + 1) / 2, solved from the two lengths; b >= 0, a >= 0 (noise)
    pairs = {n: n * (n + 1) / 2 for n in seconds}
    s, l = short_tokens, long_tokens
    pair = max((seconds[l] - seconds[s] * l / s) / (pairs[l] - pairs[s] * l / s), 0.0)
    linear = max((seconds[l] - pair * pairs[l]) / l, 0.0)
    return project, linear, pair


def projection_probe(model: PreTrainedModel, tokens: int) -> Callable[[], float]:
    """A probe of what a projection costs now: one `project_kv` of layer 0 over `tokens`
    tokens (inputs allocated once), seconds per token per layer; the restore policy calls
    it at plan time (policy.py)."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(tokens, int(model.config.hidden_size), generator=generator).to(
        device=device, dtype=dtype
    )
    positions = torch.arange(tokens, device=device)
    cos_sin = rotary_of(model.model, states, positions)

    def probe() -> float:
        return (
            _best_seconds(lambda: project_kv(model, 0, states, positions, cos_sin), device, 1, warm_up=False)
            / tokens
        )

    return probe


def measure_bandwidth(read: Callable[[], int], repeats: int = 3) -> float:
    """Bytes per second of `read` (which returns the bytes it read): the best of `repeats`."""
    best = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        moved = read()
        best = max(best, moved / max(time.perf_counter() - started, 1e-9))
    return best


def restore_costs(
    model: PreTrainedModel, tier_bytes_per_second: Mapping[str, float], element_bytes: int, **compute: int
) -> RestoreCosts:
    """The planner's costs: compute profiled on the model (`compute`: profile_compute's
    options), IO from each tier's bandwidth."""
    geometry = ModelGeometry.of(model.config)
    kv_bytes = 2 * geometry.kv_heads * geometry.head_dim * element_bytes
    hidden_bytes = int(model.config.hidden_size) * element_bytes
    project, linear, pair = profile_compute(model, **compute)
    tiers = {
        name: TierCosts.from_bandwidth(rate, kv_bytes, hidden_bytes)
        for name, rate in tier_bytes_per_second.items()
    }
    return RestoreCosts(project, linear, pair, tiers)
