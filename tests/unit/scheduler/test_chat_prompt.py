"""What of the chat template's closing the history adds after an answer (chat_prompt.py):
the part the generation did not produce, whatever way the answer ended."""

from __future__ import annotations

import pytest

from attnstore_scheduler.chat_prompt import closing_after
from attnstore_scheduler.turn_types import FinishReason

IM_END, NEWLINE, SPACE, EOS = 2, 198, 220, 0
CHATML = [IM_END, NEWLINE]  # `<|im_end|>\n`
LLAMA2 = [SPACE, EOS]  # ` </s>`: the end-of-turn token is not the closing's first


@pytest.mark.parametrize(
    ("generated", "closing", "finish_reason", "added"),
    [
        ([5, 6, IM_END], CHATML, FinishReason.STOP, [NEWLINE]),  # ended on the end-of-turn token
        ([5, 6], CHATML, FinishReason.LENGTH, CHATML),  # cut at max_tokens: left open by the model
        ([5, IM_END], CHATML, FinishReason.LENGTH, CHATML),  # a cut answer is closed whole, any ending
        ([5, 7], CHATML, FinishReason.STOP, CHATML),  # a stop token the closing lacks
        ([5, EOS], LLAMA2, FinishReason.STOP, []),  # the closing holds the stop token further on
        ([], CHATML, FinishReason.LENGTH, CHATML),
        ([5, IM_END], CHATML, FinishReason.UNSPECIFIED, CHATML),  # unknown ending: the whole closing
    ],
)
def test_the_closing_is_what_the_generation_did_not_produce(
    generated: list[int], closing: list[int], finish_reason: FinishReason, added: list[int]
) -> None:
    assert closing_after(generated, closing, finish_reason) == added
