"""`make run` for now: starts a KV-store daemon and walks a three-turn conversation
through it, showing the prefix each turn finds cached and what reading it costs over
shared memory and over gRPC. The KV bytes are random (the inference worker, which
computes real KV, is a later issue); their size and layout are SmolLM2-135M's in bf16.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from attnstore.chunks.format import encode_chunk
from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from attnstore.kvstore_client import KVStoreClient
from kvstore_daemon.launcher import DaemonProcess

LAYERS, KV_HEADS, HEAD_DIM, CHUNK_TOKENS, DTYPE = 30, 3, 64, 256, "bfloat16"
TURN_TOKENS = [700, 450, 600]  # tokens each turn adds to the conversation
MiB = 1024 * 1024


def fake_chunk(namespace: bytes, key: bytes, index: int, rng: np.random.Generator) -> bytes:
    half = KV_HEADS * CHUNK_TOKENS * HEAD_DIM * 2
    layers = [(rng.bytes(half), rng.bytes(half)) for _ in range(LAYERS)]
    return encode_chunk(
        namespace=namespace, key=key, dtype=DTYPE, kv_heads=KV_HEADS, tokens=CHUNK_TOKENS,
        head_dim=HEAD_DIM, base_position=index * CHUNK_TOKENS, layers=layers,
    )


def timed_read(client: KVStoreClient, namespace: bytes, keys: list[bytes]) -> tuple[float, int]:
    start = time.perf_counter()
    chunks = client.get_chunks(namespace, keys)
    return (time.perf_counter() - start) * 1000, sum(len(c.data) for c in chunks)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="attnstore-demo-"))
    shm_dir = Path(tempfile.mkdtemp(prefix="attnstore-demo-", dir="/dev/shm"))
    daemon = DaemonProcess(
        work / "ssd", shm_dir, work / "daemon.log",
        {"dram_capacity_bytes": 256 * MiB, "ssd_capacity_bytes": 1024 * MiB, "log_level": "WARNING"},
    )
    try:
        daemon.start()
        print(f"kvstore-daemon serving on {daemon.address} (arena in {shm_dir}, SSD tier in {work / 'ssd'})\n")
        run_conversation(daemon.address)
    finally:
        code = daemon.stop()
        shutil.rmtree(shm_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        print(f"\ndaemon stopped (exit code {code}); arena and SSD directory removed")


def run_conversation(address: str) -> None:
    namespace = NamespaceSpec(model_digest="SmolLM2-135M-Instruct", dtype=DTYPE, chunk_tokens=CHUNK_TOKENS).namespace_id()
    rng = np.random.default_rng(0)
    tokens: list[int] = []
    with KVStoreClient(address) as shm, KVStoreClient(address, use_shm=False) as remote:
        shm.register_namespace(
            namespace, num_layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, chunk_tokens=CHUNK_TOKENS,
            dtype=DTYPE, model_label="SmolLM2-135M-Instruct",
        )
        print(f"{'turn':>4} {'prompt tok':>10} {'cached tok':>10} {'cached MB':>9} {'shm ms':>7} {'gRPC ms':>8} {'new chunks':>10}")
        for turn, added in enumerate(TURN_TOKENS, start=1):
            tokens += rng.integers(0, 49152, added).tolist()
            keys = chunk_key_chain(namespace, tokens, CHUNK_TOKENS)
            hit = shm.lookup(namespace, keys).prefix_length
            shm_ms = grpc_ms = 0.0
            cached_bytes = 0
            if hit:
                shm_ms, cached_bytes = timed_read(shm, namespace, keys[:hit])
                grpc_ms, _ = timed_read(remote, namespace, keys[:hit])
            new = {key: fake_chunk(namespace, key, i, rng) for i, key in enumerate(keys) if i >= hit}
            stored = shm.put_chunks(namespace, new).stored if new else []
            print(
                f"{turn:>4} {len(tokens):>10} {hit * CHUNK_TOKENS:>10} {cached_bytes / 1e6:>9.1f} "
                f"{shm_ms:>7.2f} {grpc_ms:>8.2f} {len(stored):>10}"
            )
        stats = shm.stats()
        print(
            f"\nDRAM tier: {stats.dram.chunks} chunks, {stats.dram.used_bytes / MiB:.0f} of "
            f"{stats.dram.capacity_bytes / MiB:.0f} MiB; SSD tier: {stats.ssd.chunks} chunks "
            f"(written through in the background); hits {stats.dram.hits + stats.ssd.hits}, misses {stats.misses}"
        )


if __name__ == "__main__":
    main()
