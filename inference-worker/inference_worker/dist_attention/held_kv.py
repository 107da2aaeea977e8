"""The KV segments a worker holds for other workers' sequences, and the compute it lends
over them (the remote side of micro-attention).

    AppendKV (created, then grown) -> PartialAttention / ReadKV ... -> ReleaseKV

A PartialAttention may name several segments (a borrower's segments held here): their
partials are merged here and one comes back, so a borrower makes one call per peer and
layer however its segments were dealt.

Limits: the bytes held (an append past `max_held_bytes` is refused whole), the query
tokens of one call, and the key tokens attended at once (`max_inflight_key_tokens`, the
compute lent: a call that would pass it is refused at once rather than queued, so a
borrower's decode step never waits behind another's; the caller pulls the KV instead).
A segment no call touched for `segment_idle_ttl_seconds` is dropped at the next append or
the servicer's next sweep (a dead borrower cannot pin lent memory). Each partial comes back with the digests of the
layer's KV it attended (CRC-32 of each segment's keys and values, kept as they are
appended): the segment's home checks them against what it uploaded. Methods run on worker threads (torch releases
the GIL); one lock guards the tables.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attnstore.errors import InvalidArgument, NotFound, OutOfRange, ResourceExhausted
from inference_worker.dist_attention.address import check_address
from inference_worker.dist_attention.limits import MicroAttentionLimits
from inference_worker.dist_attention.partial import Partial, merge
from inference_worker.dist_attention.segment import LocalSegment
from inference_worker.dist_attention.wire import crc, layer_digest


@dataclass(frozen=True)
class LentPartial:
    partial: Partial
    compute_seconds: float
    inflight_key_tokens: int  # the load when the call started
    layer_digests: tuple[int, ...]  # per segment, of the layer attended (wire.layer_digest)


class HeldKV:
    def __init__(
        self, limits: MicroAttentionLimits, node: str = "", clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`node`: this worker's advertised address; segments whose home it is are this
        worker's own KV recalled by DGFM (never dropped as idle: released by their sequence)."""
        self.limits = limits
        self.node = node
        self._clock = clock
        self._segments: dict[str, LocalSegment] = {}
        self._homes: dict[str, str] = {}
        self._crcs: dict[str, list[tuple[int, int]]] = {}  # per layer: CRC-32 of its K, V bytes so far
        self._touched: dict[str, float] = {}
        self._held_bytes = 0
        self._inflight_key_tokens = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        return self._held_bytes

    def held_for(self) -> dict[str, int]:
        """Bytes held per named borrower (its home), this worker's own KV left out."""
        owed: dict[str, int] = defaultdict(int)
        with self._lock:
            for segment_id, home in self._homes.items():
                if home and home != self.node:
                    owed[home] += self._segments[segment_id].nbytes
        return dict(owed)

    def append(
        self, segment_id: str, start_position: int, k: torch.Tensor, v: torch.Tensor, home: str = ""
    ) -> LocalSegment:
        """k, v [L, n, KVH, D] at positions [start_position, +n) of `segment_id`, whose
        borrower is `home` (fixed by the first append)."""
        self._check_id(segment_id)
        if home:
            check_address(home, "home")
        if k.shape != v.shape or k.dtype != v.dtype:
            raise InvalidArgument(f"keys {list(k.shape)} and values {list(v.shape)} differ")
        size = 2 * k.numel() * k.element_size()
        with self._lock:
            self._drop_idle()
            segment = self._segments.get(segment_id)
            if segment is not None:
                if (segment.k.shape[0], *segment.k.shape[2:]) != (
                    k.shape[0],
                    *k.shape[2:],
                ) or segment.k.dtype != k.dtype:
                    raise InvalidArgument(f"segment {segment_id}: appended KV {list(k.shape)} {k.dtype} does not fit its "
                                          f"[{segment.k.shape[0]}, n, {segment.k.shape[2]}, {segment.k.shape[3]}] {segment.k.dtype}")  # fmt: skip
                if home != self._homes[segment_id]:
                    raise InvalidArgument(
                        f"segment {segment_id} belongs to home {self._homes[segment_id]!r}, not {home!r}"
                    )
                if start_position != segment.stop:
                    raise InvalidArgument(
                        f"segment {segment_id} ends at position {segment.stop}, not {start_position}"
                    )
            if self._held_bytes + size > self.limits.max_held_bytes:
                raise ResourceExhausted(
                    f"holding {size} more bytes would pass the {self.limits.max_held_bytes} bytes lent "
                    f"({self._held_bytes} held)"
                )
            if segment is None:
                layers, tokens, kv_heads, dim = k.shape
                segment = LocalSegment(layers, kv_heads, dim, start=start_position, capacity_tokens=tokens,
                                       dtype=k.dtype, device=torch.device("cpu"))  # fmt: skip
                self._segments[segment_id] = segment
                self._homes[segment_id] = home
                self._crcs[segment_id] = [(0, 0)] * layers
            segment.append(k, v)
            crcs = self._crcs[segment_id]
            for layer, (key_crc, value_crc) in enumerate(crcs):  # the appended rows follow those before
                crcs[layer] = (crc(k[layer], key_crc), crc(v[layer], value_crc))
            self._held_bytes += size
            self._touched[segment_id] = self._clock()
            return segment

    def layer_digests(self, segment_id: str) -> tuple[int, ...]:
        """Per layer, the digest of the segment's KV (wire.layer_digest)."""
        self._check_id(segment_id)
        with self._lock:
            crcs = self._crcs.get(segment_id)
        if crcs is None:
            raise NotFound(f"no segment {segment_id!r} here (released meanwhile)")
        return tuple(layer_digest(*layer) for layer in crcs)

    def partial(
        self,
        segment_ids: Sequence[str],
        layer: int,
        q: torch.Tensor,
        q_positions: torch.Tensor,
        *,
        scale: float,
        window: int | None,
    ) -> LentPartial:
        """q [Q, H, D] over `layer` of the segments, merged (one call per peer and layer
        whatever the number of a sequence's segments held here)."""
        if len(set(segment_ids)) != len(segment_ids):
            raise InvalidArgument(f"a segment is named twice in {list(segment_ids)}")
        segments = [self._segment(segment_id) for segment_id in segment_ids]
        for segment in segments:
            self._check_query(segment, layer, q, q_positions, scale)
        with self._lock:  # the segments' KV attended below: appended before, never changed after
            digests = tuple(layer_digest(*self._crcs[s][layer]) for s in segment_ids if s in self._crcs)
        if len(digests) != len(segment_ids):
            raise NotFound(f"a segment of {list(segment_ids)} was released meanwhile")
        with self._lent(sum(s.tokens for s in segments)) as load:
            started = time.perf_counter()
            part = merge([
                s.partial(layer, q.to(s.k.dtype), q_positions, scale=scale, window=window) for s in segments
            ])  # fmt: skip
            return LentPartial(part, time.perf_counter() - started, load, digests)

    def _check_query(
        self, segment: LocalSegment, layer: int, q: torch.Tensor, q_positions: torch.Tensor, scale: float
    ) -> None:
        if not 0 <= layer < segment.k.shape[0]:
            raise OutOfRange(f"layer {layer} of a segment with {segment.k.shape[0]} layers")
        if q.shape[0] > self.limits.max_query_tokens:
            raise InvalidArgument(
                f"{q.shape[0]} query tokens, more than the {self.limits.max_query_tokens} allowed"
            )
        if q.shape[0] != q_positions.shape[0]:
            raise InvalidArgument(f"{q.shape[0]} queries but {q_positions.shape[0]} positions")
        if q.shape[2] != segment.k.shape[3] or q.shape[1] % segment.k.shape[2]:
            raise InvalidArgument(
                f"queries {list(q.shape)} do not fit KV heads {segment.k.shape[2]} of dim {segment.k.shape[3]}"
            )
        if not scale > 0:
            raise InvalidArgument(f"scale {scale} is not positive")

    def read(
        self, segment_id: str, layer: int, piece_tokens: int
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(start position, K, V [n, KVH, D]) pieces of `layer`."""
        segment = self._segment(segment_id)
        if not 0 <= layer < segment.k.shape[0]:
            raise OutOfRange(f"layer {layer} of a segment with {segment.k.shape[0]} layers")
        k, v = segment.layer_kv(layer)
        piece = piece_tokens or self.limits.read_piece_tokens
        for offset in range(0, segment.tokens, piece):
            yield segment.start + offset, k[offset : offset + piece], v[offset : offset + piece]

    def holds(self, segment_id: str) -> bool:
        with self._lock:
            return segment_id in self._segments

    def release(self, segment_id: str) -> bool:
        self._check_id(segment_id)
        with self._lock:
            return self._drop(segment_id)

    def _drop(self, segment_id: str) -> bool:
        segment = self._segments.pop(segment_id, None)
        self._touched.pop(segment_id, None)
        self._homes.pop(segment_id, None)
        self._crcs.pop(segment_id, None)
        if segment is not None:
            self._held_bytes -= segment.nbytes
        return segment is not None

    def drop_idle(self) -> None:
        """Drops the segments no call touched for the idle TTL (their home died)."""
        with self._lock:
            self._drop_idle()

    def _drop_idle(self) -> None:
        oldest = self._clock() - self.limits.segment_idle_ttl_seconds
        idle = [s for s, touched in self._touched.items() if touched < oldest]
        for segment_id in [s for s in idle if not self.node or self._homes[s] != self.node]:
            self._drop(segment_id)

    def _check_id(self, segment_id: str) -> None:
        """An id that fits the limit (a 300k-character id once made a NotFound too long to send)."""
        if not segment_id:
            raise InvalidArgument("segment_id is empty")
        if len(segment_id) > self.limits.max_segment_id_chars:
            raise InvalidArgument(
                f"segment_id has {len(segment_id)} characters, more than {self.limits.max_segment_id_chars} "
                "(micro_attention.max_segment_id_chars)"
            )

    def _segment(self, segment_id: str) -> LocalSegment:
        self._check_id(segment_id)
        with self._lock:
            segment = self._segments.get(segment_id)
            if segment is not None:
                self._touched[segment_id] = self._clock()
        if segment is None:
            raise NotFound(
                f"no segment {segment_id!r} here (never appended, released, or this worker restarted)"
            )
        return segment

    @contextmanager
    def _lent(self, key_tokens: int) -> Iterator[int]:
        with self._lock:
            load = self._inflight_key_tokens
            if load + key_tokens > self.limits.max_inflight_key_tokens:
                raise ResourceExhausted(
                    f"attending {key_tokens} more key tokens would pass the {self.limits.max_inflight_key_tokens} "
                    f"lent at once ({load} in flight)"
                )
            self._inflight_key_tokens += key_tokens
        try:
            yield load
        finally:
            with self._lock:
                self._inflight_key_tokens -= key_tokens
