"""Registered namespaces: the KV layout every chunk of a namespace must have.

Persisted next to the SSD tier so a restarted daemon knows the namespaces of the
chunks it recovers.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import msgpack
import structlog

from attnstore.chunks.format import DTYPE_BYTES, ChunkHeader, max_chunk_bytes
from attnstore.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted
from kvstore_daemon import metrics

log = structlog.get_logger("kvstore_daemon.namespaces")


@dataclass(frozen=True)
class NamespaceLayout:
    num_layers: int
    kv_heads: int
    head_dim: int
    chunk_tokens: int
    dtype: str
    model_label: str = ""

    @property
    def max_chunk_bytes(self) -> int:
        return max_chunk_bytes(
            num_layers=self.num_layers,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            chunk_tokens=self.chunk_tokens,
            dtype=self.dtype,
        )

    def check_header(self, header: ChunkHeader) -> None:
        """Raises InvalidArgument unless a chunk header fits this layout."""
        expected = (self.num_layers, self.kv_heads, self.head_dim, self.dtype)
        got = (header.num_layers, header.kv_heads, header.head_dim, header.dtype)
        if got != expected:
            raise InvalidArgument(
                f"chunk shape (layers, kv_heads, head_dim, dtype)={got} does not match the namespace's {expected}"
            )
        if not 1 <= header.tokens <= self.chunk_tokens:
            raise InvalidArgument(
                f"chunk holds {header.tokens} tokens; the namespace allows 1..{self.chunk_tokens}"
            )


def validate_layout(layout: NamespaceLayout) -> None:
    for name in ("num_layers", "kv_heads", "head_dim", "chunk_tokens"):
        if not 1 <= getattr(layout, name) <= 1 << 16:
            raise InvalidArgument(f"layout.{name} must be between 1 and 65536, got {getattr(layout, name)}")
    if layout.dtype not in DTYPE_BYTES:
        raise InvalidArgument(f"layout.dtype must be one of {sorted(DTYPE_BYTES)}, got {layout.dtype!r}")
    if len(layout.model_label) > 256:
        raise InvalidArgument("layout.model_label must be at most 256 characters")


class NamespaceTableFull(ResourceExhausted):
    """Every slot holds a namespace that is in use (holds chunks or was used lately)."""


class RegistrationRateLimited(ResourceExhausted):
    """A caller registered new namespaces faster than its rate allows."""


class NamespaceRegistry:
    """Registered namespaces in least-recently-used order (every call naming one uses it).

    At `max_namespaces`, a new registration reclaims the least recently used namespace
    that is idle (unused for `idle_seconds`) and empty (`in_use` says it holds no chunk
    and no write): nothing of it is stored, so nothing can be served under a new
    layout of its name. The file is rewritten (atomically) on every change; after a
    restart every namespace counts as used at start.
    """

    def __init__(
        self,
        path: Path,
        max_namespaces: int,
        max_chunk_bytes: int,
        idle_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        self._max_namespaces = max_namespaces
        self._max_chunk_bytes = max_chunk_bytes
        self._idle_seconds = idle_seconds
        self._clock = clock
        self._layouts: OrderedDict[bytes, NamespaceLayout] = OrderedDict()  # oldest use first
        self._last_used: dict[bytes, float] = {}
        self._unsaved = False  # a change the file does not hold yet
        if path.exists():
            now = clock()
            for namespace, fields in msgpack.unpackb(path.read_bytes()).items():
                self._layouts[namespace] = NamespaceLayout(**fields)
                self._last_used[namespace] = now

    def __len__(self) -> int:
        return len(self._layouts)

    @property
    def max_namespaces(self) -> int:
        return self._max_namespaces

    def __contains__(self, namespace: bytes) -> bool:
        return namespace in self._layouts

    def register(self, namespace: bytes, layout: NamespaceLayout, in_use: Callable[[bytes], bool]) -> int:
        """Registers idempotently; returns the namespace's largest chunk in bytes."""
        validate_layout(layout)
        if layout.max_chunk_bytes > self._max_chunk_bytes:
            raise InvalidArgument(
                f"a full chunk of this layout is {layout.max_chunk_bytes} bytes, over the daemon's "
                f"max_chunk_bytes of {self._max_chunk_bytes}"
            )
        existing = self._layouts.get(namespace)
        if existing is not None:
            if existing != layout:
                raise AlreadyExists(f"namespace {namespace.hex()} is registered with a different layout")
            self._touch(namespace)
            return existing.max_chunk_bytes
        if len(self._layouts) >= self._max_namespaces and not self._reclaim_one(in_use):
            raise NamespaceTableFull(
                f"the daemon holds its maximum of {self._max_namespaces} namespaces (max_namespaces) and "
                f"none is both empty and unused for {self._idle_seconds:g}s (namespace_idle_seconds); "
                "this namespace is not registered, so its KV is neither stored nor reused"
            )
        self._layouts[namespace] = layout
        self._touch(namespace)
        self._save_or_warn(namespace)
        return layout.max_chunk_bytes

    def get(self, namespace: bytes) -> NamespaceLayout:
        """The namespace's layout; counts as a use."""
        layout = self._layouts.get(namespace)
        if layout is None:
            raise NotFound(f"unknown namespace {namespace.hex()}; call RegisterNamespace first")
        self._touch(namespace)
        return layout

    def _touch(self, namespace: bytes) -> None:
        self._layouts.move_to_end(namespace)
        self._last_used[namespace] = self._clock()

    def _reclaim_one(self, in_use: Callable[[bytes], bool]) -> bool:
        """Forgets the least recently used idle, empty namespace; False if there is none."""
        idle_before = self._clock() - self._idle_seconds
        for namespace in self._layouts:  # oldest use first: stop at the first one used lately
            if self._last_used[namespace] > idle_before:
                return False
            if not in_use(namespace):
                del self._layouts[namespace], self._last_used[namespace]
                metrics.NAMESPACES_RECLAIMED.inc()
                log.info("namespace_reclaimed", namespace=namespace.hex())
                return True
        return False

    def _save_or_warn(self, namespace: bytes) -> None:
        try:
            self._save()
        except OSError as exc:
            # A full or read-only disk: DRAM still serves the namespace. The file only lets a
            # restart recover SSD chunks, which that disk cannot take either; upkeep writes
            # it again once the SSD tier has shrunk to leave its reserve free.
            self._unsaved = True
            log.warning("namespace_not_persisted", namespace=namespace.hex(), error=str(exc))

    def save_if_changed(self) -> None:
        """Writes the file if a change could not be saved before (upkeep calls this)."""
        if not self._unsaved:
            return
        try:
            self._save()
        except OSError:
            return  # still full or read-only: the warning was logged when the change was made
        log.info("namespaces_persisted", namespaces=len(self._layouts))

    def _save(self) -> None:
        # Atomic replace: a crash leaves either the old or the new file.
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(msgpack.packb({ns: asdict(layout) for ns, layout in self._layouts.items()}))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)
            self._unsaved = False
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # a partial file would hold on to the space of a full disk
            raise
