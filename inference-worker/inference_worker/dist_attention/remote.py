"""A segment of a sequence's KV held by a peer worker (MicroAttention service): appended
once by prefill, then attended each layer of each step, remotely or by pulling its KV
(cost_model.py). A peer that cannot be reached, or no longer holds the segment, raises
PlaceLost: the sequence then recomputes that KV from its tokens (context.py), never
attends without it. Unless the segment's chunks are in the peer's daemon: then it is
attached through another lender worker reading that daemon (`_move`, lender_siblings.py),
or re-attached on the peer after its restart, and the call made again.

Every read is checked against the KV uploaded: the home keeps each layer's digest (CRC-32
of its keys' and values' bytes, wire.py) from the upload; KV pulled or recalled (ReadKV)
and each PartialAttention answer (the peer's digests of the KV it attended) must match
it, or the peer counts as lost for it (PlaceLost). A segment re-created under its id
elsewhere, cut short, or changed after its upload is then recomputed, never attended.
The CRC of one layer of a 4k-token SmolLM2 segment (6 MB of K and V) took 1.5 ms (3 ms
median, load 9, 2 cores) once at upload and per pull; a remote call compares 8-byte numbers.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
import structlog
import torch

from attnstore.security import ClientCredentials, sync_channel
from attnstore.worker.v1 import micro_attention_pb2 as pb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.cost_model import CostModel, Mode
from inference_worker.dist_attention.partial import Partial, merge, partial_attention
from inference_worker.dist_attention.segment import LocalSegment
from inference_worker.dist_attention.wire import crc, from_wire, layer_digest, to_wire
from inference_worker.engine.far_kv import FarKVLost

log = structlog.get_logger("dist_attention.remote")

T = TypeVar("T")

_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # the servers' limit (attnstore.server.lifecycle)
_APPEND_PIECE_BYTES = 8 * 1024 * 1024
# DescribeLending only reads, so gRPC may repeat it: under load (9+ on 2 cores) a fresh
# channel's first handshake to a busy peer once failed UNAVAILABLE and the long turn was
# refused for want of room. The backoffs outlast the channel's 1 s reconnect backoff; a dead
# peer then costs about 3 s before it counts as silent.
_RETRY_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "attnstore.worker.v1.MicroAttention", "method": "DescribeLending"}],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.5s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


class PlaceLost(FarKVLost):
    """A peer holding positions [start, stop) of the sequence is gone or lost them."""

    def __init__(self, address: str, start: int, stop: int, detail: str) -> None:
        super().__init__(f"peer {address} holding positions [{start}, {stop}) is lost: {detail}")
        self.address, self.start, self.stop = address, start, stop


def peer_channel(address: str, credentials: ClientCredentials | None = None) -> grpc.Channel:
    """A channel to a peer's MicroAttention: TLS and the internal token when `credentials`
    (the worker's long_context.peer_channel) say so, plaintext otherwise."""
    options = [
        ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.service_config", _RETRY_SERVICE_CONFIG),
    ]
    return sync_channel(address, credentials, options)


class PeerChannels(Mapping[str, grpc.Channel]):
    """Channels to peers' MicroAttention by address, made on first use and kept: the peers
    come from the settings, from each turn (the scheduler's workers) and from DGFM's graph."""

    def __init__(self, credentials: ClientCredentials | None) -> None:
        self._credentials = credentials
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def __getitem__(self, address: str) -> grpc.Channel:
        with self._lock:
            if address not in self._channels:
                self._channels[address] = peer_channel(address, self._credentials)
            return self._channels[address]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._channels))

    def __len__(self) -> int:
        return len(self._channels)

    def stub(self, address: str) -> micro_attention_pb2_grpc.MicroAttentionStub:
        return micro_attention_pb2_grpc.MicroAttentionStub(self[address])

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


@dataclass
class Traffic:
    """Bytes on the wire for this segment's attention (not its upload)."""

    sent_bytes: int = 0
    received_bytes: int = 0
    remote_calls: int = 0
    pulls: int = 0


@dataclass(frozen=True)
class AttachedChunks:
    """Where a segment's KV lies in its peer's daemon (put by the home: attach.py; or by
    the peer as it was appended: lent_chunks.py): what the peer reads again to re-make the
    segment after it restarted."""

    namespace: bytes
    keys: list[bytes]
    home: str


@dataclass
class RemoteSegment:
    address: str
    stub: micro_attention_pb2_grpc.MicroAttentionStub
    segment_id: str
    start: int
    tokens: int
    layer_kv_bytes: int  # one layer's K and V, for the cost model
    layers: int
    timeout_seconds: float
    digests: tuple[int, ...]  # per layer, of the KV uploaded (wire.layer_digest)
    force: Mode | None = None  # a fixed mode (benchmarks); None = the cost model decides
    # None: lost with its peer's memory (a peer with no daemon); else its chunks there
    attached: AttachedChunks | None = None
    costs: CostModel = field(default_factory=CostModel)
    traffic: Traffic = field(default_factory=Traffic)
    # The other lender workers reading a lender's daemon, with their stubs: where an attached
    # segment goes when its lender is down (lender_siblings.py); None: nowhere
    elsewhere: Callable[[str], list[tuple[str, micro_attention_pb2_grpc.MicroAttentionStub]]] | None = None

    @classmethod
    def upload(
        cls,
        address: str,
        channel: grpc.Channel,
        segment_id: str,
        local: LocalSegment,
        timeout_seconds: float,
        home: str = "",
    ) -> RemoteSegment:
        """Appends `local`'s KV to the peer in pieces, named as borrowed by `home` (this
        worker's advertised address); the peer's segment. The upload's throughput is the
        link bandwidth the cost model starts from. A peer with a daemon lends it through
        its node's ledger as chunks (AppendKVResponse.chunk_keys): the segment is then
        re-attached from them after the peer restarts, as an attached one."""
        stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
        layers, _, kv_heads, dim = local.k.shape
        per_token = 2 * layers * kv_heads * dim * local.k.element_size()
        piece = max(1, _APPEND_PIECE_BYTES // per_token)
        costs = CostModel()
        namespace, keys = b"", []
        for offset in range(0, local.tokens, piece):
            k = local.k[:, offset : min(offset + piece, local.tokens)]
            v = local.v[:, offset : min(offset + piece, local.tokens)]
            request = pb.AppendKVRequest(
                segment_id=segment_id, start_position=local.start + offset, keys=to_wire(k), values=to_wire(v),
                home=home,
            )  # fmt: skip
            started = time.perf_counter()
            reply = _call(stub.AppendKV, request, timeout_seconds, address, local.start, local.stop)
            costs.observe_transfer(request.ByteSize(), time.perf_counter() - started)
            namespace = reply.chunk_namespace
            keys.extend(reply.chunk_keys)
        attached = AttachedChunks(namespace, keys, home) if keys else None
        return cls.placed(address, stub, segment_id, local, timeout_seconds, costs, attached)

    @classmethod
    def placed(
        cls,
        address: str,
        stub: micro_attention_pb2_grpc.MicroAttentionStub,
        segment_id: str,
        local: LocalSegment,
        timeout_seconds: float,
        costs: CostModel,
        attached: AttachedChunks | None = None,
    ) -> RemoteSegment:
        """The peer's segment holding `local`'s KV (appended, or `attached`: attach.py),
        with the digests of `local`'s layers that every later read must match."""
        layers, _, kv_heads, dim = local.k.shape
        per_token = 2 * layers * kv_heads * dim * local.k.element_size()
        digests = tuple(layer_digest(crc(k), crc(v)) for k, v in map(local.layer_kv, range(layers)))
        return cls(address, stub, segment_id, local.start, local.tokens, per_token * local.tokens // layers,
                   layers, timeout_seconds, digests, costs=costs, attached=attached)  # fmt: skip

    @property
    def stop(self) -> int:
        return self.start + self.tokens

    @property
    def nbytes(self) -> int:
        return self.layer_kv_bytes * self.layers

    def partial(
        self, layer: int, q: torch.Tensor, q_positions: torch.Tensor, *, scale: float, window: int | None
    ) -> Partial:
        return attend_on_peer([self], layer, q, q_positions, scale=scale, window=window)

    def mode(self) -> Mode:
        return self.force or self.costs.choose(self.layer_kv_bytes)

    def release(self) -> None:
        """Best effort: a peer that is gone has nothing to free."""
        try:
            self.stub.ReleaseKV(pb.ReleaseKVRequest(segment_id=self.segment_id), timeout=self.timeout_seconds)
        except grpc.RpcError:
            pass

    def attach(self, wait: bool = True) -> None:
        """Makes the segment on its peer from its chunks in the peer's daemon
        (AttachChunks), waiting up to the timeout for a peer that is down or restarting
        when `wait`. Raises grpc.RpcError when the peer refuses (or is down), PlaceLost when
        what it attached is not the KV these digests name (then released there)."""
        assert self.attached is not None
        request = pb.AttachChunksRequest(
            segment_id=self.segment_id, namespace=self.attached.namespace, chunk_keys=self.attached.keys,
            home=self.attached.home,
        )  # fmt: skip
        reply = _again_if_cut_off(
            lambda: self.stub.AttachChunks(request, timeout=self.timeout_seconds, wait_for_ready=wait)
        )
        if (reply.start_position, reply.segment_tokens, tuple(reply.layer_digests)) != (
            self.start, self.tokens, self.digests
        ):  # fmt: skip
            self.release()
            raise PlaceLost(
                self.address, self.start, self.stop, "the KV it attached is not the KV put in its daemon"
            )

    def reattach(self) -> None:
        """Makes the segment again from its chunks in the peer's daemon (the peer worker
        restarted and forgot it; the chunks outlive it). Raises PlaceLost when that fails
        (the daemon lost the chunks, the peer is down again, other KV)."""
        try:
            self.attach()
        except grpc.RpcError as exc:
            raise PlaceLost(self.address, self.start, self.stop, f"re-attaching: {exc.code().name}: "
                            f"{exc.details()}") from exc  # fmt: skip
        log.info("far_segment_reattached", peer=self.address, segment=self.segment_id, tokens=self.tokens)

    def pull(
        self, layer: int, q: torch.Tensor, positions: torch.Tensor, scale: float, window: int | None
    ) -> Partial:
        started = time.perf_counter()
        k, v = self.read_layer(layer)
        transfer_seconds = time.perf_counter() - started
        self.traffic.pulls += 1
        k, v = k.to(q.device), v.to(q.device)
        started = time.perf_counter()
        part = partial_attention(
            q,
            k.to(q.dtype),
            v.to(q.dtype),
            positions,
            range(self.start, self.stop),
            scale=scale,
            window=window,
        )
        self.costs.observe_pull(k.nbytes + v.nbytes, transfer_seconds, time.perf_counter() - started)
        return part

    def read_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The segment's K, V [tokens, KVH, D] of `layer` (CPU), streamed from the peer."""
        request = pb.ReadKVRequest(segment_id=self.segment_id, layer=layer)

        def stream(wait: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
            keys, values = [], []
            for piece in self.stub.ReadKV(request, timeout=self.timeout_seconds, wait_for_ready=wait):
                keys.append(from_wire(piece.keys, "keys", 3))
                values.append(from_wire(piece.values, "values", 3))
                self.traffic.received_bytes += piece.ByteSize()
            return keys, values

        try:
            keys, values = _reattaching([self], stream)
        except grpc.RpcError as exc:
            raise PlaceLost(
                self.address, self.start, self.stop, f"{exc.code().name}: {exc.details()}"
            ) from exc
        self.traffic.sent_bytes += request.ByteSize()
        k, v = torch.cat(keys), torch.cat(values)
        if k.shape[0] != self.tokens:
            raise PlaceLost(
                self.address, self.start, self.stop, f"it sent {k.shape[0]} of {self.tokens} tokens"
            )
        if layer_digest(crc(k), crc(v)) != self.digests[layer]:
            raise PlaceLost(
                self.address, self.start, self.stop, f"its KV of layer {layer} is not the KV uploaded"
            )
        return k, v


def attend_on_peer(
    segments: Sequence[RemoteSegment], layer: int, q: torch.Tensor, positions: torch.Tensor, *,
    scale: float, window: int | None,
) -> Partial:  # fmt: skip
    """The merged partial over one peer's segments of a sequence: those their cost models
    send remote go in one PartialAttention call (one round trip per peer and layer, not one
    per segment: a 128k context in 4k segments over two peers would otherwise make 16 calls
    per peer and layer); the others, or all when the peer refuses, are pulled."""
    remote = [s for s in segments if s.mode() is Mode.REMOTE]
    pulled = [s for s in segments if all(s is not r for r in remote)]
    parts = []
    if remote:
        request = pb.PartialAttentionRequest(
            segment_id=remote[0].segment_id, more_segment_ids=[s.segment_id for s in remote[1:]], layer=layer,
            queries=to_wire(q.float()), query_positions=positions.tolist(), scale=scale, window=window or 0,
        )  # fmt: skip
        try:
            parts.append(_remote_partial(remote, request, q.device))
        except _Refused:
            for segment in remote:
                segment.costs.observe_refusal()
            pulled = list(segments)
    parts += [s.pull(layer, q, positions, scale, window) for s in pulled]
    return merge(parts)


def _remote_partial(
    segments: Sequence[RemoteSegment], request: pb.PartialAttentionRequest, device: torch.device
) -> Partial:
    first = segments[0]
    started = time.perf_counter()
    # the stub read at each try: the segments may move to another lender meanwhile (_reattaching)
    reply = _call(lambda r, **options: first.stub.PartialAttention(r, **options), request, first.timeout_seconds,
                  first.address, min(s.start for s in segments), max(s.stop for s in segments), segments)  # fmt: skip
    call_seconds, compute_seconds = time.perf_counter() - started, reply.compute_ms / 1000
    if list(reply.layer_digests) != [s.digests[request.layer] for s in segments]:
        raise PlaceLost(first.address, min(s.start for s in segments), max(s.stop for s in segments),
                        f"it attended KV of layer {request.layer} that is not the KV uploaded")  # fmt: skip
    # Each segment's share of the call: the round trip, and the compute and bytes by its keys.
    keys = sum(s.tokens for s in segments)
    for segment in segments:
        share = segment.tokens / keys
        segment.costs.observe_remote(call_seconds - compute_seconds * (1 - share), compute_seconds * share)
        segment.traffic.sent_bytes += round(request.ByteSize() * share)
        segment.traffic.received_bytes += round(reply.ByteSize() * share)
        segment.traffic.remote_calls += 1
    return Partial(from_wire(reply.output, "output", 3).to(device), from_wire(reply.lse, "lse", 2).to(device))


class _Refused(Exception):
    """The peer is over its lending threshold (RESOURCE_EXHAUSTED)."""


def _reattaching(segments: Sequence[RemoteSegment], call: Callable[[bool], T]) -> T:
    """`call(wait_for_ready)`; for segments that are all attached (their chunks in their
    peer's daemon), made again when the peer failed in a way that leaves the chunks:
    - the peer down (UNAVAILABLE: a first call fails at once): the segments are attached
      through another lender worker reading the same daemon (`_move`) and the call made
      there; with none, the call is made again waiting for the peer (a restart);
    - the peer no longer holds them (NOT_FOUND: it restarted): each re-attached from its
      daemon, then the call made again.
    Any other error, or one on appended segments, is raised."""
    if not _all_attached(segments):
        return call(False)
    try:
        return call(False)
    except grpc.RpcError as exc:
        if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND):
            raise
        if exc.code() is grpc.StatusCode.UNAVAILABLE:
            if _move(segments):
                return call(False)
            try:
                return _again_if_cut_off(lambda: call(True))
            except grpc.RpcError as again:
                if again.code() is not grpc.StatusCode.NOT_FOUND:
                    raise
    for segment in segments:
        segment.reattach()
    return _again_if_cut_off(lambda: call(True))


def _move(segments: Sequence[RemoteSegment]) -> bool:
    """Attaches one down peer's `segments` through another lender worker reading the same
    daemon (lender_siblings.py): all of them on the first with room for them all
    (AttachChunks, digests checked), which becomes their peer; True then. A sibling that is
    down too, has no room or attaches other KV is passed over. One that refuses midway
    releases what it took, which deletes those chunks (a released segment's are): the
    segments are then lost with their peer (recomputed), hence the room asked first."""
    first = segments[0]
    lost, lost_stub = first.address, first.stub
    for address, stub in first.elsewhere(lost) if first.elsewhere is not None else []:
        taken: list[RemoteSegment] = []
        try:
            lending = stub.DescribeLending(pb.DescribeLendingRequest(), timeout=first.timeout_seconds)
            if lending.max_held_bytes - lending.held_bytes < sum(s.nbytes for s in segments):
                log.info("far_segments_not_moved", peer=lost, sibling=address, error="no room")
                continue
            for segment in segments:
                segment.address, segment.stub = address, stub
                segment.attach(wait=False)
                taken.append(segment)
        except (grpc.RpcError, PlaceLost) as exc:
            for segment in taken:
                segment.release()
            log.info("far_segments_not_moved", peer=lost, sibling=address, error=str(exc))
            continue
        log.info("far_segments_moved", peer=lost, sibling=address, segments=[s.segment_id for s in segments])
        return True
    for segment in segments:
        segment.address, segment.stub = lost, lost_stub
    return False


def _again_if_cut_off(call: Callable[[], T]) -> T:
    """`call()`, made once more when the peer died during it (UNAVAILABLE); callers wait
    for a peer that is down (wait_for_ready), so a restarting one answers the second time."""
    try:
        return call()
    except grpc.RpcError as exc:
        if exc.code() is not grpc.StatusCode.UNAVAILABLE:
            raise
        return call()


def _all_attached(segments: Sequence[RemoteSegment]) -> bool:
    return bool(segments) and all(segment.attached is not None for segment in segments)


def _call(method, request, timeout: float, address: str, start: int, stop: int,
          segments: Sequence[RemoteSegment] = ()):  # fmt: skip
    """`method(request)` with its failures as the caller sees them: PlaceLost, or _Refused
    for a PartialAttention past the peer's lending threshold; `segments` (those the call
    names) are moved to another lender on their daemon, or re-attached, and the call made
    again when their peer is down or had forgotten them (_reattaching).

    A call naming only attached segments whose peer is down and has no sibling waits up to
    `timeout` for it to be reachable (wait_for_ready): a lender worker restarting meanwhile
    is re-attached, not lost (the context recomputed); one still down after `timeout` is
    lost, as any silent peer."""
    try:
        return _reattaching(segments, lambda wait: method(request, timeout=timeout, wait_for_ready=wait))
    except grpc.RpcError as exc:
        if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and isinstance(
            request, pb.PartialAttentionRequest
        ):
            raise _Refused(exc.details()) from exc
        raise PlaceLost(address, start, stop, f"{exc.code().name}: {exc.details()}") from exc
