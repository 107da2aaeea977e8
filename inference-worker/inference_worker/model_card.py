"""What the worker tells the scheduler about its model (DescribeModel), and the request
limits that follow from the settings and the model."""

from __future__ import annotations

from attnstore.chunks.format import DTYPE_BYTES
from attnstore.same_named import same_named
from attnstore.worker.v1 import worker_pb2 as pb
from inference_worker.kernels import KernelReport
from inference_worker.kv_codec import DTYPE_NAMES
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import LoadedModel
from inference_worker.settings import WorkerSettings
from inference_worker.truncation import ContextWindow
from inference_worker.validation import RequestLimits


def request_limits(loaded: LoadedModel, settings: WorkerSettings, window: ContextWindow) -> RequestLimits:
    """The settings' limits; max_tokens capped so that every prompt fits the window once truncated."""
    return same_named(
        RequestLimits,
        settings,
        vocab_size=ModelGeometry.of(loaded.config).vocab_size,
        max_new_tokens=min(settings.max_new_tokens, window.max_new_tokens),
    )


def describe_model(
    loaded: LoadedModel,
    digest: str,
    window: ContextWindow,
    limits: RequestLimits,
    max_turn_context_tokens: int,
) -> pb.DescribeModelResponse:
    geometry = ModelGeometry.of(loaded.config)
    dtype = DTYPE_NAMES[loaded.dtype]
    return pb.DescribeModelResponse(
        model_label=loaded.model_dir.name,
        model_digest=digest,
        dtype=dtype,
        num_layers=geometry.num_layers,
        kv_heads=geometry.kv_heads,
        head_dim=geometry.head_dim,
        chunk_tokens=window.chunk_tokens,
        max_context_tokens=window.max_context_tokens,
        kv_bytes_per_token=geometry.kv_bytes_per_token(DTYPE_BYTES[dtype]),
        vocab_size=limits.vocab_size,
        max_prompt_tokens=limits.max_prompt_tokens,
        max_new_tokens=limits.max_new_tokens,
        attention_sink_tokens=window.sink_tokens,
        max_samples=limits.max_samples,
        max_turn_context_tokens=max_turn_context_tokens,
        kernels=kernels_message(loaded.kernels),
    )


def kernels_message(kernels: KernelReport) -> pb.KernelReport:
    return same_named(
        pb.KernelReport,
        kernels,
        linear=same_named(pb.KernelChoice, kernels.linear),
        attention=same_named(pb.KernelChoice, kernels.attention),
    )
