"""The services the reuse benchmark measures, a LocalStack: one KV-store daemon and one
real worker process (`inference_worker.main`) per path, each serving ExecuteTurn over gRPC.

    recompute          a worker with no store: every turn prefills its whole prompt
    shm c<N>           a worker on the daemon, chunks of N tokens read from its shared memory
    grpc c<N>          the same over the daemon's gRPC byte stream

A turn's TTFT is the one the worker reports in its stats (request start to first token,
inside the worker); the client-side time to the first streamed token is kept beside it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore.same_named import same_named
from attnstore.worker.v1 import worker_pb2 as pb
from attnstore.worker.v1 import worker_pb2_grpc
from attnstore_cli.local_stack import LocalStack
from attnstore_cli.stack_spec import StackSpec, WorkerSpec

MiB = 1024 * 1024
# No write-through to SSD: the store's bytes stay in DRAM and no background disk writes
# share the 2 cores with the measurements (each conversation's chunks are deleted after it).
DAEMON_SETTINGS = {
    "dram_capacity_bytes": 2048 * MiB,
    "ssd_capacity_bytes": 256 * MiB,
    "max_chunk_bytes": 32 * MiB,
    "persist_on_commit": False,
}
WORKER_SETTINGS = {"health_check_interval_seconds": 0, "dtype": "float32"}
TURN_TIMEOUT_SECONDS = 300.0
SAVE_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class ServePath:
    """One way of serving a turn: `chunk_tokens` None means no store (recompute)."""

    key: str
    chunk_tokens: int | None = None
    use_shm: bool = True

    @property
    def reuses(self) -> bool:
        return self.chunk_tokens is not None


RECOMPUTE = ServePath("recompute")


def reuse_path(chunk_tokens: int, use_shm: bool) -> ServePath:
    return ServePath(f"{'shm' if use_shm else 'grpc'} c{chunk_tokens}", chunk_tokens, use_shm)


@dataclass
class Timing:
    """What one method cost on one turn (milliseconds)."""

    ttft_ms: float
    reused_tokens: int = 0
    compute_ms: float = 0.0
    kv_load_ms: float = 0.0
    kv_load_exposed_ms: float = 0.0
    client_ttft_ms: float | None = None  # worker paths: to the first token seen by the client
    fallback: str | None = None


def reuse_stack(work_dir: Path, model_dir: Path, device: str, paths: list[ServePath]) -> LocalStack:
    """The stack (not started): one daemon, one worker per path (named by its key), no
    scheduler."""
    workers = tuple(
        WorkerSpec(
            path.key,
            daemon=0 if path.reuses else None,
            settings={"chunk_tokens": path.chunk_tokens, "kvstore_use_shm": path.use_shm}
            if path.reuses
            else {},
        )
        for path in paths
    )
    return LocalStack(
        StackSpec(
            work_dir=work_dir,
            model_dir=model_dir,
            workers=workers,
            scheduler=False,
            daemon_settings=DAEMON_SETTINGS,
            worker_settings={**WORKER_SETTINGS, "device": device},
            log_level="WARNING",
        )
    )


class Clients:
    """gRPC stubs of every worker and one daemon client, on the running event loop."""

    def __init__(self, stack: LocalStack) -> None:
        self.channels = {key: grpc.aio.insecure_channel(w.address) for key, w in stack.workers.items()}
        self.stubs = {key: worker_pb2_grpc.WorkerStub(channel) for key, channel in self.channels.items()}
        self.kvstore = AsyncKVStoreClient(stack.daemon.address, use_shm=True)

    async def close(self) -> None:
        await self.kvstore.close()
        await asyncio.gather(*(channel.close() for channel in self.channels.values()))

    async def execute_turn(
        self, path: ServePath, tenant: str, prompt: list[int], history_tokens: int = 0
    ) -> Timing:
        """One greedy token for `prompt`: the turn's TTFT without decoding after it.
        `history_tokens`: where the conversation's history ends in it (its stored tail)."""
        request = pb.ExecuteTurnRequest(
            tenant=tenant,
            prompt_token_ids=pb.TokenIds(token_ids=prompt),
            sampling=pb.SamplingParams(max_tokens=1),
            save_generated=False,
            history_tokens=history_tokens,
        )
        started, first_token_at = time.perf_counter(), None
        stats = None
        async for reply in self.stubs[path.key].ExecuteTurn(request, timeout=TURN_TIMEOUT_SECONDS):
            if reply.WhichOneof("event") == "token":
                first_token_at = first_token_at or time.perf_counter()
            else:
                stats = reply.stats
        if stats is None or first_token_at is None:
            raise RuntimeError(f"{path.key}: the turn ended without a token and its stats")
        fallback = None if stats.fallback == pb.FALLBACK_NONE else pb.Fallback.Name(stats.fallback)
        return same_named(Timing, stats, client_ttft_ms=(first_token_at - started) * 1000, fallback=fallback)

    async def wait_stored(self, namespace: bytes, keys: list[bytes]) -> bool:
        """Waits for a worker's background save of `keys`, so that it neither shares the CPU
        with the next measurement nor changes what the next method finds stored."""
        deadline = time.monotonic() + SAVE_TIMEOUT_SECONDS
        while (await self.kvstore.lookup(namespace, keys)).prefix_length < len(keys):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True
