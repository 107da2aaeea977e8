"""bench-batch's device row: the worker's engine alone (no servers) on one device, ShareGPT
sessions as token ids, at 1, 4, 16 and 32 concurrent sessions and at batch 1.

For a machine the whole bench cannot run on (a lent GPU: no vLLM, no Redis, no model
package there): here `--export FILE` writes the workload (the sessions' turn prompts, the
chat template applied by the real tokenizer) and the real model's config; there
`--workload FILE --device cuda` runs it on random weights of that config. Throughput does
not depend on the weights' values: no stop tokens, so every turn writes `max_tokens`. A
session's turns run in order, each prompt the history so far (the dataset's answers), so the
engine's pool serves the earlier turns' blocks as a worker's does between turns; every
level and the batch-1 engine get sessions of their own and a fresh engine.

    python -m bench.batch.device_row --export .gpu/batch-workload.json
    python -m bench.batch.device_row --workload .gpu/batch-workload.json --device cuda
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from bench.common.machine import machine_info
from bench.common.plot_style import PALETTE, finish_axes, plt, save_figure
from bench.common.results import RESULTS_DIR, print_report, save_results
from inference_worker.engine.engine import Engine
from inference_worker.engine.sequence import Sequence
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import default_model_dir
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import build_engine as build_worker_engine

AT = 16  # the level the ratio to batch 1 is read at (bench-batch's)
Sessions = list[list[list[int]]]  # session -> turn -> prompt token ids


def export(path: Path, levels: list[int], *, turns: int, seed: int, max_prompt_tokens: int) -> None:
    """The workload and the real model's config, into `path`."""
    from bench.batch.workload import consecutive_sets, token_conversations  # ShareGPT: not on the device

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    counts = [*levels, AT]  # the last: the batch-1 engine's sessions
    conversations = token_conversations(
        tokenizer,
        count=sum(counts),
        seed=seed,
        system_prompt=None,
        max_turns=turns,
        max_prompt_tokens=max_prompt_tokens,
        max_answer_tokens=0,
    )
    prompts = [[turn.prompt for turn in conversation.turns] for conversation in conversations]
    sets = consecutive_sets(prompts, counts)
    config = AutoConfig.from_pretrained(default_model_dir()).to_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"config": config, "levels": dict(zip(levels, sets, strict=False)), "batch1": sets[-1]})
    )


def build_engine(
    model: LlamaForCausalLM, device: torch.device, *, batch_sequences: int, kv_memory_bytes: int | None
) -> Engine:
    """An engine as the worker builds it (turn_engine.build_engine, its settings' defaults),
    at most `batch_sequences` sequences a forward pass, a pool of `kv_memory_bytes` (None:
    the worker's share of the free memory)."""
    settings = WorkerSettings(max_batch_sequences=batch_sequences, kv_memory_bytes=kv_memory_bytes)
    return build_worker_engine(model, torch.float32, device, ModelGeometry.of(model.config), settings)


async def serve(engine: Engine, sessions: Sessions, max_tokens: int) -> dict[str, float]:
    """All `sessions` at once, each its turns in order: output tokens, seconds, tokens/s."""

    async def session(turns: list[list[int]]) -> int:
        written = 0
        for prompt in turns:
            seq = Sequence.of(prompt, max_new_tokens=max_tokens)
            written += sum([output.token is not None async for output in engine.generate(seq)])
            engine.release(seq)
        return written

    started = time.perf_counter()
    try:
        tokens = sum(await asyncio.gather(*(session(turns) for turns in sessions)))
    finally:
        await engine.close()
    seconds = time.perf_counter() - started
    return {
        "sessions": len(sessions),
        "output_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
    }


async def run(
    workload: dict[str, Any], device: torch.device, max_tokens: int, kv_memory_bytes: int | None = None
) -> dict[str, dict[str, float]]:
    """Rows "engine@<level>" and "batch1@16" of `workload` (export's) on `device`."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig.from_dict(workload["config"])).to(device=device, dtype=torch.float32)
    model.eval()
    batched = WorkerSettings().max_batch_sequences

    def engine(batch_sequences: int) -> Engine:
        return build_engine(model, device, batch_sequences=batch_sequences, kv_memory_bytes=kv_memory_bytes)

    await serve(engine(batched), [[workload["batch1"][0][0]]], 4)  # kernels built, caches warm
    rows = {
        f"engine@{level}": await serve(engine(batched), sessions, max_tokens)
        for level, sessions in workload["levels"].items()
    }
    rows[f"batch1@{AT}"] = await serve(engine(1), workload["batch1"], max_tokens)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", type=Path, help="write the workload and model config here and stop")
    parser.add_argument("--workload", type=Path, help="a file --export wrote")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens of every turn")
    parser.add_argument(
        "--kv-memory-bytes",
        type=int,
        help="each engine's pool (default: the worker's share of the free memory)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default="batch-device", help="results' file name in bench/results")
    args = parser.parse_args(argv)
    if args.export is not None:
        export(
            args.export,
            args.levels,
            turns=args.turns,
            seed=args.seed,
            max_prompt_tokens=args.max_prompt_tokens,
        )
        return
    if args.workload is None:
        parser.error("give --export FILE or --workload FILE")
    device = torch.device(args.device)
    rows = asyncio.run(
        run(json.loads(args.workload.read_text()), device, args.max_tokens, args.kv_memory_bytes)
    )
    at, batch1 = rows.get(f"engine@{AT}"), rows[f"batch1@{AT}"]
    summary = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "tokens_per_s": {name: round(row["tokens_per_s"], 1) for name, row in rows.items()},
        "throughput_vs_batch1_at_16": round(at["tokens_per_s"] / batch1["tokens_per_s"], 2) if at else None,
    }
    machine = machine_info(RESULTS_DIR, packages=("torch",))
    save_results(args.results, {"config": vars(args), "machine": machine, "rows": rows, "summary": summary})
    table = "\n".join(
        f"{name:<12} {row['sessions']:>3} sessions {row['output_tokens']:>6} tokens {row['seconds']:>8.2f} s "
        f"{row['tokens_per_s']:>9.1f} tok/s"
        for name, row in rows.items()
    )
    _plot(rows, RESULTS_DIR / f"{args.results}.png", summary["device"])
    print_report(table, [], summary)


def _plot(rows: dict[str, dict[str, float]], path: Path, device: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(
        list(rows), [row["tokens_per_s"] for row in rows.values()], color=PALETTE[0], label="output tokens/s"
    )
    finish_axes(ax, "sessions at once (engine), and the batch-1 engine", "output tokens/s")
    save_figure(fig, f"the engine alone on {device}", path)


if __name__ == "__main__":
    main()
