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

class Fallback(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FALLBACK_UNSPECIFIED: _ClassVar[Fallback]
    FALLBACK_NONE: _ClassVar[Fallback]
    FALLBACK_DAEMON_UNAVAILABLE: _ClassVar[Fallback]
    FALLBACK_DEADLINE: _ClassVar[Fallback]
    FALLBACK_CHUNK_INVALID: _ClassVar[Fallback]
FALLBACK_UNSPECIFIED: Fallback
FALLBACK_NONE: Fallback
FALLBACK_DAEMON_UNAVAILABLE: Fallback
FALLBACK_DEADLINE: Fallback
FALLBACK_CHUNK_INVALID: Fallback

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "seed", "stop_token_ids", "stop_strings", "n")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    STOP_STRINGS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    stop_strings: _containers.RepeatedScalarFieldContainer[str]
    n: int
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., stop_strings: _Optional[_Iterable[str]] = ..., n: _Optional[int] = ...) -> None: ...

class ExecuteTurnRequest(_message.Message):
    __slots__ = ("tenant", "messages", "prompt_token_ids", "pml", "sampling", "truncated_tokens", "save_generated", "history_tokens", "long_context_peers")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PML_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAVE_GENERATED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LONG_CONTEXT_PEERS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    messages: ChatMessages
    prompt_token_ids: TokenIds
    pml: PmlPrompt
    sampling: SamplingParams
    truncated_tokens: int
    save_generated: bool
    history_tokens: int
    long_context_peers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., prompt_token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., pml: _Optional[_Union[PmlPrompt, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., truncated_tokens: _Optional[int] = ..., save_generated: _Optional[bool] = ..., history_tokens: _Optional[int] = ..., long_context_peers: _Optional[_Iterable[str]] = ...) -> None: ...

class PmlPrompt(_message.Message):
    __slots__ = ("schema", "prompt", "repair_tokens", "add_generation_prompt", "repair_method", "repair_fraction")
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    REPAIR_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    REPAIR_METHOD_FIELD_NUMBER: _ClassVar[int]
    REPAIR_FRACTION_FIELD_NUMBER: _ClassVar[int]
    schema: str
    prompt: str
    repair_tokens: int
    add_generation_prompt: bool
    repair_method: str
    repair_fraction: float
    def __init__(self, schema: _Optional[str] = ..., prompt: _Optional[str] = ..., repair_tokens: _Optional[int] = ..., add_generation_prompt: _Optional[bool] = ..., repair_method: _Optional[str] = ..., repair_fraction: _Optional[float] = ...) -> None: ...

class EncodeSchemaRequest(_message.Message):
    __slots__ = ("tenant", "schema")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    schema: str
    def __init__(self, tenant: _Optional[str] = ..., schema: _Optional[str] = ...) -> None: ...

class EncodeSchemaResponse(_message.Message):
    __slots__ = ("done", "total", "module", "encoded", "namespace", "chunk_keys")
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_KEYS_FIELD_NUMBER: _ClassVar[int]
    done: int
    total: int
    module: str
    encoded: bool
    namespace: bytes
    chunk_keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, done: _Optional[int] = ..., total: _Optional[int] = ..., module: _Optional[str] = ..., encoded: _Optional[bool] = ..., namespace: _Optional[bytes] = ..., chunk_keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("token_id", "text", "sample_index")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    text: str
    sample_index: int
    def __init__(self, token_id: _Optional[int] = ..., text: _Optional[str] = ..., sample_index: _Optional[int] = ...) -> None: ...

class TurnStats(_message.Message):
    __slots__ = ("prompt_tokens", "reused_tokens", "reused_dram_chunks", "reused_ssd_chunks", "generated_tokens", "ttft_ms", "kv_load_ms", "kv_load_exposed_ms", "compute_ms", "saved_chunks", "fallback", "finish_reason", "truncated_tokens", "sink_tokens", "namespace", "chunk_keys", "namespace_refused", "samples", "module_tokens", "repaired_tokens", "encoded_modules", "restore_plan", "restore_recompute_ms", "restore_hidden_ms", "restore_kv_ms", "prompt_token_ids")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSED_DRAM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    REUSED_SSD_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    KV_LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    KV_LOAD_EXPOSED_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    SAVED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SINK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_KEYS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_REFUSED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MODULE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPAIRED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENCODED_MODULES_FIELD_NUMBER: _ClassVar[int]
    RESTORE_PLAN_FIELD_NUMBER: _ClassVar[int]
    RESTORE_RECOMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_HIDDEN_MS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_KV_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    reused_tokens: int
    reused_dram_chunks: int
    reused_ssd_chunks: int
    generated_tokens: int
    ttft_ms: float
    kv_load_ms: float
    kv_load_exposed_ms: float
    compute_ms: float
    saved_chunks: int
    fallback: Fallback
    finish_reason: _common_pb2.FinishReason
    truncated_tokens: int
    sink_tokens: int
    namespace: bytes
    chunk_keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace_refused: str
    samples: _containers.RepeatedCompositeFieldContainer[_common_pb2.SampleStats]
    module_tokens: int
    repaired_tokens: int
    encoded_modules: int
    restore_plan: str
    restore_recompute_ms: float
    restore_hidden_ms: float
    restore_kv_ms: float
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_tokens: _Optional[int] = ..., reused_tokens: _Optional[int] = ..., reused_dram_chunks: _Optional[int] = ..., reused_ssd_chunks: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., ttft_ms: _Optional[float] = ..., kv_load_ms: _Optional[float] = ..., kv_load_exposed_ms: _Optional[float] = ..., compute_ms: _Optional[float] = ..., saved_chunks: _Optional[int] = ..., fallback: _Optional[_Union[Fallback, str]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., truncated_tokens: _Optional[int] = ..., sink_tokens: _Optional[int] = ..., namespace: _Optional[bytes] = ..., chunk_keys: _Optional[_Iterable[bytes]] = ..., namespace_refused: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[_common_pb2.SampleStats, _Mapping]]] = ..., module_tokens: _Optional[int] = ..., repaired_tokens: _Optional[int] = ..., encoded_modules: _Optional[int] = ..., restore_plan: _Optional[str] = ..., restore_recompute_ms: _Optional[float] = ..., restore_hidden_ms: _Optional[float] = ..., restore_kv_ms: _Optional[float] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ExecuteTurnResponse(_message.Message):
    __slots__ = ("token", "stats")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    token: TokenChunk
    stats: TurnStats
    def __init__(self, token: _Optional[_Union[TokenChunk, _Mapping]] = ..., stats: _Optional[_Union[TurnStats, _Mapping]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("messages", "add_generation_prompt", "text", "after_contents")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    AFTER_CONTENTS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    add_generation_prompt: bool
    text: str
    after_contents: int
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., add_generation_prompt: _Optional[bool] = ..., text: _Optional[str] = ..., after_contents: _Optional[int] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DescribeModelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeModelResponse(_message.Message):
    __slots__ = ("model_label", "model_digest", "dtype", "num_layers", "kv_heads", "head_dim", "chunk_tokens", "max_context_tokens", "kv_bytes_per_token", "vocab_size", "max_prompt_tokens", "max_new_tokens", "attention_sink_tokens", "max_samples", "max_turn_context_tokens", "kernels")
    MODEL_LABEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_SINK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MAX_TURN_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    model_label: str
    model_digest: str
    dtype: str
    num_layers: int
    kv_heads: int
    head_dim: int
    chunk_tokens: int
    max_context_tokens: int
    kv_bytes_per_token: int
    vocab_size: int
    max_prompt_tokens: int
    max_new_tokens: int
    attention_sink_tokens: int
    max_samples: int
    max_turn_context_tokens: int
    kernels: KernelReport
    def __init__(self, model_label: _Optional[str] = ..., model_digest: _Optional[str] = ..., dtype: _Optional[str] = ..., num_layers: _Optional[int] = ..., kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., chunk_tokens: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., kv_bytes_per_token: _Optional[int] = ..., vocab_size: _Optional[int] = ..., max_prompt_tokens: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., attention_sink_tokens: _Optional[int] = ..., max_samples: _Optional[int] = ..., max_turn_context_tokens: _Optional[int] = ..., kernels: _Optional[_Union[KernelReport, _Mapping]] = ...) -> None: ...

class KernelChoice(_message.Message):
    __slots__ = ("kernel", "reason")
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    kernel: str
    reason: str
    def __init__(self, kernel: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class KernelReport(_message.Message):
    __slots__ = ("device", "cpu_capability", "linear", "attention")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CPU_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    LINEAR_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    device: str
    cpu_capability: str
    linear: KernelChoice
    attention: KernelChoice
    def __init__(self, device: _Optional[str] = ..., cpu_capability: _Optional[str] = ..., linear: _Optional[_Union[KernelChoice, _Mapping]] = ..., attention: _Optional[_Union[KernelChoice, _Mapping]] = ...) -> None: ...
