"""The workers and daemons the scheduler routes to, their health and their load.

The topology (nodes with a daemon and workers) comes from the settings or from pod
discovery and may change at any time. Every worker is health-checked every interval
(grpc.health.v1); a worker that fails a turn is out until its next passing check. The
model card (DescribeModel) of a worker is read once it is healthy. Load is the turns the
scheduler runs on a worker now, bounded by `max_turns_per_worker`.

Routing (`acquire`): the least-loaded healthy worker with room on the preferred node (the
one holding the session's KV: "affinity"), else the least-loaded one anywhere ("load").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore.security import ClientCredentials, aio_channel
from attnstore_scheduler import metrics
from attnstore_scheduler.hint_pusher import capacity_from_stats
from attnstore_scheduler.lookahead import NodeCapacity
from attnstore_scheduler.settings import NodeSpec
from attnstore_scheduler.worker_client import WorkerClient
from attnstore_scheduler.worker_types import ModelCard

log = structlog.get_logger("attnstore_scheduler.workers")

Route = Literal["affinity", "load"]
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(eq=False)
class WorkerHandle:
    address: str
    node: str
    channel: grpc.aio.Channel
    healthy: bool = False
    in_flight: int = 0  # turns this scheduler runs on it now
    model: ModelCard | None = None
    client: WorkerClient = field(init=False)
    health: health_pb2_grpc.HealthStub = field(init=False)

    def __post_init__(self) -> None:
        self.client = WorkerClient(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)


@dataclass(frozen=True)
class DaemonTarget:
    """A node's daemon as the hint pusher addresses it (hint_pusher.HintTarget)."""

    node: str
    client: AsyncKVStoreClient
    capacity: NodeCapacity | None  # None until its Stats answered


class WorkerRegistry:
    def __init__(
        self,
        *,
        max_turns_per_worker: int,
        health_interval_seconds: float,
        health_timeout_seconds: float,
        daemon_timeout_seconds: float,
        worker_credentials: ClientCredentials | None = None,
        daemon_credentials: ClientCredentials | None = None,
    ) -> None:
        """`worker_credentials` and `daemon_credentials`: TLS (and the internal token) of
        the channels to workers and daemons; None: plaintext."""
        self.max_turns_per_worker = max_turns_per_worker
        self._health_interval_seconds = health_interval_seconds
        self._health_timeout_seconds = health_timeout_seconds
        self._daemon_timeout_seconds = daemon_timeout_seconds
        self._worker_credentials = worker_credentials
        self._daemon_credentials = daemon_credentials
        self._workers: dict[str, WorkerHandle] = {}  # by address
        self._daemon_addresses: dict[str, str] = {}  # node -> daemon address
        self._daemons: dict[str, AsyncKVStoreClient] = {}  # node -> client, made on first use
        self._capacities: dict[str, NodeCapacity] = {}  # node -> its daemon's tier capacities
        self._listeners: list[Callable[[], None]] = []
        self._closing: set[asyncio.Task[None]] = set()

    # ---- topology -------------------------------------------------------------------------

    def set_topology(self, nodes: Sequence[NodeSpec]) -> None:
        """Adopts a new topology: new workers start unhealthy until checked; removed ones are
        closed at once (a turn running there fails and is replayed on another worker)."""
        wanted = {address: node.name for node in nodes for address in node.worker_addresses}
        for address in [a for a in self._workers if wanted.get(a) != self._workers[a].node]:
            self._close_later(self._workers.pop(address).channel.close(grace=None))
        for address, node in wanted.items():
            if address not in self._workers:
                channel = aio_channel(
                    address,
                    self._worker_credentials,
                    options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)],
                )
                self._workers[address] = WorkerHandle(address, node, channel)
        daemons = {node.name: node.daemon_address for node in nodes if node.daemon_address}
        for name in [n for n in self._daemons if daemons.get(n) != self._daemon_addresses.get(n)]:
            self._close_later(self._daemons.pop(name).close())
            self._capacities.pop(name, None)
        self._daemon_addresses = daemons
        log.info("topology", nodes={n.name: list(n.worker_addresses) for n in nodes}, daemons=daemons)
        self._changed()

    def daemon(self, node: str) -> AsyncKVStoreClient | None:
        """A client of the node's daemon (control calls only), or None if it has none."""
        if node not in self._daemons and node in self._daemon_addresses:
            self._daemons[node] = AsyncKVStoreClient(
                self._daemon_addresses[node],
                use_shm=False,
                timeout_seconds=self._daemon_timeout_seconds,
                credentials=self._daemon_credentials,
            )
        return self._daemons.get(node)

    def hint_targets(self) -> list[DaemonTarget]:
        return [
            DaemonTarget(node, client, self._capacities.get(node))
            for node in self._daemon_addresses
            if (client := self.daemon(node)) is not None
        ]

    # ---- health ---------------------------------------------------------------------------

    async def check_all(self) -> None:
        """One health round over every worker, and the daemons' capacities, concurrently."""
        workers = list(self._workers.values())
        await asyncio.gather(
            *(self._check(worker) for worker in workers),
            *(self._read_capacity(node) for node in list(self._daemon_addresses)),
        )
        metrics.HEALTHY_WORKERS.set(sum(worker.healthy for worker in self._workers.values()))

    async def _read_capacity(self, node: str) -> None:
        client = self.daemon(node)
        if client is None or node in self._capacities:
            return
        try:
            self._capacities[node] = await capacity_from_stats(client)
        except grpc.aio.AioRpcError as exc:
            log.info("daemon_stats_unavailable", node=node, code=exc.code().name)

    async def run_health_checks(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self._health_interval_seconds)

    async def _check(self, worker: WorkerHandle) -> None:
        request = health_pb2.HealthCheckRequest(service="attnstore.worker.v1.Worker")
        try:
            reply = await worker.health.Check(request, timeout=self._health_timeout_seconds)
            healthy = reply.status == health_pb2.HealthCheckResponse.SERVING
            if healthy and worker.model is None:
                worker.model = await worker.client.describe_model(
                    timeout_seconds=self._health_timeout_seconds
                )
        except grpc.aio.AioRpcError as exc:
            healthy = False
            if worker.healthy:
                log.warning("worker_unhealthy", worker=worker.address, code=exc.code().name)
        if healthy != worker.healthy:
            log.info("worker_health", worker=worker.address, node=worker.node, healthy=healthy)
            worker.healthy = healthy
            self._changed()

    def mark_failed(self, worker: WorkerHandle) -> None:
        """Takes a worker that failed a call out of routing until its next passing check."""
        if worker.healthy:
            worker.healthy = False
            metrics.HEALTHY_WORKERS.dec()
            log.warning("worker_failed", worker=worker.address, node=worker.node)

    # ---- routing --------------------------------------------------------------------------

    def workers(self) -> list[WorkerHandle]:
        return list(self._workers.values())

    def peer_addresses(self, worker: WorkerHandle, count: int) -> list[str]:
        """Up to `count` healthy workers other than `worker`, the least busy first: where
        it may place the oldest KV of a turn longer than its KV pool (DistAttention)."""
        others = [w for w in self._workers.values() if w.healthy and w is not worker]
        return [w.address for w in sorted(others, key=lambda w: (w.in_flight, w.address))[:count]]

    def model(self) -> ModelCard | None:
        """The model card of a healthy worker (every worker runs the same model)."""
        return next((w.model for w in self._workers.values() if w.healthy and w.model is not None), None)

    def _candidates(self, exclude: Collection[WorkerHandle]) -> list[WorkerHandle]:
        return [
            worker
            for worker in self._workers.values()
            if worker.healthy
            and worker.model is not None
            and worker.in_flight < self.max_turns_per_worker
            and worker not in exclude
        ]

    def has_room(self, exclude: Collection[WorkerHandle] = ()) -> bool:
        return bool(self._candidates(exclude))

    def acquire(
        self, preferred_node: str | None, exclude: Collection[WorkerHandle] = ()
    ) -> tuple[WorkerHandle, Route] | None:
        """Takes a turn slot on the best worker (see the module doc); None when all are full."""
        candidates = self._candidates(exclude)
        local = [worker for worker in candidates if worker.node == preferred_node]
        route: Route = "affinity" if local else "load"
        pool = local or candidates
        if not pool:
            return None
        worker = min(pool, key=lambda w: w.in_flight)
        worker.in_flight += 1
        return worker, route

    def release(self, worker: WorkerHandle) -> None:
        worker.in_flight -= 1
        self._changed()

    def add_listener(self, callback: Callable[[], None]) -> None:
        """`callback()` runs whenever a worker may have gained room (a slot freed, health)."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        for callback in self._listeners:
            callback()

    # ---- shutdown -------------------------------------------------------------------------

    def _close_later(self, closing: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(closing)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        for worker in self._workers.values():
            await worker.channel.close(grace=None)
        for client in self._daemons.values():
            await client.close()
        self._workers.clear()
        self._daemons.clear()
        for task in list(self._closing):
            with contextlib.suppress(Exception):
                await task
