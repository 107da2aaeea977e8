"""A turn whose history is restored through a real daemon with any mix of the three methods
(recomputation of the first layers, hidden states projected to K and V, KV loaded) gives
the same greedy tokens as recomputing it all. A random-weight multi-head Llama (fp32): its
hidden states are half the bytes of its KV."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from attnstore.chunks.format import LayerForm, decode_layout
from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.engine import Engine
from inference_worker.engine.model_runner import PagedModelRunner
from inference_worker.engine.sequence import Sequence
from inference_worker.layerwise_cache import PrefixKV
from inference_worker.model_geometry import ModelGeometry
from inference_worker.restore.capture import HiddenCapture
from inference_worker.restore.codec import encode_restore_chunks
from inference_worker.restore.loader import restore_prefix
from inference_worker.restore.planner import RestorePlan
from inference_worker.restore.storage_plan import StoragePlan
from kvstore_daemon.launcher import DaemonProcess

CHUNK = 16
HISTORY = 3 * CHUNK
NEW = 7
STEPS = 8
LAYERS = 3


@pytest.fixture(scope="module")
def mha_model() -> PreTrainedModel:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
        max_position_embeddings=512,
        initializer_range=0.2,
    )
    return LlamaForCausalLM(config).to(torch.float32).eval()


def make_engine(model: PreTrainedModel) -> Engine:
    kv = PagedKV(ModelGeometry.of(model.config), 64, 4, torch.float32, model.device)
    return Engine(PagedModelRunner(model, kv), BlockPool(64, 4), max_batch_tokens=256, max_batch_sequences=4)


def prompt() -> list[int]:
    return torch.randint(0, 256, (HISTORY + NEW,), generator=torch.Generator().manual_seed(3)).tolist()


async def greedy(engine: Engine, seq: Sequence) -> list[int]:
    tokens = [out.token async for out in engine.generate(seq) if out.token is not None]
    engine.release(seq)
    return tokens


async def history_state(model: PreTrainedModel, tokens: list[int]):
    """The history's per-layer KV and input hidden states, as the paged forward computed them."""
    engine = make_engine(model)
    capture = HiddenCapture(engine.runner)
    seq = Sequence.of(tokens[:HISTORY])
    capture.watch(seq)
    try:
        async for _ in engine.generate(seq):
            pass
        kv = engine.kv.span(seq.block_table, 0, HISTORY)
        engine.release(seq)
    finally:
        await engine.close()
    return kv, capture.take(seq)[1]


@pytest.mark.parametrize(
    ("storage", "recompute"),
    [
        (StoragePlan(LAYERS, 0, LAYERS), 0),  # hidden states only
        (StoragePlan(LAYERS, 0, LAYERS), 2),  # recompute 2, hidden 1
        (StoragePlan(LAYERS, 1, 1), 1),  # all three: recompute, hidden, KV
        (StoragePlan(LAYERS, 1, 1), LAYERS),  # all recomputed, nothing read
        (StoragePlan.all_kv(LAYERS), 0),  # KV only (classic chunks)
        (StoragePlan.all_kv(LAYERS), 1),  # recompute 1, KV 2
    ],
    ids=lambda value: value.name if isinstance(value, StoragePlan) else f"r{value}",
)
async def test_any_mix_gives_the_greedy_tokens_of_recomputation(
    mha_model: PreTrainedModel, daemon: DaemonProcess, storage: StoragePlan, recompute: int
) -> None:
    await check_restore(mha_model, daemon, storage, recompute)


@pytest.mark.gpu
async def test_a_mix_of_all_three_restores_on_cuda(mha_model: PreTrainedModel, daemon: DaemonProcess) -> None:
    """The CUDA path: pieces decoded onto the GPU, projections and recomputation there."""
    cuda = LlamaForCausalLM(mha_model.config).to(torch.float32).eval()
    cuda.load_state_dict(mha_model.state_dict())
    await check_restore(cuda.to("cuda"), daemon, StoragePlan(LAYERS, 1, 1), 1)


async def check_restore(
    mha_model: PreTrainedModel, daemon: DaemonProcess, storage: StoragePlan, recompute: int
) -> None:
    """Restores the history under `storage` with `recompute` layers recomputed into a
    sequence: its greedy tokens are recomputation's, its timeline and bytes what it did."""
    tokens = prompt()
    reference_engine = make_engine(mha_model)
    try:
        expected = await greedy(reference_engine, Sequence.of(tokens, max_new_tokens=STEPS))
    finally:
        await reference_engine.close()
    kv, hidden = await history_state(mha_model, tokens)
    assert [h.shape for h in hidden] == [(HISTORY, 64)] * LAYERS

    namespace = NamespaceSpec("mha", "float32", CHUNK, storage_plan=storage.namespace_tag).namespace_id()
    keys = chunk_key_chain(namespace, tokens[:HISTORY], CHUNK)
    chunks = encode_restore_chunks(
        namespace, keys, storage, ModelGeometry.of(mha_model.config), kv, hidden, CHUNK, 0
    )
    plan = RestorePlan.of(storage, recompute)
    engine = make_engine(mha_model)
    with ThreadPoolExecutor(1) as compute:
        async with AsyncKVStoreClient(daemon.address) as client:
            await client.register_namespace(
                namespace, num_layers=LAYERS, kv_heads=4, head_dim=16, chunk_tokens=CHUNK, dtype="float32"
            )
            await client.put_chunks(namespace, list(zip(keys, chunks, strict=True)))
            prefix = PrefixKV(LAYERS, HISTORY)
            restoring = asyncio.create_task(
                restore_prefix(
                    client,
                    namespace,
                    keys,
                    prefix,
                    model=mha_model,
                    storage=storage,
                    plan=plan,
                    token_ids=tokens,
                    compute=compute,
                    tail_tokens=CHUNK,  # as if the last chunk were a history's partial one
                )
            )
            seq = Sequence.of(tokens, max_new_tokens=STEPS, prefix=prefix)
            try:
                got = await greedy(engine, seq)
            finally:
                await engine.close()
            stats = await restoring
    assert seq.load_failure is None
    assert got == expected
    layouts = [decode_layout(chunk) for chunk in chunks]
    read = sum(end - start for start, end in (layout.layer_span(recompute, LAYERS) for layout in layouts))
    assert stats.bytes_read == read  # the recomputed layers were not read
    assert stats.plan == plan
    spans = stats.timeline.spans
    assert all(0 <= span.start_seconds <= span.end_seconds for span in spans)
    reads = {span.layer: span for span in spans if span.part == "read"}
    assert sorted(reads) == list(range(recompute, LAYERS))
    assert sorted(span.layer for span in spans if span.part == "decode") == list(range(recompute, LAYERS))
    projections = [span for span in spans if span.part == "project"]  # chunk by chunk
    assert sorted(span.layer for span in projections) == [
        layer for layer in range(recompute, recompute + plan.hidden_layers) for _ in keys
    ]
    for layer in {span.layer for span in projections}:
        own = [span for span in projections if span.layer == layer]
        assert min(span.start_seconds for span in own) >= reads[layer].start_seconds
        assert max(span.end_seconds for span in own) >= reads[layer].end_seconds  # the last chunk's waits
        # assembled from the chunks' projections: the paged forward's K and V of the layer
        k, v = prefix.wait_layer(layer, 0.0)
        torch.testing.assert_close(k, kv[layer][0], atol=1e-4, rtol=0)
        torch.testing.assert_close(v, kv[layer][1], atol=1e-4, rtol=0)
    assert [span.layer for span in spans if span.part == "recompute"] == ([0] if recompute else [])
    # the last chunk's hidden states of every HIDDEN layer, read or recomputed (for the capture)
    assert sorted(stats.tail_hidden) == [
        layer for layer, form in enumerate(storage.forms) if form is LayerForm.HIDDEN
    ]
    for layer, states in stats.tail_hidden.items():
        torch.testing.assert_close(states, hidden[layer][-CHUNK:], atol=1e-4, rtol=0)
