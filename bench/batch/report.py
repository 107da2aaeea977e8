"""What bench-batch prints and saves besides its summary: the serving table (per system and
concurrency: output tokens/s, turns/s, TTFT and inter-token latency p50/p99, and the
engine's mean sequences per forward pass from the worker's metrics), the memory
table, the issue's targets as PASS/FAIL lines, and the figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common.plot_style import PALETTE, plt, save_figure

ENGINE, BATCH1, VLLM = "attnstore", "attnstore batch-1", "vllm"
SYSTEMS = (ENGINE, BATCH1, VLLM)
TARGETS = {  # summary key: (at least / at most, target, what)
    "throughput_vs_batch1_at_16": (">=", 4.0, "output tokens/s at 16 sessions vs the batch-1 engine"),
    "throughput_vs_vllm_at_16": (">=", 0.8, "output tokens/s at 16 sessions vs vLLM CPU (prefix caching)"),
    "kv_waste_fraction": ("<=", 0.04, "pool slots allocated to live sequences that hold no token"),
    "shared_prefix_capacity_gain": (">=", 1.8, "sessions that fit one pool, shared system prompt vs not"),
}


def _cell(value: float | None, width: int, digits: int = 1) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def format_serving(cells: dict[str, dict[int, dict[str, Any]]]) -> str:
    header = (
        f"{'system':<18} {'sessions':>8} {'out tok/s':>9} {'turns/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>8} {'ITL p99':>8} {'batch':>6}   (ms; batch: sequences per forward)"
    )
    lines = [header, "-" * len(header)]
    for system, levels in cells.items():
        for level, c in sorted(levels.items()):
            lines.append(
                f"{system:<18} {level:>8} {_cell(c['output_tokens_per_s'], 9)} "
                f"{_cell(c['turns_per_s'], 7, 2)} {_cell(c['ttft_p50_ms'], 9, 0)} "
                f"{_cell(c['ttft_p99_ms'], 9, 0)} {_cell(c['itl_p50_ms'], 8, 0)} "
                f"{_cell(c['itl_p99_ms'], 8, 0)} {_cell(c.get('mean_batch_sequences'), 6)}"
            )
    return "\n".join(lines)


def format_memory(memory: dict[str, Any]) -> str:
    waste = (
        f"KV waste (in-process replay, {memory['waste_turns']} ShareGPT turns): mean "
        f"{memory['kv_waste_fraction']:.2%}, max {memory['kv_waste_fraction_max']:.2%} "
        f"over {memory['waste_steps']} steps"
    )
    capacity = (
        f"sessions in a {memory['capacity_pool_bytes'] / 2**20:.0f} MiB pool with a "
        f"{memory['system_prompt_tokens']}-token system prompt (median session "
        f"{memory['session_tokens_median']:.0f} tokens): {memory['sessions_fit_shared']} sharing it, "
        f"{memory['sessions_fit_unshared']} not ({memory['shared_prefix_capacity_gain']}x)"
    )
    lines = [waste, capacity]
    for name, sampling in memory["parallel_sampling"].items():
        saved = ", ".join(f"n={n}: {fraction:.1%}" for n, fraction in sampling["saved_fraction"].items())
        lines.append(
            f"parallel sampling KV saved, {name} (median prompt {sampling['prompt_tokens_median']:.0f}, "
            f"answer {sampling['answer_tokens_median']:.0f} tokens): {saved}"
        )
    return "\n".join(lines)


def met(key: str, value: float | None) -> bool | None:
    """Whether `value` meets the target of summary key `key`; None when it was not measured."""
    if value is None:
        return None
    sense, target, _ = TARGETS[key]
    return value >= target if sense == ">=" else value <= target


def verdicts(summary: dict[str, Any]) -> list[str]:
    lines = []
    for key, (sense, target, what) in TARGETS.items():
        value = summary.get(key)
        verdict = {True: "PASS", False: "FAIL", None: "UNAVAILABLE"}[met(key, value)]
        lines.append(f"{verdict:<4}  {key} = {value} (target {sense} {target}): {what}")
    return lines


def plot(cells: dict[str, dict[int, dict[str, Any]]], memory: dict[str, Any], title: str, out: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    for color, (system, levels) in zip(PALETTE, cells.items(), strict=False):
        xs = sorted(levels)
        axes[0].plot(
            xs, [levels[x]["output_tokens_per_s"] for x in xs], marker="o", color=color, label=system
        )
        axes[1].plot(
            xs, [levels[x]["ttft_p50_ms"] for x in xs], marker="o", color=color, label=f"{system} p50"
        )
        axes[1].plot(xs, [levels[x]["ttft_p99_ms"] for x in xs], marker="x", ls="--", color=color)
    for axis, label in ((axes[0], "output tokens/s"), (axes[1], "TTFT ms (p50 solid, p99 dashed)")):
        axis.set_xscale("log", base=2)
        levels = sorted({level for cells_ in cells.values() for level in cells_})
        axis.set_xticks(levels, [str(level) for level in levels])
        axis.set_xlabel("concurrent sessions")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    names = list(memory["parallel_sampling"])
    width = 0.8 / len(names)
    for index, name in enumerate(names):
        saved = memory["parallel_sampling"][name]["saved_fraction"]
        xs = [i + index * width for i in range(len(saved))]
        axes[2].bar(xs, [100 * v for v in saved.values()], width, label=name, color=PALETTE[index])
        axes[2].set_xticks(
            [i + width * (len(names) - 1) / 2 for i in range(len(saved))], [f"n={n}" for n in saved]
        )
    axes[2].set_ylabel("KV memory saved by sharing (%)")
    axes[2].legend(fontsize=8)
    axes[2].grid(alpha=0.3, axis="y")
    save_figure(fig, title, out)
