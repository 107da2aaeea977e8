"""Turns whose KV does not fit the worker's KV pool: run over this worker and its peers
(LongContext), instead of being refused.

    TurnEngine.run_turn ──kept prompt + max_tokens > pool──> LongTurns.run
        ──> room asked of each peer (long_context.peers, with peers_from_scheduler the
            workers the turn names, with pool_redis_url the lenders the ledger lists;
            DescribeLending) ──> far_prefill.place_far (the
            oldest segments prefilled in the engine's steps and appended to peers) ──> the
            engine prefills the newest tokens and decodes, batched with the other turns,
            merging the far partials (engine/far_kv.py) ──> release the segments
        a peer lost mid-turn: the engine hands the sequence back ──> place_far again over
            the peers left (or UNAVAILABLE) ──> resubmitted

Decisions:
- The newest tokens (up to the pool's capacity, room for max_tokens included) run in the
  engine's pool like any sequence's, in its batched steps: a long turn's decode is one
  more row of the step, its attention a merge of the pool's partial (the C decode
  kernel's entry point with log-sum-exp) and its peers'. The far part is prefilled in the
  engine's steps too, one segment at a time staged in the pool (far_prefill.py), so long
  turns' prefills interleave with the other turns' steps under the engine's token budget;
  a segment is therefore at most the pool's capacity less one block.
- One sample, no reuse: a long turn neither loads stored chunks nor saves its KV (its
  KV lives in several places; the next turn recomputes it), and n > 1 is refused.
- The room on each peer is what its DescribeLending reports now (held vs max_held_bytes),
  capped by what the pool's ledger says its daemon may lend (ledger_room.py); a peer
  that does not answer gets nothing placed on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Collection, Iterable

import grpc
import structlog
from transformers import PreTrainedTokenizerBase

from attnstore.chunks.keys import NAMESPACE_BYTES
from attnstore.errors import InvalidArgument
from attnstore.worker.v1 import micro_attention_pb2 as pb
from inference_worker.decoding import IncrementalDetokenizer
from inference_worker.dist_attention.address import check_address
from inference_worker.dist_attention.attach import ChunkAttacher
from inference_worker.dist_attention.context import LongContext
from inference_worker.dist_attention.dgfm import DebtSwaps
from inference_worker.dist_attention.far_prefill import place_far
from inference_worker.dist_attention.held_kv import HeldKV
from inference_worker.dist_attention.ledger_room import LedgerRoom
from inference_worker.dist_attention.lender_siblings import LenderSiblings
from inference_worker.dist_attention.limits import MicroAttentionLimits
from inference_worker.dist_attention.long_settings import LongContextSettings
from inference_worker.dist_attention.placement import ContextTooLong
from inference_worker.dist_attention.remote import PeerChannels, RemoteSegment
from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.engine.engine import Engine
from inference_worker.engine.sequence import Sequence
from inference_worker.model_store import LoadedModel
from inference_worker.truncation import Truncation
from inference_worker.turn_types import SampleStats, TokenEvent, TurnStats

log = structlog.get_logger("dist_attention.long_turn")


class LongTurns:
    def __init__(
        self,
        model: LoadedModel,
        settings: LongContextSettings,
        limits: MicroAttentionLimits,
        engine: Engine,
        attacher: ChunkAttacher,
    ) -> None:
        """`limits`: what this worker lends (its MicroAttention's HeldKV, made here: DGFM
        keeps recalled KV there too); `engine`: runs the turns' newest tokens (at most its
        pool's capacity; it prefills the far parts too, far_prefill.py); `attacher`: places
        segments through the daemons the peers report (attach.py). Reads the peer channel's
        credentials now (a bad file stops the start)."""
        self.settings = settings
        self.engine = engine
        self.attacher = attacher
        self.local_tokens = engine.pool.num_blocks * engine.pool.block_tokens
        self.tokenizer: PreTrainedTokenizerBase = model.tokenizer
        self.channels = PeerChannels(settings.peer_channel.load("long_context.peer_channel"))
        self.held = HeldKV(limits, node=settings.advertise_address)
        self.ledger = LedgerRoom(
            settings.pool_redis_url, settings.peer_timeout_seconds, settings.pool_node_name
        )
        self.swaps = DebtSwaps(
            self.held, settings.dgfm, self.channels, settings.peer_timeout_seconds, self.ledger
        )
        self.siblings = LenderSiblings(self.ledger, settings.advertise_address)
        self._dgfm: asyncio.Task[None] | None = None  # started by the first long turn
        self.model = model.model
        self._runner: DistributedRunner | None = None  # made by the first long turn

    @property
    def enabled(self) -> bool:
        """Whether a turn longer than the pool may run here (over peers) at all."""
        settings = self.settings
        return bool(settings.peers) or settings.peers_from_scheduler or settings.pool_redis_url is not None

    def check_peers(self, requested: Collection[str]) -> tuple[str, ...]:
        """The peers a turn names (ExecuteTurnRequest.long_context_peers), checked; ignored
        (none) unless long_context.peers_from_scheduler. Raises InvalidArgument."""
        if not self.settings.peers_from_scheduler:
            return ()
        if len(requested) > self.settings.max_turn_peers:
            raise InvalidArgument(
                f"{len(requested)} long_context_peers, more than the {self.settings.max_turn_peers} allowed"
            )
        return tuple(check_address(address, "long_context_peers entry") for address in requested)

    @property
    def runner(self) -> DistributedRunner:
        if self._runner is None:
            self._runner = DistributedRunner(self.model)
        return self._runner

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
        if self._dgfm is not None:
            self._dgfm.cancel()
        self.channels.close()
        self.ledger.close()

    def peer_room_tokens(self, peers: Iterable[str]) -> dict[str, int]:
        """Tokens of KV each answering peer of `peers` and of the lenders the ledger lists
        now may take (and its daemon, for the attacher)."""
        room, daemons = {}, {}
        per_token = self.runner.geometry.kv_bytes_per_token(self.runner.dtype.itemsize)
        own = self.settings.advertise_address
        listed = self.ledger.lenders(own, self.settings.ledger_peers)
        for address in sorted({*peers, *listed} - {own}):
            try:
                lending = self.channels.stub(address).DescribeLending(
                    pb.DescribeLendingRequest(), timeout=self.settings.peer_timeout_seconds
                )
            except grpc.RpcError as exc:
                log.warning(
                    "long_context_peer_silent", peer=address, error=f"{exc.code().name}: {exc.details()}"
                )
                continue
            self.attacher.learn(address, lending)
            self.siblings.learn(address, lending)
            room[address] = max(0, lending.max_held_bytes - lending.held_bytes) // per_token
            daemons[address] = lending.pool_daemon
        return self.ledger.cap(room, daemons, per_token)

    async def run(
        self,
        prompt_tokens: int,
        truncation: Truncation,
        seq: Sequence,
        samples: int,
        peers: Iterable[str] = (),
    ) -> AsyncIterator[TokenEvent | TurnStats]:
        """`seq`: the kept prompt, set up to decode (TurnEngine._decoding); `peers`: the
        turn's own (check_peers), beside long_context.peers. Streams a TokenEvent per
        token, then the TurnStats. Raises ContextTooLong (RESOURCE_EXHAUSTED) beyond
        max_context_tokens or the peers' room, ContextUnavailable (UNAVAILABLE) when a
        lost peer's part no longer fits, InvalidArgument for n > 1."""
        started = time.perf_counter()
        context_tokens = len(seq) + seq.max_new_tokens
        if context_tokens > self.settings.max_context_tokens:
            raise ContextTooLong(
                f"a context of {context_tokens} tokens (kept prompt {len(seq)} + max_tokens {seq.max_new_tokens}) "
                f"is longer than the {self.settings.max_context_tokens} served across peers "
                "(long_context.max_context_tokens)"
            )
        if samples > 1:
            raise InvalidArgument(
                f"n is {samples}: a turn longer than the KV pool ({self.local_tokens} tokens) runs one sample"
            )
        if self.swaps.enabled and self._dgfm is None:
            self._dgfm = asyncio.create_task(self.swaps.run_periodically(), name="dgfm")
        turn_peers = {*self.settings.peers, *peers}
        context = LongContext(
            self.runner, self.channels, lambda: self.peer_room_tokens(turn_peers),
            local_tokens=self.local_tokens, segment_tokens=self.segment_tokens,
            chunk_tokens=self.segment_tokens,  # its own prefill's (LongContext.prefill): unused here
            timeout_seconds=self.settings.peer_timeout_seconds,
            home=self.settings.advertise_address, attacher=self.attacher, siblings=self.siblings,
        )  # fmt: skip
        first_token_at: float | None = None
        local: Sequence | None = None
        with self.swaps.live(context):  # its remote segments may be recalled (DGFM)
            try:
                local = self._near_part(seq, await self._place(context, seq), context)
                log.info("long_context_turn", context_tokens=context_tokens, local_tokens=self.local_tokens,
                         peers=sorted({p.address for p in context.places if isinstance(p, RemoteSegment)}))  # fmt: skip
                detokenizer = IncrementalDetokenizer(self.tokenizer, seq.token_ids)
                async with contextlib.aclosing(self.engine.generate(local)) as outputs:
                    async for output in outputs:
                        if output.preempted:  # a peer holding its far KV was lost
                            await self._place(context, seq)  # the same split: `local` stays as it is
                            self.engine.submit(local)
                            continue
                        if output.token is None:  # max_new_tokens >= 1: every other output carries one
                            continue
                        first_token_at = first_token_at or time.perf_counter()
                        yield TokenEvent(output.token, detokenizer.add(output.token, final=output.finished))
            finally:
                if local is not None:
                    self.engine.release(local)  # applied before the next step: none reads the far KV after
                await asyncio.to_thread(context.close)
        generated, reason = len(local.generated), local.finish_reason or "length"
        first_token_at = first_token_at or time.perf_counter()
        yield TurnStats(
            prompt_tokens=prompt_tokens, reused_tokens=0, reused_dram_chunks=0, reused_ssd_chunks=0,
            generated_tokens=generated, ttft_seconds=first_token_at - started, kv_load_seconds=0.0,
            kv_load_exposed_seconds=0.0, compute_seconds=first_token_at - started, saved_chunks=0,
            finish_reason=reason, truncated_tokens=truncation.dropped_tokens,
            sink_tokens=truncation.sink_tokens, samples=(SampleStats(generated, reason),),
        )  # fmt: skip

    @property
    def segment_tokens(self) -> int:
        """long_context.segment_tokens, at most what the pool stages (far_prefill.py)."""
        return max(1, min(self.settings.segment_tokens, self.local_tokens - self.engine.pool.block_tokens))

    async def _place(self, context: LongContext, seq: Sequence) -> int:
        """The far part of `seq`'s prompt prefilled in the engine's steps and placed on
        peers; where the near part starts."""
        return await place_far(self.engine, context, list(seq.token_ids), seq.max_new_tokens)

    @staticmethod
    def _near_part(seq: Sequence, start: int, context: LongContext) -> Sequence:
        """The sequence the engine runs: `seq`'s tokens from position `start` on, at their
        positions, with `context` as its far KV; in a namespace of its own, so no other
        sequence shares its blocks (their keys name tokens, not positions)."""
        return Sequence.of(
            seq.token_ids[start:], bytes.fromhex(context.name)[:NAMESPACE_BYTES],
            positions=list(range(start, len(seq))), far=context, sampling=seq.sampling, stops=seq.stops,
            stop_text=seq.stop_text, max_new_tokens=seq.max_new_tokens,
        )  # fmt: skip
