"""vLLM CPU 0.32.0 with AttnStoreConnector and a real daemon process, against vLLM alone.

One engine with the connector and one without start side by side for the module. Each
test takes its own random prompt P, runs P on both, then P + a suffix: the baseline from
vLLM's own prefix cache, the connector engine after its prefix cache was cleared, so its
prefix can only come from the daemon. Output token ids and log-probs must be equal.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from attnstore.chunks.format import decode_layout
from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client import KVStoreClient
from attnstore.shm_arena import SharedArena
from attnstore_vllm.settings import ConnectorSettings, kv_transfer_config
from inference_worker.model_store import model_digest
from kvstore_daemon.launcher import DaemonProcess

BLOCK_TOKENS = 32
CHUNK_TOKENS = 64  # two vLLM blocks
PROMPT_TOKENS = 200  # three full chunks (192 tokens) and a partial one
SUFFIX_TOKENS = 100
MAX_TOKENS = 8
HIT_TOKENS = 3 * CHUNK_TOKENS
MiB = 1024 * 1024
SAVE_DEADLINE_SECONDS = 30.0

pytestmark = pytest.mark.timeout(1200)  # the first run installs vLLM CPU (about 2 minutes)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path]) -> Path:
    # head_dim 32: the smallest head size vLLM's CPU attention supports.
    return tiny_model_saver(
        tmp_path_factory.mktemp("vllm-model"),
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        max_position_embeddings=1024,
    )


@pytest.fixture(scope="module")
def engines(vllm_engine: Callable[..., Any], model_dir: Path, daemon: DaemonProcess) -> tuple[Any, Any]:
    """(vLLM with the connector, vLLM alone), started together."""
    options = {"block_size": BLOCK_TOKENS, "kv_cache_bytes": 64 * MiB}
    connector_config = kv_transfer_config(
        ConnectorSettings(
            daemon=daemon.address,
            chunk_tokens=CHUNK_TOKENS,
            model_digest=model_digest(model_dir),  # the attnstore worker's: they share chunks
            lookup_timeout_seconds=2.0,
            rpc_timeout_seconds=2.0,
        )
    )
    with_store = vllm_engine(model_dir, "with-connector", kv_transfer_config=connector_config, **options)
    alone = vllm_engine(model_dir, "alone", **options)
    with_store.wait_ready()
    alone.wait_ready()
    return with_store, alone


@pytest.fixture(scope="module")
def store(daemon: DaemonProcess) -> Iterator[KVStoreClient]:
    with KVStoreClient(daemon.address, timeout_seconds=5.0) as client:
        yield client


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 300) for _ in range(length)]


def chunk_keys(model_dir: Path, tokens: list[int]) -> tuple[bytes, list[bytes]]:
    """The attnstore worker's namespace and keys for `tokens` (inference_worker.namespaces)."""
    namespace = NamespaceSpec(model_digest(model_dir), "float32", CHUNK_TOKENS).namespace_id()
    return namespace, chunk_key_chain(namespace, tokens, CHUNK_TOKENS)


def flip_last_byte_in_the_arena(daemon: DaemonProcess, namespace: bytes, key: bytes) -> None:
    """Corrupts a stored chunk where it lies in the daemon's shared memory (its last V value)."""
    with grpc.insecure_channel(daemon.address) as channel:
        stub = kvstore_pb2_grpc.KVStoreStub(channel)
        shm = stub.OpenShm(kvstore_pb2.OpenShmRequest())
        located = stub.GetShm(kvstore_pb2.GetShmRequest(namespace=namespace, keys=[key]))
        arena = SharedArena(Path(shm.path), shm.size_bytes)
        try:
            chunk = located.chunks[0]
            extents = [(extent.offset_bytes, extent.length_bytes) for extent in chunk.extents]
            last = arena.read(extents, chunk.size_bytes - 1, chunk.size_bytes)
            arena.write(extents, chunk.size_bytes - 1, bytes([last[0] ^ 0xFF]))
        finally:
            arena.close()
            stub.ReleaseLease(kvstore_pb2.ReleaseLeaseRequest(lease_ids=[located.lease_id]))


def counters(engine: Any) -> dict[str, float]:
    return {name.removeprefix("attnstore_vllm_"): value for name, value in engine.call(op="metrics").items()}


def wait_for_saved(engine: Any, at_least: float) -> dict[str, float]:
    deadline = time.monotonic() + SAVE_DEADLINE_SECONDS
    while (now := counters(engine))["saved_chunks"] < at_least:
        assert time.monotonic() < deadline, f"saves did not land: {now}"
        time.sleep(0.05)
    return now


def run_both(engines: tuple[Any, Any], first: list[int], second: list[int]) -> tuple[dict, dict]:
    """`first` on both engines, then `second` on the baseline from its own prefix cache and
    on the connector engine with its prefix cache cleared."""
    with_store, alone = engines
    assert with_store.call(op="generate", prompt=first, max_tokens=MAX_TOKENS) == alone.call(
        op="generate", prompt=first, max_tokens=MAX_TOKENS
    )
    expected = alone.call(op="generate", prompt=second, max_tokens=MAX_TOKENS)
    assert with_store.call(op="reset_prefix_cache") == {"ok": True}
    return with_store.call(op="generate", prompt=second, max_tokens=MAX_TOKENS), expected


def test_the_prefix_loads_from_the_daemon_and_the_output_equals_vllm_alone(engines, store, model_dir) -> None:
    with_store, _ = engines
    first = prompt(1, PROMPT_TOKENS)
    second = first + prompt(2, SUFFIX_TOKENS)
    namespace, keys = chunk_keys(model_dir, first)
    before = counters(with_store)
    dram_hits = store.stats().dram.hits

    with_store.call(op="generate", prompt=first, max_tokens=MAX_TOKENS)
    saved = wait_for_saved(with_store, before["saved_chunks"] + len(keys))
    assert store.lookup(namespace, keys).prefix_length == len(keys)  # in the project's format and keys
    assert store.get_whole_chunks(namespace, keys[:1])[0][:4] == b"ATKV"
    assert with_store.call(op="reset_prefix_cache") == {"ok": True}
    got, expected = run_both(engines, first, second)

    after = counters(with_store)
    assert got == expected
    assert after["hit_tokens"] - saved["hit_tokens"] >= HIT_TOKENS
    assert after["loaded_chunks"] - saved["loaded_chunks"] >= len(keys)
    assert after["load_bytes"] > saved["load_bytes"] and after["load_seconds"] > saved["load_seconds"]
    assert after["load_errors"] == before["load_errors"]
    assert after["save_bytes"] > 0 and after["save_seconds"] > 0
    assert store.stats().dram.hits >= dram_hits + len(keys)  # the daemon served them


def test_a_corrupt_chunk_is_recomputed_counted_and_replaced(engines, store, daemon, model_dir) -> None:
    with_store, _ = engines
    first = prompt(3, PROMPT_TOKENS)
    second = first + prompt(4, SUFFIX_TOKENS)
    namespace, keys = chunk_keys(model_dir, first)
    before = counters(with_store)
    with_store.call(op="generate", prompt=first, max_tokens=MAX_TOKENS)
    wait_for_saved(with_store, before["saved_chunks"] + len(keys))
    good = store.get_whole_chunks(namespace, [keys[1]])[0]
    flip_last_byte_in_the_arena(daemon, namespace, keys[1])  # the daemon checks puts, not its memory
    assert with_store.call(op="reset_prefix_cache") == {"ok": True}

    got, expected = run_both(engines, first, second)

    after = counters(with_store)
    assert got == expected
    assert after["load_errors"] == before["load_errors"] + 1
    assert "Recovered from KV load failure" in with_store.log_path.read_text()  # vLLM recomputed
    # The bad chunk was deleted and the recompute saved a good one: the next run loads it.
    deadline = time.monotonic() + SAVE_DEADLINE_SECONDS
    while store.lookup(namespace, keys).prefix_length < len(keys):
        assert time.monotonic() < deadline, "the recomputed chunk was not saved again"
        time.sleep(0.05)
    assert store.get_whole_chunks(namespace, [keys[1]])[0] == good  # checksums verified on read


def test_chunks_saved_by_vllm_hold_the_models_kv_as_the_attnstore_worker_reads_it(
    engines, store, model_dir
) -> None:
    """Equal outputs prove vLLM reads back what it wrote; this proves what it wrote is the
    project's format: per layer K then V [kv_heads, tokens, head_dim], keys rotated at their
    positions, under the worker's namespace and keys, equal to transformers' own KV."""
    import torch
    from transformers import AutoModelForCausalLM

    with_store, _ = engines
    tokens = prompt(7, PROMPT_TOKENS)
    namespace, keys = chunk_keys(model_dir, tokens)
    before = counters(with_store)
    with_store.call(op="generate", prompt=tokens, max_tokens=1)
    wait_for_saved(with_store, before["saved_chunks"] + len(keys))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        cache = model(torch.tensor([tokens]), use_cache=True).past_key_values

    for index, data in enumerate(store.get_whole_chunks(namespace, keys)):
        layout = decode_layout(data)
        header = layout.header
        assert (header.tokens, header.base_position) == (CHUNK_TOKENS, index * CHUNK_TOKENS)
        span = slice(index * CHUNK_TOKENS, (index + 1) * CHUNK_TOKENS)
        for layer in range(header.num_layers):
            start, end = layout.layer_span(layer, layer + 1)
            stored = torch.frombuffer(bytearray(data[start:end]), dtype=torch.float32)
            k, v = stored.view(2, header.kv_heads, header.tokens, header.head_dim)
            torch.testing.assert_close(k, cache.layers[layer].keys[0, :, span], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(v, cache.layers[layer].values[0, :, span], atol=1e-4, rtol=1e-4)


def test_vllm_keeps_answering_when_the_daemon_dies(engines, daemon) -> None:
    with_store, _ = engines
    first = prompt(5, PROMPT_TOKENS)
    second = first + prompt(6, SUFFIX_TOKENS)
    before = counters(with_store)
    with_store.call(op="generate", prompt=first, max_tokens=MAX_TOKENS)
    wait_for_saved(with_store, before["saved_chunks"] + 3)
    daemon.kill9()

    got, expected = run_both(engines, first, second)

    assert got == expected
    after = counters(with_store)
    assert after["lookup_errors"] > before["lookup_errors"]
