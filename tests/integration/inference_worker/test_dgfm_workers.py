"""DGFM inside the workers, through ExecuteTurn: worker processes on loopback ports stand
for nodes, each advertising its address, in a ring (each one's only peer is the next), and
each runs a long turn at once, so the debts form a cycle: a 2-cycle (A's oldest KV on B,
B's on A) and a 3-cycle (A on B, B on C, C on A). The cycle's smallest node finds it from
the workers' own records (DescribeLending.held_for, gathered backwards from itself) and
asks each debtor to recall its KV (RecallKV, between two of its steps). While the turns
run, a moment comes when every node holds only its own sequence's KV, as many bytes as it
held for its borrower; the turns answer with the same greedy tokens as plain forwards of
the whole sequence; afterwards nothing is held anywhere. With debts below the minimum
swap size nothing moves. With each worker advertising a daemon of its own, the turns'
segments are attached through the peers' daemons (AttachChunks) instead of appended, and
the same cycle is swapped home with the same answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc
import pytest
import torch
from running_daemon import MiB, running_daemon
from running_workers import running_workers
from transformers import AutoModelForCausalLM

from attnstore.server.ports import free_port
from attnstore.worker.v1 import micro_attention_pb2 as mpb
from attnstore.worker.v1 import micro_attention_pb2_grpc, worker_pb2_grpc
from attnstore.worker.v1 import worker_pb2 as pb
from inference_worker.launcher import WorkerProcess
from inference_worker.model_store import LoadedModel

KV_BYTES_PER_TOKEN = 3 * 2 * 2 * 16 * 4  # the tiny Llama: layers x K,V x kv_heads x head_dim x fp32
POOL_TOKENS = 128
PROMPT_TOKENS, NEW_TOKENS = 300, 120  # 120 decode steps: the turns overlap for many DGFM periods
REMOTE_BYTES = (PROMPT_TOKENS + NEW_TOKENS - POOL_TOKENS) * KV_BYTES_PER_TOKEN


@contextmanager
def ring(
    root: Path, model_dir: Path, size: int, min_swap_bytes: int, daemons: bool, redis_url: str | None = None
) -> Iterator[list[WorkerProcess]]:
    """`size` workers, each with a KV pool of POOL_TOKENS and the next one as its only
    peer; with `daemons`, each with a daemon of its own that it advertises; with
    `redis_url`, each publishing its debts in that pool ledger (DGFM reads them there)."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(size)]
    with ExitStack() as stack:
        stores = []
        for i in range(size if daemons else 0):
            (root / f"daemon-{i}").mkdir()
            stores.append(
                stack.enter_context(
                    running_daemon(root / f"daemon-{i}", dram_bytes=64 * MiB, ssd_bytes=64 * MiB)
                )
            )
        settings = {
            f"node-{i}": {
                "listen_address": address,
                "kv_memory_bytes": POOL_TOKENS * KV_BYTES_PER_TOKEN,
                "long_context": {
                    "peers": [addresses[(i + 1) % size]],
                    "advertise_address": address,
                    "segment_tokens": 64,
                    "dgfm": {"period_seconds": 0.05, "min_swap_bytes": min_swap_bytes},
                    "pool_redis_url": redis_url,
                },
            }
            for i, address in enumerate(addresses)
        }
        for node, store in zip(settings.values(), stores):
            node["kvstore_address"] = store.address
            node["long_context"]["advertise_kvstore_address"] = store.address  # type: ignore[index]
        with running_workers(root, model_dir, settings) as started:
            yield list(started.values())


def greedy_turn(address: str, prompt: list[int]) -> list[int]:
    with grpc.insecure_channel(address) as channel:
        request = pb.ExecuteTurnRequest(
            tenant="t",
            prompt_token_ids=pb.TokenIds(token_ids=prompt),
            sampling=pb.SamplingParams(max_tokens=NEW_TOKENS),
        )
        replies = list(worker_pb2_grpc.WorkerStub(channel).ExecuteTurn(request, timeout=300))
    return [r.token.token_id for r in replies[:-1]]


def lending(address: str) -> mpb.DescribeLendingResponse:
    with grpc.insecure_channel(address) as channel:
        stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
        return stub.DescribeLending(mpb.DescribeLendingRequest(), timeout=10)


def plain_greedy(model_dir: Path, prompt: list[int]) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    generated: list[int] = []
    with torch.no_grad():  # greedy by plain forwards over the whole sequence
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=torch.tensor([prompt + generated])).logits[0, -1]
            generated.append(int(logits.argmax()))
            if generated[-1] == model.generation_config.eos_token_id:  # the turn ends with it too
                break
    return generated


def run_turns_at_once(
    size: int,
    root: Path,
    model_dir: Path,
    min_swap_bytes: int,
    daemons: bool = False,
    redis_url: str | None = None,
) -> tuple[bool, list[WorkerProcess]]:
    """A long turn on every worker of a ring at once, checked against plain forwards;
    whether a moment came when every node held only its own sequence's KV, as much as it
    lent, and the workers (stopped)."""
    gen = torch.Generator().manual_seed(size)
    prompts = [torch.randint(0, 300, (PROMPT_TOKENS,), generator=gen).tolist() for _ in range(size)]
    with (
        ring(root, model_dir, size, min_swap_bytes, daemons, redis_url) as workers,
        ThreadPoolExecutor(size) as pool,
    ):
        addresses = [worker.address for worker in workers]
        turns = [pool.submit(greedy_turn, address, prompt) for address, prompt in zip(addresses, prompts)]
        swapped = False
        while not all(turn.done() for turn in turns):
            states = [lending(address) for address in addresses]
            swapped |= all(
                s.node == address and not s.held_for and s.held_bytes == REMOTE_BYTES
                for s, address in zip(states, addresses)
            )
            time.sleep(0.01)
        answers = [turn.result() for turn in turns]
        assert all(lending(address).held_bytes == 0 for address in addresses)
    for prompt, answer in zip(prompts, answers):
        assert answer == plain_greedy(model_dir, prompt)
    return swapped, workers


@pytest.mark.parametrize("size", [2, 3], ids=["2-cycle", "3-cycle"])
def test_a_cycle_of_debts_is_swapped_home_while_the_turns_answer_unchanged(
    size: int, tmp_path: Path, tiny_model: LoadedModel
) -> None:
    swapped, _ = run_turns_at_once(size, tmp_path, tiny_model.model_dir, min_swap_bytes=KV_BYTES_PER_TOKEN)
    assert swapped, "the cycle of debts was never swapped home"


def test_debts_below_the_minimum_swap_stay_where_they_are(tmp_path: Path, tiny_model: LoadedModel) -> None:
    swapped, workers = run_turns_at_once(2, tmp_path, tiny_model.model_dir, min_swap_bytes=REMOTE_BYTES + 1)
    assert not swapped and not any("dgfm_swap" in worker.log_path.read_text() for worker in workers)


def test_attached_segments_of_live_turns_are_swapped_home(tmp_path: Path, tiny_model: LoadedModel) -> None:
    swapped, workers = run_turns_at_once(
        2, tmp_path, tiny_model.model_dir, min_swap_bytes=KV_BYTES_PER_TOKEN, daemons=True
    )
    assert swapped, "the cycle of attached debts was never swapped home"
    logs = [worker.log_path.read_text() for worker in workers]
    assert all("far_segment_attached" in log and "far_segment_attach_failed" not in log for log in logs)
