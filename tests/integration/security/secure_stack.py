"""Settings and processes of the security integration tests (imported by the tests of this
folder; the fixtures are in conftest.py): TLS and internal-auth settings as the services
read them, client credentials, and `start_secure_stack`, a LocalStack of a daemon + one
worker + a scheduler with TLS on every endpoint, mutual TLS and internal tokens between
them."""

from __future__ import annotations

import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from stack_clients import StackClients
from tls_certs import Pki

from attnstore.api_client import AttnStoreClient
from attnstore.chunks.format import encode_chunk
from attnstore.chunks.keys import chunk_key
from attnstore.security import ChannelSecurity, ClientCredentials, token_digest
from attnstore.shm_arena import arena_root
from attnstore_cli.local_stack import LocalStack
from attnstore_cli.stack_spec import InternalAuth, StackSpec, StackTls, WorkerSpec
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


def stack_tls(pki: Pki) -> StackTls:
    return StackTls(pki.ca, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key)


def server_tls(pki: Pki, *, mutual: bool) -> dict[str, object]:
    return stack_tls(pki).server(mutual=mutual)


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
    shm_root = arena_root(root)
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
class SecureStack(StackClients):
    """One LocalStack with TLS and internal auth, and the clients the tests open on it."""

    pki: Pki
    tokens: Tokens
    local: LocalStack
    _clients: list[AttnStoreClient] = field(default_factory=list)

    @property
    def worker(self) -> WorkerProcess:
        return self.local.worker

    def client(self, tenant: str) -> AttnStoreClient:
        """A TLS client of the public API with `tenant`'s key, closed with the stack."""
        return self._open_client(API_KEYS[tenant], ClientCredentials.from_pem(self.pki.ca.read_bytes()))


def start_secure_stack(
    root: Path, model_dir: Path, pki: Pki, tokens: Tokens, scheduler_settings: dict[str, object]
) -> SecureStack:
    """Internal endpoints: mutual TLS and internal auth; the worker dials its daemon with the
    worker token, the scheduler dials both with the admin token. The public API: TLS."""
    spec = StackSpec(
        work_dir=root,
        model_dir=model_dir,
        workers=(WorkerSpec("node"),),
        api_keys=API_KEYS,
        tls=stack_tls(pki),
        internal_auth=InternalAuth(worker_token_file=tokens.worker, admin_token_file=tokens.admin),
        daemon_settings=DAEMON_SETTINGS,
        worker_settings={"chunk_tokens": CHUNK_TOKENS},
        scheduler_settings={"worker_health_interval_seconds": 0.5, **scheduler_settings},
    )
    return SecureStack(pki, tokens, LocalStack(spec).start())
