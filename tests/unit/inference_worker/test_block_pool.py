"""The block pool against a model of it: sequences allocated, grown, forked (parallel
samples), preempted and resumed, freed; reference counts, the free list and the prefix map
must stay exact, and every sequence must read its own tokens through its block table
(a shadow of the KV pool records which token each slot holds)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule

from inference_worker.engine.block_pool import BlockPool, PoolExhausted
from inference_worker.engine.sequence import Sequence

BLOCK = 2
BLOCKS = 12
tokens = st.lists(st.integers(0, 2), min_size=1, max_size=9)


class PoolMachine(RuleBasedStateMachine):
    live = Bundle("live")
    keep_freed_prefixes = True

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(BLOCKS, BLOCK, keep_freed_prefixes=self.keep_freed_prefixes)
        self.slots: list[list[int | None]] = [[None] * BLOCK for _ in range(BLOCKS)]  # the "KV"
        self.sequences: list[Sequence] = []
        self.preempted: list[Sequence] = []

    def _compute(self, seq: Sequence) -> None:
        """What a forward pass does: writes the KV of the pending tokens, then commits."""
        for position in range(seq.computed_tokens, len(seq)):
            block = seq.block_table[position // BLOCK]
            assert (
                self.pool.ref_counts[block] == 1
                or self.slots[block][position % BLOCK] == seq.token_ids[position]
            )
            self.slots[block][position % BLOCK] = seq.token_ids[position]
        self.pool.commit(seq, len(seq))

    def _admit(self, seq: Sequence) -> bool:
        if not self.pool.can_allocate(seq):
            with pytest.raises(PoolExhausted):
                self.pool.allocate(seq)
            assert seq.block_table == []
            return False
        self.pool.allocate(seq)
        assert seq.computed_tokens < len(seq)  # the last token is always computed
        self._compute(seq)
        self.sequences.append(seq)
        return True

    @rule(target=live, prompt=tokens)
    def new_sequence(self, prompt: list[int]) -> Sequence:
        seq = Sequence.of(prompt)
        self._admit(seq)
        return seq

    @rule(target=live, data=st.data())
    @precondition(lambda self: self.sequences)
    def new_sequence_sharing_a_prefix(self, data: st.DataObject) -> Sequence:
        other = data.draw(st.sampled_from(self.sequences))
        cut = data.draw(st.integers(1, len(other)))
        seq = Sequence.of(other.token_ids[:cut] + data.draw(tokens))
        self._admit(seq)
        return seq

    @rule(seq=live, token=st.integers(0, 2))
    def append(self, seq: Sequence, token: int) -> None:
        if seq not in self.sequences:
            return
        seq.token_ids.append(token)
        if not self.pool.can_append(seq):
            with pytest.raises(PoolExhausted):
                self.pool.append_slot(seq)
            seq.token_ids.pop()
            return
        copy = self.pool.append_slot(seq)
        if copy is not None:
            assert self.pool.ref_counts[copy.src] >= 1 and self.pool.ref_counts[copy.dst] == 1
            self.slots[copy.dst] = list(self.slots[copy.src])
        self._compute(seq)

    @rule(target=live, seq=live)
    def fork(self, seq: Sequence) -> Sequence:
        child = Sequence.of(seq.token_ids)
        if seq in self.sequences:
            self.pool.fork(seq, child)
            self.sequences.append(child)
        return child

    @rule(seq=consumes(live))
    def finish(self, seq: Sequence) -> None:
        if seq in self.sequences:
            self.pool.free(seq)
            self.sequences.remove(seq)
            assert seq.block_table == [] and seq.computed_tokens == 0

    @rule(seq=live)
    def preempt(self, seq: Sequence) -> None:
        if seq in self.sequences:
            self.pool.free(seq)
            self.sequences.remove(seq)
            self.preempted.append(seq)

    @rule()
    @precondition(lambda self: self.preempted)
    def resume(self) -> None:
        seq = self.preempted[0]
        if self._admit(seq):
            self.preempted.pop(0)

    @invariant()
    def reference_counts_are_exact(self) -> None:
        expected = [0] * BLOCKS
        for seq in self.sequences:
            assert len(seq.block_table) == self.pool.blocks_for(len(seq))
            for block in seq.block_table:
                expected[block] += 1
        assert self.pool.ref_counts == expected
        usage = self.pool.usage()
        assert usage.used == sum(1 for count in expected if count)
        assert usage.shared == sum(1 for count in expected if count > 1)
        assert usage.free == self.pool.free_blocks == expected.count(0)

    @invariant()
    def prefix_map_points_at_full_keyed_blocks(self) -> None:
        keyed = {block: key for block, key in enumerate(self.pool.keys) if key is not None}
        assert self.pool.by_key == {key: block for block, key in keyed.items()}
        for block in keyed:
            assert None not in self.slots[block]
            assert self.keep_freed_prefixes or self.pool.ref_counts[block] > 0

    @invariant()
    def every_sequence_reads_its_own_tokens(self) -> None:
        for seq in self.sequences:
            assert seq.computed_tokens == len(seq)
            read = [self.slots[seq.block_table[i // BLOCK]][i % BLOCK] for i in range(len(seq))]
            assert read == seq.token_ids


class LivePrefixesMachine(PoolMachine):
    keep_freed_prefixes = False


TestBlockPool = PoolMachine.TestCase
TestBlockPool.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestBlockPoolLivePrefixes = LivePrefixesMachine.TestCase
TestBlockPoolLivePrefixes.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_a_shared_prefix_is_found_and_the_last_token_recomputed() -> None:
    pool = BlockPool(8, 2)
    first = Sequence.of([1, 2, 3, 4, 5])
    pool.allocate(first)
    pool.commit(first, 5)
    second = Sequence.of([1, 2, 3, 4])  # blocks [1, 2] and [3, 4]: the second holds its last token
    pool.allocate(second)
    assert second.computed_tokens == 2 and second.block_table[0] == first.block_table[0]
    assert pool.usage().shared == 1


def test_a_fork_copies_the_partial_block_it_writes_into() -> None:
    pool = BlockPool(8, 4)
    parent = Sequence.of([1, 2, 3])
    pool.allocate(parent)
    pool.commit(parent, 3)
    child = Sequence.of(parent.token_ids)
    pool.fork(parent, child)
    child.token_ids.append(9)
    copy = pool.append_slot(child)
    assert copy is not None and copy.src == parent.block_table[0] and child.block_table == [copy.dst]
    parent.token_ids.append(7)
    assert pool.append_slot(parent) is None  # the last sharer writes in place
