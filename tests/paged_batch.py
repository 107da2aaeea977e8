"""The paged engine's batch loop as the paged-forward tests drive it (tests/ is on sys.path
through the root conftest): chunked prefill of several sequences together, then greedy
decoding together, with each sequence's logits kept for comparison with transformers."""

from __future__ import annotations

import torch

from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.model_runner import PagedModelRunner, Work
from inference_worker.engine.sequence import Sequence


def run_batch(
    runner: PagedModelRunner, pool: BlockPool, seqs: list[Sequence], chunk_tokens: int, decode_steps: int
) -> list[list[torch.Tensor]]:
    """Prefills `seqs` together in chunks of at most `chunk_tokens`, then decodes them greedily
    together; each sequence's logits after its prompt and after each decode step."""
    for seq in seqs:
        pool.allocate(seq)
    logits: list[list[torch.Tensor]] = [[] for _ in seqs]
    while any(seq.pending_tokens for seq in seqs):
        work = [Work(seq, min(seq.pending_tokens, chunk_tokens)) for seq in seqs if seq.pending_tokens]
        out = runner.forward(runner.prepare(work))
        for row, item in enumerate(work):
            pool.commit(item.seq, item.seq.computed_tokens + item.tokens)
            if not item.seq.pending_tokens:
                logits[seqs.index(item.seq)].append(out[row])
    for _ in range(decode_steps):
        for index, seq in enumerate(seqs):
            seq.token_ids.append(int(torch.argmax(logits[index][-1])))
            copy = pool.append_slot(seq)
            if copy is not None:
                runner.kv.copy_block(copy.src, copy.dst)
        out = runner.forward(runner.prepare([Work(seq, 1) for seq in seqs]))
        for index, seq in enumerate(seqs):
            pool.commit(seq, len(seq))
            logits[index].append(out[index])
    return logits
