"""The other lender workers that read the same KV-store daemon as a given one: where a far
segment is attached again when its lender worker died but its node's daemon, which holds
the segment's chunks (lent_chunks.py, attach.py), lives (remote.py, RemoteSegment.move),
instead of the context being recomputed.

    placement: each peer's DescribeLending ──> learn(peer): the daemon it lends through
    a lender down (its calls fail UNAVAILABLE at once) ──> others(lender): the peers learned
        on that daemon, then those the ledger lists on it (LedgerRoom.lenders_on)
        ──> AttachChunks on the first that takes them all (digests checked)

Decisions:
- A daemon is named by its ledger id (DescribeLending.pool_daemon), else by the address
  workers advertise for it (kvstore_address): workers sharing a daemon report the same
  name; a worker reporting neither has no siblings (its segments' loss is recomputed).
- The ledger is read only when a lender is lost, not per placement: a sibling that joined
  since the placement (or was not among the lenders asked) is found too.
"""

from __future__ import annotations

import threading

from attnstore.worker.v1 import micro_attention_pb2 as pb
from inference_worker.dist_attention.ledger_room import LedgerRoom


class LenderSiblings:
    def __init__(self, ledger: LedgerRoom, own_address: str) -> None:
        """`ledger`: the pool's (lists the lenders on each daemon); `own_address`: this
        worker's advertised address, never proposed (its segments are not remote to it)."""
        self._ledger = ledger
        self._own = own_address
        self._daemons: dict[str, str] = {}  # peer -> the daemon it lends through
        self._lock = threading.Lock()

    def learn(self, peer: str, lending: pb.DescribeLendingResponse) -> None:
        """Records the daemon `peer` lends through (none: forgotten)."""
        daemon = lending.pool_daemon or lending.kvstore_address
        with self._lock:
            if daemon:
                self._daemons[peer] = daemon
            else:
                self._daemons.pop(peer, None)

    def others(self, peer: str) -> list[str]:
        """The other lender workers on `peer`'s daemon: those learned, then the ledger's
        (learned too: a segment moved to one may have to move again)."""
        with self._lock:
            daemon = self._daemons.get(peer)
            if daemon is None:
                return []
            known = sorted(p for p, d in self._daemons.items() if d == daemon and p not in (peer, self._own))
        listed = [p for p in self._ledger.lenders_on(daemon, self._own) if p != peer and p not in known]
        with self._lock:
            self._daemons.update(dict.fromkeys(listed, daemon))
        return known + listed
