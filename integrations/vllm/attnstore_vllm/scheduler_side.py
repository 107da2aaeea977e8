"""The scheduler-side half of the connector: which prompt tokens the daemon holds, where
vLLM puts them, and which completed chunks to save.

Per request: the chained keys of the prompt's full chunks (attnstore.chunks.keys) in its
tenant's namespace, one chain per tensor-parallel rank, and one Lookup (of rank 0's
chain: the ranks save the same chunks together; a chunk another rank lacks fails that
rank's load, and vLLM recomputes). vLLM is offered the hit minus what its own prefix
cache holds, in whole chunks (so whole blocks), and never the chunk holding the last
prompt token: that token's logits start decoding, so it is always computed. Chunks from
the first one the daemon lacks are saved in the step whose forward completes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from attnstore.chunks.keys import chunk_key_chain
from attnstore.kvstore_client import KVStoreClient, Tier
from attnstore_vllm import metrics
from attnstore_vllm.namespaces import ModelShape, NamespaceRegistry, namespace_id
from attnstore_vllm.plan import LoadSpec, SaveSpec, StepPlan
from attnstore_vllm.settings import TENANT_PARAM, ConnectorSettings


@dataclass
class _Request:
    namespaces: tuple[bytes, ...]  # per tensor-parallel rank
    chains: tuple[list[bytes], ...]  # per rank: the keys of the prompt's full chunks
    tiers: list[Tier]  # the Lookup's answer: the tier of each leading chunk the daemon holds
    offered_from: int  # vLLM's own hit when the daemon's was offered
    block_ids: list[int]
    next_save: int  # the first chunk not yet handed to the worker for saving
    external_tokens: int = 0  # to load in the request's first step


class SchedulerSide:
    def __init__(
        self,
        settings: ConnectorSettings,
        shape: ModelShape,
        block_size: int,
        store: KVStoreClient,
        registry: NamespaceRegistry,
    ) -> None:
        self._settings = settings
        self._shape = shape
        self._chunk_tokens = settings.chunk_tokens
        self._blocks_per_chunk = settings.chunk_tokens // block_size
        self._store = store
        self._registry = registry
        self._requests: dict[str, _Request] = {}

    def matched_tokens(self, req_id: str, prompt: list[int], tenant: str | None, num_computed: int) -> int:
        """Tokens beyond `num_computed` that the daemon holds and vLLM may load."""
        if len(prompt) < self._chunk_tokens:
            return 0
        salt = tenant if tenant is not None else self._settings.tenant
        namespaces = tuple(
            namespace_id(self._shape, self._chunk_tokens, salt, rank) for rank in range(self._shape.tp_size)
        )
        chains = tuple(chunk_key_chain(namespace, prompt, self._chunk_tokens) for namespace in namespaces)
        tiers = self._lookup(namespaces[0], chains[0])
        self._requests[req_id] = _Request(namespaces, chains, tiers, num_computed, [], next_save=len(tiers))
        loadable = min(len(tiers), (len(prompt) - 1) // self._chunk_tokens) * self._chunk_tokens
        return max(0, loadable - num_computed)

    def _lookup(self, namespace: bytes, keys: list[bytes]) -> list[Tier]:
        metrics.LOOKUPS.inc()
        if not self._registry.ensure(namespace):
            metrics.LOOKUP_ERRORS.inc()
            return []
        try:
            found = self._store.call(
                self._store.aio.lookup(namespace, keys), self._settings.lookup_timeout_seconds
            )
        except Exception:  # noqa: BLE001 -- any failure of the store is a miss
            metrics.LOOKUP_ERRORS.inc()
            return []
        return found.tiers[: found.prefix_length]

    def hit_tiers(self, req_id: str, num_external_tokens: int) -> dict[Tier, int]:
        """How many of the offered tokens each daemon tier holds."""
        request = self._requests.get(req_id)
        counts: dict[Tier, int] = {}
        if request is None:
            return counts
        start, end = request.offered_from, request.offered_from + num_external_tokens
        for chunk in range(start // self._chunk_tokens, -(-end // self._chunk_tokens)):
            overlap = min(end, (chunk + 1) * self._chunk_tokens) - max(start, chunk * self._chunk_tokens)
            tier = request.tiers[chunk]
            counts[tier] = counts.get(tier, 0) + overlap
        return counts

    def after_alloc(self, req_id: str, num_external_tokens: int) -> None:
        if num_external_tokens > 0 and req_id in self._requests:
            self._requests[req_id].external_tokens = num_external_tokens
            metrics.HIT_TOKENS.inc(num_external_tokens)

    def build_meta(
        self,
        new: Iterable[tuple[str, list[int], int]],
        cached: Iterable[tuple[str, list[int] | None, bool, int]],
        scheduled_tokens: dict[str, int],
    ) -> StepPlan:
        """`new`: (req id, block ids, computed tokens) of first-scheduled requests; `cached`:
        (req id, new block ids, resumed, computed tokens) of the others."""
        meta = StepPlan()
        for req_id, block_ids, computed in new:
            if (request := self._requests.get(req_id)) is not None:
                request.block_ids = list(block_ids)
                self._plan(meta, req_id, request, computed, scheduled_tokens.get(req_id, 0))
        for req_id, new_block_ids, resumed, computed in cached:
            if (request := self._requests.get(req_id)) is None:
                continue
            if new_block_ids is not None:  # a resumed request gets all of its blocks anew
                request.block_ids = (
                    list(new_block_ids) if resumed else request.block_ids + list(new_block_ids)
                )
            self._plan(meta, req_id, request, computed, scheduled_tokens.get(req_id, 0))
        return meta

    def _plan(self, meta: StepPlan, req_id: str, request: _Request, computed: int, scheduled: int) -> None:
        per_chunk = self._blocks_per_chunk
        if request.external_tokens:
            local = computed - request.external_tokens  # vLLM's own prefix-cache hit, whole blocks
            first, end = local // self._chunk_tokens, computed // self._chunk_tokens
            meta.loads.append(
                LoadSpec(
                    req_id=req_id,
                    namespaces=request.namespaces,
                    keys=tuple(tuple(chain[first:end]) for chain in request.chains),
                    block_ids=tuple(request.block_ids[first * per_chunk : end * per_chunk]),
                    skip_blocks=(local - first * self._chunk_tokens) // (self._chunk_tokens // per_chunk),
                )
            )
            request.external_tokens = 0
        ready = min((computed + scheduled) // self._chunk_tokens, len(request.chains[0]))
        for chunk in range(request.next_save, ready):
            meta.saves.append(
                SaveSpec(
                    req_id=req_id,
                    namespaces=request.namespaces,
                    keys=tuple(chain[chunk] for chain in request.chains),
                    block_ids=tuple(request.block_ids[chunk * per_chunk : (chunk + 1) * per_chunk]),
                    base_position=chunk * self._chunk_tokens,
                )
            )
        request.next_save = max(request.next_save, ready)

    def on_invalid_blocks(self, block_ids: set[int]) -> None:
        """Blocks whose load failed are recomputed by vLLM; their chunks are saved again."""
        for request in self._requests.values():
            for position, block in enumerate(request.block_ids):
                if block in block_ids:
                    request.next_save = min(request.next_save, position // self._blocks_per_chunk)
                    break

    def finished(self, req_id: str) -> None:
        self._requests.pop(req_id, None)


def request_tenant(kv_transfer_params: dict | None) -> str | None:
    """The tenant a request names in its kv_transfer_params, if any."""
    value = (kv_transfer_params or {}).get(TENANT_PARAM)
    return str(value) if value is not None else None
