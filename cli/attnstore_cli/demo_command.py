"""`attnstore demo` (what `make run` runs): starts the local stack with the default model,
walks a multi-turn conversation through the public API and shows, per turn, the TTFT with
the conversation's KV reused against the TTFT of the same prompt recomputed from scratch
by a second worker that has no KV store (the baseline runs first, on an idle machine, so
neither measurement shares the CPU with the other's work)."""

from __future__ import annotations

import argparse
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from rich.console import Console
from rich.table import Table

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AttnStoreClient
from attnstore.worker.v1 import worker_pb2 as pb
from attnstore.worker.v1 import worker_pb2_grpc
from attnstore_cli.demo_conversation import SYSTEM_PROMPT, USER_TURNS
from attnstore_cli.stack_arguments import add_stack_arguments, running_stack, stack_spec
from attnstore_cli.stack_spec import WorkerSpec
from attnstore_cli.stack_state import attnstore_home
from attnstore_cli.turn_display import reuse_summary

TURN_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class DemoTurn:
    stats: api.TurnStats
    recomputed_ttft_ms: float

    @property
    def speedup(self) -> float:
        return self.recomputed_ttft_ms / self.stats.worker_ttft_ms if self.stats.worker_ttft_ms else 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_stack_arguments(parser)
    parser.add_argument("--max-tokens", type=int, default=48, help="most tokens per answer (greedy decoding)")
    parser.add_argument(
        "--turns", type=int, default=len(USER_TURNS), help=f"turns to run, 1 to {len(USER_TURNS)}"
    )


def run(args: argparse.Namespace, console: Console) -> int:
    # A fresh directory each run, kept afterwards so that its logs can be read.
    data_dir = attnstore_home() / "demo"
    shutil.rmtree(data_dir, ignore_errors=True)
    spec = stack_spec(args, data_dir=data_dir, scheduler_port=0, openai_port=0)
    try:
        with running_stack(spec, console) as (stack, state):
            with console.status("starting the baseline worker (same model, no KV store)"):
                baseline = stack.add_worker(WorkerSpec("baseline", daemon=None))
            turns = _converse(state.scheduler_address, baseline.address, args, console)
            console.print(_turns_table(turns))
            console.print(_summary(turns))
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    return 0


def _converse(
    scheduler_address: str, baseline_address: str, args: argparse.Namespace, console: Console
) -> list[DemoTurn]:
    turns: list[DemoTurn] = []
    with AttnStoreClient(scheduler_address) as client, grpc.insecure_channel(baseline_address) as channel:
        baseline = worker_pb2_grpc.WorkerStub(channel)
        session_id = client.create_session(system_prompt=SYSTEM_PROMPT).session_id
        console.print(
            f"[dim]system prompt: {len(SYSTEM_PROMPT.split())} words of instructions and reference text[/dim]"
        )
        for message in USER_TURNS[: args.turns]:
            history = client.get_session(session_id).messages
            recomputed_ms = _recomputed_ttft_ms(
                baseline, [*history, api.Message(role=api.ROLE_USER, content=message)]
            )
            console.print(f"\n[bold green]user>[/bold green] {message}")
            console.print("[bold blue]assistant>[/bold blue] ", end="")
            stats = None
            for event in client.stream_chat(session_id, message, max_tokens=args.max_tokens):
                if isinstance(event, api.TurnStats):
                    stats = event
                else:
                    console.print(event.text, end="", markup=False, highlight=False)
            assert stats is not None  # the client raises when a stream ends without its stats
            console.print(f"\n[dim]{reuse_summary(stats)}; recomputed: {recomputed_ms:.0f} ms[/dim]")
            turns.append(DemoTurn(stats, recomputed_ms))
    return turns


def _recomputed_ttft_ms(baseline: worker_pb2_grpc.WorkerStub, messages: Sequence[api.Message]) -> float:
    """The worker-measured TTFT of the whole prompt with nothing reused (one token)."""
    request = pb.ExecuteTurnRequest(
        tenant="baseline",
        messages=pb.ChatMessages(
            messages=[
                pb.ChatMessage(role=api.Role.Name(m.role).removeprefix("ROLE_").lower(), content=m.content)
                for m in messages
            ]
        ),
        sampling=pb.SamplingParams(max_tokens=1),
    )
    for reply in baseline.ExecuteTurn(request, timeout=TURN_TIMEOUT_SECONDS):
        if reply.WhichOneof("event") == "stats":
            return float(reply.stats.ttft_ms)
    raise RuntimeError("the baseline worker ended its turn without stats")


def _turns_table(turns: list[DemoTurn]) -> Table:
    table = Table(title="TTFT per turn: KV reused through attnstore vs the same prompt recomputed")
    for column in (
        "turn",
        "prompt tokens",
        "reused tokens",
        "TTFT via API ms",
        "worker TTFT ms",
        "recomputed TTFT ms",
        "speedup",
    ):
        table.add_column(column, justify="right")
    for number, turn in enumerate(turns, start=1):
        stats = turn.stats
        table.add_row(
            str(number),
            str(stats.prompt_tokens),
            str(stats.reused_tokens),
            f"{stats.ttft_ms:.0f}",
            f"{stats.worker_ttft_ms:.0f}",
            f"{turn.recomputed_ttft_ms:.0f}",
            f"{turn.speedup:.1f}x",
        )
    return table


def _summary(turns: list[DemoTurn]) -> str:
    later = [turn for turn in turns[1:] if turn.stats.reused_tokens > 0]
    if not later:
        return "[yellow]no later turn reused KV (see the logs)[/yellow]"
    reused = statistics.median(turn.stats.worker_ttft_ms for turn in later)
    recomputed = statistics.median(turn.recomputed_ttft_ms for turn in later)
    return (
        f"turns 2-{len(turns)}: median TTFT {reused:.0f} ms with the conversation's KV reused vs "
        f"{recomputed:.0f} ms recomputed ([bold]{recomputed / reused:.1f}x faster[/bold])"
    )
