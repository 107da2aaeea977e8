"""What the scheduler-side connector tells the worker-side one each step (vLLM pickles
it to the workers when they run in other processes). No vLLM import here: the planning
is tested without vLLM (connector.py wraps a StepPlan in vLLM's metadata type)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoadSpec:
    """Read consecutive chunks into `block_ids`, `blocks_per_chunk` per chunk; the first
    `skip_blocks` of them vLLM holds already (its own prefix cache) and are not written.
    Each tensor-parallel rank reads its own chunks (its own kv heads): `namespaces[rank]`,
    `keys[rank]`."""

    req_id: str
    namespaces: tuple[bytes, ...]
    keys: tuple[tuple[bytes, ...], ...]
    block_ids: tuple[int, ...]
    skip_blocks: int

    @property
    def written_block_ids(self) -> tuple[int, ...]:
        return self.block_ids[self.skip_blocks :]


@dataclass(frozen=True)
class SaveSpec:
    """Gather `block_ids` (one chunk's blocks, whose KV this step completes) and store them
    as chunk `keys[rank]` in `namespaces[rank]`; its first token is at `base_position`."""

    req_id: str
    namespaces: tuple[bytes, ...]
    keys: tuple[bytes, ...]
    block_ids: tuple[int, ...]
    base_position: int


@dataclass
class StepPlan:
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
