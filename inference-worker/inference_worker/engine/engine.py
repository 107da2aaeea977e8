"""The engine: one step loop that runs every live sequence's next tokens in one batched
forward pass (continuous batching, PagedAttention's KV pool).

    submit ──> Scheduler.waiting ──schedule──> Plan (decodes, prefill chunks, preemptions)
           ──> copy-on-write ──> one forward ──> sample ──> outputs ──> each sequence's queue

`step` runs in the engine's thread (blocking torch code), always the same one: libgomp keeps
an OpenMP team per thread that starts parallel regions, and the loop's default executor
handed steps to whichever of its threads was idle, each then with a team of its own (cold
threads, and a spinning team beside the working one under `openmp_spin_count`); everything
else runs on the event loop. Submissions, releases and aborts from the loop go through an inbox that the
next step applies first, so the scheduler and the pool are only ever touched by one thread.
A finished sequence keeps its blocks until its owner `release`s it: the owner reads its KV
(to save it) first.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from attnstore.errors import ResourceExhausted
from inference_worker import metrics
from inference_worker.decoding import Sampler
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.model_runner import PagedModelRunner, SequenceFarLost, SequencePrefixFailed
from inference_worker.engine.scheduler import Scheduler
from inference_worker.engine.sequence import Sequence, Status


class SequenceTooLong(ResourceExhausted):
    """A sequence that could never fit the KV pool, even alone (RESOURCE_EXHAUSTED at the edge)."""


@dataclass(frozen=True)
class StepOutput:
    seq: Sequence
    token: int | None  # the sampled token; None when a prefill-only sequence finished or when preempted
    finished: bool
    logits: torch.Tensor | None  # [vocab] fp32 that `token` was sampled from
    # handed back to its owner (store_chunk_tokens, or its far KV lost): resume it with `submit`
    preempted: bool = False


@dataclass(frozen=True)
class EngineStats:
    steps: int
    last_batch_sequences: int
    max_batch_sequences: int  # the most sequences one forward pass has run so far
    preemptions: int


def sample_next(seq: Sequence, sampler: Sampler, logits: torch.Tensor) -> StepOutput:
    """Appends the token `sampler` draws from `logits` [vocab] to `seq` and says whether
    it finished it (a stop token, a stop string, max_new_tokens)."""
    if seq.max_new_tokens == 0:
        seq.finish_reason = "length"
        return StepOutput(seq, None, True, logits)
    token = sampler(logits)
    seq.token_ids.append(token)
    if token in seq.stops:
        seq.finish_reason = "stop"
    elif seq.stop_text is not None and seq.stop_text(token):
        seq.finish_reason = "stop_string"
    elif len(seq.generated) >= seq.max_new_tokens:
        seq.finish_reason = "length"
    return StepOutput(seq, token, seq.finish_reason is not None, logits)


class Engine:
    def __init__(
        self, runner: PagedModelRunner, pool: BlockPool, *, max_batch_tokens: int, max_batch_sequences: int
    ) -> None:
        self.runner = runner
        self.kv: PagedKV = runner.kv
        self.pool = pool
        self.scheduler = Scheduler(
            pool,
            max_batch_tokens=max_batch_tokens,
            max_batch_sequences=max_batch_sequences,
            before_free=self._snapshot,
        )
        self._seq_ids = itertools.count()  # this engine's names of its sequences
        self._samplers: dict[int, Sampler] = {}
        self._inbox: list[tuple[str, Sequence]] = []
        self._inbox_lock = threading.Lock()
        self._queues: dict[int, asyncio.Queue[StepOutput]] = {}
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False
        self._stepper = ThreadPoolExecutor(1, thread_name_prefix="engine-step")  # the engine's thread
        self._steps = self._last_batch = self._max_batch = self._preemptions = 0

    @property
    def stats(self) -> EngineStats:
        return EngineStats(self._steps, self._last_batch, self._max_batch, self._preemptions)

    # ---- the step (engine thread) ------------------------------------------------------

    def step(self) -> list[StepOutput]:
        self._apply_inbox()
        self.kv.deferred.flush()  # prefixes the last step attended in place (prefix_in_place.py)
        plan = self.scheduler.schedule()
        self._preemptions += len(plan.preempted)
        metrics.PREEMPTIONS.inc(len(plan.preempted))
        handed_back = [
            StepOutput(seq, None, False, None, preempted=True)
            for seq in plan.preempted
            if seq.store_chunk_tokens
        ]
        if not plan.work:
            self._observe_pool()  # blocks released since the last step
            return handed_back
        for copy in plan.copies:
            self.kv.copy_block(copy.src, copy.dst)
        try:
            logits = self.runner.forward(self.runner.prepare(plan.work))  # [sequences, vocab]
        except SequencePrefixFailed as exc:  # its stored KV did not come: recompute it, retry the step
            failed = exc.seq
            failed.load_failure, failed.prefix = exc.__cause__, None
            failed.computed_tokens = failed.prefix_skip
            return handed_back
        except SequenceFarLost as exc:  # its owner places its far KV again and resubmits it
            self.scheduler.remove(exc.seq)
            self.pool.free(exc.seq)
            exc.seq.status = Status.WAITING
            return [*handed_back, StepOutput(exc.seq, None, False, None, preempted=True)]
        self._observe(len(plan.work))
        outputs = handed_back
        for row, item in enumerate(plan.work):
            seq = item.seq
            computed = seq.computed_tokens + item.tokens
            if seq.prefix is not None:  # its stored KV is in its blocks now: they get keys too
                seq.computed_tokens, seq.prefix = seq.prefix_skip, None
            self.pool.commit(seq, computed)
            if seq.pending_tokens:
                continue  # a prefill chunk: the rest follows in later steps
            for sample in (seq, *self.scheduler.fork_samples(seq)):  # each samples the prompt's logits
                output = self._sample(sample, logits[row])
                if output.finished:
                    self.scheduler.remove(sample)
                    sample.status = Status.FINISHED
                outputs.append(output)
        return outputs

    def _snapshot(self, seq: Sequence) -> None:
        """A preempted sequence's KV of its computed whole chunks, copied before its blocks go."""
        if seq.store_chunk_tokens:
            tokens = seq.computed_tokens // seq.store_chunk_tokens * seq.store_chunk_tokens
            seq.snapshot = self.kv.span(seq.block_table, 0, tokens) if tokens else None

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> StepOutput:
        return sample_next(seq, self._samplers[seq.seq_id], logits)

    def _observe(self, batch: int) -> None:
        self._steps += 1
        self._last_batch, self._max_batch = batch, max(self._max_batch, batch)
        metrics.BATCH_SEQUENCES.observe(batch)
        self._observe_pool()

    def _observe_pool(self) -> None:
        usage = self.pool.usage()
        metrics.RUNNING_SEQUENCES.set(len(self.scheduler.running))
        metrics.WAITING_SEQUENCES.set(len(self.scheduler.waiting))
        metrics.POOL_BLOCKS.labels("used").set(usage.used)
        metrics.POOL_BLOCKS.labels("free").set(usage.free)
        metrics.POOL_BLOCKS.labels("shared").set(usage.shared)

    def _apply_inbox(self) -> None:
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        for action, seq in inbox:
            if action == "add":
                self.scheduler.add(seq)
            else:  # "release": finished and read, or aborted
                if not self.pool.keep_freed_prefixes:
                    self.kv.deferred.discard(seq.seq_id)  # its blocks are freed unread
                self.scheduler.remove(seq)
                self.pool.free(seq)
                seq.status = Status.FINISHED
                self._samplers.pop(seq.seq_id, None)

    # ---- the event loop side -------------------------------------------------------------

    def _post(self, action: str, seq: Sequence) -> None:
        with self._inbox_lock:
            self._inbox.append((action, seq))
        if self._wake is None:
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(
                self._run(self._wake), name="engine-steps"
            )
        self._wake.set()

    async def _run(self, wake: asyncio.Event) -> None:
        """Steps while there is work or an inbox entry; ends, idle, once `close` was called."""
        while True:
            await wake.wait()
            wake.clear()
            while True:
                outputs = await asyncio.get_running_loop().run_in_executor(self._stepper, self.step)
                for output in outputs:
                    queue = self._queues.get(output.seq.seq_id)
                    if queue is not None:
                        queue.put_nowait(output)
                with self._inbox_lock:
                    idle = not self._inbox
                if idle and not self.scheduler.has_work():
                    break
            if self._closing:
                return

    async def generate(self, seq: Sequence) -> AsyncIterator[StepOutput]:
        """Submits `seq` (with its parallel samples, `seq.forks`) and streams their outputs
        until all finished. Their blocks stay allocated until `release`; closing the stream
        early aborts the unfinished ones (and frees their blocks)."""
        if self._blocks_needed(seq) > self.pool.num_blocks:
            raise SequenceTooLong(
                f"{len(seq)} tokens ({len(seq.forks) + 1} samples) need more than the worker's KV pool of "
                f"{self.pool.num_blocks} blocks of {self.pool.block_tokens} tokens (kv_memory_bytes, "
                "kv_memory_fraction)"
            )
        for member in (seq, *seq.forks):
            if member.seq_id < 0:  # a sequence generated again (a long turn's) keeps its id
                member.seq_id = next(self._seq_ids)
        unfinished = {member.seq_id: member for member in (seq, *seq.forks)}
        queue: asyncio.Queue[StepOutput] = asyncio.Queue()
        for member in unfinished.values():
            self._samplers[member.seq_id] = Sampler(member.sampling)
            self._queues[member.seq_id] = queue
        group = list(unfinished)
        self._post("add", seq)
        try:
            while unfinished:
                output = await queue.get()
                if output.finished:
                    del unfinished[output.seq.seq_id]
                yield output
        finally:
            for seq_id in group:
                del self._queues[seq_id]
            for member in unfinished.values():
                self.release(member)

    def _blocks_needed(self, seq: Sequence) -> int:
        """The fewest blocks `seq` ever runs in. With samples, sample 0 keeps its blocks
        until all finished (its owner saves its KV), so another must be able to progress
        beside it whole: its blocks after the prompt's full ones (which it shares)."""
        if not seq.forks:
            return self.pool.blocks_for(len(seq) + 1)
        # A whole sample's blocks: the last sampled token's KV is never computed.
        whole = self.pool.blocks_for(len(seq) + seq.max_new_tokens - 1)
        return 2 * whole - len(seq) // self.pool.block_tokens

    def submit(self, seq: Sequence) -> None:
        """Queues a sequence handed back by preemption again (its stream goes on)."""
        self._post("add", seq)

    def release(self, seq: Sequence) -> None:
        """Frees `seq`'s blocks (at the start of the next step)."""
        self._post("release", seq)

    async def close(self) -> None:
        """Applies what was posted (releases free their blocks), runs what is queued to its
        end, then stops the step loop."""
        self._closing = True
        if self._wake is not None and self._loop_task is not None:
            self._wake.set()
            await self._loop_task
        self._stepper.shutdown(wait=False)
