"""Round trips through a real daemon with the client SDK, over shared memory and gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import TYPE_CHECKING

import pytest

from attnstore.chunks.format import decode_layout, encode_chunk
from attnstore.chunks.keys import chunk_key
from attnstore.kvstore_client import AsyncKVStoreClient, KVStoreClient, Tier

if TYPE_CHECKING:  # the fixture's class; conftest modules are not imported by name
    from conftest import DaemonProcess, PollUntil

NAMESPACE = bytes(range(16))
LAYERS, KV_HEADS, TOKENS, HEAD_DIM, DTYPE = 4, 2, 16, 32, "float16"
HALF = KV_HEADS * TOKENS * HEAD_DIM * 2  # bytes of K (or V) of one layer


def make_chunks(count: int, seed: int = 0) -> dict[bytes, bytes]:
    rng = random.Random(seed)
    chunks: dict[bytes, bytes] = {}
    parent = None
    for index in range(count):
        key = chunk_key(NAMESPACE, parent, [index] * TOKENS)
        layers = [(rng.randbytes(HALF), rng.randbytes(HALF)) for _ in range(LAYERS)]
        chunks[key] = encode_chunk(
            namespace=NAMESPACE,
            key=key,
            dtype=DTYPE,
            kv_heads=KV_HEADS,
            tokens=TOKENS,
            head_dim=HEAD_DIM,
            base_position=index * TOKENS,
            layers=layers,
        )
        parent = key
    return chunks


LAYOUT = {
    "num_layers": LAYERS,
    "kv_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "chunk_tokens": TOKENS,
    "dtype": DTYPE,
}


@pytest.mark.parametrize("use_shm", [True, False], ids=["shm", "grpc"])
def test_sync_round_trip(daemon: DaemonProcess, use_shm: bool, poll_until: PollUntil) -> None:
    chunks = make_chunks(3)
    keys = list(chunks)
    with KVStoreClient(daemon.address, use_shm=use_shm) as client:
        assert client.open_shm() is use_shm
        assert client.register_namespace(NAMESPACE, **LAYOUT) >= len(chunks[keys[0]])

        put = client.put_chunks(NAMESPACE, chunks)
        assert put.stored == keys and not put.already_stored
        assert client.put_chunks(NAMESPACE, chunks).already_stored == keys

        lookup = client.lookup(NAMESPACE, [*keys, bytes(32)])
        assert lookup.prefix_length == 3 and lookup.tiers == [Tier.DRAM] * 3

        assert client.get_whole_chunks(NAMESPACE, keys) == [chunks[key] for key in keys]

        partial = client.get_chunks(NAMESPACE, keys, layer_start=1, layer_end=3)
        for key, got in zip(keys, partial, strict=True):
            start, end = decode_layout(chunks[key]).layer_span(1, 3)
            assert got.data == chunks[key][start:end] and got.layout.header.key == key

        pieces = client.iter_layers(NAMESPACE, keys, layer_start=2)
        assert [(p.chunk_index, p.layer) for p in pieces] == [
            (i, layer) for layer in (2, 3) for i in range(3)
        ]
        for piece in pieces:
            start, end = piece.layout.layer_span(piece.layer, piece.layer + 1)
            assert piece.data == chunks[keys[piece.chunk_index]][start:end]

        buffers = [bytearray(len(chunks[key]) + 100) for key in keys]
        layouts = client.get_chunks_into(NAMESPACE, keys, [memoryview(b) for b in buffers])
        for key, buffer, layout in zip(keys, buffers, layouts, strict=True):
            assert buffer[: layout.total_bytes] == chunks[key]

        assert client.delete(NAMESPACE, keys[2:]) == 1
        assert client.lookup(NAMESPACE, keys).prefix_length == 2
        stats = client.stats()
        assert stats.dram.chunks == 2 and stats.reservations == 0
        # Finished leases ride on the next GetShm or a flush a few ms later.
        poll_until(lambda: client.stats().leases == 0, what="read leases to end")


@pytest.mark.parametrize("use_shm", [True, False], ids=["shm", "grpc"])
async def test_async_layer_stream_and_early_close(daemon: DaemonProcess, use_shm: bool) -> None:
    chunks = make_chunks(2, seed=1)
    keys = list(chunks)
    async with AsyncKVStoreClient(daemon.address, use_shm=use_shm) as client:
        await client.register_namespace(NAMESPACE, **LAYOUT)
        assert (await client.put_chunks(NAMESPACE, list(chunks.items()), durable=True)).stored == keys
        layers = [piece.layer async for piece in client.iter_layers(NAMESPACE, keys)]
        assert layers == [layer for layer in range(LAYERS) for _ in keys]
        async with contextlib.aclosing(client.iter_layers(NAMESPACE, keys)) as pieces:
            async for _ in pieces:
                break  # closing early must end the lease (or cancel the stream)
        deadline = time.monotonic() + 5
        while (await client.stats()).leases and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert (await client.stats()).leases == 0


async def test_a_chunk_just_read_over_shm_is_deleted_and_put_again(daemon: DaemonProcess) -> None:
    """A shared-memory read releases its lease lazily (lease_releaser.py); a delete right after
    must not find the chunk still leased, or the put that replaces it stores nothing."""
    chunks = make_chunks(2, seed=3)
    keys = list(chunks)
    async with AsyncKVStoreClient(daemon.address, use_shm=True) as client:
        await client.register_namespace(NAMESPACE, **LAYOUT)
        assert (await client.put_chunks(NAMESPACE, list(chunks.items()))).stored == keys
        assert await client.get_whole_chunks(NAMESPACE, keys) == list(chunks.values())
        assert await client.delete(NAMESPACE, keys) == len(keys)
        assert (await client.put_chunks(NAMESPACE, list(chunks.items()))).stored == keys
        assert (await client.lookup(NAMESPACE, keys)).prefix_length == len(keys)


def test_restart_remaps_the_arena_and_serves_durable_chunks(daemon: DaemonProcess) -> None:
    chunks = make_chunks(2, seed=2)
    keys = list(chunks)
    with KVStoreClient(daemon.address) as client:
        client.register_namespace(NAMESPACE, **LAYOUT)
        assert client.put_chunks(NAMESPACE, chunks, durable=True).stored == keys
        daemon.kill9()
        daemon.start()  # same port, new arena generation
        assert client.get_whole_chunks(NAMESPACE, keys) == [chunks[key] for key in keys]
        more = make_chunks(3, seed=3)
        new_key = list(more)[2]
        assert client.put_chunks(NAMESPACE, {new_key: more[new_key]}).stored == [new_key]
        assert client.get_whole_chunks(NAMESPACE, [new_key]) == [more[new_key]]


@pytest.mark.parametrize("use_shm", [True, False], ids=["shm", "grpc"])
def test_large_chunks_span_arena_blocks_and_stream_messages(daemon: DaemonProcess, use_shm: bool) -> None:
    # 512 KiB layers, ~4 MiB chunks: several 2 MiB arena blocks, 1 MiB WritePut pieces and
    # 4 MiB Get messages per chunk.
    namespace, layers, kv_heads, tokens, head_dim = bytes(16), 8, 8, 256, 64
    rng = random.Random(4)
    half = kv_heads * tokens * head_dim * 2
    chunks = {}
    for index in range(3):
        key = chunk_key(namespace, None, [index] * tokens)
        chunks[key] = encode_chunk(
            namespace=namespace,
            key=key,
            dtype="float16",
            kv_heads=kv_heads,
            tokens=tokens,
            head_dim=head_dim,
            base_position=0,
            layers=[(rng.randbytes(half), rng.randbytes(half)) for _ in range(layers)],
        )
    keys = list(chunks)
    with KVStoreClient(daemon.address, use_shm=use_shm) as client:
        client.register_namespace(
            namespace,
            num_layers=layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            chunk_tokens=tokens,
            dtype="float16",
        )
        assert client.put_chunks(namespace, chunks).stored == keys
        assert client.get_whole_chunks(namespace, keys) == [chunks[key] for key in keys]
        middle = client.get_chunks(namespace, keys, layer_start=3, layer_end=6)
        for key, got in zip(keys, middle, strict=True):
            start, end = got.layout.layer_span(3, 6)
            assert got.data == chunks[key][start:end]
