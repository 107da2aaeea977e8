"""LocalStack against real processes, without a model (daemons start in a second): every
service is ready when start() returns, stops cleanly, and leaves no shared memory; a
failed start stops what had started; daemons named as nodes join the pool's ledger as
those nodes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil
import pytest
import redis.asyncio as aioredis
from service_probes import is_serving

from attnstore.pool_ledger import PoolLedger
from attnstore.server.redis_process import RedisProcess
from attnstore_cli.local_stack import LocalStack
from attnstore_cli.stack_spec import StackSpec

MiB = 1024 * 1024
SMALL = {
    "dram_capacity_bytes": 64 * MiB,
    "dram_block_bytes": 64 * 1024,
    "ssd_capacity_bytes": 64 * MiB,
    "max_chunk_bytes": 4 * MiB,
}


def test_two_daemons_serve_when_started_and_leave_nothing_behind(tmp_path: Path) -> None:
    spec = StackSpec(tmp_path, daemons=2, workers=(), scheduler=False, daemon_settings=SMALL)
    with LocalStack(spec) as stack:
        assert list(stack.processes()) == ["daemon-0", "daemon-1"]
        assert all(is_serving(daemon.address) for daemon in stack.daemons)  # ready, not slept on
        assert [daemon.ssd_dir for daemon in stack.daemons] == [tmp_path / "ssd-0", tmp_path / "ssd-1"]
        shm_dirs = [daemon.shm_dir for daemon in stack.daemons]
        pids = stack.pids()
        assert all(path.is_dir() for path in shm_dirs)
    assert not any(path.exists() for path in shm_dirs)
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids.values()
    )
    assert (tmp_path / "logs" / "daemon-1.log").exists()


def test_a_service_that_cannot_start_stops_the_ones_before_it(tmp_path: Path) -> None:
    spec = StackSpec(
        tmp_path,
        daemons=2,
        workers=(),
        daemon_settings=SMALL,
        scheduler_settings={"session_ttl_seconds": "not a number"},
    )
    stack = LocalStack(spec)
    with pytest.raises(RuntimeError, match="attnstore_scheduler.main exited with"):
        stack.start()
    assert len(stack.daemons) == 2 and not any(daemon.running for daemon in stack.daemons)
    assert stack.pids() == {}
    assert not any(daemon.shm_dir.exists() for daemon in stack.daemons)


def test_daemons_named_as_nodes_join_one_pool_ledger_as_those_nodes(
    tmp_path: Path, redis_installed: None
) -> None:
    redis_server = RedisProcess(tmp_path / "redis")
    redis_server.start()
    try:
        pooled = {**SMALL, "pool_redis_url": redis_server.url, "pool_heartbeat_seconds": 0.2}
        spec = StackSpec(
            tmp_path,
            daemons=2,
            workers=(),
            scheduler=False,
            daemon_settings=pooled,
            daemon_nodes=("node-a", "node-b"),
        )
        with LocalStack(spec) as stack:

            async def members() -> dict[str, str]:
                client = aioredis.Redis.from_url(redis_server.url)
                try:
                    return {
                        entry.grpc_address: entry.node for entry in await PoolLedger.reader(client).members()
                    }
                finally:
                    await client.aclose()

            expected = {stack.daemons[0].address: "node-a", stack.daemons[1].address: "node-b"}
            deadline = time.monotonic() + 30
            while (found := asyncio.run(members())) != expected and time.monotonic() < deadline:
                time.sleep(0.2)  # the first heartbeat follows the start
            assert found == expected
    finally:
        redis_server.stop()
