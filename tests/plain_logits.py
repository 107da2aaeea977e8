"""The check of the engine's far-KV tests (unit and integration): every logit an engine
output was sampled from equals a plain forward of the whole sequence (tests/ is on
sys.path through the root conftest)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from inference_worker.engine.engine import StepOutput

TOLERANCE = 1e-4  # fp32


def assert_plain_logits(
    model: PreTrainedModel, prompt: list[int], outputs: list[StepOutput], new_tokens: int
) -> None:
    """`outputs`: a greedy sequence's, one per new token, after `prompt`."""
    tokens = torch.tensor([[*prompt, *(o.token for o in outputs)]], device=model.device)
    with torch.no_grad():
        expected = model(input_ids=tokens).logits[0].float()
    assert len(outputs) == new_tokens
    for index, output in enumerate(outputs):
        assert output.logits is not None
        assert (output.logits - expected[len(prompt) - 1 + index]).abs().max() <= TOLERANCE
        assert output.token == int(expected[len(prompt) - 1 + index].argmax())
