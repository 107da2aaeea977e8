"""The paged engine on CUDA (skipped without a GPU): concurrent sequences of different
lengths, two sharing a prefix and one drawing three parallel samples, run in shared
forward passes over the pool's blocks on the GPU, and every logit vector each sampled
token came from matches a plain forward pass over that sequence's tokens on the same
device within 1e-4 (tiny Llama, fp32, TF32 off)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch
from transformers import PreTrainedModel

from inference_worker.decoding import sample_params
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.engine import Engine, StepOutput
from inference_worker.engine.model_runner import PagedModelRunner
from inference_worker.engine.sequence import Sequence
from inference_worker.model_geometry import ModelGeometry
from inference_worker.turn_types import SamplingParams

pytestmark = pytest.mark.gpu

BLOCK = 4
STEPS = 12
CUDA = torch.device("cuda")


@pytest.fixture
def exact_fp32() -> Iterator[None]:
    """TF32 matmuls round to 10 mantissa bits: far beyond 1e-4 on logits."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    system = torch.randint(0, 256, (21,), generator=generator).tolist()
    own = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in (5, 13, 30, 2)]
    return [system + own[0], system + own[1], own[2], own[3]]


async def run_all(engine: Engine, seqs: list[Sequence]) -> list[list[StepOutput]]:
    async def one(seq: Sequence) -> list[StepOutput]:
        outputs = [output async for output in engine.generate(seq)]
        for member in {output.seq for output in outputs}:
            engine.release(member)
        return outputs

    try:
        return await asyncio.gather(*(one(seq) for seq in seqs))
    finally:
        await engine.close()


@pytest.mark.usefixtures("exact_fp32")
async def test_the_paged_engine_on_cuda_matches_plain_forward_passes(tiny_llama: PreTrainedModel) -> None:
    model = tiny_llama.to(CUDA)
    try:
        kv = PagedKV(ModelGeometry.of(model.config), 128, BLOCK, torch.float32, CUDA)
        engine = Engine(
            PagedModelRunner(model, kv), BlockPool(128, BLOCK), max_batch_tokens=24, max_batch_sequences=8
        )
        seqs = [Sequence.of(prompt, max_new_tokens=STEPS) for prompt in prompts()]
        params = SamplingParams(temperature=1.0, seed=3, n=3)  # the last prompt: three samples
        seqs[-1].sampling = sample_params(params, 0)
        seqs[-1].forks = [
            Sequence.of(
                seqs[-1].token_ids, max_new_tokens=STEPS, sampling=sample_params(params, i), sample_index=i
            )
            for i in (1, 2)
        ]
        results = await run_all(engine, seqs)
        assert engine.stats.max_batch_sequences >= 4  # they shared forward passes
        checked = 0
        for outputs in results:
            for member in {output.seq for output in outputs}:
                mine = [output for output in outputs if output.seq is member and output.token is not None]
                assert len(mine) == STEPS
                tokens = member.token_ids
                prompt_tokens = member.prompt_tokens
                with torch.no_grad():
                    reference = model(input_ids=torch.tensor([tokens[:-1]], device=CUDA)).logits[
                        0, prompt_tokens - 1 :
                    ]
                got = torch.stack([output.logits for output in mine])  # [STEPS, vocab]
                torch.testing.assert_close(got, reference.float(), atol=1e-4, rtol=0)
                checked += 1
        assert checked == 6  # three sequences, three samples
    finally:
        tiny_llama.to("cpu")
