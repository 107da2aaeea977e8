from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_DRAM: _ClassVar[Tier]
    TIER_SSD: _ClassVar[Tier]
    TIER_PEER: _ClassVar[Tier]

class ReserveStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESERVE_STATUS_UNSPECIFIED: _ClassVar[ReserveStatus]
    RESERVE_STATUS_RESERVED: _ClassVar[ReserveStatus]
    RESERVE_STATUS_ALREADY_STORED: _ClassVar[ReserveStatus]
    RESERVE_STATUS_IN_PROGRESS: _ClassVar[ReserveStatus]
    RESERVE_STATUS_NO_SPACE: _ClassVar[ReserveStatus]

class HintAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HINT_ACTION_UNSPECIFIED: _ClassVar[HintAction]
    HINT_ACTION_PREFETCH: _ClassVar[HintAction]
    HINT_ACTION_PROTECT: _ClassVar[HintAction]
    HINT_ACTION_EVICT_FIRST: _ClassVar[HintAction]
    HINT_ACTION_PREDICT: _ClassVar[HintAction]
    HINT_ACTION_DECLINE: _ClassVar[HintAction]
TIER_UNSPECIFIED: Tier
TIER_DRAM: Tier
TIER_SSD: Tier
TIER_PEER: Tier
RESERVE_STATUS_UNSPECIFIED: ReserveStatus
RESERVE_STATUS_RESERVED: ReserveStatus
RESERVE_STATUS_ALREADY_STORED: ReserveStatus
RESERVE_STATUS_IN_PROGRESS: ReserveStatus
RESERVE_STATUS_NO_SPACE: ReserveStatus
HINT_ACTION_UNSPECIFIED: HintAction
HINT_ACTION_PREFETCH: HintAction
HINT_ACTION_PROTECT: HintAction
HINT_ACTION_EVICT_FIRST: HintAction
HINT_ACTION_PREDICT: HintAction
HINT_ACTION_DECLINE: HintAction

class NamespaceLayout(_message.Message):
    __slots__ = ("num_layers", "kv_heads", "head_dim", "chunk_tokens", "dtype", "model_label")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_LABEL_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    kv_heads: int
    head_dim: int
    chunk_tokens: int
    dtype: str
    model_label: str
    def __init__(self, num_layers: _Optional[int] = ..., kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., chunk_tokens: _Optional[int] = ..., dtype: _Optional[str] = ..., model_label: _Optional[str] = ...) -> None: ...

class RegisterNamespaceRequest(_message.Message):
    __slots__ = ("namespace", "layout")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    layout: NamespaceLayout
    def __init__(self, namespace: _Optional[bytes] = ..., layout: _Optional[_Union[NamespaceLayout, _Mapping]] = ...) -> None: ...

class RegisterNamespaceResponse(_message.Message):
    __slots__ = ("max_chunk_bytes",)
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_chunk_bytes: int
    def __init__(self, max_chunk_bytes: _Optional[int] = ...) -> None: ...

class OpenShmRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenDataPlaneRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenDataPlaneResponse(_message.Message):
    __slots__ = ("port", "tls", "max_frame_bytes")
    PORT_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    port: int
    tls: bool
    max_frame_bytes: int
    def __init__(self, port: _Optional[int] = ..., tls: _Optional[bool] = ..., max_frame_bytes: _Optional[int] = ...) -> None: ...

class OpenShmResponse(_message.Message):
    __slots__ = ("path", "size_bytes", "block_bytes", "arena_generation", "block_versions_offset_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARENA_GENERATION_FIELD_NUMBER: _ClassVar[int]
    BLOCK_VERSIONS_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    block_bytes: int
    arena_generation: str
    block_versions_offset_bytes: int
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., block_bytes: _Optional[int] = ..., arena_generation: _Optional[str] = ..., block_versions_offset_bytes: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("namespace", "keys", "promote")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    promote: bool
    def __init__(self, namespace: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., promote: _Optional[bool] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("prefix_length", "tiers", "peer_addresses")
    PREFIX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    prefix_length: int
    tiers: _containers.RepeatedScalarFieldContainer[Tier]
    peer_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, prefix_length: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., peer_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class Extent(_message.Message):
    __slots__ = ("offset_bytes", "length_bytes")
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    LENGTH_BYTES_FIELD_NUMBER: _ClassVar[int]
    offset_bytes: int
    length_bytes: int
    def __init__(self, offset_bytes: _Optional[int] = ..., length_bytes: _Optional[int] = ...) -> None: ...

class PutItem(_message.Message):
    __slots__ = ("key", "size_bytes")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    size_bytes: int
    def __init__(self, key: _Optional[bytes] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class ReservePutRequest(_message.Message):
    __slots__ = ("namespace", "items", "ttl_seconds", "borrower")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BORROWER_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    items: _containers.RepeatedCompositeFieldContainer[PutItem]
    ttl_seconds: int
    borrower: str
    def __init__(self, namespace: _Optional[bytes] = ..., items: _Optional[_Iterable[_Union[PutItem, _Mapping]]] = ..., ttl_seconds: _Optional[int] = ..., borrower: _Optional[str] = ...) -> None: ...

class Reservation(_message.Message):
    __slots__ = ("key", "status", "write_id", "extents")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    status: ReserveStatus
    write_id: int
    extents: _containers.RepeatedCompositeFieldContainer[Extent]
    def __init__(self, key: _Optional[bytes] = ..., status: _Optional[_Union[ReserveStatus, str]] = ..., write_id: _Optional[int] = ..., extents: _Optional[_Iterable[_Union[Extent, _Mapping]]] = ...) -> None: ...

class ReservePutResponse(_message.Message):
    __slots__ = ("reservations", "arena_generation")
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    ARENA_GENERATION_FIELD_NUMBER: _ClassVar[int]
    reservations: _containers.RepeatedCompositeFieldContainer[Reservation]
    arena_generation: str
    def __init__(self, reservations: _Optional[_Iterable[_Union[Reservation, _Mapping]]] = ..., arena_generation: _Optional[str] = ...) -> None: ...

class WritePutRequest(_message.Message):
    __slots__ = ("write_id", "offset_bytes", "data")
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    write_id: int
    offset_bytes: int
    data: bytes
    def __init__(self, write_id: _Optional[int] = ..., offset_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class WritePutResponse(_message.Message):
    __slots__ = ("bytes_written",)
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    def __init__(self, bytes_written: _Optional[int] = ...) -> None: ...

class CommitPutRequest(_message.Message):
    __slots__ = ("write_ids", "durable")
    WRITE_IDS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    write_ids: _containers.RepeatedScalarFieldContainer[int]
    durable: bool
    def __init__(self, write_ids: _Optional[_Iterable[int]] = ..., durable: _Optional[bool] = ...) -> None: ...

class CommitPutResponse(_message.Message):
    __slots__ = ("committed_count",)
    COMMITTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    committed_count: int
    def __init__(self, committed_count: _Optional[int] = ...) -> None: ...

class AbortPutRequest(_message.Message):
    __slots__ = ("write_ids",)
    WRITE_IDS_FIELD_NUMBER: _ClassVar[int]
    write_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, write_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AbortPutResponse(_message.Message):
    __slots__ = ("aborted_count",)
    ABORTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    aborted_count: int
    def __init__(self, aborted_count: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("namespace", "keys", "layer_start", "layer_end")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    layer_start: int
    layer_end: int
    def __init__(self, namespace: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ...) -> None: ...

class LayerSlice(_message.Message):
    __slots__ = ("chunk_index", "layer", "data")
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    chunk_index: int
    layer: int
    data: bytes
    def __init__(self, chunk_index: _Optional[int] = ..., layer: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("chunk_headers", "slices")
    CHUNK_HEADERS_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    chunk_headers: _containers.RepeatedScalarFieldContainer[bytes]
    slices: _containers.RepeatedCompositeFieldContainer[LayerSlice]
    def __init__(self, chunk_headers: _Optional[_Iterable[bytes]] = ..., slices: _Optional[_Iterable[_Union[LayerSlice, _Mapping]]] = ...) -> None: ...

class GetShmRequest(_message.Message):
    __slots__ = ("namespace", "keys", "lease_ttl_seconds", "release_lease_ids")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    lease_ttl_seconds: int
    release_lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, namespace: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., lease_ttl_seconds: _Optional[int] = ..., release_lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChunkLocation(_message.Message):
    __slots__ = ("size_bytes", "extents")
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    size_bytes: int
    extents: _containers.RepeatedCompositeFieldContainer[Extent]
    def __init__(self, size_bytes: _Optional[int] = ..., extents: _Optional[_Iterable[_Union[Extent, _Mapping]]] = ...) -> None: ...

class GetShmResponse(_message.Message):
    __slots__ = ("lease_id", "chunks", "arena_generation", "lease_ttl_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ARENA_GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkLocation]
    arena_generation: str
    lease_ttl_ms: int
    def __init__(self, lease_id: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[ChunkLocation, _Mapping]]] = ..., arena_generation: _Optional[str] = ..., lease_ttl_ms: _Optional[int] = ...) -> None: ...

class ReleaseLeaseRequest(_message.Message):
    __slots__ = ("lease_ids", "lease_free_reads")
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FREE_READS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    lease_free_reads: _containers.RepeatedCompositeFieldContainer[LeaseFreeReads]
    def __init__(self, lease_ids: _Optional[_Iterable[int]] = ..., lease_free_reads: _Optional[_Iterable[_Union[LeaseFreeReads, _Mapping]]] = ...) -> None: ...

class LeaseFreeReads(_message.Message):
    __slots__ = ("namespace", "keys")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReleaseLeaseResponse(_message.Message):
    __slots__ = ("released_count",)
    RELEASED_COUNT_FIELD_NUMBER: _ClassVar[int]
    released_count: int
    def __init__(self, released_count: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("namespace", "keys")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted_count",)
    DELETED_COUNT_FIELD_NUMBER: _ClassVar[int]
    deleted_count: int
    def __init__(self, deleted_count: _Optional[int] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("namespace", "keys", "ttl_seconds")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    ttl_seconds: int
    def __init__(self, namespace: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ("pinned_count",)
    PINNED_COUNT_FIELD_NUMBER: _ClassVar[int]
    pinned_count: int
    def __init__(self, pinned_count: _Optional[int] = ...) -> None: ...

class UnpinRequest(_message.Message):
    __slots__ = ("namespace", "keys")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class UnpinResponse(_message.Message):
    __slots__ = ("unpinned_count",)
    UNPINNED_COUNT_FIELD_NUMBER: _ClassVar[int]
    unpinned_count: int
    def __init__(self, unpinned_count: _Optional[int] = ...) -> None: ...

class HintEntry(_message.Message):
    __slots__ = ("keys", "action", "queue_position", "next_use_seconds")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    NEXT_USE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    action: HintAction
    queue_position: int
    next_use_seconds: float
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., action: _Optional[_Union[HintAction, str]] = ..., queue_position: _Optional[int] = ..., next_use_seconds: _Optional[float] = ...) -> None: ...

class HintRequest(_message.Message):
    __slots__ = ("namespace", "entries", "replace", "ttl_seconds", "source")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    entries: _containers.RepeatedCompositeFieldContainer[HintEntry]
    replace: bool
    ttl_seconds: int
    source: str
    def __init__(self, namespace: _Optional[bytes] = ..., entries: _Optional[_Iterable[_Union[HintEntry, _Mapping]]] = ..., replace: _Optional[bool] = ..., ttl_seconds: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class HintResponse(_message.Message):
    __slots__ = ("hinted_keys", "prefetches_started")
    HINTED_KEYS_FIELD_NUMBER: _ClassVar[int]
    PREFETCHES_STARTED_FIELD_NUMBER: _ClassVar[int]
    hinted_keys: int
    prefetches_started: int
    def __init__(self, hinted_keys: _Optional[int] = ..., prefetches_started: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("capacity_bytes", "used_bytes", "chunks", "hits", "evictions")
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    capacity_bytes: int
    used_bytes: int
    chunks: int
    hits: int
    evictions: int
    def __init__(self, capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., chunks: _Optional[int] = ..., hits: _Optional[int] = ..., evictions: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("dram", "ssd", "misses", "eviction_policy", "namespaces", "reservations", "leases", "pinned_chunks", "promotions", "demotions", "max_namespaces", "namespaces_refused_table_full", "namespaces_refused_rate_limited", "namespaces_reclaimed", "admissions_declined", "pool_address")
    DRAM_FIELD_NUMBER: _ClassVar[int]
    SSD_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    EVICTION_POLICY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    PINNED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_FIELD_NUMBER: _ClassVar[int]
    DEMOTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_REFUSED_TABLE_FULL_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_REFUSED_RATE_LIMITED_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_RECLAIMED_FIELD_NUMBER: _ClassVar[int]
    ADMISSIONS_DECLINED_FIELD_NUMBER: _ClassVar[int]
    POOL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    dram: TierStats
    ssd: TierStats
    misses: int
    eviction_policy: str
    namespaces: int
    reservations: int
    leases: int
    pinned_chunks: int
    promotions: int
    demotions: int
    max_namespaces: int
    namespaces_refused_table_full: int
    namespaces_refused_rate_limited: int
    namespaces_reclaimed: int
    admissions_declined: int
    pool_address: str
    def __init__(self, dram: _Optional[_Union[TierStats, _Mapping]] = ..., ssd: _Optional[_Union[TierStats, _Mapping]] = ..., misses: _Optional[int] = ..., eviction_policy: _Optional[str] = ..., namespaces: _Optional[int] = ..., reservations: _Optional[int] = ..., leases: _Optional[int] = ..., pinned_chunks: _Optional[int] = ..., promotions: _Optional[int] = ..., demotions: _Optional[int] = ..., max_namespaces: _Optional[int] = ..., namespaces_refused_table_full: _Optional[int] = ..., namespaces_refused_rate_limited: _Optional[int] = ..., namespaces_reclaimed: _Optional[int] = ..., admissions_declined: _Optional[int] = ..., pool_address: _Optional[str] = ...) -> None: ...
