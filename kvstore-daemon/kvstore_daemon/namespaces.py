"""Registered namespaces: the KV layout every chunk of a namespace must have.

Persisted next to the SSD tier so a restarted daemon knows the namespaces of the
chunks it recovers.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import msgpack
import structlog

from attnstore.chunks.format import DTYPE_BYTES, ChunkHeader, max_chunk_bytes
from attnstore.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted

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
            raise InvalidArgument(f"chunk holds {header.tokens} tokens; the namespace allows 1..{self.chunk_tokens}")


def validate_layout(layout: NamespaceLayout) -> None:
    for name in ("num_layers", "kv_heads", "head_dim", "chunk_tokens"):
        if not 1 <= getattr(layout, name) <= 1 << 16:
            raise InvalidArgument(f"layout.{name} must be between 1 and 65536, got {getattr(layout, name)}")
    if layout.dtype not in DTYPE_BYTES:
        raise InvalidArgument(f"layout.dtype must be one of {sorted(DTYPE_BYTES)}, got {layout.dtype!r}")
    if len(layout.model_label) > 256:
        raise InvalidArgument("layout.model_label must be at most 256 characters")


class NamespaceRegistry:
    def __init__(self, path: Path, max_namespaces: int, max_chunk_bytes: int) -> None:
        self._path = path
        self._max_namespaces = max_namespaces
        self._max_chunk_bytes = max_chunk_bytes
        self._layouts: dict[bytes, NamespaceLayout] = {}
        if path.exists():
            for namespace, fields in msgpack.unpackb(path.read_bytes()).items():
                self._layouts[namespace] = NamespaceLayout(**fields)

    def __len__(self) -> int:
        return len(self._layouts)

    def register(self, namespace: bytes, layout: NamespaceLayout) -> int:
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
            return existing.max_chunk_bytes
        if len(self._layouts) >= self._max_namespaces:
            raise ResourceExhausted(f"the daemon holds its maximum of {self._max_namespaces} namespaces")
        self._layouts[namespace] = layout
        try:
            self._save()
        except OSError as exc:
            # A full or read-only disk: DRAM still serves the namespace. The file only lets a
            # restart recover SSD chunks, which that disk cannot take either; the next
            # registration writes it again.
            log.warning("namespace_not_persisted", namespace=namespace.hex(), error=str(exc))
        return layout.max_chunk_bytes

    def get(self, namespace: bytes) -> NamespaceLayout:
        layout = self._layouts.get(namespace)
        if layout is None:
            raise NotFound(f"unknown namespace {namespace.hex()}; call RegisterNamespace first")
        return layout

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
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # a partial file would hold on to the space of a full disk
            raise
