"""Sequences with far KV in the engine's batched steps, in one process: a prompt's oldest
positions split at a random point into 1-3 segments computed by the distributed runner
(what peers hold), its newest tokens run by the engine beside a plain sequence, prefilled
in chunks of a random size and decoded in shared steps. Every logit of both sequences is
within 1e-4 (fp32) of a plain forward of its whole sequence, for any split (seeded random
draws), with sliding-window layers too, with the far rows' pool part (prefill and decode rows) from
the C decode kernel's log-sum-exp entry point or from torch, and on CUDA (skipped without a
GPU)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable

import pytest
import torch
from plain_logits import assert_plain_logits
from transformers import PreTrainedModel

from inference_worker.dist_attention.partial import Partial
from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.dist_attention.segment import LocalSegment
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.engine import Engine, StepOutput
from inference_worker.engine.far_kv import KERNEL_MAX_ROWS
from inference_worker.engine.model_runner import Batch, PagedModelRunner, Work
from inference_worker.engine.sequence import Sequence
from inference_worker.model_geometry import ModelGeometry

BLOCK = 4
NEW_TOKENS = 4


class SegmentsFar:
    """Far KV in this process: segments the distributed runner computed (FarKV)."""

    def __init__(self, runner: DistributedRunner, segments: list[LocalSegment]) -> None:
        self.runner, self.segments = runner, segments
        self.frozen = threading.RLock()
        self.calls = 0

    def attend(
        self, layer: int, q: torch.Tensor, positions: torch.Tensor, *, scale: float, window: int | None
    ) -> Callable[[], Partial]:
        self.calls += 1
        return self.runner.start_attend(self.segments, layer, q, positions, scale=scale, window=window)


def far_segments(runner: DistributedRunner, prompt: list[int], cuts: list[int]) -> list[LocalSegment]:
    """The KV of prompt positions [0, cuts[-1]) in segments ending at each cut."""
    segments: list[LocalSegment] = []
    for start, stop in zip([0, *cuts[:-1]], cuts, strict=True):
        segment = runner.new_segment(start, stop - start)
        runner.forward(prompt[start:stop], start, [*segments, segment], segment)
        segments.append(segment)
    return segments


async def collect(engine: Engine, seq: Sequence) -> list[StepOutput]:
    outputs = [output async for output in engine.generate(seq)]
    engine.release(seq)
    return outputs


async def run_split(
    model: PreTrainedModel, seed: int, *, decode_kernel: bool = True, budgets: tuple[int, ...] = (5, 16, 48)
) -> tuple[int, int]:
    """The far sequence's rows, and those in runs short enough for the C kernel."""
    draw = random.Random(seed)
    device = model.device
    prompt = [draw.randrange(256) for _ in range(draw.randint(30, 120))]
    plain = [draw.randrange(256) for _ in range(draw.randint(3, 30))]
    split = draw.randint(1, len(prompt) - 1)
    cuts = sorted({*draw.sample(range(1, split), min(split - 1, draw.randint(0, 2))), split})
    runner = DistributedRunner(model)
    far = SegmentsFar(runner, far_segments(runner, prompt, cuts))
    near = Sequence.of(prompt[split:], bytes(16), positions=list(range(split, len(prompt))), far=far,
                       max_new_tokens=NEW_TOKENS)  # fmt: skip
    kv = PagedKV(ModelGeometry.of(model.config), 64, BLOCK, torch.float32, device)
    paged = PagedModelRunner(model, kv, decode_kernel=decode_kernel)
    # the far sequence's rows: all, those in runs the C kernel takes, those it attended (with log-sum-exp)
    far_rows = short_rows = kernel_rows = 0
    prepare = paged.prepare

    def counted(work: list[Work]) -> Batch:
        nonlocal far_rows, short_rows, kernel_rows
        batch = prepare(work)
        runs = [part.rows.stop - part.rows.start for part in batch.far]
        far_rows += sum(runs)
        short_rows += sum(rows for rows in runs if rows <= KERNEL_MAX_ROWS)
        kernel_rows += 0 if batch.far_decode is None else batch.far_decode.rows.shape[0]
        return batch

    paged.prepare = counted  # type: ignore[method-assign]
    engine = Engine(paged, BlockPool(64, BLOCK), max_batch_tokens=draw.choice(budgets), max_batch_sequences=4)
    try:
        far_outputs, plain_outputs = await asyncio.gather(
            collect(engine, near), collect(engine, Sequence.of(plain, max_new_tokens=NEW_TOKENS))
        )
    finally:
        await engine.close()
        runner.close()
    assert_plain_logits(model, prompt, far_outputs, NEW_TOKENS)
    assert_plain_logits(model, plain, plain_outputs, NEW_TOKENS)
    assert engine.stats.max_batch_sequences == 2 and far.calls > 0
    assert far_rows >= len(prompt) - split  # its prefill rows, then its decode rows
    assert kernel_rows == (short_rows if decode_kernel and paged.decode_kernel is not None else 0)
    return far_rows, short_rows


@pytest.mark.parametrize("seed", range(6))
async def test_any_split_gives_plain_logits_in_shared_steps(tiny_llama: PreTrainedModel, seed: int) -> None:
    await run_split(tiny_llama, seed)


@pytest.mark.parametrize("seed", range(2))
async def test_short_prefill_runs_through_the_kernel(tiny_llama: PreTrainedModel, seed: int) -> None:
    """A budget of 3 tokens a step: every far row, prefill ones included, through the C kernel."""
    far_rows, short_rows = await run_split(tiny_llama, seed, budgets=(KERNEL_MAX_ROWS - 1,))
    assert short_rows == far_rows  # run_split checks the kernel attended each (where it loads)


@pytest.mark.parametrize("seed", range(2))
async def test_far_decodes_through_torch_without_the_kernel(tiny_llama: PreTrainedModel, seed: int) -> None:
    await run_split(tiny_llama, seed, decode_kernel=False)


@pytest.mark.parametrize("seed", range(2))
async def test_sliding_window_layers(tiny_mistral_factory: Callable[..., PreTrainedModel], seed: int) -> None:
    await run_split(tiny_mistral_factory(sliding_window=24), seed)


@pytest.mark.gpu
async def test_on_cuda(tiny_llama_factory: Callable[..., PreTrainedModel]) -> None:
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 rounds far beyond 1e-4 on logits
    try:
        await run_split(tiny_llama_factory().to("cuda"), seed=0)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
