"""The engine's step loop: concurrent sequences submitted at different times, prefilled in
chunks mixed with decodes, some sharing a prefix, one preempted when the pool runs out,
decode exactly what each decodes alone (greedy, 32 tokens, tiny Llama, fp32), in shared
forward passes, every step on one thread; an abandoned stream frees its blocks."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
import torch
from transformers import PreTrainedModel

from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.engine import Engine, SequenceTooLong, StepOutput
from inference_worker.engine.model_runner import PagedModelRunner
from inference_worker.engine.sequence import Sequence
from inference_worker.model_geometry import ModelGeometry
from inference_worker.turn_types import SamplingParams

BLOCK = 4
STEPS = 32


def make_engine(model: PreTrainedModel, blocks: int, max_batch_tokens: int = 24) -> Engine:
    kv = PagedKV(ModelGeometry.of(model.config), blocks, BLOCK, torch.float32, torch.device("cpu"))
    return Engine(
        PagedModelRunner(model, kv),
        BlockPool(blocks, BLOCK),
        max_batch_tokens=max_batch_tokens,
        max_batch_sequences=16,
    )


def greedy_reference(model: PreTrainedModel, prompt: list[int], steps: int) -> list[int]:
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tokens.append(int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt) :]


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    system = torch.randint(0, 256, (21,), generator=generator).tolist()  # shared by three prompts
    lengths = [3, 9, 17, 30, 45, 6, 11, 2]
    made = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in lengths]
    return [system + made[0], system + made[1], system[:13] + made[2], *made[3:]]


async def generate(engine: Engine, prompt: list[int], delay_seconds: float = 0.0) -> list[int]:
    await asyncio.sleep(delay_seconds)
    seq = Sequence.of(prompt, max_new_tokens=STEPS)
    tokens = [output.token async for output in engine.generate(seq) if output.token is not None]
    engine.release(seq)
    return tokens


@pytest.mark.parametrize("blocks", [128, 40], ids=["roomy", "preempting"])
async def test_concurrent_sequences_decode_what_each_decodes_alone(
    tiny_llama: PreTrainedModel, blocks: int
) -> None:
    engine = make_engine(tiny_llama, blocks)
    batch = prompts()
    try:
        got = await asyncio.gather(*(generate(engine, p, 0.01 * (i % 3)) for i, p in enumerate(batch)))
    finally:
        await engine.close()
    for prompt, tokens in zip(batch, got, strict=True):
        assert tokens == greedy_reference(tiny_llama, prompt, STEPS)
    assert engine.stats.max_batch_sequences >= 4  # they did share forward passes
    if blocks == 40:  # 8 sequences of up to 62 tokens need ~100 blocks of 4
        assert engine.stats.preemptions > 0
    usage = engine.pool.usage()
    assert usage.used == 0 and usage.cached > 0


async def test_every_step_runs_on_the_engines_one_thread(
    tiny_llama: PreTrainedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One OpenMP team for all forwards: libgomp keeps one per thread that starts regions."""
    engine = make_engine(tiny_llama, 128)
    threads: set[int] = set()
    step = engine.step

    def recorded() -> list[StepOutput]:
        threads.add(threading.get_ident())
        return step()

    monkeypatch.setattr(engine, "step", recorded)
    try:
        for _ in range(3):  # runs of steps with the loop idle between them
            await asyncio.gather(*(generate(engine, p, 0.01 * i) for i, p in enumerate(prompts()[:4])))
            await asyncio.gather(*(asyncio.to_thread(threading.get_ident) for _ in range(8)))  # busy executor
    finally:
        await engine.close()
    assert engine.stats.steps > 3 * STEPS
    assert len(threads) == 1 and threading.get_ident() not in threads


async def test_a_shared_prefix_is_computed_once(tiny_llama: PreTrainedModel) -> None:
    engine = make_engine(tiny_llama, 64, max_batch_tokens=256)
    first, second, _ = prompts()[:3]
    seqs = [Sequence.of(first, max_new_tokens=1), Sequence.of(second, max_new_tokens=1)]
    try:
        async for _ in engine.generate(seqs[0]):
            pass
        async for _ in engine.generate(seqs[1]):
            pass
        assert seqs[1].block_table[:5] == seqs[0].block_table[:5]  # the 21-token system prompt's full blocks
        assert engine.pool.usage().shared == 5
        assert [seq.seq_id for seq in seqs] == [0, 1]  # numbered by the engine that runs them
    finally:
        await engine.close()


async def test_an_abandoned_stream_frees_its_blocks(tiny_llama: PreTrainedModel) -> None:
    engine = make_engine(tiny_llama, 64)
    seq = Sequence.of(prompts()[3], max_new_tokens=STEPS, sampling=SamplingParams(temperature=1.0, seed=1))
    try:
        async with contextlib.aclosing(engine.generate(seq)) as stream:
            async for _ in stream:
                assert engine.pool.usage().used > 0
                break
        async for _ in engine.generate(Sequence.of([1, 2], max_new_tokens=1)):  # one more step
            pass
        assert engine.pool.usage().used == 1  # the new sequence's block only: the abandoned one's are free
        assert not engine.scheduler.has_work()
    finally:
        await engine.close()


async def test_a_sequence_larger_than_the_pool_is_refused(tiny_llama: PreTrainedModel) -> None:
    engine = make_engine(tiny_llama, 4)
    with pytest.raises(SequenceTooLong, match="4 blocks of 4 tokens"):
        async for _ in engine.generate(Sequence.of(list(range(16)), max_new_tokens=1)):
            pass
