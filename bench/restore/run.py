"""Restoring a history's KV from stored hidden states (HCache): recomputation, KV loading,
hidden states only and the planner's mix, on a multi-head-attention Llama of realistic width
(random weights: timing only), from the daemon's DRAM tier, from chunk files on disk (the
SSD tier's medium, page cache dropped) and from a throttled read path (<= 1 GB/s).

For each history length the history's KV and per-layer input hidden states are computed
once, stored under each storage plan (all KV; all hidden states; the planner's plan for
each tier) and restored into a `PrefixKV` (what the paged forward consumes) with
`restore_prefix`: the restore time is the wall time until every layer is ready, the median
of `--repeats` rounds, each round running the planner and the single methods that may be
the best (interleaved: the same spells of the machine; each round in another order, every
order in turn: samples.py; recomputation, which reads nothing, once per history, and a
single method far slower than the fastest on a tier once: `ROUNDS_WITHIN`). The disk tier
drops the chunks' pages before every sample of every method (tiers.py), and the run checks
that dropping them makes a read slower (`ssd_read_check`). The storage plan's costs come
from one KV and one hidden-state restore just before a tier's rounds (a tier's bandwidth
from its KV load, a projection from the compute thread's time, a layer's recomputation from
the full one): on a machine shared by several engineers, the worker's start-up profile
(profiler.py, recorded as `startup_profile`) taken minutes earlier was off by up to 5x.
Each planner restore plans as a worker does, planning time counted in the restore's (with
the worker's probe setting: restore/policy.py). Results: a table, bench/results/restore.json
(restore-partial.json after each history until the last) and the JSON summary as the last
line; the issue's targets as PASS/FAIL (exit code 0).
"""

from __future__ import annotations

import inference_worker.openmp_waiting  # noqa: F401  # isort: skip  -- before torch: measured as the worker runs

import argparse
import functools
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import uvloop
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore.shm_arena import arena_root
from bench.common.machine import machine_info
from bench.common.results import RESULTS_DIR, print_report, save_results, work_dir
from bench.restore.report import (
    THROTTLED_SPEEDUP_TARGET,
    Costs,
    Row,
    format_table,
    plot,
    summarize,
    throttled_tier,
)
from bench.restore.samples import median_sample, round_orders
from bench.restore.tiers import FileTier, ThrottledReads
from inference_worker.cpu_linear import use_onednn_linears
from inference_worker.layerwise_cache import PrefixKV
from inference_worker.model_geometry import ModelGeometry
from inference_worker.restore.codec import encode_restore_chunks
from inference_worker.restore.loader import RestoreStats, restore_prefix
from inference_worker.restore.planner import (
    RestoreCosts,
    RestorePlan,
    TierCosts,
    plan_restore,
    plan_storage,
    restore_seconds,
)
from inference_worker.restore.policy import RestorePolicy
from inference_worker.restore.profiler import profile_compute, projection_probe
from inference_worker.restore.settings import RestoreSettings
from inference_worker.restore.storage_plan import StoragePlan
from kvstore_daemon.launcher import DaemonProcess

WORK_DIR = work_dir("restore")
MiB = 1024 * 1024
ELEMENT_BYTES = 4  # fp32
PUT_BATCH = 4  # chunks per put
ROUNDS_WITHIN = 1.5  # a single method is in a tier's rounds if its probe took less than this x the fastest
Measured = tuple[float, int, RestoreStats]  # wall seconds, bytes read, the restore's stats
Run = Callable[[], Awaitable[Measured]]  # one restore, timed


def build_model(layers: int, hidden: int, device: str = "cpu") -> PreTrainedModel:
    """The benchmark's MHA Llama on `device`, with its linears on a CPU switched to oneDNN
    where it runs them, as the worker's model_store does (projections 1.12-1.17x faster
    than on torch's default linears: hidden_states.py)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 256 * 256,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        vocab_size=32000,
        max_position_embeddings=16384,
    )
    model = LlamaForCausalLM(config).to(device=device, dtype=torch.float32).eval()
    if model.device.type == "cpu":
        use_onednn_linears(model, torch.float32)
    return model


@torch.no_grad()
def history_state(model: PreTrainedModel, ids: torch.Tensor):
    """Per layer K, V [heads, tokens, D] and input hidden states [tokens, hidden] of `ids`."""
    cache = DynamicCache()
    out = model(input_ids=ids[None], cache=cache, use_cache=True, output_hidden_states=True)
    kv = [(layer.keys[0], layer.values[0]) for layer in cache.layers]
    return kv, [h[0] for h in out.hidden_states[: model.config.num_hidden_layers]]


class Bench:
    def __init__(
        self, model: PreTrainedModel, client: AsyncKVStoreClient, files: FileTier, args: argparse.Namespace
    ):
        self.model, self.client, self.files, self.args = model, client, files, args
        self.geometry = ModelGeometry.of(model.config)
        self.layers = self.geometry.num_layers
        self.hidden = int(model.config.hidden_size)
        self.reads = {
            "dram": client,
            "ssd": files,
            **{throttled_tier(gbps): ThrottledReads(client, gbps * 1e9) for gbps in args.throttled_gbps},
        }
        self.costs: Costs = {}  # per tier and history: measured per token and layer
        self.compute = ThreadPoolExecutor(1)
        self.stored: dict[str, tuple[bytes, list[bytes]]] = {}  # plan name -> namespace, keys
        worker = RestoreSettings()  # the planner's probe as a worker runs it
        self.probe = projection_probe(model, worker.probe_tokens) if worker.probe_tokens else None
        self.probe_max_age_seconds = worker.probe_max_age_seconds

    async def store(self, plan: StoragePlan, ids: list[int], kv, hidden) -> tuple[bytes, list[bytes]]:
        if plan.name in self.stored:
            return self.stored[plan.name]
        c = self.args.chunk_tokens
        namespace = NamespaceSpec(
            "bench-restore", "float32", c, storage_plan=plan.namespace_tag
        ).namespace_id()
        keys = chunk_key_chain(namespace, ids, c)
        await self.client.register_namespace(
            namespace,
            num_layers=self.layers,
            kv_heads=self.geometry.kv_heads,
            head_dim=self.geometry.head_dim,
            chunk_tokens=c,
            dtype="float32",
        )
        for start in range(0, len(keys), PUT_BATCH):
            batch = keys[start : start + PUT_BATCH]
            span = slice(start * c, (start + len(batch)) * c)
            chunks = encode_restore_chunks(
                namespace,
                batch,
                plan,
                self.geometry,
                [(k[:, span], v[:, span]) for k, v in kv],
                [h[span] for h in hidden],
                c,
                start * c,
            )
            await self.client.put_chunks(namespace, list(zip(batch, chunks, strict=True)))
            for key, chunk in zip(batch, chunks, strict=True):
                self.files.put(namespace, key, chunk)
        self.stored[plan.name] = (namespace, keys)
        return namespace, keys

    async def restore(self, tier: str, plan: StoragePlan, restore: RestorePlan, ids: list[int]) -> Measured:
        """Wall seconds of one restore until every layer is ready, the bytes it read, its stats."""
        namespace, keys = self.stored[plan.name]
        if tier == "ssd":
            self.files.drop_cache(namespace, keys)
        prefix = PrefixKV(self.layers, len(ids))
        started = time.perf_counter()
        stats = await restore_prefix(
            self.reads[tier],
            namespace,
            keys,
            prefix,
            model=self.model,
            storage=plan,  # type: ignore[arg-type]
            plan=restore,
            token_ids=ids,
            compute=self.compute,
        )
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()  # the last projections' kernels
        seconds = time.perf_counter() - started
        for layer in range(self.layers):
            prefix.wait_layer(layer, 0.0)  # raises if the restore failed
        return seconds, stats.bytes_read, stats

    async def planned(self, tier: str, policy: RestorePolicy, ids: list[int]) -> Measured:
        """One restore as a worker runs it: planned now (probe included in its time), then run."""
        started = time.perf_counter()
        chosen = policy.plan(tier, len(ids))
        planning = time.perf_counter() - started
        seconds, read, stats = await self.restore(tier, policy.storage, chosen, ids)
        return seconds + planning, read, stats

    async def rounds(self, runs: list[Run], repeats: int) -> list[list[Measured]]:
        """Every sample of `repeats` rounds of each run; each round runs them all, so a busy
        spell of the machine hits every method alike, in the orders of `round_orders`."""
        samples: list[list[Measured]] = [[] for _ in runs]
        for order in round_orders(len(runs), repeats):
            for index in order:
                samples[index].append(await runs[index]())
        return samples

    async def history(self, tokens: int) -> list[Row]:
        generator = torch.Generator().manual_seed(tokens)
        ids = torch.randint(0, int(self.model.config.vocab_size), (tokens,), generator=generator)
        kv, hidden = history_state(self.model, ids.to(self.model.device))
        token_ids = ids.tolist()
        all_kv, all_hidden = StoragePlan.all_kv(self.layers), StoragePlan(self.layers, 0, self.layers)
        for plan in (all_kv, all_hidden):
            await self.store(plan, token_ids, kv, hidden)
        rows: list[Row] = []

        def row(tier: str, method: str, plan: StoragePlan, samples: list[Measured]) -> Row:
            seconds, read, stats = median_sample(samples)
            per_token = (
                0
                if method == "recompute"
                else plan.bytes_per_token(self.geometry, self.hidden, ELEMENT_BYTES)
            )
            return {
                "tier": tier,
                "history_tokens": tokens,
                "method": method,
                "plan": stats.plan.name,
                "storage_plan": plan.name,
                "seconds": seconds,
                "samples_seconds": [round(sample[0], 5) for sample in samples],
                "read_bytes": read,
                "bytes_per_token": per_token,
                "estimated_seconds": stats.plan.estimated_seconds,
                "timeline": {k: round(v, 4) for k, v in stats.timeline.overlap().as_dict().items()},
            }

        def run(tier: str, plan: StoragePlan, restore: RestorePlan) -> Run:
            return lambda: self.restore(tier, plan, restore, token_ids)

        recompute = RestorePlan.of(all_kv, self.layers)
        await self.restore(
            "dram", all_hidden, RestorePlan.of(all_hidden, 1), token_ids
        )  # warm-up: every path once
        # Reads nothing, so the same on every tier; 10-100x the other methods, so timed once
        # (`--recompute-repeats`) and not in every tier's rounds: its spread changes no ratio.
        (recomputed,) = await self.rounds([run("dram", all_kv, recompute)], self.args.recompute_repeats)
        recompute_seconds = median_sample(recomputed)[2].seconds["recompute"]
        kv_token = 2 * self.geometry.kv_heads * self.geometry.head_dim * ELEMENT_BYTES
        singles = {
            "recompute": (all_kv, recompute),
            "kv": (all_kv, RestorePlan.of(all_kv, 0)),
            "hidden": (all_hidden, RestorePlan.of(all_hidden, 0)),
        }
        layer_tokens = self.layers * tokens
        for tier in self.reads:
            # The costs the storage plan is chosen on, from one KV and one hidden-state restore
            # just before the rounds (not counted in them): the tier's bandwidth from the KV
            # load; a projection and a layer's recomputation from the compute thread's own
            # time (not wall time: an IO-bound hidden-only run would overstate it). Each of
            # the planner's restores then plans on them as a worker does (restore/policy.py).
            (kv_probe,), (hidden_probe,) = await self.rounds(
                [run(tier, *singles["kv"]), run(tier, *singles["hidden"])], 1
            )
            io = TierCosts.from_bandwidth(kv_probe[1] / kv_probe[0], kv_token, self.hidden * ELEMENT_BYTES)
            costs = RestoreCosts(
                hidden_probe[2].seconds["hidden"] / layer_tokens,
                recompute_seconds / layer_tokens,
                0.0,
                {tier: io},
            )
            chunk = self.args.chunk_tokens
            storage = plan_storage(costs, self.layers, tier, tokens, hidden_allowed=True, chunk_tokens=chunk)
            await self.store(storage, token_ids, kv, hidden)
            policy = RestorePolicy(costs, storage, chunk, self.probe, self.probe_max_age_seconds)
            self.costs[f"{tier}/{tokens}"] = self.modelled(costs, tier, tokens, storage)
            # The planner and every single method that may be the best in the same rounds
            # (same spells); one whose probe took ROUNDS_WITHIN x the fastest probe's time or
            # more keeps its probe as its one sample, as recomputation does: no candidate for
            # the best, its spread changes no ratio. It leaves hidden states only out of the
            # DRAM, disk and 1 GB/s rounds (5-8x KV loading's time there, compute-bound: most
            # of those rounds' time) and KV loading out of the 0.1 GB/s ones (2x, its time
            # the throttle's: samples 2% apart at load 5).
            probed = {"kv": kv_probe, "hidden": hidden_probe}
            fastest = min(seconds for seconds, _, _ in probed.values())
            rounded = [m for m, (seconds, _, _) in probed.items() if seconds < ROUNDS_WITHIN * fastest]
            sampled = await self.rounds(
                [
                    *(run(tier, *singles[m]) for m in rounded),
                    functools.partial(self.planned, tier, policy, token_ids),
                ],
                self.args.repeats,
            )
            measured = {
                **{m: [probe] for m, probe in probed.items()},
                **dict(zip([*rounded, "planner"], sampled, strict=True)),
                "recompute": recomputed,
            }
            for method, plan in [*((m, p) for m, (p, _) in singles.items()), ("planner", storage)]:
                rows.append(row(tier, method, plan, measured[method]))
            if storage not in (all_kv, all_hidden):  # one mix stored at a time: the DRAM tier's size
                await self.client.delete(*self.stored.pop(storage.name))
        for namespace, keys in self.stored.values():
            await self.client.delete(namespace, keys)
        shutil.rmtree(self.files.directory, ignore_errors=True)
        self.stored.clear()
        return rows

    def modelled(
        self, costs: RestoreCosts, tier: str, tokens: int, storage: StoragePlan
    ) -> dict[str, float | str]:
        """The costs planned on and what the planner's model predicts from them."""
        io, chunk = costs.tiers[tier], self.args.chunk_tokens
        chosen = plan_restore(costs, storage, tier, tokens, chunk_tokens=chunk)
        # The best any plan can do on these costs as modelled (recomputation included):
        # the planner's search without the mix margin and the swing checks.
        unguarded = {"margin": 0.0, "chunk_tokens": chunk, "compute_swing": 1.0}
        ceiling = plan_restore(
            costs,
            plan_storage(costs, self.layers, tier, tokens, hidden_allowed=True, **unguarded),  # type: ignore[arg-type]
            tier,
            tokens,
            **unguarded,  # type: ignore[arg-type]
        )
        kv_modelled = restore_seconds(costs, tier, tokens, 0, 0, self.layers)
        return {
            **{
                f"{name}_us_per_token_layer": round(seconds * 1e6, 2)
                for name, seconds in (
                    ("project", costs.project_seconds),
                    ("kv_read", io.kv_seconds),
                    ("hidden_read", io.hidden_seconds),
                    ("recompute", costs.recompute_seconds),
                )
            },
            "modelled_best_vs_kv": round(kv_modelled / chosen.estimated_seconds, 3),
            "predicted_ceiling_vs_kv": round(kv_modelled / ceiling.estimated_seconds, 3),
            "predicted_ceiling_plan": ceiling.name,
            # Hidden+KV mixes at best 1 + (hidden read)/(projection) x KV loading (many
            # layers, reads and projections overlapping; 2 when the projection is
            # cheaper than the read): that ceiling, and the rate at which it is the
            # target, at this run's projection cost.
            "mix_ceiling_vs_kv": round(1 + min(io.hidden_seconds / costs.project_seconds, 1.0), 3),
            "gbps_for_throttled_target": round(
                self.hidden * ELEMENT_BYTES / ((THROTTLED_SPEEDUP_TARGET - 1) * costs.project_seconds) / 1e9,
                3,
            ),
        }


HistoryDone = Callable[[list[Row], Costs, dict[str, float], list[int]], None]


async def measure(
    args: argparse.Namespace, address: str, model: PreTrainedModel, history_done: HistoryDone
) -> None:
    """Measures each history in turn; `history_done(rows, costs, read check, histories so
    far)` after each."""
    rows: list[Row] = []
    async with AsyncKVStoreClient(address, timeout_seconds=120.0) as client:
        bench = Bench(model, client, FileTier(WORK_DIR / "files"), args)
        read_check = bench.files.read_check()
        print(f"disk read, cached vs pages dropped: {read_check}", file=sys.stderr)
        for index, tokens in enumerate(args.histories):
            print(f"history of {tokens} tokens ...", file=sys.stderr)
            rows += await bench.history(tokens)
            history_done(rows, bench.costs, read_check, args.histories[: index + 1])
        bench.compute.shutdown()


def device_problem(device: str) -> str | None:
    """Why the benchmark cannot run its model on `device` (None: it can)."""
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        return f"--device {device}: not a torch device ({exc})"
    if kind == "cuda" and not torch.cuda.is_available():
        built = torch.version.cuda or "none: a CPU-only build"
        return f"--device {device}: CUDA is not available on this machine (torch's CUDA version: {built}); use --device cpu"
    if kind not in ("cpu", "cuda"):
        return f"--device {device}: only cpu and cuda are supported"
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one 1k history")
    # 12 x 768: the narrowest realistic width; 16 x 1024 over 1k-8k histories did not
    # finish its 2k history in 9 minutes on the shared 2-core machine (load average 15-18)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768, help="hidden size (heads of 64)")
    parser.add_argument("--histories", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument(
        "--throttled-gbps",
        type=float,
        nargs="+",
        default=[1.0, 0.1],
        help="bandwidths (GB/s) of the throttled tiers, one tier each",
    )
    # 6: every order of the three methods once (samples.py)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--recompute-repeats", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--results", help="results' file name in bench/results (default restore, restore-quick)"
    )
    args = parser.parse_args(argv)
    if (problem := device_problem(args.device)) is not None:
        parser.error(problem)
    if args.quick:
        args.histories = [1024]
    # a quick run keeps the full run's files
    results = args.results or ("restore-quick" if args.quick else "restore")
    started, load_before = time.monotonic(), os.getloadavg()
    model = build_model(args.layers, args.hidden, args.device)
    compute = profile_compute(model)
    geometry = ModelGeometry.of(model.config)
    largest = (
        max(args.histories) * 2 * geometry.num_layers * geometry.kv_heads * geometry.head_dim * ELEMENT_BYTES
    )
    dram = 3 * largest + 256 * MiB  # all KV, all hidden (half) and one planner plan of one history
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    run_dir = Path(
        tempfile.mkdtemp(prefix="attnstore-restore-", dir=arena_root(Path(tempfile.gettempdir()), dram))
    )
    daemon = DaemonProcess(
        run_dir / "ssd",
        run_dir,
        WORK_DIR / "daemon.log",
        {
            "dram_capacity_bytes": dram,
            "ssd_capacity_bytes": 64 * MiB,
            "max_chunk_bytes": 64 * MiB,
            "persist_on_commit": False,
        },
    )
    tiers = ["dram", "ssd", *(throttled_tier(gbps) for gbps in args.throttled_gbps)]
    config: dict[str, Any] = {
        **vars(args),
        "device": args.device,
        "dtype": "float32",
        # OneDnnLinear where oneDNN runs them
        "linears": type(model.model.layers[0].self_attn.k_proj).__name__,
        "startup_profile": dict(
            zip(
                ("project_per_token_layer", "recompute_per_token_layer", "recompute_per_pair_layer"),
                compute,
                strict=True,
            )
        ),
    }
    report: list[Any] = []  # rows, summary and verdicts after the last history

    def history_done(rows: list[Row], costs: Costs, read_check: dict[str, float], done: list[int]) -> None:
        """The results so far, after each history: a run cut short (a time limit on a busy
        machine: the seventh session's full run at load 10-13 was stopped in its 8k history
        after 13 minutes) keeps the histories it finished, in `<name>-partial.json`
        (git-ignored) until the last history writes `<name>.json`."""
        summary, verdicts = summarize(rows, tiers, done, costs)
        machine = machine_info(WORK_DIR, packages=("torch",))
        if model.device.type == "cuda":
            machine["gpu"] = torch.cuda.get_device_name(model.device)
        machine["loadavg_1_5_15min"] = {"before": load_before, "after": os.getloadavg()}
        machine["ssd_read_check"] = read_check  # the page-cache drop really evicts: cold slower
        name = results if done == args.histories else f"{results}-partial"
        save_results(
            name,
            {
                "config": config,
                "machine": machine,
                "histories_done": done,
                "rows": rows,
                "measured_costs": costs,
                "summary": summary,
                "verdicts": verdicts,
                "seconds": time.monotonic() - started,
            },
        )
        report[:] = [rows, summary, verdicts]

    # A time limit's SIGTERM (`timeout`) unwinds through the `finally`: the disk tier's
    # chunk files (1.4 GB at 8k) and the arena do not outlive the run (the daemon's log does).
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    try:
        daemon.start()
        uvloop.run(measure(args, daemon.address, model, history_done))
    finally:
        daemon.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(WORK_DIR / "files", ignore_errors=True)
    rows, summary, verdicts = report
    (RESULTS_DIR / f"{results}-partial.json").unlink(missing_ok=True)
    plot(rows, tiers, RESULTS_DIR / f"{results}.png")
    shutil.rmtree(WORK_DIR, ignore_errors=True)
    print_report(format_table(rows), verdicts, summary)
