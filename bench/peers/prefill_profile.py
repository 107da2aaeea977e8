"""In-process profile of the prefill behind bench-peers' TTFT: one forward pass of the paged
engine (real SmolLM2-135M-Instruct, fp32, CPU) over `new` tokens after `prefix` tokens already
in the pool, at 1 and 2 torch threads taken in turns: wall and process CPU time, the FLOP rate
each reaches, the busiest thread's CPU time (what two threads would take on idle cores, the
wake-ups aside: readable under other load) and the master's (the calling thread: it alone runs
the Python between parallel regions); with `--attention torch kernel`, the prefill's
attention through torch's SDPA and through the C prefill kernel (prefill_kernel.py) taken in
turns too, and their logits compared; with `--layer-blocks on off`, a layer's blocks around
attention in one C call each (layer_blocks.py, from 3 to 32 new tokens) and a call per op, in
turns likewise (the second path's names end in `-calls`); with `--ops`, after those, each
path's forward at two threads with its ops timed (op_split.py): per op its calls, the master's
CPU and the other threads' meanwhile, and the master's CPU outside the ops (the Python between
them, the embedding, lm_head's row; the timing's own reads taken out).
`python -m bench.peers.prefill_profile [--shapes 0x642 800x250 ...] [--ops]`.

Why: the serving comparison's later turns are mostly this forward (the worker's CPU from
Chat to first token is within ~10% of it), and its FLOP rate can be set beside vLLM's,
derived from the same turns' TTFT in bench/results/peers.json (`docs/inference-worker.md`,
"Prefill pass"). Run it on an idle machine: under other load only the CPU times mean anything.
OpenMP waits as the worker's does (`OMP_WAIT_POLICY`, PASSIVE unless set); run it once more
with `OMP_WAIT_POLICY=ACTIVE` to see what sleeping between parallel regions costs.
Prints a table and a JSON line; writes no results file (it is a diagnosis, not a suite).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

from bench.peers.op_split import OpSplit, OpTotals

if TYPE_CHECKING:  # torch loads in `main`, after OpenMP's waiting is set (importing this sets nothing)
    import torch
    from torch import nn

    from inference_worker.engine.model_runner import Batch, PagedModelRunner
    from inference_worker.model_geometry import ModelGeometry

# (prefix, new) of bench-peers' turns: a fresh first turn, and later turns of the fits phase
DEFAULT_SHAPES = ("0x642", "800x250", "1250x480")
BLOCK_TOKENS = 16
ATTENTION = ("torch", "kernel")  # the prefill's attention: SDPA (chunk_attention.py), the C kernel
LAYER_BLOCKS = ("on", "off")  # a layer's blocks in one C call each (layer_blocks.py), a call per op


@dataclass(frozen=True)
class Shape:
    prefix: int  # tokens whose KV is already in the pool
    new: int  # tokens the forward computes

    @classmethod
    def parse(cls, text: str) -> Shape:
        prefix, new = (int(part) for part in text.split("x"))
        if prefix < 0 or new < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: want PREFIXxNEW, NEW >= 1")
        return cls(prefix, new)


def prefill_flops(geometry: ModelGeometry, layer_weights: int, head_weights: int, shape: Shape) -> float:
    """Multiply-adds x 2 of the forward: every layer linear for each new token, the LM head
    for the last one, and attention (QK^T and PV) of each new token over the prefix and the
    new tokens before it (causal)."""
    linears = 2 * shape.new * layer_weights + 2 * head_weights
    keys_seen = shape.new * shape.prefix + shape.new * (shape.new + 1) / 2
    attention = 4 * geometry.num_layers * geometry.heads * geometry.head_dim * keys_seen
    return linears + attention


def _weights(modules: list[nn.Module]) -> int:
    from torch import nn

    return sum(m.weight.numel() for layer in modules for m in layer.modules() if isinstance(m, nn.Linear))


def _thread_cpu() -> dict[int, float]:
    """CPU seconds of each of this process's threads (10 ms ticks)."""
    return {thread.id: thread.user_time + thread.system_time for thread in psutil.Process().threads()}


def _forward(
    runner: PagedModelRunner, ids: list[int], shape: Shape, threads: int
) -> tuple[float, float, float, float, torch.Tensor]:
    """(wall, process CPU, the busiest thread's CPU, the master's CPU, logits) of the forward
    over the shape's new tokens, its prefix computed first. OpenMP's threads wait passively (no spinning), so
    a thread's CPU is its work: the busiest one's is what the pass takes on idle cores, less
    the wake-ups, even when other load stretches the wall time."""
    batch = _prepared(runner, ids, shape, threads)
    before, cpu, wall = _thread_cpu(), time.process_time(), time.perf_counter()
    logits = runner.forward(batch)
    wall, cpu, after = time.perf_counter() - wall, time.process_time() - cpu, _thread_cpu()
    spent = {thread: seconds - before.get(thread, 0.0) for thread, seconds in after.items()}
    return wall, cpu, max(spent.values()), spent[threading.get_native_id()], logits


def _prepared(runner: PagedModelRunner, ids: list[int], shape: Shape, threads: int) -> Batch:
    """The batch of the shape's new tokens, its prefix computed into the pool first."""
    import torch

    from inference_worker.engine.block_pool import BlockPool
    from inference_worker.engine.model_runner import Work
    from inference_worker.engine.sequence import Sequence

    torch.set_num_threads(threads)
    seq, pool = Sequence.of(ids), BlockPool(runner.kv.k.shape[2], BLOCK_TOKENS)
    pool.allocate(seq)
    if shape.prefix:
        runner.forward(runner.prepare([Work(seq, shape.prefix)]))
        pool.commit(seq, shape.prefix)
    return runner.prepare([Work(seq, shape.new)])


def _op_split(runner: PagedModelRunner, ids: list[int], shape: Shape, rounds: int) -> dict[str, object]:
    """Per op of the forward at two threads, means over `rounds` forwards (ms of CPU): its
    calls, the master's CPU inside them, the other threads' meanwhile; the whole forward's,
    and the master's outside the ops."""
    from inference_worker import cpu_linear
    from inference_worker.engine import model_runner, prefill_kernel, row_kernels

    ops = {
        "forward": (model_runner.PagedModelRunner, "forward"),
        "rms_norm": (row_kernels.RowKernels, "rms_norm"),
        "rope_into_pool": (row_kernels.RowKernels, "rope_into_pool"),
        "silu_mul": (row_kernels.RowKernels, "silu_mul"),
        "gemm q/k/v, gate/up": (cpu_linear.FusedProjection, "__call__"),
        "gemm + residual o, down": (cpu_linear.OneDnnLinear, "plus"),
        "paged_attention (torch paths)": (model_runner, "paged_attention"),
        "prefill kernel": (prefill_kernel.PagedPrefillKernel, "__call__"),
    }
    split = OpSplit()
    for _ in range(rounds):
        batch = _prepared(runner, ids, shape, 2)  # the prefix's forward not timed
        with split.installed(ops):
            runner.forward(batch)
    totals = {label: split.totals.get(label, OpTotals()) for label in ops}
    per_forward = {
        label: {
            "calls": t.calls // rounds,
            "master_ms": round(t.master_ns / rounds / 1e6, 1),
            "other_ms": round(t.other_ns / rounds / 1e6, 1),
        }
        for label, t in totals.items()
    }
    inside = sum(t.master_ns + t.read_ns for label, t in totals.items() if label != "forward")
    per_forward["outside the ops"] = {
        "master_ms": round((totals["forward"].master_ns - inside) / rounds / 1e6, 1)
    }
    return per_forward


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", type=Shape.parse, nargs="+", default=[Shape.parse(s) for s in DEFAULT_SHAPES]
    )
    parser.add_argument("--rounds", type=int, default=5, help="forwards per thread count, taken in turns")
    for flag, paths, default, what in (
        ("--attention", ATTENTION, "kernel", "the prefill attention paths"),
        (
            "--layer-blocks",
            LAYER_BLOCKS,
            "on",
            "a layer's blocks in one C call each (on) or a call per op (off)",
        ),
    ):
        parser.add_argument(
            flag,
            nargs="+",
            choices=paths,
            default=[default],
            help=f"{what}, taken in turns (default: {default})",
        )
    parser.add_argument(
        "--ops", action="store_true", help="then each path's ops at two threads: who runs them"
    )
    args = parser.parse_args(argv)
    if "torch" in sys.modules:
        raise SystemExit("run it as its own process (python -m bench.peers.prefill_profile): torch is loaded")
    importlib.import_module("inference_worker.openmp_waiting")  # before torch loads libgomp, as the worker
    import torch

    from inference_worker.engine.attention import PagedKV
    from inference_worker.engine.model_runner import PagedModelRunner
    from inference_worker.model_geometry import ModelGeometry
    from inference_worker.model_store import default_model_dir, load_model

    load_before = os.getloadavg()
    model = load_model(default_model_dir(), torch.float32, "cpu").model
    geometry = ModelGeometry.of(model.config)
    layer_weights, head_weights = _weights(list(model.model.layers)), model.lm_head.weight.numel()
    most = max(s.prefix + s.new for s in args.shapes)
    kv = PagedKV(geometry, -(-most // BLOCK_TOKENS), BLOCK_TOKENS, torch.float32, torch.device("cpu"))
    runners = {
        name + ("" if blocks == "on" else "-calls"): PagedModelRunner(
            model, kv, prefill_kernel=name == "kernel", layer_blocks=blocks == "on"
        )
        for name in args.attention
        for blocks in args.layer_blocks
    }
    generator = torch.Generator().manual_seed(0)
    rows = []
    for shape in args.shapes:
        ids = torch.randint(0, geometry.vocab_size, (shape.prefix + shape.new,), generator=generator).tolist()
        logits = {name: _forward(runner, ids, shape, 2)[4] for name, runner in runners.items()}  # warm-up
        runs: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {
            (name, threads): [] for name in runners for threads in (1, 2)
        }
        for _ in range(args.rounds):
            for (name, threads), times in runs.items():
                times.append(_forward(runners[name], ids, shape, threads)[:4])
        gflop = prefill_flops(geometry, layer_weights, head_weights, shape) / 1e9
        row: dict[str, object] = {"prefix": shape.prefix, "new": shape.new, "gflop": round(gflop, 1)}
        for (name, threads), times in runs.items():
            wall = statistics.median(w for w, *_ in times)
            row[f"wall_ms_{name}_{threads}t"] = round(wall * 1e3, 1)
            row[f"cpu_ms_{name}_{threads}t"] = round(statistics.median(t[1] for t in times) * 1e3, 1)
            row[f"busiest_thread_cpu_ms_{name}_{threads}t"] = round(
                statistics.median(t[2] for t in times) * 1e3
            )
            row[f"master_thread_cpu_ms_{name}_{threads}t"] = round(
                statistics.median(t[3] for t in times) * 1e3
            )
            row[f"gflops_{name}_{threads}t"] = round(gflop / wall, 1)
        if args.ops:
            for name, runner in runners.items():
                row[f"ops_{name}"] = _op_split(runner, ids, shape, args.rounds)
        if len(logits) == 2:  # the two paths' last-token logits, and greedy tokens
            first, second = logits.values()
            row["max_logit_diff"] = float((first - second).abs().max())
            row["same_greedy"] = bool((first.argmax(-1) == second.argmax(-1)).all())
        rows.append(row)
        print(" | ".join(f"{key} {value}" for key, value in row.items()), flush=True)
    summary = {
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "loadavg_1_5_15min": {"before": load_before, "after": os.getloadavg()},
        "rows": rows,
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
