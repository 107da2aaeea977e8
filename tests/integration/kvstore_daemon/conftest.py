"""A real daemon process per test: port 0, its own SSD directory, its arena in a private
directory under /dev/shm, readiness awaited through the ready file (never a sleep).

Shared helpers come as fixtures (conftest modules are not imported by name):
`chunk_set` builds deterministic test chunks, `raw_stub` opens the generated gRPC stub
for tests that must see real statuses, `poll_until` waits for background work with a
deadline."""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import pytest
from process_factory import ProcessFactory

from attnstore.chunks.format import DTYPE_BYTES, encode_chunk
from attnstore.chunks.keys import chunk_key
from attnstore.kvstore.v1 import kvstore_pb2_grpc
from attnstore.kvstore_client import KVStoreClient, Tier
from attnstore.shm_arena import arena_root
from kvstore_daemon.launcher import DaemonProcess

_POLL_SECONDS = 0.02
MiB = 1024 * 1024
MAX_MESSAGE_BYTES = 64 * MiB
T = TypeVar("T")


class DaemonFactory(ProcessFactory[DaemonProcess]):
    """Starts daemons under `root` with extra settings, e.g. `factory(DRAM_CAPACITY_BYTES=...)`
    (names without the ATTNSTORE_DAEMON_ prefix); `close()` stops them all."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self._root = root
        self._shm_root = arena_root(root)

    def __call__(self, *, ssd_dir: Path | None = None, **settings: object) -> DaemonProcess:
        """`ssd_dir` None: a fresh directory under `root`."""
        directory = self._root / f"daemon{len(self._started)}"
        directory.mkdir()
        defaults = {
            "DRAM_CAPACITY_BYTES": 64 * MiB,
            "SSD_CAPACITY_BYTES": 256 * MiB,
            "MAX_CHUNK_BYTES": 16 * MiB,
        }
        process = DaemonProcess(
            ssd_dir=ssd_dir or directory / "ssd",
            shm_dir=Path(tempfile.mkdtemp(prefix="attnstore-test-", dir=self._shm_root)),
            log_path=directory / "daemon.log",
            settings={**defaults, **settings},
        )
        return self._start(process)

    def _stop(self, process: DaemonProcess) -> None:
        process.stop()
        shutil.rmtree(process.shm_dir, ignore_errors=True)


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[DaemonFactory]:
    """Daemons for one test; all are stopped at teardown."""
    with DaemonFactory(tmp_path) as factory:
        yield factory


@pytest.fixture(scope="module")
def module_daemon_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonFactory]:
    """Daemons shared by the tests of one module (for many cheap cases against one daemon)."""
    with DaemonFactory(tmp_path_factory.mktemp("daemons")) as factory:
        yield factory


@pytest.fixture
def daemon(daemon_factory: DaemonFactory) -> DaemonProcess:
    return daemon_factory()


# ---- test data ---------------------------------------------------------------------------


class ChunkSet:
    """Deterministic chunks of one namespace. Key `i` is link `i` of one chained key
    sequence (so keys 0..n-1 form a valid Lookup chain); its K/V bytes are seeded random,
    and `version` gives the same key other bytes. A full chunk is a 4 KiB header block
    plus `num_layers` layers of K and V, each [kv_heads, chunk_tokens, head_dim]."""

    def __init__(
        self,
        namespace: bytes = bytes(range(16)),
        *,
        num_layers: int = 4,
        kv_heads: int = 2,
        head_dim: int = 32,
        chunk_tokens: int = 16,
        dtype: str = "float16",
        seed: int = 0,
    ) -> None:
        self.namespace = namespace
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.chunk_tokens = chunk_tokens
        self.dtype = dtype
        self._seed = seed
        self._keys: list[bytes] = []
        self._data: dict[tuple[int, int, int], bytes] = {}

    @property
    def layout(self) -> dict[str, Any]:
        """RegisterNamespace's layout fields (keyword arguments of `register_namespace`)."""
        return {
            "num_layers": self.num_layers,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "chunk_tokens": self.chunk_tokens,
            "dtype": self.dtype,
        }

    def register(self, client: KVStoreClient) -> int:
        return client.register_namespace(self.namespace, **self.layout)

    def key(self, index: int) -> bytes:
        while len(self._keys) <= index:
            parent = self._keys[-1] if self._keys else None
            first = len(self._keys) * self.chunk_tokens
            self._keys.append(chunk_key(self.namespace, parent, range(first, first + self.chunk_tokens)))
        return self._keys[index]

    def keys(self, start: int, stop: int) -> list[bytes]:
        return [self.key(index) for index in range(start, stop)]

    def data(self, index: int, *, tokens: int | None = None, version: int = 0) -> bytes:
        """The serialized chunk of key `index` (`tokens` < chunk_tokens: a partial chunk)."""
        tokens = tokens or self.chunk_tokens
        cached = self._data.get((index, tokens, version))
        if cached is None:
            rng = random.Random(f"{self._seed}/{index}/{tokens}/{version}")
            half = self.kv_heads * tokens * self.head_dim * DTYPE_BYTES[self.dtype]  # K or V of a layer
            cached = encode_chunk(
                namespace=self.namespace,
                key=self.key(index),
                dtype=self.dtype,
                kv_heads=self.kv_heads,
                tokens=tokens,
                head_dim=self.head_dim,
                base_position=index * self.chunk_tokens,
                layers=[(rng.randbytes(half), rng.randbytes(half)) for _ in range(self.num_layers)],
            )
            self._data[(index, tokens, version)] = cached
        return cached

    def items(self, start: int, stop: int) -> dict[bytes, bytes]:
        return {self.key(index): self.data(index) for index in range(start, stop)}

    def tiers(self, client: KVStoreClient, indices: Iterable[int]) -> list[Tier | None]:
        """Where each chunk is now (None: not stored), one single-key Lookup per chunk."""
        found = []
        for index in indices:
            result = client.lookup(self.namespace, [self.key(index)])
            found.append(result.tiers[0] if result.prefix_length else None)
        return found


@pytest.fixture(scope="session")
def chunk_set() -> type[ChunkSet]:
    """`chunk_set(namespace, num_layers=..., seed=...)` builds a ChunkSet."""
    return ChunkSet


# ---- raw gRPC and waiting --------------------------------------------------------------------


def open_channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(
        address,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )


@pytest.fixture
def raw_stub() -> Iterator[Callable[[DaemonProcess], kvstore_pb2_grpc.KVStoreStub]]:
    """`raw_stub(daemon)`: the generated blocking stub, for tests that check real statuses;
    its channel closes at teardown."""
    channels: list[grpc.Channel] = []

    def open_stub(process: DaemonProcess) -> kvstore_pb2_grpc.KVStoreStub:
        channels.append(open_channel(process.address))
        return kvstore_pb2_grpc.KVStoreStub(channels[-1])

    try:
        yield open_stub
    finally:
        for channel in channels:
            channel.close()


class PollUntil(Protocol):
    def __call__(self, condition: Callable[[], T], *, what: str, timeout_seconds: float = ...) -> T: ...


def wait_for(condition: Callable[[], T], *, what: str, timeout_seconds: float = 10.0) -> T:
    """Polls `condition` until it returns something truthy (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds}s waiting for {what} (last: {value!r})")
        time.sleep(_POLL_SECONDS)


@pytest.fixture
def poll_until() -> PollUntil:
    """`poll_until(condition, what="...", timeout_seconds=10)`: the truthy value, or a failure
    naming `what` at the deadline. For background work (demotion, expiry, prefetch)."""
    return wait_for
