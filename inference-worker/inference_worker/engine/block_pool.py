"""The KV block pool: fixed-size blocks, their reference counts, the free list, and the
prefix map that lets sequences share the blocks of a common prefix (PagedAttention).

A block holds the KV of `block_tokens` consecutive tokens of one or more sequences. Its
lifecycle:

    free (no key) --allocate--> owned (ref 1) --fork / prefix hit--> shared (ref > 1)
    owned/shared --computed full--> keyed (in the prefix map, findable by its chain key)
    ref drops to 0 --> free; with `keep_freed_prefixes` its key is kept (cached): a later
                       prefix hit revives it, taking it for new tokens drops the key
    a sequence about to write into a shared block --copy-on-write--> its own copy (ref 1)

Decisions:
- Keys are the project's chained chunk keys (`chunk_key(namespace, parent, tokens)`) over
  block-sized runs of tokens, in the sequence's namespace (model, dtype, tenant: tenants
  never share blocks). Block size divides the chunk size; with equal sizes (the
  default) a pool block and a daemon chunk have the same key, so "in the pool", "in the
  daemon's DRAM" and "on SSD" are three levels of one cache.
- A block gets its key only once its KV is computed (`commit`), never at allocation: with
  chunked prefill another sequence could otherwise hit a block still being filled.
- A prefix hit never covers the block holding a sequence's last token: that token's logits
  start the decoding, so at least it is computed (as the daemon lookup does).
- Blocks never used go first, then freed ones oldest-freed first, so the cached prefixes
  freed last survive longest. Every count is kept as it changes: a step never walks the
  pool (a CPU pool sized from free RAM holds a million blocks of a tiny model).
- Keeping freed prefixes is a choice (`keep_freed_prefixes`): off, the pool shares blocks
  among live sequences only and the daemon stays the one cache across turns (every turn's
  KV is saved there), so a turn's reuse statistics say what the store gave it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from attnstore.chunks.keys import chunk_key
from inference_worker.engine.sequence import Sequence


class PoolExhausted(RuntimeError):
    """An allocation was attempted without checking `can_allocate` / `can_append` first."""


@dataclass(frozen=True)
class BlockCopy:
    """Copy-on-write: the runner copies block `src`'s KV into `dst` before the next write."""

    src: int
    dst: int


@dataclass(frozen=True)
class PoolUsage:
    total: int
    used: int  # referenced by at least one sequence
    shared: int  # referenced by more than one
    cached: int  # free but still keyed: a prefix hit can revive them

    @property
    def free(self) -> int:
        return self.total - self.used


class BlockPool:
    def __init__(self, num_blocks: int, block_tokens: int, *, keep_freed_prefixes: bool = True) -> None:
        if num_blocks < 1 or block_tokens < 1:
            raise ValueError(f"a pool needs blocks ({num_blocks}) of at least one token ({block_tokens})")
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        self.keep_freed_prefixes = keep_freed_prefixes
        self.ref_counts = [0] * num_blocks
        self.keys: list[bytes | None] = [None] * num_blocks
        self.by_key: dict[bytes, int] = {}
        self._never_used_from = 0  # blocks from here on were never taken
        self._freed: OrderedDict[int, None] = OrderedDict()  # free again, oldest first
        self._used = self._shared = self._cached = 0

    # ---- queries -----------------------------------------------------------------------

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    @property
    def free_blocks(self) -> int:
        return self.num_blocks - self._used

    def usage(self) -> PoolUsage:
        return PoolUsage(self.num_blocks, self._used, self._shared, self._cached)

    def cached_tokens(self, seq: Sequence) -> int:
        """How many of `seq`'s leading tokens a prefix hit would find in the pool now (safe
        to ask from another thread: a plain read, stale by the time `seq` is admitted)."""
        return len(self._hits(seq)) * self.block_tokens

    def _hits(self, seq: Sequence) -> list[int]:
        """The pool blocks holding the longest computed prefix of `seq`'s full blocks (the
        block of its last token excluded)."""
        hits: list[int] = []
        for index in range((len(seq) - 1) // self.block_tokens):
            block = self.by_key.get(self._key(seq, index))
            if block is None:
                break
            hits.append(block)
        return hits

    def _key(self, seq: Sequence, index: int) -> bytes:
        """The chain key of `seq`'s full block `index` (memoized on the sequence)."""
        keys, size = seq.block_keys, self.block_tokens
        while len(keys) <= index:
            start = len(keys) * size
            keys.append(
                chunk_key(seq.namespace, keys[-1] if keys else None, seq.token_ids[start : start + size])
            )
        return keys[index]

    # ---- admission -----------------------------------------------------------------------

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether `allocate(seq)` finds the blocks for all of `seq`'s tokens (hits revived
        from the free list count against it)."""
        hits = self._hits(seq)
        revived = sum(1 for block in hits if self.ref_counts[block] == 0)
        return self.blocks_for(len(seq)) - len(hits) + revived <= self.free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Gives a sequence without blocks the blocks of all its tokens: the prefix found in
        the pool shared (its KV counted as computed), fresh blocks for the rest."""
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id} already holds blocks")
        if not self.can_allocate(seq):
            raise PoolExhausted(f"sequence {seq.seq_id} needs more blocks than are free")
        hits = self._hits(seq)
        for block in hits:
            self._take(block)
        seq.block_table = hits + [self._take_fresh() for _ in range(self.blocks_for(len(seq)) - len(hits))]
        seq.computed_tokens = len(hits) * self.block_tokens

    # ---- growth --------------------------------------------------------------------------

    def can_append(self, seq: Sequence) -> bool:
        """Whether `append_slot(seq)` finds a block for its tokens (at most one is needed)."""
        return self._blocks_needed_to_write(seq) <= self.free_blocks

    def _blocks_needed_to_write(self, seq: Sequence) -> int:
        if len(seq) > len(seq.block_table) * self.block_tokens:
            return 1
        last = seq.block_table[(len(seq) - 1) // self.block_tokens]
        return int(self.ref_counts[last] > 1)  # copy-on-write

    def append_slot(self, seq: Sequence) -> BlockCopy | None:
        """Makes `seq`'s last token writable after it grew by one token: a new block when
        it starts one, a private copy when its block is shared (returned: the runner copies
        the KV before writing)."""
        if len(seq) - seq.computed_tokens != 1:
            raise ValueError(f"sequence {seq.seq_id} grows by one token at a time")
        if not self.can_append(seq):
            raise PoolExhausted(f"sequence {seq.seq_id} needs a block and none is free")
        index = (len(seq) - 1) // self.block_tokens
        if index == len(seq.block_table):
            seq.block_table.append(self._take_fresh())
            return None
        block = seq.block_table[index]
        if self.ref_counts[block] == 1:
            return None
        copy = self._take_fresh()
        self._release(block)
        seq.block_table[index] = copy
        return BlockCopy(src=block, dst=copy)

    def commit(self, seq: Sequence, computed_tokens: int) -> None:
        """Records that `seq`'s KV now covers its first `computed_tokens` tokens, and keys
        the blocks that became full so later sequences find them."""
        if not seq.computed_tokens <= computed_tokens <= len(seq):
            raise ValueError(f"computed tokens go from {seq.computed_tokens} to {computed_tokens}")
        first = seq.computed_tokens // self.block_tokens
        seq.computed_tokens = computed_tokens
        for index in range(first, computed_tokens // self.block_tokens):
            key = self._key(seq, index)
            block = seq.block_table[index]
            if self.keys[block] is None and key not in self.by_key:
                self.keys[block] = key
                self.by_key[key] = block

    # ---- sharing and release -------------------------------------------------------------

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` (a sample of `parent`, same tokens) shares all of parent's blocks."""
        if child.block_table or child.token_ids != parent.token_ids:
            raise ValueError("a fork starts without blocks, with its parent's tokens")
        for block in parent.block_table:
            self._add_ref(block, 1)
        child.block_table = list(parent.block_table)
        child.computed_tokens = parent.computed_tokens
        child.block_keys = list(parent.block_keys)

    def free(self, seq: Sequence) -> None:
        """Releases `seq`'s blocks (last first, so the tail of a prefix is reused before its
        head); it keeps its tokens and can be allocated again (preemption)."""
        for block in reversed(seq.block_table):
            self._release(block)
        seq.block_table = []
        seq.computed_tokens = 0

    def _take(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self._freed[block]
            self._cached -= self.keys[block] is not None
        self._add_ref(block, 1)

    def _take_fresh(self) -> int:
        if self._never_used_from < self.num_blocks:
            block = self._never_used_from
            self._never_used_from += 1
        elif self._freed:
            block, _ = self._freed.popitem(last=False)
            key = self.keys[block]
            if key is not None:  # its cached prefix is gone
                del self.by_key[key]
                self.keys[block] = None
                self._cached -= 1
        else:
            raise PoolExhausted("no free block")
        self._add_ref(block, 1)
        return block

    def _release(self, block: int) -> None:
        self._add_ref(block, -1)
        if self.ref_counts[block]:
            return
        self._freed[block] = None
        key = self.keys[block]
        if key is None:
            return
        if self.keep_freed_prefixes:
            self._cached += 1
        else:
            del self.by_key[key]
            self.keys[block] = None

    def _add_ref(self, block: int, delta: int) -> None:
        before = self.ref_counts[block]
        after = before + delta
        self.ref_counts[block] = after
        self._used += (after > 0) - (before > 0)
        self._shared += (after > 1) - (before > 1)
