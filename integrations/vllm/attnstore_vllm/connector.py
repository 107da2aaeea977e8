"""`AttnStoreConnector`: vLLM V1 reuses prefix KV through the attnstore daemon.

    --kv-transfer-config '{"kv_connector": "AttnStoreConnector",
                           "kv_connector_module_path": "attnstore_vllm.connector",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"daemon": "127.0.0.1:50051"}}'

vLLM builds one instance in its scheduler (role SCHEDULER: scheduler_side.py) and one in
each worker (role WORKER: worker_side.py); this class only routes vLLM's calls to them.
Loads are synchronous in vLLM's sense (they complete within the step that needs them,
layer by layer), saves asynchronous (after the step, off its path). vLLM's
`kv_load_failure_policy` is set to "recompute": a store failure never fails a request.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from attnstore.kvstore_client import KVStoreClient, Tier
from attnstore_vllm.kv_layout import BACKEND_PACKINGS, CPU_VEC_ISAS, KVPacking
from attnstore_vllm.namespaces import DTYPE_NAMES, ModelShape, NamespaceRegistry, config_digest
from attnstore_vllm.plan import StepPlan
from attnstore_vllm.scheduler_side import SchedulerSide, request_tenant
from attnstore_vllm.settings import ConnectorSettings
from attnstore_vllm.worker_side import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = init_logger(__name__)


def model_shape(vllm_config: VllmConfig, settings: ConnectorSettings) -> ModelShape:
    model, parallel, cache = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    if parallel.pipeline_parallel_size > 1:
        raise ValueError("AttnStoreConnector does not support pipeline parallelism")
    if cache.cache_dtype != "auto":
        raise ValueError(
            f"AttnStoreConnector stores KV in the model's dtype, not kv_cache_dtype={cache.cache_dtype}"
        )
    if settings.chunk_tokens % cache.block_size:
        raise ValueError(
            f"chunk_tokens {settings.chunk_tokens} is not a multiple of block_size {cache.block_size}"
        )
    return ModelShape(
        label=str(model.served_model_name or model.model),
        digest=settings.model_digest or config_digest(str(model.model), model.hf_config.to_json_string()),
        dtype=DTYPE_NAMES[str(model.dtype)],
        num_layers=model.get_num_layers(parallel),
        kv_heads=model.get_num_kv_heads(parallel),
        head_dim=model.get_head_size(),
        tp_size=parallel.tensor_parallel_size,
    )


def layer_packing(layer: Any) -> KVPacking:
    """How the attention layer's backend packs K and V (kv_layout.py); refuses the unknown."""
    backend = layer.attn_backend.get_name()
    if backend not in BACKEND_PACKINGS:
        raise ValueError(f"AttnStoreConnector does not know the KV layout of attention backend {backend}")
    isa = getattr(layer, "isa", None)  # set by the CPU backend's metadata builder
    if backend == "CPU_ATTN" and isa not in CPU_VEC_ISAS:
        raise ValueError(f"AttnStoreConnector does not support the CPU attention kernel {isa!r} (only vec)")
    return BACKEND_PACKINGS[backend]


_TIER_SOURCES = {Tier.DRAM: CacheHitSource.HOST, Tier.SSD: CacheHitSource.DISK}


class AttnStoreMetadata(StepPlan, KVConnectorMetadata):
    """A step's plan as vLLM's connector metadata."""


class AttnStoreConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._settings = ConnectorSettings.from_extra_config(
            self._kv_transfer_config.kv_connector_extra_config
        )
        self._shape = model_shape(vllm_config, self._settings)
        # vLLM calls the connector from threads without an event loop: the client runs its
        # own, where loads and saves overlap the forward pass. Loads verify each layer
        # themselves, right after copying it (worker_load.py).
        self._store = KVStoreClient(
            self._settings.daemon,
            use_shm=self._settings.use_shm,
            shm_dir=Path(self._settings.shm_dir) if self._settings.shm_dir else None,
            timeout_seconds=self._settings.rpc_timeout_seconds,
            verify_checksums=False,
        )
        registry = NamespaceRegistry(self._register)
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            if self._kv_transfer_config.kv_load_failure_policy != "recompute":
                logger.info(
                    "AttnStoreConnector sets kv_load_failure_policy=recompute: store failures recompute"
                )
                self._kv_transfer_config.kv_load_failure_policy = "recompute"
            self._scheduler = SchedulerSide(
                self._settings, self._shape, vllm_config.cache_config.block_size, self._store, registry
            )
        else:
            self._worker = WorkerSide(
                self._settings,
                self._shape,
                self._store,
                registry,
                vllm_config.model_config.dtype,
                get_tensor_model_parallel_rank(),
            )

    def _register(self, namespace: bytes) -> None:
        shape = self._shape
        register = self._store.aio.register_namespace(
            namespace,
            num_layers=shape.num_layers,
            kv_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            chunk_tokens=self._settings.chunk_tokens,
            dtype=shape.dtype,
            model_label=shape.label,
        )
        self._store.call(register, self._settings.rpc_timeout_seconds)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped save is a future miss

    # Worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        context = self._vllm_config.compilation_config.static_forward_context
        self._worker.register(kv_caches, {name: layer_packing(context[name]) for name in kv_caches})

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_load(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        assert self._worker is not None
        self._worker.wait_for_layer(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        assert self._worker is not None
        self._worker.save_layer(layer_name, self._meta())

    def wait_for_save(self) -> None:
        assert self._worker is not None
        self._worker.finish_step(self._meta() if self.has_connector_metadata() else None)

    def get_block_ids_with_load_errors(self) -> set[int]:
        assert self._worker is not None
        return self._worker.take_failed_blocks()

    def _meta(self) -> StepPlan:
        meta = self._get_connector_metadata()
        assert isinstance(meta, AttnStoreMetadata)
        return meta

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):  # closing a dead channel must not fail vLLM's shutdown
            self._store.close(self._settings.rpc_timeout_seconds)

    # Scheduler side

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        prompt = list(request.prompt_token_ids or [])
        tenant = request_tenant(request.kv_transfer_params)
        return self._scheduler.matched_tokens(request.request_id, prompt, tenant, num_computed_tokens), False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        assert self._scheduler is not None
        self._scheduler.after_alloc(request.request_id, num_external_tokens)

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        assert self._scheduler is not None
        tiers = self._scheduler.hit_tiers(request.request_id, num_external_tokens)
        return {_TIER_SOURCES[tier]: tokens for tier, tokens in tiers.items() if tokens}

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> AttnStoreMetadata:
        assert self._scheduler is not None
        cached = scheduler_output.scheduled_cached_reqs
        plan = self._scheduler.build_meta(
            new=[
                (req.req_id, req.block_ids[0], req.num_computed_tokens)
                for req in scheduler_output.scheduled_new_reqs
            ],
            cached=[
                (req_id, None if blocks is None else blocks[0], req_id in cached.resumed_req_ids, computed)
                for req_id, blocks, computed in zip(
                    cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=True
                )
            ],
            scheduled_tokens=scheduler_output.num_scheduled_tokens,
        )
        return AttnStoreMetadata(loads=plan.loads, saves=plan.saves)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        assert self._scheduler is not None
        if connector_output.invalid_block_ids:
            self._scheduler.on_invalid_blocks(connector_output.invalid_block_ids)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        self._scheduler.finished(request.request_id)
        return False, None  # saves copied the KV out already: the blocks may go now
