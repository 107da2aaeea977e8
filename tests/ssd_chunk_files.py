"""The chunk files a daemon left in its SSD directory, read as another program would (for
the tests of crashes and full disks)."""

from __future__ import annotations

from pathlib import Path

from attnstore.chunks.format import decode_layout, verify_layers


def verified_chunk_files(ssd_dir: Path) -> dict[bytes, tuple[bytes, bytes]]:
    """key -> (namespace, bytes) of every chunk file, each checked against its own per-layer
    checksums."""
    found = {}
    for path in ssd_dir.glob("chunks/*/*.chunk"):
        data = path.read_bytes()
        layout = decode_layout(data)
        verify_layers(data, layout, 0, layout.header.num_layers)
        found[layout.header.key] = (layout.header.namespace, data)
    return found
