"""Entry point: `attnstore-kvstore-daemon` / `python -m kvstore_daemon.main`."""

from __future__ import annotations

import asyncio
import contextlib

import structlog
import uvloop

from attnstore.kvstore.v1 import kvstore_pb2_grpc
from attnstore.security import SecurityConfigError
from attnstore.server.auth_interceptor import internal_auth_interceptors
from attnstore.server.lifecycle import create_server, serve
from attnstore.server.startup import start_service
from attnstore.settings import run_or_exit
from kvstore_daemon.chunk_store import ChunkStore
from kvstore_daemon.data_plane import DataPlaneServer
from kvstore_daemon.dram_tier import ArenaError, DramTier, remove_stale_arenas
from kvstore_daemon.namespaces import NamespaceRegistry
from kvstore_daemon.peer_tier import make_peer_tier, static_peers
from kvstore_daemon.pool_member import PoolMember
from kvstore_daemon.servicer import ADMIN_METHODS, SERVICE_NAME, KVStoreServicer
from kvstore_daemon.settings import DaemonSettings
from kvstore_daemon.ssd_tier import SsdTier

log = structlog.get_logger("kvstore_daemon")

_MAINTENANCE_INTERVAL_SECONDS = 0.2


async def _maintain_forever(store: ChunkStore) -> None:
    while True:
        await asyncio.sleep(_MAINTENANCE_INTERVAL_SECONDS)
        try:
            await store.maintain()
        except Exception:  # upkeep must keep running; the next pass retries
            log.exception("maintenance_failed")


async def run_daemon(settings: DaemonSettings) -> None:
    credentials = settings.tls.load()  # before anything else: a bad certificate stops the start
    if settings.internal_auth.enabled and not settings.internal_auth.admin_token_sha256:
        log.warning(
            "admin_calls_refused", reason="no internal_auth.admin_token_sha256", methods=sorted(ADMIN_METHODS)
        )
    removed = remove_stale_arenas(settings.shm_dir)
    dram = DramTier(settings.shm_dir, settings.dram_capacity_bytes, settings.dram_block_bytes)
    ssd = SsdTier(
        settings.ssd_dirs,
        settings.ssd_capacity_bytes,
        settings.io_threads,
        reserve_bytes=settings.ssd_reserved_bytes,
    )
    namespaces = NamespaceRegistry(
        settings.ssd_dirs[0] / "namespaces.msgpack",
        settings.max_namespaces,
        settings.max_chunk_bytes,
        settings.namespace_idle_seconds,
    )
    member = PoolMember(settings, ssd) if settings.pool_redis_url is not None else None
    find_peers = member.find_peers if member is not None else static_peers(settings.pool_peers)
    pooled = settings.pool_capacity_bytes > 0 and (member is not None or settings.pool_peers)
    peer = make_peer_tier(settings, namespaces, find_peers) if pooled else None
    store = ChunkStore(settings, dram, ssd, namespaces, peer=peer)
    await store.start()
    log.info(
        "daemon_starting", arena=str(dram.path), stale_arenas_removed=removed, policy=settings.eviction_policy
    )
    maintenance = asyncio.get_running_loop().create_task(_maintain_forever(store))
    data_plane = DataPlaneServer(store, settings, asyncio.get_running_loop())
    data_plane_port = data_plane.start() if settings.data_plane_port else 0
    log.info("data_plane", port=data_plane_port, tls=data_plane.tls)

    async def on_stop() -> None:
        data_plane.stop()
        maintenance.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await maintenance
        if member is not None:
            await member.stop()
        await store.stop(settings.shutdown_grace_seconds)
        if peer is not None:
            await peer.close()

    def pool_address() -> str:
        return member.address if member is not None else ""

    def on_started(port: int) -> None:
        if member is not None:  # into the ledger once peers can reach it
            member.start(port, data_plane_port, store)

    auth = internal_auth_interceptors(settings.internal_auth, settings.tls, ADMIN_METHODS)
    server = create_server(settings.serving, interceptors=auth)
    kvstore_pb2_grpc.add_KVStoreServicer_to_server(
        KVStoreServicer(store, settings, data_plane_port, pool_address), server
    )
    await serve(
        server,
        settings,
        service_names=[SERVICE_NAME],
        on_stop=on_stop,
        on_started=on_started,
        credentials=credentials,
    )


def main() -> None:
    settings = start_service(DaemonSettings, "attnstore-kvstore-daemon", large_buffers=True)
    startup_errors = (ArenaError, SecurityConfigError)
    run_or_exit("attnstore-kvstore-daemon", uvloop.run, run_daemon(settings), startup_errors)


if __name__ == "__main__":
    main()
