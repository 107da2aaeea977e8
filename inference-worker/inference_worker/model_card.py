"""What the worker tells the scheduler about its model (DescribeModel), and the request
limits that follow from the settings and the model."""

from __future__ import annotations

from attnstore.chunks.format import DTYPE_BYTES
from attnstore.worker.v1 import worker_pb2 as pb
from inference_worker.kv_codec import DTYPE_NAMES
from inference_worker.model_store import LoadedModel
from inference_worker.settings import WorkerSettings
from inference_worker.truncation import ContextWindow
from inference_worker.validation import RequestLimits


def request_limits(loaded: LoadedModel, settings: WorkerSettings, window: ContextWindow) -> RequestLimits:
    """The settings' limits; max_tokens capped so that every prompt fits the window once truncated."""
    return RequestLimits(
        vocab_size=int(loaded.config.vocab_size),
        max_prompt_tokens=settings.max_prompt_tokens,
        max_new_tokens=min(settings.max_new_tokens, window.max_new_tokens),
        max_message_chars=settings.max_message_chars,
        max_messages=settings.max_messages,
    )


def describe_model(
    loaded: LoadedModel, digest: str, window: ContextWindow, limits: RequestLimits
) -> pb.DescribeModelResponse:
    config = loaded.config
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    num_layers = int(config.num_hidden_layers)
    dtype = DTYPE_NAMES[loaded.dtype]
    return pb.DescribeModelResponse(
        model_label=loaded.model_dir.name,
        model_digest=digest,
        dtype=dtype,
        num_layers=num_layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        chunk_tokens=window.chunk_tokens,
        max_context_tokens=window.max_context_tokens,
        kv_bytes_per_token=2 * num_layers * kv_heads * head_dim * DTYPE_BYTES[dtype],  # K and V
        vocab_size=limits.vocab_size,
        max_prompt_tokens=limits.max_prompt_tokens,
        max_new_tokens=limits.max_new_tokens,
        attention_sink_tokens=window.sink_tokens,
        kernels=loaded.kernels.message(),
    )
