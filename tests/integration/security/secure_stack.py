"""Settings and processes of the security integration tests (imported by the tests of this
folder; the fixtures are in conftest.py): TLS and internal-auth settings as the services
read them, client credentials, and `start_secure_stack`, a daemon + one worker + a
scheduler with TLS on every endpoint, mutual TLS and internal tokens between them."""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tls_certs import Pki

from attnstore.api_client import AttnStoreClient
from attnstore.chunks.format import encode_chunk
from attnstore.chunks.keys import chunk_key
from attnstore.security import ChannelSecurity, ClientCredentials, token_digest
from attnstore_scheduler.launcher import SchedulerProcess
from attnstore_scheduler.settings import NodeSpec
from inference_worker.launcher import WorkerProcess
from kvstore_daemon.launcher import DaemonProcess

MiB = 1024 * 1024
CHUNK_TOKENS = 16
WORKER_TOKEN, ADMIN_TOKEN = "worker-token-7f3a", "admin-token-91c4"
API_KEYS = {"acme": "key-acme", "globex": "key-globex", "chat": "key-chat", "full": "key-full"}
DAEMON_SETTINGS = {
    "dram_capacity_bytes": 64 * MiB,
    "dram_block_bytes": 64 * 1024,  # the tiny model's chunks are 8 KiB
    "ssd_capacity_bytes": 256 * MiB,
}


# Chunks of a made-up namespace, for the tests that call a daemon directly.
NAMESPACE = bytes(range(16))
LAYOUT = {"num_layers": 2, "kv_heads": 2, "head_dim": 8, "chunk_tokens": 16, "dtype": "float16"}


def make_chunks(count: int, seed: int) -> dict[bytes, bytes]:
    """`count` chained chunks of random KV in NAMESPACE's layout, by key."""
    rng, made, parent = random.Random(seed), {}, None
    tokens = LAYOUT["chunk_tokens"]
    half = LAYOUT["kv_heads"] * tokens * LAYOUT["head_dim"] * 2  # bytes of K (or V) of one layer
    for index in range(count):
        key = chunk_key(NAMESPACE, parent, [seed, index] * (tokens // 2))
        layers = [(rng.randbytes(half), rng.randbytes(half)) for _ in range(LAYOUT["num_layers"])]
        made[key] = encode_chunk(
            namespace=NAMESPACE, key=key, dtype="float16", kv_heads=LAYOUT["kv_heads"], tokens=tokens,
            head_dim=LAYOUT["head_dim"], base_position=index * tokens, layers=layers,
        )  # fmt: skip
        parent = key
    return made


@dataclass(frozen=True)
class Tokens:
    """Token files: what a worker, the scheduler (admin) and an impostor would present."""

    worker: Path
    admin: Path
    wrong: Path


def write_tokens(directory: Path) -> Tokens:
    paths = []
    for name, token in (("worker", WORKER_TOKEN), ("admin", ADMIN_TOKEN), ("wrong", "guessed-token")):
        paths.append(directory / f"{name}.token")
        paths[-1].write_text(token + "\n")
    return Tokens(*paths)


def server_tls(pki: Pki, *, mutual: bool) -> dict[str, object]:
    tls: dict[str, object] = {"cert_file": pki.server_cert, "key_file": pki.server_key}
    if mutual:
        tls |= {"client_ca_file": pki.ca, "require_client_cert": True}
    return tls


def internal_auth() -> dict[str, object]:
    return {
        "enabled": True,
        "token_sha256": [token_digest(WORKER_TOKEN)],
        "admin_token_sha256": [token_digest(ADMIN_TOKEN)],
    }


def channel(pki: Pki, *, cert: bool, token: Path | None = None) -> dict[str, object]:
    """ChannelSecurity fields: TLS trusting the test CA, the client certificate if `cert`."""
    fields: dict[str, object] = {"tls": True, "ca_file": pki.ca}
    if cert:
        fields |= {"cert_file": pki.client_cert, "key_file": pki.client_key}
    if token is not None:
        fields["token_file"] = token
    return fields


def credentials(pki: Pki, *, cert: bool, token: Path | None = None, **fields: object) -> ClientCredentials:
    loaded = ChannelSecurity.model_validate(channel(pki, cert=cert, token=token) | fields).load("test")
    assert loaded is not None
    return loaded


def start_daemon(root: Path, settings: dict[str, object]) -> DaemonProcess:
    """A daemon under `root` (its arena under /dev/shm); stop it with stop_daemon."""
    shm_root = Path("/dev/shm") if Path("/dev/shm").is_dir() else root
    daemon = DaemonProcess(
        root / "ssd",
        Path(tempfile.mkdtemp(prefix="attnstore-test-", dir=shm_root)),
        root / "daemon.log",
        {**DAEMON_SETTINGS, **settings},
    )
    try:
        daemon.start()
    except BaseException:
        shutil.rmtree(daemon.shm_dir, ignore_errors=True)
        raise
    return daemon


def stop_daemon(daemon: DaemonProcess) -> None:
    daemon.stop()
    shutil.rmtree(daemon.shm_dir, ignore_errors=True)


@dataclass
class SecureStack:
    pki: Pki
    tokens: Tokens
    daemon: DaemonProcess
    worker: WorkerProcess
    scheduler: SchedulerProcess
    _clients: list[AttnStoreClient] = field(default_factory=list)

    def client(self, tenant: str) -> AttnStoreClient:
        """A TLS client of the public API with `tenant`'s key, closed with the stack."""
        public = ClientCredentials.from_pem(self.pki.ca.read_bytes())
        client = AttnStoreClient(
            self.scheduler.address, API_KEYS[tenant], timeout_seconds=120, credentials=public
        )
        self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self.scheduler.stop()
        self.worker.stop()
        stop_daemon(self.daemon)


def start_secure_stack(
    root: Path, model_dir: Path, pki: Pki, tokens: Tokens, scheduler_settings: dict[str, object]
) -> SecureStack:
    """Internal endpoints: mutual TLS and internal auth; the worker dials its daemon with the
    worker token, the scheduler dials both with the admin token. The public API: TLS."""
    daemon = start_daemon(root, {"tls": server_tls(pki, mutual=True), "internal_auth": internal_auth()})
    worker = WorkerProcess(
        root / "worker.log",
        model_dir=model_dir,
        kvstore_address=daemon.address,
        settings={
            "chunk_tokens": CHUNK_TOKENS,
            "tls": server_tls(pki, mutual=True),
            "internal_auth": internal_auth(),
            "kvstore_channel": channel(pki, cert=True, token=tokens.worker),
        },
    )
    try:
        worker.start()
        keys = root / "api-keys.json"
        keys.write_text(json.dumps({t: [token_digest(k)] for t, k in API_KEYS.items()}))
        scheduler = SchedulerProcess(
            root / "scheduler.log",
            nodes=[NodeSpec(name="node", daemon_address=daemon.address, worker_addresses=(worker.address,))],
            api_keys_file=keys,
            settings={
                "tls": server_tls(pki, mutual=False),
                "daemon_channel": channel(pki, cert=True, token=tokens.admin),
                "worker_channel": channel(pki, cert=True, token=tokens.admin),
                "worker_health_interval_seconds": 0.5,
                **scheduler_settings,
            },
        )
        scheduler.start()
    except BaseException:
        worker.stop()
        stop_daemon(daemon)
        raise
    return SecureStack(pki, tokens, daemon, worker, scheduler)
