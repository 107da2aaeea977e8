"""One sequence as the engine sees it: its tokens, the pool blocks that hold their KV, how
many of those tokens' KV is already computed (or loaded), and how it is sampled.

    tokens:   t0 t1 t2 ... t(computed-1) | t(computed) ... t(n-1)
              KV in the pool's blocks     | still to run (prefill chunk or the decode token)

    WAITING --admitted (blocks allocated)--> RUNNING --stop token / max_tokens--> FINISHED
       ^                                        |
       +------- preempted (blocks freed) -------+
    (a sample in `forks` skips WAITING: once its parent's prompt is computed it is forked,
    RUNNING with the parent's blocks shared)
    (with `store_chunk_tokens`, preempted goes to its owner instead, which saves the
    snapshot, loads it back as the prefix, and submits the sequence again)
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Tokens
from dataclasses import dataclass, field
from enum import Enum

import torch

from attnstore.chunks.keys import NAMESPACE_BYTES
from inference_worker.engine.far_kv import FarKV
from inference_worker.layerwise_cache import PrefixKV
from inference_worker.turn_types import SamplingParams


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity: two sequences with equal tokens are still two sequences
class Sequence:
    token_ids: list[int]
    namespace: bytes = bytes(NAMESPACE_BYTES)  # its KV's namespace: who may share its blocks
    seq_id: int = -1  # its name in messages, numbered by the Engine that runs it (-1: none yet)
    block_table: list[int] = field(default_factory=list)  # pool block of tokens [iB, (i+1)B)
    computed_tokens: int = 0  # tokens [0, computed_tokens) have their KV in the blocks
    cached_tokens: int = 0  # of them, found in the pool's blocks when it was admitted
    # Explicit positions of the prompt's tokens (prompt modules: gaps, KV in another order);
    # None: token i sits at position i. Generated tokens follow the last prompt position.
    positions: list[int] | None = None
    block_keys: list[bytes] = field(default_factory=list)  # chain keys of its first full blocks
    # -- decoding (engine.py) --
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stops: frozenset[int] = frozenset()
    stop_text: Callable[[int], bool] | None = None  # True on the token that completes a stop string
    max_new_tokens: int = 0  # 0: prefill only (no token is sampled)
    prompt_tokens: int = 0  # len(token_ids) when submitted
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop", "stop_string" or "length" once FINISHED
    preemptions: int = 0
    # -- parallel sampling: the other samples of its prompt, forked from it (sharing its
    # blocks) once its prompt is computed, then sequences of their own (engine.py) --
    forks: list[Sequence] = field(default_factory=list)
    sample_index: int = 0
    # -- stored KV loaded into its first blocks during its first forward (layer by layer) --
    prefix: PrefixKV | None = None
    prefix_skip: int = 0  # leading prefix tokens already in the pool (shared blocks: not written)
    load_wait_seconds: float = 0.0  # how long forward passes waited for the prefix's layers
    load_failure: BaseException | None = None  # why the prefix did not arrive (then recomputed)
    # -- preemption through the store: when set, a preempted sequence's KV of its first
    # whole chunks is copied out before its blocks are freed, and its owner resumes it --
    store_chunk_tokens: int = 0
    snapshot: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer K, V [kv_heads, tokens, D]
    # -- DistAttention: the KV of the positions before its first token, held elsewhere
    # (far_kv.py; its tokens then carry explicit `positions`, right after the far ones) --
    far: FarKV | None = None

    @classmethod
    def of(cls, tokens: Tokens[int], namespace: bytes = bytes(NAMESPACE_BYTES), **fields: object) -> Sequence:
        return cls(list(tokens), namespace, prompt_tokens=len(tokens), **fields)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def pending_tokens(self) -> int:
        """Tokens whose KV the next forward passes must compute."""
        return len(self.token_ids) - self.computed_tokens

    def positions_of(self, start: int, stop: int) -> list[int] | range:
        """The positions of tokens [start, stop)."""
        given = self.positions
        if given is None:
            return range(start, stop)
        after = given[-1] + 1 - len(given) if given else 0  # generated token i sits at i + after
        return [given[i] if i < len(given) else i + after for i in range(start, stop)]

    @property
    def generated(self) -> list[int]:
        return self.token_ids[self.prompt_tokens :]
