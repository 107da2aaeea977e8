"""Which sequences run in the next step, and how many tokens each: decodes first, then
prefill chunks under a token budget; preemption when the pool runs out.

Policy (vLLM's and nano-vllm's, with chunked prefill mixed into decode steps):
1. Every running sequence that decodes gets its one token, oldest first. When the pool
   has no block for one, the newest running sequence is preempted (its blocks freed,
   back to the front of the waiting queue) until it fits, or the sequence itself is.
2. Running sequences still prefilling continue, in chunks, within `max_batch_tokens`.
3. Waiting sequences are admitted in arrival order while the budget, `max_batch_sequences`
   and the pool allow; a preempted one resumes by prefilling its tokens again (the pool's
   cached blocks, then the store, cover what they can).
A sequence whose prompt can never fit the pool is refused at submission (engine.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from inference_worker.engine.block_pool import BlockCopy, BlockPool
from inference_worker.engine.model_runner import Work
from inference_worker.engine.sequence import Sequence, Status


@dataclass
class Plan:
    work: list[Work] = field(default_factory=list)
    copies: list[BlockCopy] = field(default_factory=list)  # copy-on-write before the forward
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        pool: BlockPool,
        *,
        max_batch_tokens: int,
        max_batch_sequences: int,
        before_free: Callable[[Sequence], None] = lambda seq: None,
    ) -> None:
        """`before_free(seq)`: called on a preempted sequence while it still holds its blocks."""
        self.pool = pool
        self.before_free = before_free
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_sequences = max_batch_sequences
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last is preempted first

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Takes `seq` out of the queues (finished or aborted); its blocks stay its owner's."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Plan:
        plan = Plan()
        budget = self.max_batch_tokens
        for seq in list(self.running):
            if seq.pending_tokens != 1 or seq.prefix is not None:
                continue
            while not self.pool.can_append(seq):
                victim = self.running[-1]
                self._preempt(victim, plan)
                if victim is seq:
                    break
            else:
                copy = self.pool.append_slot(seq)
                if copy is not None:
                    plan.copies.append(copy)
                plan.work.append(Work(seq, 1))
                budget -= 1
        decoding = {item.seq for item in plan.work}
        for seq in self.running:
            if seq not in decoding and budget > 0:
                tokens = min(seq.pending_tokens, budget)
                plan.work.append(Work(seq, tokens))
                budget -= tokens
        while self.waiting and budget > 0 and len(self.running) < self.max_batch_sequences:
            seq = self.waiting[0]
            if not self.pool.can_allocate(seq):
                break
            self.waiting.popleft()
            self._admit(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            tokens = min(seq.pending_tokens, budget)
            plan.work.append(Work(seq, tokens))
            budget -= tokens
        return plan

    def fork_samples(self, seq: Sequence) -> list[Sequence]:
        """Parallel sampling: `seq`'s prompt is computed, so the samples waiting on it
        (`seq.forks`) share all its blocks and run from now on; a block is copied only
        when one of them writes into it (`append_slot`)."""
        forks, seq.forks = seq.forks, []
        for sample in forks:
            self.pool.fork(seq, sample)
            sample.status = Status.RUNNING
            self.running.append(sample)
        return forks

    def _admit(self, seq: Sequence) -> None:
        """Allocates `seq`'s blocks; stored KV it brings (`prefix`) covers what the pool's
        own prefix hit does not, and is written into its blocks during its first forward."""
        self.pool.allocate(seq)
        seq.cached_tokens = seq.computed_tokens
        if seq.prefix is None:
            return
        if seq.computed_tokens >= seq.prefix.prefix_tokens:
            seq.prefix = None  # the pool already held all of it
            return
        if seq.computed_tokens < seq.prefix.start_tokens:
            seq.prefix = None  # the pool let go of blocks the load counted on: recompute them
            return
        seq.prefix_skip = seq.computed_tokens
        seq.computed_tokens = seq.prefix.prefix_tokens

    def _preempt(self, seq: Sequence, plan: Plan) -> None:
        """Frees `seq`'s blocks; it waits at the front of the queue, or, resumable through
        the store (`store_chunk_tokens`), with its owner, who submits it again."""
        self.running.remove(seq)
        self.before_free(seq)
        self.pool.free(seq)
        seq.prefix = None
        seq.preemptions += 1
        seq.status = Status.WAITING
        if not seq.store_chunk_tokens:
            self.waiting.appendleft(seq)
        plan.preempted.append(seq)
        plan.work = [item for item in plan.work if item.seq is not seq]
