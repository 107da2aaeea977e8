"""Later-turn TTFT in the three-node pooled replay (issue 21): the replay of pooled.py with
the busy node's turns served by a real worker (`inference_worker.main`, its node's daemon
as its store), over the same three layouts (islands, pooled, one_big).

The worker computes with a random-weight Llama with SmolLM2's tokenizer (bench/load/model.py;
MODEL: 4 layers, hidden 512, one KV head of 64: 2 KiB of fp32 KV per token, 516 KiB per
256-token chunk): SmolLM2-135M's 5.9 MB chunks would need GBs of tiers per node and ~2 ms
a prefilled token, minutes per layout on these 2 cores. With the load benchmark's narrower
Llama (hidden 64) a prefilled token cost about what reading its KV back did, and later
turns took the same 31-32 ms in every layout whatever their hit rate. What a later turn's
TTFT gains here is the prefill of the reused prefix against reading it (from the node's
DRAM or SSD, or a peer's data plane); a real model's prefill costs far more per token
than this one's, so the gap is a floor of what it would be.

Turns: a session's token ids are seeded random ids; turn i's prompt is the first
256 * prompt_blocks + TAIL_TOKENS of them (the history of the hit-rate replay's turn; the
longest of 60 conversations is 2,624 tokens, under MAX_PROMPT_TOKENS), one greedy token, no generated KV saved: the next turn
reuses the previous prompt's full chunks and recomputes the answer and its question (the
chunk-level replay stores the answer's chunks too). Each worker turn runs at its
arrival, and the replay waits until its new chunks are on the daemon before the next
event. The other two nodes' sessions replay at the chunk level (pooled.py) with chunks of
the worker's size in a namespace of their own: they fill the lenders as their own
sessions would. Fewer conversations than the hit-rate replay (every busy-node turn is a
prefill): sized the same way (pooled_workload.py).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from attnstore.chunks.format import encode_chunk, max_chunk_bytes
from attnstore.chunks.keys import NamespaceSpec
from attnstore.kvstore_client import KVStoreClient
from attnstore.worker.v1 import worker_pb2 as pb
from attnstore.worker.v1 import worker_pb2_grpc
from bench.hitrate.workloads import SHAREGPT_CHUNK_TOKENS, Turn, Workload, load_sharegpt
from bench.load.model import TINY_LLAMA, save_load_model
from bench.pool.pooled import SHAREGPT, StoreChunks, replay
from bench.pool.pooled_layouts import LAYOUTS, layout
from bench.pool.pooled_workload import deal, events, size_nodes
from inference_worker.launcher import WorkerProcess

TTFT_CONVERSATIONS = 60  # 226 s for the three layouts at load 9-11
QUICK_TTFT_CONVERSATIONS = 30
TAIL_TOKENS = 64  # the turn's new tokens past its full chunks
MAX_PROMPT_TOKENS = 4096
DRAM_CHUNKS = MAX_PROMPT_TOKENS // SHAREGPT_CHUNK_TOKENS + 8  # the longest prompt's chunks, read at once
# Wider than the load benchmark's Llama, so that a prefilled token costs more than reading
# its KV (2 KiB) back: one KV head of 64, 4 layers, hidden 512.
MODEL = {**TINY_LLAMA, "hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8,
         "num_key_value_heads": 1, "max_position_embeddings": MAX_PROMPT_TOKENS + 64}  # fmt: skip
WORKER_SETTINGS = {"chunk_tokens": SHAREGPT_CHUNK_TOKENS, "dtype": "float32", "max_prompt_tokens": MAX_PROMPT_TOKENS,
                   "health_check_interval_seconds": 0}  # fmt: skip
TENANT = "pool-bench"
TURN_TIMEOUT_SECONDS = 120.0
SAVE_TIMEOUT_SECONDS = 10.0


def lender_chunks() -> tuple[StoreChunks, int]:
    """The other nodes' chunks, shaped as the worker's (its geometry, fp32), and the size of
    the largest chunk of that shape (a DRAM block)."""
    layers, heads = int(MODEL["num_hidden_layers"]), int(MODEL["num_key_value_heads"])
    head_dim = int(MODEL["hidden_size"]) // int(MODEL["num_attention_heads"])
    tokens = SHAREGPT_CHUNK_TOKENS
    namespace = NamespaceSpec(
        model_digest="pool-bench-lenders", dtype="float32", chunk_tokens=tokens
    ).namespace_id()
    half = bytes(heads * tokens * head_dim * 4)

    def encode(key: bytes) -> bytes:
        return encode_chunk(namespace=namespace, key=key, dtype="float32", kv_heads=heads, tokens=tokens,
                            head_dim=head_dim, base_position=0, layers=[(half, half)] * layers)  # fmt: skip

    spec = {
        "num_layers": layers,
        "kv_heads": heads,
        "head_dim": head_dim,
        "chunk_tokens": tokens,
        "dtype": "float32",
    }
    return StoreChunks(namespace, spec, encode), max_chunk_bytes(**spec)  # type: ignore[arg-type]


@dataclass
class BusyNode:
    """Runs the busy node's turns on its worker and keeps their stats."""

    workload: Workload
    sessions: frozenset[int]  # the sessions dealt to the busy node
    worker: worker_pb2_grpc.WorkerStub
    daemon: KVStoreClient
    vocab: int
    ttft_ms: list[float] = field(default_factory=list)  # later turns
    wanted_chunks: int = 0  # later turns: full chunks the previous turn saved
    reused_chunks: int = 0
    unsaved_turns: int = 0  # saves not seen on the daemon within SAVE_TIMEOUT_SECONDS
    fallbacks: Counter[str] = field(default_factory=Counter)  # why stored KV went unused, by reason

    def prompt_tokens(self, number: int, index: int) -> int:
        return _prompt_tokens(self.workload.sessions[number].turns[index])

    def __call__(self, number: int, index: int) -> None:
        tokens = random.Random(number).choices(range(self.vocab), k=self.prompt_tokens(number, index))
        request = pb.ExecuteTurnRequest(tenant=TENANT, prompt_token_ids=pb.TokenIds(token_ids=tokens),
                                        sampling=pb.SamplingParams(max_tokens=1))  # fmt: skip
        stats = [
            r.stats
            for r in self.worker.ExecuteTurn(request, timeout=TURN_TIMEOUT_SECONDS)
            if r.HasField("stats")
        ][-1]
        if index > 0:
            self.ttft_ms.append(stats.ttft_ms)
            self.wanted_chunks += self.prompt_tokens(number, index - 1) // SHAREGPT_CHUNK_TOKENS
            self.reused_chunks += stats.reused_tokens // SHAREGPT_CHUNK_TOKENS
            if stats.fallback != pb.FALLBACK_NONE:
                self.fallbacks[pb.Fallback.Name(stats.fallback)] += 1
        if stats.saved_chunks:  # saved in the background: wait, so the next event sees them stored
            deadline = time.monotonic() + SAVE_TIMEOUT_SECONDS
            while not self.daemon.lookup(stats.namespace, stats.chunk_keys[-1:]).prefix_length:
                if time.monotonic() > deadline:
                    self.unsaved_turns += 1
                    break
                time.sleep(0.005)

    def result(self) -> dict[str, Any]:
        ttft = sorted(self.ttft_ms)
        return {
            "later_turns": len(ttft),
            "hit_rate": round(self.reused_chunks / max(self.wanted_chunks, 1), 4),
            "ttft_ms_p50": round(statistics.median(ttft), 1),
            "ttft_ms_mean": round(statistics.fmean(ttft), 1),
            "ttft_ms_p90": round(ttft[int(0.9 * (len(ttft) - 1))], 1),
            "unsaved_turns": self.unsaved_turns,
            "fallbacks": dict(self.fallbacks),
        }


def _prompt_tokens(turn: Turn) -> int:
    return turn.prompt_blocks * SHAREGPT_CHUNK_TOKENS + TAIL_TOKENS


def longest_prompt(workload: Workload) -> int:
    return max(_prompt_tokens(turn) for session in workload.sessions for turn in session.turns)


def run_pooled_ttft(root: Path, conversations: int) -> dict[str, Any]:
    workload = load_sharegpt(**{**SHAREGPT, "conversations": conversations})
    if (longest := longest_prompt(workload)) > MAX_PROMPT_TOKENS:
        raise ValueError(
            f"a prompt of {longest} tokens: over the model's and the nodes' DRAM's {MAX_PROMPT_TOKENS}"
        )
    schedule = events(workload)
    sizing = size_nodes(workload, schedule)
    node_of = deal(workload, int(SHAREGPT["seed"]))
    chunks, chunk_bytes = lender_chunks()
    model_dir = save_load_model(root / "ttft-model", shape=MODEL)
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    busy_sessions = frozenset(n for n, i in enumerate(node_of) if i == 0)
    busy: dict[str, dict[str, Any]] = {}
    with ExitStack() as all_layouts:
        stacks = {name: all_layouts.enter_context(ExitStack()) for name in LAYOUTS}
        addresses = {
            name: stack.enter_context(layout(root / "ttft", name, sizing.node_chunks, chunk_bytes, DRAM_CHUNKS * chunk_bytes))
            for name, stack in stacks.items()
        }  # fmt: skip
        workers = {
            name: WorkerProcess(root / f"ttft-{name}-worker.log", model_dir=model_dir,
                                kvstore_address=addresses[name][0], settings=WORKER_SETTINGS)
            for name in LAYOUTS
        }  # fmt: skip
        for name, worker in workers.items():
            stacks[name].callback(worker.stop)
        with ThreadPoolExecutor(len(workers)) as starting:  # each start waits seconds for torch and the model
            list(starting.map(WorkerProcess.start, workers.values()))
        for name, stack in stacks.items():
            with (
                stack,
                grpc.insecure_channel(workers[name].address) as channel,
                KVStoreClient(addresses[name][0]) as daemon,
            ):
                node = BusyNode(workload, busy_sessions, worker_pb2_grpc.WorkerStub(channel), daemon, vocab)
                replay(workload, schedule, addresses[name], node_of if len(addresses[name]) > 1 else [0] * len(node_of),
                       chunks, node)  # fmt: skip
            busy[name] = node.result()
            print(f"pooled replay  {name:<8} busy node's worker: {busy[name]}", flush=True)
    return {
        "busy_node": busy,
        "workload": workload.notes | {"turns": workload.turns, "longest_prompt_tokens": longest},
        "chunk_bytes": chunk_bytes,
        "working_set_chunks": sizing.working_set_chunks,
        "node_chunks": sizing.node_chunks,
        "model": MODEL,
    }
