"""Entry point: `attnstore-scheduler` / `python -m attnstore_scheduler.main`.

Start: settings, logging, TLS credentials, API keys, the session store (Redis, or
embedded without `redis_url`), the worker registry fed by the static topology or by pod
discovery, one health round over the workers, then serve (gRPC, and the OpenAI-compatible
HTTP API when `openai_listen_address` is set). Background tasks: the dispatch
loop, worker health checks, the expiry sweeper and the look-ahead hint pusher. Health is
SERVING while the session store answers. Stop: in-flight turns finish within the grace
period, then the background tasks end and the store closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Coroutine
from typing import Any

import redis.asyncio as aioredis
import structlog
import uvloop

from attnstore.api.v1 import api_pb2_grpc
from attnstore.pool_ledger import PoolLedger
from attnstore.same_named import same_named
from attnstore.security import SecurityConfigError
from attnstore.server.lifecycle import create_server, serve
from attnstore.server.startup import start_service
from attnstore.settings import run_or_exit
from attnstore_scheduler.auth import ApiKeys, ApiKeysError
from attnstore_scheduler.callers import Callers
from attnstore_scheduler.dispatcher import Dispatcher
from attnstore_scheduler.hint_pusher import HintPusher
from attnstore_scheduler.job_queue import JobQueue
from attnstore_scheduler.kubernetes_discovery import PodWatcher
from attnstore_scheduler.openai_api.app import HttpServer, create_app
from attnstore_scheduler.openai_api.context import ApiContext
from attnstore_scheduler.pool_routing import PoolRouting
from attnstore_scheduler.rate_limit import RateLimiter
from attnstore_scheduler.redis_schema_store import RedisSchemaStore
from attnstore_scheduler.redis_session_store import RedisSessionStore
from attnstore_scheduler.schema_protection import SchemaProtection
from attnstore_scheduler.schema_store import EmbeddedSchemaStore
from attnstore_scheduler.schemas import Schemas
from attnstore_scheduler.servicer import SERVICE_NAME, AttnStoreServicer
from attnstore_scheduler.session_activity import SessionActivity
from attnstore_scheduler.session_store import EmbeddedSessionStore, SessionStore
from attnstore_scheduler.sessions import Sessions
from attnstore_scheduler.settings import SchedulerSettings
from attnstore_scheduler.turn_runner import TurnRunner
from attnstore_scheduler.turns import Turns
from attnstore_scheduler.validation import ApiLimits
from attnstore_scheduler.worker_registry import WorkerRegistry

log = structlog.get_logger("attnstore_scheduler")


def open_store(settings: SchedulerSettings) -> SessionStore:
    if settings.redis_url is None:
        return EmbeddedSessionStore(settings.session_lock_wait_seconds)
    return RedisSessionStore(
        settings.redis_url,
        expiry_grace_seconds=settings.expiry_grace_seconds,
        lock_ttl_seconds=settings.session_lock_ttl_seconds,
        lock_wait_seconds=settings.session_lock_wait_seconds,
        max_connections=settings.redis_max_connections,
        pool_timeout_seconds=settings.redis_pool_timeout_seconds,
    )


def open_pool_routing(settings: SchedulerSettings, registry: WorkerRegistry) -> PoolRouting | None:
    """Pool-aware affinity reads the daemons' ledger in the scheduler's Redis."""
    if settings.redis_url is None or settings.pool_routing_min_share is None:
        return None
    ledger = PoolLedger.reader(aioredis.Redis.from_url(settings.redis_url))
    return PoolRouting(registry, ledger, settings.pool_routing_min_share)


def topology_source(
    settings: SchedulerSettings, registry: WorkerRegistry
) -> Coroutine[Any, Any, None] | None:
    """Static nodes are adopted now; discovery is a task that adopts them as pods change."""
    if not settings.kubernetes_discovery:
        registry.set_topology(settings.nodes)
        return None
    return PodWatcher(
        settings.kubernetes_namespace,
        settings.kubernetes_daemon_selector,
        settings.kubernetes_worker_selector,
        daemon_port=settings.kubernetes_daemon_port,
        worker_port=settings.kubernetes_worker_port,
        on_topology=registry.set_topology,
    ).run()


def open_http_api(settings: SchedulerSettings, context: ApiContext) -> HttpServer | None:
    """The OpenAI-compatible HTTP API, bound now; None when openai_listen_address is unset."""
    if settings.openai_listen_address is None:
        return None
    app = create_app(context, max_request_bytes=settings.openai_max_request_bytes)
    return HttpServer(
        app, settings.openai_listen_address, grace_seconds=settings.shutdown_grace_seconds, tls=settings.tls
    )


async def run_scheduler(settings: SchedulerSettings) -> None:
    server_credentials = settings.tls.load()
    api_keys = None
    if settings.auth_enabled and settings.api_keys_file is not None:  # the settings require the file
        api_keys = ApiKeys.load(settings.api_keys_file, settings.admin_tenant)
    else:
        log.warning("authentication_disabled", tenant="default")
    store = open_store(settings)
    registry = WorkerRegistry(
        max_turns_per_worker=settings.max_turns_per_worker,
        health_interval_seconds=settings.worker_health_interval_seconds,
        health_timeout_seconds=settings.worker_health_timeout_seconds,
        daemon_timeout_seconds=settings.release_timeout_seconds,
        worker_credentials=settings.worker_channel.load("worker_channel"),
        daemon_credentials=settings.daemon_channel.load("daemon_channel"),
    )
    queue = JobQueue(settings.max_queue_length)
    dispatcher = Dispatcher(queue, registry)
    runner = TurnRunner(
        dispatcher,
        registry,
        retry_attempts=settings.turn_retry_attempts,
        attempt_timeout_seconds=settings.turn_timeout_seconds,
        long_context_peers=settings.long_context_peers,
    )
    limits = same_named(ApiLimits, settings)
    activity = SessionActivity() if settings.hints.policy == "predictive" else None
    protection = SchemaProtection()
    hints = HintPusher(
        queue,
        registry.hint_targets,
        settings.hints,
        activity=activity,
        source=settings.hints.source or socket.gethostname(),
        protection=protection,
    )
    sessions = Sessions(
        store,
        registry,
        hints,
        max_sessions_per_tenant=settings.max_sessions_per_tenant,
        max_kv_bytes_per_tenant=settings.max_kv_bytes_per_tenant,
        activity=activity,
    )
    turns = Turns(sessions, runner, registry, limits, open_pool_routing(settings, registry))
    schemas = Schemas(
        RedisSchemaStore(store.redis) if isinstance(store, RedisSessionStore) else EmbeddedSchemaStore(),
        registry,
        settings.pml_limits,
        max_schemas_per_tenant=settings.max_schemas_per_tenant,
        eager_encoding=settings.schema_encoding == "eager",
        encode_timeout_seconds=settings.schema_encode_timeout_seconds,
        remember_node=turns.remember_schema_node,
        protection=protection,
    )
    callers = Callers(api_keys, RateLimiter(settings.requests_per_second, settings.requests_burst))
    servicer = AttnStoreServicer(sessions, turns, callers, limits, schemas)
    http = open_http_api(settings, ApiContext(turns, sessions, registry, callers, limits))
    discovery = topology_source(settings, registry)
    await registry.check_all()  # route from the first call on when workers are already up
    loop = asyncio.get_running_loop()
    tasks = [
        loop.create_task(work)
        for work in (
            dispatcher.run(),
            registry.run_health_checks(),
            sessions.sweep_forever(settings.expiry_sweep_interval_seconds),
            hints.run(),
            *([discovery] if discovery is not None else []),
        )
    ]

    async def on_stop() -> None:
        if http is not None:
            await http.stop()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await registry.close()
        await store.close()

    if http is not None:
        http.start()
        log.info("openai_api_serving", port=http.port)
    server = create_server(settings.serving)
    api_pb2_grpc.add_AttnStoreServicer_to_server(servicer, server)
    log.info(
        "scheduler_starting", store="redis" if settings.redis_url else "embedded", nodes=len(settings.nodes)
    )
    await serve(
        server,
        settings,
        service_names=[SERVICE_NAME],
        on_stop=on_stop,
        on_stopping=http.begin_stop if http is not None else None,
        health_probe=store.ping,
        health_probe_interval_seconds=settings.health_check_interval_seconds,
        credentials=server_credentials,
    )


def main() -> None:
    settings = start_service(SchedulerSettings, "attnstore-scheduler")
    startup_errors = (ApiKeysError, SecurityConfigError)
    run_or_exit("attnstore-scheduler", uvloop.run, run_scheduler(settings), startup_errors)


if __name__ == "__main__":
    main()
