"""The paged engine forward on the real model (SmolLM2-135M-Instruct, fp32): three prompts of
different lengths prefilled together in chunks, then decoded together for 32 greedy steps,
give transformers' logits (1e-4) and tokens for each prompt alone."""

from __future__ import annotations

import pytest
import torch
from paged_batch import run_batch
from transformers import DynamicCache

from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.model_runner import PagedModelRunner
from inference_worker.engine.sequence import Sequence
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import default_model_dir, load_model

pytestmark = pytest.mark.timeout(600)

STEPS = 32
TOLERANCE = 1e-4


@torch.no_grad()
def reference(model, prompt: list[int]) -> list[torch.Tensor]:
    """Logits [vocab] after the prompt and after each of STEPS greedy tokens, alone."""
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1].float()
    out = [logits]
    for _ in range(STEPS):
        token = torch.tensor([[int(logits.argmax())]])
        logits = model(input_ids=token, cache=cache, use_cache=True).logits[0, -1].float()
        out.append(logits)
    return out


def test_batched_paged_decoding_matches_each_prompt_alone() -> None:
    model = load_model(default_model_dir(), torch.float32, "cpu").model
    kv = PagedKV(ModelGeometry.of(model.config), 64, 16, torch.float32, torch.device("cpu"))
    runner, pool = PagedModelRunner(model, kv), BlockPool(64, 16)
    generator = torch.Generator().manual_seed(0)
    seqs = [Sequence.of(torch.randint(0, 49000, (n,), generator=generator).tolist()) for n in (5, 40, 120)]
    expected = [reference(model, seq.token_ids) for seq in seqs]
    got = run_batch(runner, pool, seqs, chunk_tokens=48, decode_steps=STEPS)
    for mine, theirs in zip(got, expected, strict=True):
        assert [int(x.argmax()) for x in mine] == [int(x.argmax()) for x in theirs]
        assert max((a - b).abs().max().item() for a, b in zip(mine, theirs, strict=True)) <= TOLERANCE
