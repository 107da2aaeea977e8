"""`make bench-vllm`: vLLM CPU alone vs vLLM CPU with AttnStoreConnector, in one run.

bench-peers' multi-turn replay (ShareGPT conversations, round-robin, greedy, each server
keeping its own answers as history; peers_workload.py) sent turn by turn to two vLLM
servers of the same build, model (SmolLM2-135M-Instruct, fp32) and KV space: one alone,
one with the connector and a daemon whose DRAM tier is as large as that KV space, plus
its SSD tier. Which server goes first alternates; both are idle before every timed
request (cpu_quiet.py). Two phases on their own conversations:

  fits           vLLM's KV space holds every conversation: the connector must cost nothing
  over capacity  it does not: vLLM evicts a conversation's blocks before its next turn, the
                 daemon keeps them and the connector loads them back

Per turn: TTFT seen by the client, prompt tokens. Per phase and server: vLLM's own and
the connector's (external) prefix-cache hits, tokens per second over the phase's turns;
the daemon's stats. The JSON summary is the last line (and bench/results/vllm.json):
`later_turn_ttft_with_connector_vs_without` (median TTFT of turns >= 3 beyond vLLM's KV
space, with / without; target <= 0.5) and `..._fits` (target <= 1.05).

    python bench/vllm/run.py [--quick] [--kv-cache-mib N] ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import transformers

from attnstore.kvstore_client import KVStoreClient
from attnstore.shm_arena import arena_root
from attnstore_vllm.settings import ConnectorSettings, kv_transfer_config
from bench.common.cpu_quiet import wait_until_idle
from bench.common.results import RESULTS_DIR, print_report, save_results
from bench.peers.run import usable_cores_bind
from bench.peers.serving import WARMUP_MESSAGE
from bench.peers.vllm import VllmServer
from bench.peers.workload import Dialogue, Step, round_robin, select_dialogues
from bench.vllm.report import format_table, plot, verdicts
from bench.vllm.vllm_env import ROOT, PeerVenv, connector_env, ensure_vllm
from inference_worker.model_store import default_model_dir, model_digest
from kvstore_daemon.launcher import DaemonProcess

WORK_DIR = ROOT / "bench" / ".work-vllm"
MiB = 1024 * 1024
LATER_TURN = 3
ALONE, WITH = "vllm", "vllm+attnstore"
FITS, OVER = "fits", "over capacity"
MESSAGE_LIMITS = {"min_tokens": 900, "max_tokens": 2200, "max_message_tokens": 800}  # as bench-peers
_COUNTER = re.compile(
    r"^((?:vllm:(?:external_)?prefix_cache_(?:queries|hits))|attnstore_vllm_\w+)_total"
    r"(?:\{[^}]*\})?\s+([0-9.e+-]+)$",
    re.MULTILINE,
)


class BenchServer(VllmServer):
    """bench-peers' vLLM server, and the connector when configured."""

    def __init__(self, *args: Any, block_size: int, kv_transfer_config: dict[str, Any] | None) -> None:
        super().__init__(*args, block_size=block_size)
        self.kv_transfer_config = kv_transfer_config

    def command(self) -> list[str]:
        extra = (
            []
            if self.kv_transfer_config is None
            else ["--kv-transfer-config", json.dumps(self.kv_transfer_config)]
        )
        return [*super().command(), *extra]

    def counters(self) -> dict[str, float]:
        """vLLM's prefix-cache counters and the connector's, summed over label sets."""
        totals: dict[str, float] = {}
        for name, value in _COUNTER.findall(self._get("/metrics")[1]):
            totals[name] = totals.get(name, 0.0) + float(value)
        return totals


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few conversations and turns: a smoke run")
    parser.add_argument(
        "--kv-cache-mib",
        type=int,
        default=128,
        help="each vLLM's KV space and the daemon's DRAM tier (SmolLM2 fp32: 45 KiB per token)",
    )
    parser.add_argument(
        "--max-model-len", type=int, default=2560, help="vLLM needs KV space for one sequence this long"
    )
    parser.add_argument("--fits-conversations", type=int, default=1)
    parser.add_argument("--over-conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--omp-threads-bind", default=usable_cores_bind())
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.fits_conversations, args.over_conversations, args.turns = 1, 4, 3
    return args


def replay(
    servers: dict[str, BenchServer], phases: list[tuple[str, list[Dialogue]]], turns: int, max_tokens: int
) -> tuple[list[dict[str, Any]], dict[str, dict[str, dict[str, float]]]]:
    """Every turn to both servers; the records and each phase's counter deltas per server."""
    histories: dict[tuple[str, str], list[dict[str, str]]] = {}
    records: list[dict[str, Any]] = []
    deltas: dict[str, dict[str, dict[str, float]]] = {}
    pids = [server.pid for server in servers.values() if server.pid is not None]
    for server in servers.values():  # untimed: first-request costs stay out of the phases
        server.chat([{"role": "user", "content": WARMUP_MESSAGE}], max_tokens)
    for phase, dialogues in phases:
        before = {side: server.counters() for side, server in servers.items()}
        steps: list[Step] = round_robin(dialogues, turns)
        for index, step in enumerate(steps):
            dialogue = dialogues[step.dialogue]
            for side in list(servers) if index % 2 == 0 else list(reversed(servers)):
                wait_until_idle(pids)
                messages = [
                    *histories.get((side, dialogue.id), []),
                    {"role": "user", "content": dialogue.messages[step.turn - 1]},
                ]
                timing = servers[side].chat(messages, max_tokens)
                histories[(side, dialogue.id)] = [*messages, {"role": "assistant", "content": timing.text}]
                records.append(
                    {
                        "side": side,
                        "phase": phase,
                        "dialogue": dialogue.id,
                        "turn": step.turn,
                        "ttft_ms": timing.ttft_ms,
                        "total_ms": timing.total_ms,
                        "prompt_tokens": timing.prompt_tokens,
                        "completion_tokens": timing.completion_tokens,
                    }
                )
            print(
                f"{phase} turn {step.turn} conversation {step.dialogue}: "
                + ", ".join(f"{r['side']} {r['ttft_ms']:.0f} ms" for r in records[-2:]),
                file=sys.stderr,
                flush=True,
            )
        deltas[phase] = {
            side: {name: value - before[side].get(name, 0.0) for name, value in server.counters().items()}
            for side, server in servers.items()
        }
    return records, deltas


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(records: list[dict[str, Any]], deltas: dict[str, Any]) -> dict[str, Any]:
    def later(phase: str, side: str) -> float | None:
        return _median(
            [
                r["ttft_ms"]
                for r in records
                if r["phase"] == phase and r["side"] == side and r["turn"] >= LATER_TURN
            ]
        )

    def ratio(phase: str) -> float | None:
        with_store, alone = later(phase, WITH), later(phase, ALONE)
        return round(with_store / alone, 3) if with_store is not None and alone else None

    def throughput(phase: str, side: str) -> float:
        mine = [r for r in records if r["phase"] == phase and r["side"] == side]
        tokens = sum(r["prompt_tokens"] + r["completion_tokens"] for r in mine)
        return round(tokens / (sum(r["total_ms"] for r in mine) / 1000), 1)

    return {
        "later_turn_ttft_with_connector_vs_without": ratio(OVER),
        "later_turn_ttft_with_connector_vs_without_fits": ratio(FITS),
        "later_turn_median_ttft_ms": {
            phase: {side: later(phase, side) for side in (ALONE, WITH)} for phase in (FITS, OVER)
        },
        "tokens_per_second": {
            phase: {side: throughput(phase, side) for side in (ALONE, WITH)} for phase in (FITS, OVER)
        },
        "connector_hit_tokens": {
            phase: deltas[phase][WITH].get("vllm:external_prefix_cache_hits", 0.0) for phase in (FITS, OVER)
        },
        "vllm_own_hit_tokens": {
            phase: {side: deltas[phase][side].get("vllm:prefix_cache_hits", 0.0) for side in (ALONE, WITH)}
            for phase in (FITS, OVER)
        },
        "targets": {"over_capacity_at_most": 0.5, "fits_at_most": 1.05},
    }


def main(argv: list[str]) -> dict[str, Any]:
    args = parse_args(argv)
    peer: PeerVenv = ensure_vllm()
    os.environ.update(connector_env(peer))  # the servers' environment: PeerVenv.env() copies ours
    model_dir = default_model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    count = args.fits_conversations + args.over_conversations
    dialogues = select_dialogues(tokenizer, count=count, turns=args.turns, seed=args.seed, **MESSAGE_LIMITS)
    phases = [(FITS, dialogues[: args.fits_conversations]), (OVER, dialogues[args.fits_conversations :])]
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    kv_bytes = args.kv_cache_mib * MiB
    daemon = DaemonProcess(
        ssd_dir=WORK_DIR / "ssd",
        shm_dir=arena_root(WORK_DIR) / f"attnstore-bench-vllm-{os.getpid()}",
        log_path=WORK_DIR / "daemon.log",
        settings={"DRAM_CAPACITY_BYTES": kv_bytes, "SSD_CAPACITY_BYTES": 16 * kv_bytes},
    )
    daemon.shm_dir.mkdir()
    servers: dict[str, BenchServer] = {}
    started = time.monotonic()
    try:
        daemon.start()
        connector = kv_transfer_config(
            ConnectorSettings(
                daemon=daemon.address, chunk_tokens=args.chunk_tokens, model_digest=model_digest(model_dir)
            )
        )
        for side, config in ((ALONE, None), (WITH, connector)):
            servers[side] = BenchServer(
                peer,
                model_dir,
                kv_bytes,
                WORK_DIR / f"{side}.log",
                args.max_model_len,
                args.omp_threads_bind,
                block_size=args.block_size,
                kv_transfer_config=config,
            )
        with ThreadPoolExecutor(len(servers)) as pool:  # compiling takes minutes: both at once
            list(pool.map(BenchServer.start, servers.values()))
        records, deltas = replay(servers, phases, args.turns, args.max_tokens)
        with KVStoreClient(daemon.address, use_shm=False) as client:
            daemon_stats = str(client.stats()).replace("\n", " ")
    finally:
        for server in servers.values():
            server.stop()
        daemon.stop()
        shutil.rmtree(daemon.shm_dir, ignore_errors=True)
    summary = summarize(records, deltas)
    result = {
        "args": vars(args),
        "summary": summary,
        "records": records,
        "counters": deltas,
        "daemon_stats": daemon_stats,
        "wall_seconds": round(time.monotonic() - started, 1),
        "vllm": peer.version,
    }
    if not args.quick:
        save_results("vllm", result)
        plot(
            records,
            f"vLLM CPU {peer.version} alone vs with AttnStoreConnector (SmolLM2-135M)",
            RESULTS_DIR / "vllm.png",
        )
    print_report(format_table(summary), verdicts(summary), summary)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
