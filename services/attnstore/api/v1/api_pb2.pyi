from attnstore.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union
from attnstore.common.v1.common_pb2 import SampleStats as SampleStats
from attnstore.common.v1.common_pb2 import FinishReason as FinishReason

DESCRIPTOR: _descriptor.FileDescriptor
FINISH_REASON_UNSPECIFIED: _common_pb2.FinishReason
FINISH_REASON_STOP: _common_pb2.FinishReason
FINISH_REASON_LENGTH: _common_pb2.FinishReason
FINISH_REASON_STOP_STRING: _common_pb2.FinishReason

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]

class RepairMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPAIR_METHOD_UNSPECIFIED: _ClassVar[RepairMethod]
    REPAIR_METHOD_FIRST: _ClassVar[RepairMethod]
    REPAIR_METHOD_DEVIATION: _ClassVar[RepairMethod]
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
REPAIR_METHOD_UNSPECIFIED: RepairMethod
REPAIR_METHOD_FIRST: RepairMethod
REPAIR_METHOD_DEVIATION: RepairMethod

class Message(_message.Message):
    __slots__ = ("role", "content", "finish_reason")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    role: Role
    content: str
    finish_reason: _common_pb2.FinishReason
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ...) -> None: ...

class GenerationOptions(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "seed", "stop", "n")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    n: int
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., n: _Optional[int] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_id", "tenant", "messages", "turns", "history_tokens", "truncated_tokens", "cached_chunks", "node", "created_at_unix_ms", "updated_at_unix_ms", "expires_at_unix_ms", "ttl_seconds")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    turns: int
    history_tokens: int
    truncated_tokens: int
    cached_chunks: int
    node: str
    created_at_unix_ms: int
    updated_at_unix_ms: int
    expires_at_unix_ms: int
    ttl_seconds: int
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., turns: _Optional[int] = ..., history_tokens: _Optional[int] = ..., truncated_tokens: _Optional[int] = ..., cached_chunks: _Optional[int] = ..., node: _Optional[str] = ..., created_at_unix_ms: _Optional[int] = ..., updated_at_unix_ms: _Optional[int] = ..., expires_at_unix_ms: _Optional[int] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("system_prompt", "ttl_seconds", "expected_next_turn_seconds", "conversation_over")
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_NEXT_TURN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_OVER_FIELD_NUMBER: _ClassVar[int]
    system_prompt: str
    ttl_seconds: int
    expected_next_turn_seconds: float
    conversation_over: bool
    def __init__(self, system_prompt: _Optional[str] = ..., ttl_seconds: _Optional[int] = ..., expected_next_turn_seconds: _Optional[float] = ..., conversation_over: _Optional[bool] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class ChatRequest(_message.Message):
    __slots__ = ("session_id", "message", "options", "expected_next_turn_seconds", "conversation_over", "pml", "repair_tokens", "repair_method", "repair_fraction")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_NEXT_TURN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_OVER_FIELD_NUMBER: _ClassVar[int]
    PML_FIELD_NUMBER: _ClassVar[int]
    REPAIR_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPAIR_METHOD_FIELD_NUMBER: _ClassVar[int]
    REPAIR_FRACTION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    message: str
    options: GenerationOptions
    expected_next_turn_seconds: float
    conversation_over: bool
    pml: str
    repair_tokens: int
    repair_method: RepairMethod
    repair_fraction: float
    def __init__(self, session_id: _Optional[str] = ..., message: _Optional[str] = ..., options: _Optional[_Union[GenerationOptions, _Mapping]] = ..., expected_next_turn_seconds: _Optional[float] = ..., conversation_over: _Optional[bool] = ..., pml: _Optional[str] = ..., repair_tokens: _Optional[int] = ..., repair_method: _Optional[_Union[RepairMethod, str]] = ..., repair_fraction: _Optional[float] = ...) -> None: ...

class TokenText(_message.Message):
    __slots__ = ("text", "token_id", "sample_index")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_id: int
    sample_index: int
    def __init__(self, text: _Optional[str] = ..., token_id: _Optional[int] = ..., sample_index: _Optional[int] = ...) -> None: ...

class TurnStats(_message.Message):
    __slots__ = ("prompt_tokens", "reused_tokens", "generated_tokens", "ttft_ms", "worker_ttft_ms", "queue_wait_ms", "truncated_tokens", "finish_reason", "attempts", "node", "history_tokens", "session_saved", "kv_unavailable_reason", "samples", "module_tokens", "computed_tokens", "repaired_tokens", "encoded_modules", "restore_plan", "restore_recompute_ms", "restore_hidden_ms", "restore_kv_ms")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    WORKER_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SESSION_SAVED_FIELD_NUMBER: _ClassVar[int]
    KV_UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MODULE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENCODED_MODULES_FIELD_NUMBER: _ClassVar[int]
    RESTORE_PLAN_FIELD_NUMBER: _ClassVar[int]
    RESTORE_RECOMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_HIDDEN_MS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_KV_MS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    reused_tokens: int
    generated_tokens: int
    ttft_ms: float
    worker_ttft_ms: float
    queue_wait_ms: float
    truncated_tokens: int
    finish_reason: _common_pb2.FinishReason
    attempts: int
    node: str
    history_tokens: int
    session_saved: bool
    kv_unavailable_reason: str
    samples: _containers.RepeatedCompositeFieldContainer[_common_pb2.SampleStats]
    module_tokens: int
    computed_tokens: int
    repaired_tokens: int
    encoded_modules: int
    restore_plan: str
    restore_recompute_ms: float
    restore_hidden_ms: float
    restore_kv_ms: float
    def __init__(self, prompt_tokens: _Optional[int] = ..., reused_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., ttft_ms: _Optional[float] = ..., worker_ttft_ms: _Optional[float] = ..., queue_wait_ms: _Optional[float] = ..., truncated_tokens: _Optional[int] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., attempts: _Optional[int] = ..., node: _Optional[str] = ..., history_tokens: _Optional[int] = ..., session_saved: _Optional[bool] = ..., kv_unavailable_reason: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[_common_pb2.SampleStats, _Mapping]]] = ..., module_tokens: _Optional[int] = ..., computed_tokens: _Optional[int] = ..., repaired_tokens: _Optional[int] = ..., encoded_modules: _Optional[int] = ..., restore_plan: _Optional[str] = ..., restore_recompute_ms: _Optional[float] = ..., restore_hidden_ms: _Optional[float] = ..., restore_kv_ms: _Optional[float] = ...) -> None: ...

class ChatResponse(_message.Message):
    __slots__ = ("token", "stats")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    token: TokenText
    stats: TurnStats
    def __init__(self, token: _Optional[_Union[TokenText, _Mapping]] = ..., stats: _Optional[_Union[TurnStats, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("system_prompt", "prompt", "options", "pml", "repair_tokens", "add_generation_prompt", "repair_method", "repair_fraction")
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PML_FIELD_NUMBER: _ClassVar[int]
    REPAIR_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    REPAIR_METHOD_FIELD_NUMBER: _ClassVar[int]
    REPAIR_FRACTION_FIELD_NUMBER: _ClassVar[int]
    system_prompt: str
    prompt: str
    options: GenerationOptions
    pml: str
    repair_tokens: int
    add_generation_prompt: bool
    repair_method: RepairMethod
    repair_fraction: float
    def __init__(self, system_prompt: _Optional[str] = ..., prompt: _Optional[str] = ..., options: _Optional[_Union[GenerationOptions, _Mapping]] = ..., pml: _Optional[str] = ..., repair_tokens: _Optional[int] = ..., add_generation_prompt: _Optional[bool] = ..., repair_method: _Optional[_Union[RepairMethod, str]] = ..., repair_fraction: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token", "stats")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    token: TokenText
    stats: TurnStats
    def __init__(self, token: _Optional[_Union[TokenText, _Mapping]] = ..., stats: _Optional[_Union[TurnStats, _Mapping]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id", "tenant")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("session_id", "tenant")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = ("released_chunks",)
    RELEASED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    released_chunks: int
    def __init__(self, released_chunks: _Optional[int] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "tenant")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    tenant: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SchemaInfo(_message.Message):
    __slots__ = ("name", "digest", "modules", "document_bytes", "registered_at_unix_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    MODULES_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    digest: str
    modules: int
    document_bytes: int
    registered_at_unix_ms: int
    def __init__(self, name: _Optional[str] = ..., digest: _Optional[str] = ..., modules: _Optional[int] = ..., document_bytes: _Optional[int] = ..., registered_at_unix_ms: _Optional[int] = ...) -> None: ...

class RegisterSchemaRequest(_message.Message):
    __slots__ = ("schema",)
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    schema: str
    def __init__(self, schema: _Optional[str] = ...) -> None: ...

class SchemaEncodeProgress(_message.Message):
    __slots__ = ("done", "total", "module", "encoded")
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    done: int
    total: int
    module: str
    encoded: bool
    def __init__(self, done: _Optional[int] = ..., total: _Optional[int] = ..., module: _Optional[str] = ..., encoded: _Optional[bool] = ...) -> None: ...

class RegisterSchemaResponse(_message.Message):
    __slots__ = ("progress", "schema")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    progress: SchemaEncodeProgress
    schema: SchemaInfo
    def __init__(self, progress: _Optional[_Union[SchemaEncodeProgress, _Mapping]] = ..., schema: _Optional[_Union[SchemaInfo, _Mapping]] = ...) -> None: ...

class ListSchemasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSchemasResponse(_message.Message):
    __slots__ = ("schemas",)
    SCHEMAS_FIELD_NUMBER: _ClassVar[int]
    schemas: _containers.RepeatedCompositeFieldContainer[SchemaInfo]
    def __init__(self, schemas: _Optional[_Iterable[_Union[SchemaInfo, _Mapping]]] = ...) -> None: ...

class DeleteSchemaRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteSchemaResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...
