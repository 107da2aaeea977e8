from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class AppendKVRequest(_message.Message):
    __slots__ = ("segment_id", "start_position", "keys", "values", "home")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    start_position: int
    keys: Tensor
    values: Tensor
    home: str
    def __init__(self, segment_id: _Optional[str] = ..., start_position: _Optional[int] = ..., keys: _Optional[_Union[Tensor, _Mapping]] = ..., values: _Optional[_Union[Tensor, _Mapping]] = ..., home: _Optional[str] = ...) -> None: ...

class AppendKVResponse(_message.Message):
    __slots__ = ("segment_tokens", "held_bytes", "chunk_namespace", "chunk_keys")
    SEGMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_KEYS_FIELD_NUMBER: _ClassVar[int]
    segment_tokens: int
    held_bytes: int
    chunk_namespace: bytes
    chunk_keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, segment_tokens: _Optional[int] = ..., held_bytes: _Optional[int] = ..., chunk_namespace: _Optional[bytes] = ..., chunk_keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PartialAttentionRequest(_message.Message):
    __slots__ = ("segment_id", "layer", "queries", "query_positions", "scale", "window", "more_segment_ids")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    QUERY_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    MORE_SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    layer: int
    queries: Tensor
    query_positions: _containers.RepeatedScalarFieldContainer[int]
    scale: float
    window: int
    more_segment_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, segment_id: _Optional[str] = ..., layer: _Optional[int] = ..., queries: _Optional[_Union[Tensor, _Mapping]] = ..., query_positions: _Optional[_Iterable[int]] = ..., scale: _Optional[float] = ..., window: _Optional[int] = ..., more_segment_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PartialAttentionResponse(_message.Message):
    __slots__ = ("output", "lse", "compute_ms", "inflight_key_tokens", "layer_digests")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    LSE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_KEY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAYER_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    output: Tensor
    lse: Tensor
    compute_ms: float
    inflight_key_tokens: int
    layer_digests: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, output: _Optional[_Union[Tensor, _Mapping]] = ..., lse: _Optional[_Union[Tensor, _Mapping]] = ..., compute_ms: _Optional[float] = ..., inflight_key_tokens: _Optional[int] = ..., layer_digests: _Optional[_Iterable[int]] = ...) -> None: ...

class ReadKVRequest(_message.Message):
    __slots__ = ("segment_id", "layer", "piece_tokens")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    PIECE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    layer: int
    piece_tokens: int
    def __init__(self, segment_id: _Optional[str] = ..., layer: _Optional[int] = ..., piece_tokens: _Optional[int] = ...) -> None: ...

class ReadKVResponse(_message.Message):
    __slots__ = ("start_position", "keys", "values")
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    start_position: int
    keys: Tensor
    values: Tensor
    def __init__(self, start_position: _Optional[int] = ..., keys: _Optional[_Union[Tensor, _Mapping]] = ..., values: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class AttachChunksRequest(_message.Message):
    __slots__ = ("segment_id", "namespace", "chunk_keys", "home")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_KEYS_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    namespace: bytes
    chunk_keys: _containers.RepeatedScalarFieldContainer[bytes]
    home: str
    def __init__(self, segment_id: _Optional[str] = ..., namespace: _Optional[bytes] = ..., chunk_keys: _Optional[_Iterable[bytes]] = ..., home: _Optional[str] = ...) -> None: ...

class AttachChunksResponse(_message.Message):
    __slots__ = ("segment_tokens", "start_position", "held_bytes", "layer_digests")
    SEGMENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYER_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    segment_tokens: int
    start_position: int
    held_bytes: int
    layer_digests: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, segment_tokens: _Optional[int] = ..., start_position: _Optional[int] = ..., held_bytes: _Optional[int] = ..., layer_digests: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseKVRequest(_message.Message):
    __slots__ = ("segment_id",)
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    def __init__(self, segment_id: _Optional[str] = ...) -> None: ...

class ReleaseKVResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class DescribeLendingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeLendingResponse(_message.Message):
    __slots__ = ("held_bytes", "max_held_bytes", "node", "held_for", "kvstore_address", "pool_daemon")
    HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    HELD_FOR_FIELD_NUMBER: _ClassVar[int]
    KVSTORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    POOL_DAEMON_FIELD_NUMBER: _ClassVar[int]
    held_bytes: int
    max_held_bytes: int
    node: str
    held_for: _containers.RepeatedCompositeFieldContainer[HeldFor]
    kvstore_address: str
    pool_daemon: str
    def __init__(self, held_bytes: _Optional[int] = ..., max_held_bytes: _Optional[int] = ..., node: _Optional[str] = ..., held_for: _Optional[_Iterable[_Union[HeldFor, _Mapping]]] = ..., kvstore_address: _Optional[str] = ..., pool_daemon: _Optional[str] = ...) -> None: ...

class HeldFor(_message.Message):
    __slots__ = ("home", "bytes")
    HOME_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    home: str
    bytes: int
    def __init__(self, home: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class RecallKVRequest(_message.Message):
    __slots__ = ("creditor", "max_bytes")
    CREDITOR_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    creditor: str
    max_bytes: int
    def __init__(self, creditor: _Optional[str] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class RecallKVResponse(_message.Message):
    __slots__ = ("moved_bytes",)
    MOVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    moved_bytes: int
    def __init__(self, moved_bytes: _Optional[int] = ...) -> None: ...
