"""Parallel sampling in the engine: `n` samples of one prompt are prefilled once, then
share the prompt's blocks (each copies only the block it diverges in). Greedy samples
decode what one sequence decodes; seeded sample i decodes what a lone sequence seeded
seed + i decodes; every sample's logits match a plain forward pass over its own tokens
within 1e-4 (tiny Llama, fp32)."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from inference_worker.decoding import sample_params
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.engine import Engine, SequenceTooLong, StepOutput
from inference_worker.engine.model_runner import PagedModelRunner
from inference_worker.engine.sequence import Sequence
from inference_worker.model_geometry import ModelGeometry
from inference_worker.turn_types import SamplingParams

BLOCK = 4
PROMPT = torch.randint(
    0, 256, (37,), generator=torch.Generator().manual_seed(3)
).tolist()  # 9 full blocks + 1
STEPS = 8


def make_engine(model: PreTrainedModel, blocks: int, max_batch_tokens: int = 64) -> Engine:
    kv = PagedKV(ModelGeometry.of(model.config), blocks, BLOCK, torch.float32, torch.device("cpu"))
    pool = BlockPool(blocks, BLOCK)
    return Engine(PagedModelRunner(model, kv), pool, max_batch_tokens=max_batch_tokens, max_batch_sequences=8)


def group(prompt: list[int], params: SamplingParams) -> Sequence:
    """Sample 0 with the other samples of `params.n` waiting to fork from it."""
    seq = Sequence.of(prompt, max_new_tokens=STEPS, sampling=sample_params(params, 0))
    seq.forks = [
        Sequence.of(prompt, max_new_tokens=STEPS, sampling=sample_params(params, i), sample_index=i)
        for i in range(1, params.n)
    ]
    return seq


async def run(engine: Engine, seq: Sequence) -> list[list[StepOutput]]:
    """Each sample's outputs, the group's blocks still held (not released)."""
    outputs: list[list[StepOutput]] = [[] for _ in range(len(seq.forks) + 1)]
    async for output in engine.generate(seq):
        outputs[output.seq.sample_index].append(output)
    return outputs


def tokens_of(outputs: list[StepOutput]) -> list[int]:
    return [output.token for output in outputs if output.token is not None]


async def test_samples_share_the_prompts_blocks_and_copy_only_the_one_they_diverge_in(
    tiny_llama: PreTrainedModel,
) -> None:
    engine = make_engine(tiny_llama, blocks=64)
    seq = group(PROMPT, SamplingParams(temperature=1.0, seed=11, n=4))
    try:
        samples = [seq, *seq.forks]
        await run(engine, seq)
        usage = engine.pool.usage()
        for sample in samples:
            engine.release(sample)
    finally:
        await engine.close()
    full = len(PROMPT) // BLOCK  # 9 full prompt blocks, shared by all four
    own = (
        engine.pool.blocks_for(len(PROMPT) + STEPS - 1) - full
    )  # the last prompt block's copy, then new ones
    assert engine.stats.steps == 1 + STEPS - 1  # one prefill, then decodes of all four together
    assert (usage.used, usage.shared) == (full + 4 * own, full)
    separate = 4 * engine.pool.blocks_for(len(PROMPT) + STEPS - 1)
    assert usage.used / separate < 0.4  # 17 of 44 blocks
    assert engine.pool.usage().used == 0


async def test_greedy_samples_decode_what_one_sequence_decodes(tiny_llama: PreTrainedModel) -> None:
    engine = make_engine(tiny_llama, blocks=64)
    try:
        outputs = await run(engine, group(PROMPT, SamplingParams(n=3)))
    finally:
        await engine.close()
    with torch.no_grad():  # greedy: each token is the argmax after the ones before it
        reference = tiny_llama.generate(
            torch.tensor([PROMPT]), max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS
        )[0, len(PROMPT) :].tolist()
    assert [tokens_of(sample) for sample in outputs] == [reference] * 3
    assert all(sample[-1].finished and sample[-1].seq.finish_reason == "length" for sample in outputs)


async def test_seeded_sample_i_decodes_what_a_lone_sequence_seeded_seed_plus_i_decodes(
    tiny_llama: PreTrainedModel,
) -> None:
    params = SamplingParams(temperature=1.5, seed=2**64 - 2, n=4)  # seed + 2 wraps to 0
    engine = make_engine(tiny_llama, blocks=64)
    try:
        together = [tokens_of(sample) for sample in await run(engine, group(PROMPT, params))]
        again = [tokens_of(sample) for sample in await run(engine, group(PROMPT, params))]
        alone = [
            tokens_of((await run(engine, group(PROMPT, SamplingParams(temperature=1.5, seed=seed))))[0])
            for seed in (2**64 - 2, 2**64 - 1, 0, 1)
        ]
    finally:
        await engine.close()
    assert together == again == alone
    assert len({tuple(tokens) for tokens in together}) > 1  # the samples did diverge


async def test_every_samples_logits_match_a_forward_pass_over_its_own_tokens(
    tiny_llama: PreTrainedModel,
) -> None:
    engine = make_engine(tiny_llama, blocks=64, max_batch_tokens=16)  # the prompt prefills in 3 chunks
    try:
        outputs = await run(engine, group(PROMPT, SamplingParams(temperature=2.0, seed=5, n=4)))
    finally:
        await engine.close()
    for sample in outputs:
        tokens = tokens_of(sample)
        with torch.no_grad():
            reference = tiny_llama(input_ids=torch.tensor([PROMPT + tokens[:-1]])).logits[
                0, len(PROMPT) - 1 :
            ]
        got = torch.stack([output.logits for output in sample if output.logits is not None])
        torch.testing.assert_close(got, reference, atol=1e-4, rtol=0)


async def test_samples_survive_preemption_and_decode_what_they_decode_alone(
    tiny_llama: PreTrainedModel,
) -> None:
    # 14 blocks: sample 0's 11 and one more sample's own 2 (+1) at least, not all four at once.
    engine = make_engine(tiny_llama, blocks=14)
    params = SamplingParams(temperature=1.0, seed=9, n=4)
    try:
        seq = group(PROMPT, params)
        samples = [seq, *seq.forks]
        got: list[list[int]] = [[] for _ in samples]
        async for output in engine.generate(seq):
            if output.token is not None:
                got[output.seq.sample_index].append(output.token)
            if output.finished and output.seq.sample_index:
                engine.release(output.seq)  # as the turn engine does: only sample 0 is kept
        engine.release(seq)
        roomy = make_engine(tiny_llama, blocks=64)
        expected = [tokens_of(sample) for sample in await run(roomy, group(PROMPT, params))]
        await roomy.close()
    finally:
        await engine.close()
    assert engine.stats.preemptions > 0
    assert got == expected


async def test_a_group_the_pool_can_never_run_is_refused(tiny_llama: PreTrainedModel) -> None:
    engine = make_engine(tiny_llama, blocks=12)  # sample 0 alone fits (11 blocks), a second one never
    try:
        with pytest.raises(SequenceTooLong, match="4 samples"):
            await run(engine, group(PROMPT, SamplingParams(n=4)))
    finally:
        await engine.close()
