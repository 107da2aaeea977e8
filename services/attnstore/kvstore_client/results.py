"""What the KV-store client returns: small typed values instead of raw protos."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from attnstore.chunks.format import ChunkLayout
from attnstore.kvstore.v1 import kvstore_pb2


class Tier(enum.Enum):
    """Where a stored chunk lives (a DRAM chunk may also have an SSD copy)."""

    DRAM = kvstore_pb2.TIER_DRAM
    SSD = kvstore_pb2.TIER_SSD
    PEER = kvstore_pb2.TIER_PEER  # placed on another daemon of the pool


class HintAction(enum.Enum):
    """A look-ahead placement hint; values are the proto's."""

    PREFETCH = kvstore_pb2.HINT_ACTION_PREFETCH  # needed soon: load into DRAM and keep it there
    PROTECT = kvstore_pb2.HINT_ACTION_PROTECT  # needed later: evict after unhinted chunks
    EVICT_FIRST = kvstore_pb2.HINT_ACTION_EVICT_FIRST  # not needed: evict before anything else
    PREDICT = kvstore_pb2.HINT_ACTION_PREDICT  # not queued: expected to be read in next_use_seconds
    DECLINE = kvstore_pb2.HINT_ACTION_DECLINE  # never read again: do not store, evict first


@dataclass(frozen=True)
class LookupResult:
    prefix_length: int  # how many leading keys are stored
    tiers: list[Tier]  # the tier of each of the first `prefix_length` keys
    peers: list[str]  # per hit: the gRPC address of the pool peer holding it (Tier.PEER), else ""


@dataclass(frozen=True)
class PutResult:
    """The fate of each key of a put; every key is in exactly one list."""

    stored: list[bytes]  # written and committed by this call
    already_stored: list[bytes]  # the daemon already had it; nothing was sent
    in_progress: list[bytes]  # another writer holds a reservation for it
    no_space: list[bytes]  # DRAM is full of pinned or leased chunks


@dataclass(frozen=True)
class HintResult:
    hinted_keys: int  # keys the hints now cover
    prefetches_started: int  # SSD chunks whose promotion to DRAM started


@dataclass(frozen=True)
class ChunkData:
    """A layer range of one chunk: for each layer, K then V, each [kv_heads, tokens, head_dim]."""

    layout: ChunkLayout  # the parsed header (tokens, dtype, base position, checksums)
    data: bytearray  # only the requested layers, layer-major


@dataclass(frozen=True)
class LayerPiece:
    """One layer of one chunk, K then V; `chunk_index` indexes the request's keys."""

    chunk_index: int
    layer: int
    data: bytes | bytearray | memoryview  # a memoryview: of the leased arena, valid while iterating
    layout: ChunkLayout  # of the chunk the layer belongs to (tokens may differ for a tail chunk)


@dataclass(frozen=True)
class ClientStats:
    transport: str | None  # the byte path: "shm", "dataplane" or "grpc"; None before first use
    reads: dict[str, int]  # read calls per byte path
    writes: dict[str, int]  # put calls per byte path
    peers: dict[str, str | None]  # pool peers read from directly -> their byte path
