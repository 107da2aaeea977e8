"""bench-batch's memory measurements, in-process on the engine's own BlockPool and
Scheduler (inference_worker/engine/) with real token ids; no forward pass runs: which
blocks a sequence gets depends on its tokens and lengths, never on logits.

  kv_waste_fraction            pool slots allocated to live sequences that hold no token,
                               over all allocated slots, sampled after every step of a
                               replay of ShareGPT turns through the Scheduler (prompts, then
                               the dataset's answer tokens as the sampled ones)
  shared_prefix_capacity_gain  sessions whose KV fits one pool when they share a system
                               prompt's blocks, over the same sessions in separate
                               namespaces (nothing shared)
  parallel sampling            n samples forked from one prompt (BlockPool.fork), each
                               growing by its answer: the pool blocks they hold over n
                               separate copies' blocks
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from attnstore.chunks.keys import NAMESPACE_BYTES
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.scheduler import Scheduler
from inference_worker.engine.sequence import Sequence as EngineSequence


@dataclass(frozen=True)
class Request:
    """A turn to replay: its prompt, then the tokens the replay 'samples' one per step."""

    prompt: list[int]
    answer: list[int]


def kv_waste_fraction(block_tokens: int, sequences: Iterable[tuple[Sequence[int], int]]) -> float:
    """Empty slots over allocated slots of the blocks that `(block_table, tokens)` pairs
    hold. A block shared by several sequences counts once, as full as its fullest holder
    fills it (its other holders' tokens there are the same tokens)."""
    filled: dict[int, int] = {}
    for table, tokens in sequences:
        for index, block in enumerate(table):
            held = min(block_tokens, max(0, tokens - index * block_tokens))
            filled[block] = max(filled.get(block, 0), held)
    if not filled:
        return 0.0
    return 1 - sum(filled.values()) / (len(filled) * block_tokens)


def _namespace(index: int) -> bytes:
    return index.to_bytes(NAMESPACE_BYTES, "big")


def replay_waste(
    requests: Sequence[Request],
    *,
    concurrency: int,
    block_tokens: int,
    num_blocks: int,
    max_batch_tokens: int,
) -> list[float]:
    """The pool's waste after every step while `concurrency` requests run at once (a new one
    admitted as one ends), the engine's step without its forward pass: schedule, commit
    what ran, append a sampled token to each sequence done prefilling."""
    pool = BlockPool(num_blocks, block_tokens, keep_freed_prefixes=False)
    scheduler = Scheduler(pool, max_batch_tokens=max_batch_tokens, max_batch_sequences=concurrency)
    queue = iter(requests)
    answers: dict[EngineSequence, list[int]] = {}
    live: list[EngineSequence] = []
    samples: list[float] = []

    def admit() -> None:
        request = next(queue, None)
        if request is not None:
            seq = EngineSequence.of(request.prompt, max_new_tokens=len(request.answer))
            answers[seq] = request.answer
            scheduler.add(seq)
            live.append(seq)

    for _ in range(concurrency):
        admit()
    while scheduler.has_work():
        plan = scheduler.schedule()
        if not plan.work:
            raise RuntimeError("the pool cannot hold the replay's sequences: give it more blocks")
        for item in plan.work:
            seq = item.seq
            pool.commit(seq, seq.computed_tokens + item.tokens)
            if seq.pending_tokens:
                continue
            answer, generated = answers[seq], len(seq.generated)
            if generated < len(answer):  # sampled: its KV is computed by the next step
                seq.token_ids.append(answer[generated])
                generated += 1
            if generated == len(answer):  # finished (the engine's owner then releases it)
                scheduler.remove(seq)
                pool.free(seq)
                live.remove(seq)
                admit()
        samples.append(
            kv_waste_fraction(block_tokens, ((s.block_table, len(s)) for s in live if s.block_table))
        )
    return samples


def sessions_that_fit(
    sessions: Sequence[Sequence[int]], num_blocks: int, block_tokens: int, *, share: bool
) -> int:
    """How many of `sessions` (token ids, admitted in order) the pool holds at once.
    `share`: all in one namespace, so a session finds the full blocks of the prefix it has
    in common with those admitted before (a shared system prompt); otherwise each in its
    own namespace (a tenant of its own: nothing is shared). Raises when all of them fit:
    the count would say more about the list than about the pool."""
    pool = BlockPool(num_blocks, block_tokens, keep_freed_prefixes=False)
    for count, tokens in enumerate(sessions):
        seq = EngineSequence.of(tokens, _namespace(0 if share else count + 1))
        if not pool.can_allocate(seq):
            return count
        pool.allocate(seq)
        pool.commit(seq, len(seq))  # computed: its full blocks are keyed for the next ones
    raise ValueError(
        f"all {len(sessions)} sessions fit {num_blocks} blocks: give more sessions or fewer blocks"
    )


def parallel_sampling_blocks(
    prompt: Sequence[int], answer: Sequence[int], n: int, block_tokens: int
) -> tuple[int, int]:
    """(blocks `n` forked samples of `prompt` hold once each has generated `answer`'s
    length, blocks `n` unshared copies would hold). Each sample appends its own tokens
    (the answer, offset per sample so that they differ) as the engine's step does."""
    num_blocks = n * (-(-(len(prompt) + len(answer)) // block_tokens)) + n
    pool = BlockPool(num_blocks, block_tokens, keep_freed_prefixes=False)
    parent = EngineSequence.of(prompt)
    pool.allocate(parent)
    pool.commit(parent, len(parent))
    samples = [parent]
    for _ in range(n - 1):
        child = EngineSequence.of(prompt)
        pool.fork(parent, child)
        samples.append(child)
    for token in answer:
        for index, seq in enumerate(samples):
            seq.token_ids.append(token + index)
            pool.append_slot(seq)
            pool.commit(seq, len(seq))
    return pool.usage().used, n * pool.blocks_for(len(prompt) + len(answer))


def parallel_sampling_saving(requests: Sequence[Request], n: int, block_tokens: int) -> float:
    """The share of KV memory forking saves over separate copies, summed over the requests."""
    shared = unshared = 0
    for request in requests:
        used, copies = parallel_sampling_blocks(request.prompt, request.answer, n, block_tokens)
        shared, unshared = shared + used, unshared + copies
    return round(1 - shared / unshared, 4)
