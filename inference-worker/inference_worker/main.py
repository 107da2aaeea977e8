"""Entry point: `attnstore-inference-worker` / `python -m inference_worker.main`.

Start: settings, logging, TLS credentials (a bad certificate stops the start before the
model loads), the model (the default one converted on first use), the turn engine (with a
daemon client when `kvstore_address` is set), one warm-up turn, then serve. Health turns
SERVING only after a tiny tensor op on the model's device succeeded, and follows that
check periodically. Stop: in-flight turns finish within the grace period, then pending
KV saves are drained (bounded by the same grace) and the daemon client closes.
"""

from __future__ import annotations

# First: sets OMP_WAIT_POLICY, which libgomp reads only when torch loads it.
from inference_worker import openmp_waiting  # isort: skip
import asyncio
import functools
import os

import structlog
import torch
import transformers

from attnstore.chunks.format import DTYPE_BYTES
from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore.security import SecurityConfigError
from attnstore.server.auth_interceptor import internal_auth_interceptors
from attnstore.server.lifecycle import create_server, serve
from attnstore.server.startup import start_service
from attnstore.settings import run_or_exit
from attnstore.worker.v1 import worker_pb2_grpc
from inference_worker.chat_template import ChatTemplate
from inference_worker.device_check import DeviceCheckFailed, check_device
from inference_worker.dist_attention import servicer as micro_attention
from inference_worker.dist_attention.lender_notice import lender_notice
from inference_worker.engine.memory import PoolTooSmall
from inference_worker.kv_codec import DTYPE_NAMES, TORCH_DTYPES
from inference_worker.model_card import describe_model, request_limits
from inference_worker.model_store import (
    LoadedModel,
    ModelStoreError,
    default_model_dir,
    load_model,
    model_digest,
)
from inference_worker.restore.policy import worker_policy
from inference_worker.servicer import SERVICE_NAME, WorkerServicer
from inference_worker.settings import WorkerSettings
from inference_worker.truncation import ContextWindowError
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import SamplingParams, TurnInput

log = structlog.get_logger("inference_worker")


class StartupError(Exception):
    """The worker cannot start with these settings on this machine; the message says why."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise StartupError(f"device {name!r} was asked for, but CUDA is not available")
    return torch.device(name)


def load(settings: WorkerSettings) -> LoadedModel:
    model_dir = settings.model_dir or default_model_dir(settings.model_cache_dir)
    return load_model(
        model_dir, TORCH_DTYPES[settings.dtype], resolve_device(settings.device), settings.cpu_linear
    )


async def warm_up(engine: TurnEngine) -> None:
    """One tiny turn without the cache: the first forward pass pays for lazy kernel and
    allocator setup (over a second for SmolLM2 on a CPU), so no caller's first turn does."""
    turn = TurnInput(prompt_token_ids=[0], sampling=SamplingParams(max_tokens=2), save_generated=False)
    async for _ in engine.run_turn(turn, None):
        pass


async def run_worker(settings: WorkerSettings) -> None:
    server_credentials = settings.tls.load()
    kvstore_credentials = settings.kvstore_channel.load("kvstore_channel")
    loaded = await asyncio.to_thread(load, settings)
    digest = await asyncio.to_thread(model_digest, loaded.model_dir)
    kvstore = None
    if settings.kvstore_address is not None:
        kvstore = AsyncKVStoreClient(
            settings.kvstore_address,
            use_shm=settings.kvstore_use_shm,
            shm_dir=settings.kvstore_shm_dir,
            credentials=kvstore_credentials,
            data_plane_tls=settings.kvstore_channel.ssl_context(),  # its own daemon's and pool peers'
            verify_checksums=False,  # the prefix loader verifies its own copies (kv_codec)
        )
    restore = await asyncio.to_thread(
        worker_policy,
        loaded.model,
        settings.restore,
        DTYPE_BYTES[DTYPE_NAMES[loaded.dtype]],
        settings.chunk_tokens,
    )  # None (KV, nothing profiled) unless hidden states pay off for this model
    engine = TurnEngine(loaded, kvstore, settings, restore)
    await warm_up(engine)
    limits = request_limits(loaded, settings, engine.window)
    model_card = describe_model(loaded, digest, engine.window, limits, engine.max_turn_context_tokens)
    log.info(
        "worker_starting",
        model=model_card.model_label,
        digest=digest[:16],
        device=str(loaded.device),
        dtype=settings.dtype,
        kvstore=settings.kvstore_address,
    )
    kernels = loaded.kernels
    log.info(
        "kernels",
        device=kernels.device,
        cpu_capability=kernels.cpu_capability,
        linear=kernels.linear.kernel,
        linear_reason=kernels.linear.reason,
        attention=kernels.attention.kernel,
        attention_reason=kernels.attention.reason,
    )

    server = create_server(
        settings.serving, interceptors=internal_auth_interceptors(settings.internal_auth, settings.tls)
    )
    template = ChatTemplate(loaded.tokenizer, settings.special_tokens_in_messages)
    servicer = WorkerServicer(engine, template, limits, model_card)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    lending = micro_attention.add_to_server(
        engine.long_turns.swaps,
        kvstore,
        settings.chunk_tokens,
        server,
        settings.long_context.advertise_kvstore_address,
    )
    notice = lender_notice(settings.long_context, settings.micro_attention, lending)

    async def on_stop() -> None:
        if notice is not None:
            await notice.close()  # first: no home places here while the worker stops
        try:
            await asyncio.wait_for(engine.drain_saves(), settings.shutdown_grace_seconds)
        except TimeoutError:
            log.warning("kv_saves_abandoned", grace_seconds=settings.shutdown_grace_seconds)
        finally:
            await lending.close()
            await engine.close()
            if kvstore is not None:
                await kvstore.close()

    await serve(
        server,
        settings,
        service_names=[SERVICE_NAME, micro_attention.SERVICE_NAME],
        on_stop=on_stop,
        health_probe=functools.partial(
            check_device, loaded.device, loaded.dtype, settings.health_check_timeout_seconds
        ),
        health_probe_interval_seconds=settings.health_check_interval_seconds,
        credentials=server_credentials,
    )


def warn_openmp_not_applied(settings: WorkerSettings) -> None:
    """A config file's OpenMP settings come after torch loaded libgomp, and explicit OpenMP
    variables win over them: says when libgomp runs otherwise than the settings ask."""
    spinning = os.environ.get(openmp_waiting.SPIN_COUNT_VARIABLE)
    if settings.openmp_spin_count is not None and spinning != str(settings.openmp_spin_count):
        log.warning(
            "openmp_spin_count_not_applied", setting=settings.openmp_spin_count, gomp_spincount=spinning
        )
    binding = os.environ.get(openmp_waiting.BIND_VARIABLE)
    if settings.openmp_pin_threads and (binding or "false").lower() == "false":
        log.warning("openmp_pin_threads_not_applied", omp_proc_bind=binding)


def main() -> None:
    openmp_waiting.release_loading_thread()  # before any thread starts: they inherit its cores
    settings = start_service(WorkerSettings, "attnstore-inference-worker", large_buffers=True)
    warn_openmp_not_applied(settings)
    transformers.utils.logging.disable_progress_bar()
    startup_errors = (
        ModelStoreError,
        StartupError,
        DeviceCheckFailed,
        ContextWindowError,
        PoolTooSmall,
        SecurityConfigError,
    )
    run_or_exit("attnstore-inference-worker", asyncio.run, run_worker(settings), startup_errors)


if __name__ == "__main__":
    main()
