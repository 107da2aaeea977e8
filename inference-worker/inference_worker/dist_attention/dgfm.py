"""DGFM between workers: cycles of debts among the workers' long turns are found and each
debtor around a cycle recalls its own KV from its creditor (services/attnstore/
debt_graph.py plans; this executes, for real, between worker processes).

    every period, while a long turn runs here:
      debts(): the pool ledger's debt graph (long_context.pool_redis_url), else
        DescribeLending of this node, then of every borrower it names, ... ──>
      plan_swaps ──> a cycle whose smallest node is this one ──> RecallKV(creditor, m)
      to each debtor around it (this one in process) ──> recall(): between two steps of
      each live sequence, its segments on the creditor are read (ReadKV), kept here in
      the memory this worker lends (HeldKV, home = this node) and released there

A node is named by its advertised address (long_context.advertise_address), the name its
sequences' segments carry to the peers (AppendKV.home) and its peers list it by.

Decisions:
- With a ledger, the graph is the one its lender workers publish (pool_debts.py: each
  its held_for, whole, with a TTL): one Redis read per period, however many nodes. Every
  lender of such a pool must publish there: one outside it would leave its edges out.
- Without one (no Redis, or it does not answer), the graph is gathered backwards from
  this node: its borrowers (DescribeLending.held_for), their borrowers, ... Walking back
  around any cycle through this node reaches every member, so each node sees every cycle
  through it.
- One node executes a cycle: its smallest name. Each debtor recalling on its own would
  break a 2-cycle: the first recall removes an edge and the other debtor no longer sees a
  cycle. A debtor that does not answer leaves the swap partial (logged): balance is lost
  until the next period's plan, never correctness.
- A recalled segment stays in the memory this worker lends, where its creditor's segments
  (the debtor's behind it in the cycle) were: every node holds what it held. The recall
  happens before the other debtor's, so for a moment a node holds both; past
  max_held_bytes the recall stops (RESOURCE_EXHAUSTED from HeldKV) and moves less.
- Whole segments, oldest first, while they fit the swap's size: a swap may move less than
  planned, never more (which would unbalance a node).
- Frozen while moving: recall() takes the sequence's step lock (LongContext.frozen), so no
  step attends a segment halfway moved.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import structlog
import torch

from attnstore.debt_graph import Edge, plan_swaps
from attnstore.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, ServiceError
from attnstore.worker.v1 import micro_attention_pb2 as pb
from inference_worker import metrics
from inference_worker.dist_attention.context import LongContext
from inference_worker.dist_attention.held_kv import HeldKV
from inference_worker.dist_attention.ledger_room import LedgerRoom
from inference_worker.dist_attention.long_settings import DgfmSettings
from inference_worker.dist_attention.remote import PeerChannels, PlaceLost, RemoteSegment
from inference_worker.dist_attention.segment import RecalledSegment

log = structlog.get_logger("dist_attention.dgfm")


class DebtSwaps:
    def __init__(
        self,
        held: HeldKV,
        settings: DgfmSettings,
        channels: PeerChannels,
        timeout_seconds: float,
        ledger: LedgerRoom | None = None,
    ) -> None:
        """`held.node` names this worker (empty: DGFM off); `ledger`: where the debt graph
        is read (None, or one without Redis: gathered from the workers)."""
        self.held = held
        self.ledger = ledger
        self.settings = settings
        self.channels = channels
        self.timeout_seconds = timeout_seconds
        self._live: set[LongContext] = set()
        self._lock = threading.Lock()

    @property
    def node(self) -> str:
        return self.held.node

    @property
    def enabled(self) -> bool:
        return bool(self.node)

    @contextmanager
    def live(self, context: LongContext) -> Iterator[None]:
        """While inside, `context`'s remote segments may be recalled."""
        with self._lock:
            self._live.add(context)
        try:
            yield
        finally:
            with self._lock:
                self._live.discard(context)

    def recall(self, creditor: str, max_bytes: int) -> int:
        """Brings up to `max_bytes` of the live sequences' KV held by `creditor` home; the
        bytes moved (RecallKV)."""
        if not self.enabled:
            raise FailedPrecondition(
                "this worker has no long_context.advertise_address: it takes no part in DGFM"
            )
        if not creditor or creditor == self.node:
            raise InvalidArgument(f"creditor {creditor!r} is not another worker")
        if max_bytes <= 0:
            raise InvalidArgument("max_bytes is 0")
        with self._lock:
            contexts = sorted(self._live, key=lambda c: c.name)
        moved = 0
        for context in contexts:
            with context.frozen:
                for index, place in enumerate(context.places):
                    if not isinstance(place, RemoteSegment) or place.address != creditor:
                        continue
                    if place.nbytes > max_bytes - moved:
                        return moved
                    try:
                        context.places[index] = self._bring_home(place)
                    except (ResourceExhausted, PlaceLost) as exc:  # full; creditor gone or KV not ours
                        log.warning(
                            "dgfm_recall_stopped", creditor=creditor, moved_bytes=moved, error=str(exc)
                        )
                        return moved
                    moved += place.nbytes
                    metrics.DGFM_RECALLED_BYTES.inc(place.nbytes)
        return moved

    def debts(self) -> tuple[dict[Edge, int], str]:
        """(debtor, creditor) -> bytes and where they come from: the ledger's, else gathered
        backwards from this node (every cycle through it is complete; a node that does not
        answer adds nothing)."""
        if self.ledger is not None and (published := self.ledger.debts()) is not None:
            return published, "ledger"
        return self._walk(), "walk"

    def _walk(self) -> dict[Edge, int]:
        debts: dict[Edge, int] = {}
        queue, seen = [self.node], {self.node}
        while queue:
            creditor = queue.pop()
            for home, size in self._held_for(creditor).items():
                debts[(home, creditor)] = size
                if home not in seen:
                    seen.add(home)
                    queue.append(home)
        return debts

    def round(self) -> int:
        """One DGFM period: the cycles this node leads, swapped; the bytes moved."""
        moved = 0
        debts, graph = self.debts()
        for swap in plan_swaps(debts, self.settings.min_swap_bytes):
            if min(swap.cycle) != self.node:
                continue  # the cycle's smallest node swaps it
            for owner, creditor, size in swap.moves():
                moved += (
                    self.recall(creditor, size)
                    if owner == self.node
                    else self._recall_at(owner, creditor, size)
                )
            log.info("dgfm_swap", cycle=list(swap.cycle), size_bytes=swap.size_bytes, graph=graph)
        return moved

    async def run_periodically(self) -> None:
        """Rounds every period while a long turn runs here (a node in a cycle is a debtor,
        so it has one); until cancelled."""
        while True:
            await asyncio.sleep(self.settings.period_seconds)
            if not self._live:
                continue
            try:
                await asyncio.to_thread(self.round)
            except ServiceError as exc:  # a period lost, not the loop: the next one plans afresh
                metrics.DGFM_ROUND_FAILURES.inc()
                log.warning("dgfm_round_failed", error=f"{type(exc).__name__}: {exc}")

    def _bring_home(self, place: RemoteSegment) -> RecalledSegment:
        """The segment's KV read layer by layer, held here; the old copy released only then."""
        layers = [place.read_layer(layer) for layer in range(place.layers)]
        k = torch.stack([k for k, _ in layers])  # [L, tokens, KVH, D]
        v = torch.stack([v for _, v in layers])
        segment = self.held.append(place.segment_id, place.start, k, v, home=self.node)
        place.release()
        return RecalledSegment(segment, lambda: self.held.release(place.segment_id))

    def _held_for(self, node: str) -> dict[str, int]:
        if node == self.node:
            return self.held.held_for()
        try:
            lending = self.channels.stub(node).DescribeLending(
                pb.DescribeLendingRequest(), timeout=self.timeout_seconds
            )
        except grpc.RpcError as exc:
            log.warning("dgfm_node_silent", node=node, error=f"{exc.code().name}: {exc.details()}")
            return {}
        return {entry.home: entry.bytes for entry in lending.held_for}

    def _recall_at(self, owner: str, creditor: str, size: int) -> int:
        request = pb.RecallKVRequest(creditor=creditor, max_bytes=size)
        try:
            return self.channels.stub(owner).RecallKV(request, timeout=self.timeout_seconds).moved_bytes
        except grpc.RpcError as exc:
            log.warning("dgfm_recall_failed", owner=owner, creditor=creditor,
                        error=f"{exc.code().name}: {exc.details()}")  # fmt: skip
            return 0
