"""One long sequence whose KV spans this worker and its peers.

    plan (placement.py) -> prefill segment by segment -> decode steps (tail here)
                     ^                                      |
                     +---- a peer lost (PlaceLost) ---------+

Prefill runs here, chunk by chunk; a segment planned for a peer is computed into a local
staging segment, then appended to the peer and dropped here. Decode appends to the local
tail. Or, in a worker (long_turn.py), the engine computes the segments planned for peers
in its batched steps (`plan_far`, `add_far`: far_prefill.py) and runs the newest tokens in
its pool, attending this context's places as their far KV (`attend`, engine/far_kv.py).
When a peer is lost, the sequence forgets it, re-plans over the peers left and
recomputes every segment from its tokens (the KV of position p depends on all tokens
before it), or raises ContextUnavailable when the context no longer fits: never an
answer computed without part of the context.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TypeVar

import grpc
import structlog
import torch

from attnstore.chunks.keys import NAMESPACE_BYTES
from attnstore.errors import InvalidArgument, Unavailable
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.attach import ChunkAttacher
from inference_worker.dist_attention.lender_siblings import LenderSiblings
from inference_worker.dist_attention.partial import Partial
from inference_worker.dist_attention.placement import ContextTooLong, SegmentPlan, plan_segments
from inference_worker.dist_attention.remote import PlaceLost, RemoteSegment
from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.dist_attention.segment import KVPlace, LocalSegment, RecalledSegment
from inference_worker.engine.far_kv import FarKVLost

log = structlog.get_logger("dist_attention")

T = TypeVar("T")


class ContextUnavailable(Unavailable):
    """A peer holding part of the context is lost and the context does not fit without it."""


class LongContext:
    def __init__(
        self,
        runner: DistributedRunner,
        channels: Mapping[str, grpc.Channel],
        peer_room_tokens: Callable[[], Mapping[str, int]],
        *,
        local_tokens: int,
        segment_tokens: int,
        chunk_tokens: int,
        timeout_seconds: float = 5.0,
        home: str = "",
        attacher: ChunkAttacher | None = None,
        siblings: LenderSiblings | None = None,
    ) -> None:
        """`peer_room_tokens`: tokens each live peer may hold now (the pool's ledger).
        `local_tokens`: the most tokens of this sequence kept here, decoded ones included.
        `home`: this worker's advertised address, named to the peers as the borrower.
        `attacher`: places segments through the peers' daemons (attach.py) where they have
        one; without it, or where that fails, segments are appended (AppendKV).
        `siblings`: the other lender workers on a peer's daemon, where its segments go when
        it is down (lender_siblings.py); without it they wait for it, or are recomputed."""
        self.runner = runner
        self.channels = channels
        self.peer_room_tokens = peer_room_tokens
        self.local_tokens = local_tokens
        self.segment_tokens = segment_tokens
        self.chunk_tokens = chunk_tokens
        self.timeout_seconds = timeout_seconds
        self.home = home
        self.attacher = attacher
        self.siblings = siblings
        self.chunk_namespace = b""  # of its chunks in the peers' daemons, new with each plan (_plan)
        self.frozen = threading.RLock()  # held by each step; DGFM moves segments only between steps
        self.name = uuid.uuid4().hex  # its segments' ids on peers that many workers borrow from
        self.token_ids: list[int] = []
        self.places: list[KVPlace] = []
        self.lost: set[str] = set()
        self.last_loss = ""  # why the last peer was lost, for the error when none is left
        self.recomputations = 0
        self.new_tokens_left = 0

    @property
    def tail(self) -> LocalSegment:
        return self.places[-1]  # type: ignore[return-value]

    def prefill(self, token_ids: list[int], max_new_tokens: int) -> torch.Tensor:
        """The logits [vocab] after the prompt; room is planned for `max_new_tokens` more
        (fewer than `local_tokens`: decoded tokens stay here)."""
        with self.frozen:
            self._start(token_ids, max_new_tokens)
            return self._with_recovery(lambda: self._prefill(len(self.token_ids)))

    def plan_far(self, token_ids: list[int], max_new_tokens: int) -> tuple[list[SegmentPlan], int]:
        """Releases what was placed and plans the prompt again over the peers not lost:
        the segments planned on peers (computed by the caller, then `add_far`) and the
        position where the tokens planned here start (the same split every time: it
        depends only on the context's length and `local_tokens`). Raises ContextTooLong,
        ContextUnavailable."""
        with self.frozen:
            self._start(token_ids, max_new_tokens)
            *far, local = self._plan()
            return far, local.start

    def add_far(self, index: int, plan: SegmentPlan, segment: LocalSegment) -> None:
        """Appends the computed KV of `plan` (the index-th of plan_far's) to its peer, as
        the next place. Raises PlaceLost (the peer forgotten, every place released)."""
        with self.frozen:
            try:
                self.places.append(self._upload(index, plan, segment))
            except PlaceLost as lost:
                self._forget(lost)
                self.close()
                raise

    def attend(
        self, layer: int, q: torch.Tensor, positions: torch.Tensor, *, scale: float, window: int | None
    ) -> Callable[[], Partial]:
        """The partial of q over this context's places, started (engine/far_kv.py's FarKV):
        a lost peer is remembered (not placed on again) and raised (PlaceLost). Closed (an
        aborted turn's step racing its release), FarKVLost: the engine abandons the step and
        hands the sequence back, to an owner who is gone; nothing is attended without it."""
        if not self.places:
            raise FarKVLost(f"sequence {self.name}: its far KV was released")
        pending = self.runner.start_attend(self.places, layer, q, positions, scale=scale, window=window)

        def result() -> Partial:
            try:
                return pending()
            except PlaceLost as lost:
                self._forget(lost)
                raise

        return result

    def _start(self, token_ids: list[int], max_new_tokens: int) -> None:
        if not token_ids or max_new_tokens >= self.local_tokens:
            raise InvalidArgument(f"{len(token_ids)} prompt tokens and {max_new_tokens} new ones with "
                                  f"{self.local_tokens} held here: need a prompt and fewer new tokens")  # fmt: skip
        self.token_ids, self.new_tokens_left = list(token_ids), max_new_tokens

    def decode(self, token_id: int) -> torch.Tensor:
        """Appends a token; the logits [vocab] after it."""
        if self.new_tokens_left <= 0:
            raise ContextTooLong(f"the {self.local_tokens} tokens planned here are used up")
        self.token_ids.append(token_id)
        self.new_tokens_left -= 1
        position = len(self.token_ids) - 1

        def step() -> torch.Tensor:
            if not self.places:  # a peer was lost: recompute the context before the token
                self._prefill(position)
            return self.runner.forward([token_id], position, self.places, self.tail)

        with self.frozen:
            return self._with_recovery(step)

    def close(self) -> None:
        with self.frozen:
            for place in self.places:
                if isinstance(place, (RemoteSegment, RecalledSegment)):
                    place.release()
            self.places = []

    def _with_recovery(self, step: Callable[[], T]) -> T:
        while True:
            try:
                return step()
            except PlaceLost as lost:
                self._forget(lost)
                self.close()

    def _forget(self, lost: PlaceLost) -> None:
        """Its segments are recomputed on the peers left (the caller's next step)."""
        log.warning("dist_attention_peer_lost", sequence=self.name, error=str(lost))
        self.lost.add(lost.address)
        self.last_loss = str(lost)
        self.recomputations += 1

    def _prefill(self, upto: int) -> torch.Tensor:
        """Plans and computes positions [0, upto); the logits after the last one."""
        logits = torch.empty(0)
        for index, plan in enumerate(self._plan()):
            logits = self._fill(index, plan, min(plan.start + plan.tokens, upto))
        return logits

    def _plan(self) -> list[SegmentPlan]:
        """The segments of the whole context over the peers not lost (what was placed before released)."""
        self.close()
        # KV recomputed after a loss may differ in its last bits (other batches): its chunks
        # must not meet the first computation's under the same keys.
        self.chunk_namespace = uuid.uuid4().bytes[:NAMESPACE_BYTES]
        room = {a: n for a, n in self.peer_room_tokens().items() if a not in self.lost}
        context = len(self.token_ids) + self.new_tokens_left
        try:
            plans = plan_segments(context, self.local_tokens, room, self.segment_tokens)
        except ContextTooLong as exc:
            if self.lost:
                raise ContextUnavailable(
                    f"peers {sorted(self.lost)} were lost (the last: {self.last_loss}) and {exc}"
                ) from exc
            raise
        return plans

    def _fill(self, index: int, plan: SegmentPlan, stop: int) -> torch.Tensor:
        capacity = plan.tokens if plan.peer is not None else self.local_tokens
        segment = self.runner.new_segment(plan.start, capacity)
        logits = torch.empty(0)
        for begin in range(plan.start, stop, self.chunk_tokens):
            end = min(begin + self.chunk_tokens, stop)
            logits = self.runner.forward(self.token_ids[begin:end], begin, [*self.places, segment], segment)
        self.places.append(segment if plan.peer is None else self._upload(index, plan, segment))
        return logits

    def _upload(self, index: int, plan: SegmentPlan, segment: LocalSegment) -> RemoteSegment:
        assert plan.peer is not None
        segment_id, channel = f"{self.name}-{index}", self.channels[plan.peer]
        placed = None
        if self.attacher is not None:
            placed = self.attacher.attach(
                plan.peer, channel, segment_id, segment, self.token_ids, self.chunk_namespace, self.home
            )
        if placed is None:
            placed = RemoteSegment.upload(
                plan.peer, channel, segment_id, segment, self.timeout_seconds, self.home
            )
        if self.siblings is not None:
            placed.elsewhere = self._elsewhere
        return placed

    def _elsewhere(self, peer: str) -> list[tuple[str, micro_attention_pb2_grpc.MicroAttentionStub]]:
        """The other lender workers on `peer`'s daemon, none of them lost, with their stubs."""
        assert self.siblings is not None
        others = [address for address in self.siblings.others(peer) if address not in self.lost]
        return [
            (address, micro_attention_pb2_grpc.MicroAttentionStub(self.channels[address]))
            for address in others
        ]
