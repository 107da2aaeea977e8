"""The in-memory paths of the daemon benchmark, run cell by cell for one chunk pool at one
concurrency: memcpy (the yardstick), the daemon over shared memory and over gRPC, a bare
grpcio stream of the same bytes (grpc_ceiling.py), Redis.

Each of the `concurrency` workers has its own client (one request in flight each) and
its own preallocated destination buffer. Put cells delete what a round stored between
rounds (untimed), so every Put stores a new chunk; Get cells read a pool stored once,
after checking that every path returns the stored bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import redis
import redis.asyncio as aredis
from tqdm import tqdm

from attnstore.kvstore_client import AsyncKVStoreClient
from bench.common.harness import Budget, Measurement, run_tasks, run_threads
from bench.daemon.grpc_ceiling import CeilingClient
from bench.daemon.report import (
    GRPC,
    GRPC_CEILING,
    GRPC_VERIFY,
    MEMCPY,
    REDIS_AIO,
    REDIS_SYNC,
    SHM,
    SHM_BATCH,
    SHM_LEASED,
    SHM_VERIFY,
    Row,
)
from bench.daemon.workloads import ChunkPool

BUDGETS = {
    1: Budget(min_ops=200, min_seconds=1.5, max_bytes=2_000_000_000, max_seconds=5.0),
    4: Budget(min_ops=100, min_seconds=1.0, max_seconds=3.0),
}
QUICK_BUDGET = Budget(min_ops=8, min_seconds=0.05, max_bytes=50_000_000, max_seconds=0.5)
BATCH_KEYS = 4  # the "4 keys/req" row: one Get of 4 chunks (a 1024-token prefix), into 4 buffers


def cells_per_pool(concurrency: int) -> int:
    return 14 if concurrency == 1 else 11


class MemoryBench:
    """Runs every cell of one chunk pool at one concurrency and collects the rows."""

    def __init__(
        self, address: str, redis_port: int, ceiling_address: str, max_bytes: int, progress: tqdm, quick: bool
    ) -> None:
        self.address, self.redis_port, self.progress, self.quick = address, redis_port, progress, quick
        self.ceiling_address = ceiling_address
        self.max_bytes = max_bytes
        self.rows: list[Row] = []
        self.clients: dict[str, list[Any]] = {}
        self.outs: list[np.ndarray] = []  # one preallocated destination per worker

    async def open(self, concurrency: int) -> None:
        def daemon(shm: bool, verify: bool, n: int, **options: int) -> list[AsyncKVStoreClient]:
            return [
                AsyncKVStoreClient(self.address, use_shm=shm, verify_checksums=verify, **options)
                for _ in range(n)
            ]

        self.clients = {
            SHM: daemon(True, False, concurrency),
            GRPC: daemon(False, False, concurrency),
            SHM_LEASED: daemon(True, False, concurrency, location_cache_entries=0),
            SHM_VERIFY: daemon(True, True, 1),
            GRPC_VERIFY: daemon(False, True, 1),
            REDIS_SYNC: [redis.Redis(port=self.redis_port) for _ in range(concurrency)],
            REDIS_AIO: [aredis.Redis(port=self.redis_port) for _ in range(concurrency)],
            GRPC_CEILING: [CeilingClient(self.ceiling_address) for _ in range(concurrency)],
        }
        if not await self.clients[SHM][0].open_shm():
            raise RuntimeError("the daemon's shared-memory arena cannot be mapped from this process")
        self.outs = [np.zeros(self.max_bytes, np.uint8) for _ in range(concurrency)]

    async def close(self) -> None:
        for name, clients in self.clients.items():
            for client in clients:
                if name == REDIS_SYNC:
                    client.close()
                elif name == REDIS_AIO:
                    await client.aclose()
                else:
                    await client.close()

    def record(self, path: str, op: str, pool: ChunkPool, concurrency: int, result: Measurement) -> None:
        self.rows.append(
            {
                "path": path,
                "op": op,
                "size": pool.label,
                "chunk_bytes": pool.chunk_bytes,
                "chunk_tokens": pool.chunk_tokens,
                "concurrency": concurrency,
                **result.as_dict(),
            }
        )
        self.progress.update()

    def budget(self, concurrency: int) -> Budget:
        return QUICK_BUDGET if self.quick else BUDGETS[concurrency]

    async def threads(
        self, path: str, op: str, pool: ChunkPool, c: int, fn: Callable[[int, int], object]
    ) -> None:
        self.progress.set_postfix_str(f"{path} {op} {pool.label} c={c}")
        self.record(
            path,
            op,
            pool,
            c,
            run_threads(
                fn, item_bytes=pool.chunk_bytes, count=pool.count, concurrency=c, budget=self.budget(c)
            ),
        )

    async def tasks(
        self,
        path: str,
        op: str,
        pool: ChunkPool,
        c: int,
        fn: Callable[[int, int], Awaitable[object]],
        between_rounds: Callable[[], Awaitable[object]] | None = None,
        keys_per_op: int = 1,
    ) -> None:
        self.progress.set_postfix_str(f"{path} {op} {pool.label} c={c}")
        self.record(
            path,
            op,
            pool,
            c,
            await run_tasks(
                fn,
                item_bytes=pool.chunk_bytes * keys_per_op,
                count=pool.count // keys_per_op,
                concurrency=c,
                budget=self.budget(c),
                between_rounds=between_rounds,
            ),
        )

    async def run(self, pool: ChunkPool, c: int) -> None:
        ns, keys, chunks, n = pool.namespace, pool.keys, pool.chunks, pool.chunk_bytes
        admin = self.clients[SHM][0]
        await admin.register_namespace(ns, **pool.layout(), model_label="bench")
        sources = [np.frombuffer(chunk, np.uint8) for chunk in chunks]
        rkeys = [f"bench:{pool.label}:{i}".encode() for i in range(pool.count)]
        sync_redis, aio_redis = self.clients[REDIS_SYNC], self.clients[REDIS_AIO]

        await self.threads(MEMCPY, "copy", pool, c, lambda w, i: np.copyto(self.outs[w][:n], sources[i]))

        async def delete_all() -> None:
            await admin.delete(ns, keys)

        for path in (SHM, GRPC):

            async def put(w: int, i: int, clients: list[AsyncKVStoreClient] = self.clients[path]) -> None:
                if len((await clients[w].put_chunks(ns, [(keys[i], chunks[i])])).stored) != 1:
                    raise RuntimeError(f"put of chunk {i} was not stored")

            await self.tasks(path, "put", pool, c, put, delete_all)
        await self.threads(REDIS_SYNC, "set", pool, c, lambda w, i: sync_redis[w].set(rkeys[i], chunks[i]))
        await self.tasks(REDIS_AIO, "set", pool, c, lambda w, i: aio_redis[w].set(rkeys[i], chunks[i]))

        await admin.put_chunks(ns, list(zip(keys, chunks, strict=True)))
        await self.check_reads(pool, rkeys)
        for path in (SHM, SHM_LEASED, GRPC, SHM_VERIFY, GRPC_VERIFY) if c == 1 else (SHM, SHM_LEASED, GRPC):

            async def get(w: int, i: int, clients: list[AsyncKVStoreClient] = self.clients[path]) -> None:
                await clients[w].get_chunks_into(ns, [keys[i]], [self.outs[w]])

            await self.tasks(path, "get", pool, c, get)
        ceiling = self.clients[GRPC_CEILING]
        await self.tasks(GRPC_CEILING, "get", pool, c, lambda w, i: ceiling[w].get_into(n, self.outs[w]))
        if c == 1:
            outs = [self.outs[0], *(np.zeros(self.max_bytes, np.uint8) for _ in range(BATCH_KEYS - 1))]

            async def get_batch(w: int, i: int) -> None:
                await self.clients[SHM][w].get_chunks_into(
                    ns, keys[i * BATCH_KEYS : (i + 1) * BATCH_KEYS], outs
                )

            await self.tasks(SHM_BATCH, "get", pool, c, get_batch, keys_per_op=BATCH_KEYS)
        await self.threads(REDIS_SYNC, "get", pool, c, lambda w, i: sync_redis[w].get(rkeys[i]))
        await self.tasks(REDIS_AIO, "get", pool, c, lambda w, i: aio_redis[w].get(rkeys[i]))
        await delete_all()
        await aio_redis[0].flushdb()

    async def check_reads(self, pool: ChunkPool, rkeys: list[bytes]) -> None:
        """Every path returns the bytes that were stored, before any of them is timed."""
        expected, n = pool.chunks[-1], pool.chunk_bytes
        for path in (SHM, SHM_LEASED, GRPC, SHM_VERIFY, GRPC_VERIFY):
            self.outs[0][:] = 0
            await self.clients[path][0].get_chunks_into(pool.namespace, [pool.keys[-1]], [self.outs[0]])
            if self.outs[0][:n].tobytes() != expected:
                raise RuntimeError(f"{path} returned other bytes than were stored ({pool.label})")
        if self.clients[REDIS_SYNC][0].get(rkeys[-1]) != expected:
            raise RuntimeError(f"redis returned other bytes than were stored ({pool.label})")
