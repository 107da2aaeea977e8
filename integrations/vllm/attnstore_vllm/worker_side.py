"""The worker-side half of the connector: vLLM's KV tensors, one step's loads and saves."""

from __future__ import annotations

import re

import structlog
import torch

from attnstore.kvstore_client import KVStoreClient
from attnstore_vllm.kv_layout import KVPacking, KVViews, kv_views
from attnstore_vllm.namespaces import ModelShape, NamespaceRegistry
from attnstore_vllm.plan import StepPlan
from attnstore_vllm.settings import ConnectorSettings
from attnstore_vllm.worker_load import LoadJob
from attnstore_vllm.worker_save import ChunkSaver

log = structlog.get_logger("attnstore_vllm.worker")

_LAYER_NUMBER = re.compile(r"\.(\d+)\.")


def layer_order(names: list[str]) -> list[str]:
    """Attention layer names in model order ("model.layers.10..." after "model.layers.9...")."""

    def number(name: str) -> int:
        found = _LAYER_NUMBER.search(name)
        if found is None:
            raise ValueError(f"cannot tell the layer number of {name!r}")
        return int(found.group(1))

    return sorted(names, key=number)


class WorkerSide:
    def __init__(
        self,
        settings: ConnectorSettings,
        shape: ModelShape,
        store: KVStoreClient,
        registry: NamespaceRegistry,
        dtype: torch.dtype,
        tp_rank: int,
    ) -> None:
        self._settings = settings
        self._rank = tp_rank
        self._shape = shape
        self._store = store
        self._dtype = dtype
        self._saver = ChunkSaver(store, registry, shape.dtype, settings.max_pending_save_bytes, tp_rank)
        self._views: list[KVViews] = []  # per model layer
        self._index: dict[str, int] = {}
        self._job: LoadJob | None = None
        self._failed_blocks: set[int] = set()

    def register(self, kv_caches: dict[str, torch.Tensor], packings: dict[str, KVPacking]) -> None:
        names = layer_order(list(kv_caches))
        if len(names) != self._shape.num_layers:
            raise ValueError(f"{len(names)} attention layers for a model of {self._shape.num_layers}")
        self._views = [
            kv_views(kv_caches[name], packings[name], self._shape.kv_heads, self._shape.head_dim)
            for name in names
        ]
        self._index = {name: index for index, name in enumerate(names)}
        log.info(
            "attnstore connector registered vLLM's KV",
            layers=len(names),
            block_shape=list(self._views[0][0].shape),
        )

    def start_load(self, meta: StepPlan) -> None:
        if meta.loads:
            self._job = LoadJob(
                meta.loads,
                self._views,
                self._dtype,
                self._store,
                self._settings.layer_timeout_seconds,
                self._rank,
            )

    def wait_for_layer(self, layer_name: str) -> None:
        if self._job is not None and layer_name in self._index:
            self._job.wait_for_layer(self._index[layer_name])

    def save_layer(self, layer_name: str, meta: StepPlan) -> None:
        if meta.saves and layer_name in self._index:
            self._saver.gather_layer(meta.saves, self._views[self._index[layer_name]])

    def finish_step(self, meta: StepPlan | None) -> None:
        """After the forward pass: ends the step's loads, then submits its saves."""
        failed_requests: set[str] = set()
        if self._job is not None:
            self._failed_blocks |= self._job.finish()
            failed_requests = self._job.failed
            self._job = None
        if meta is not None and meta.saves:
            self._saver.submit(meta.saves, len(self._views), failed_requests)

    def take_failed_blocks(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed
