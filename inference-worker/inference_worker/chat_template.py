"""Chat messages to prompt token ids through the model's own chat template.

The template is the model's (a Jinja program shipped with its tokenizer). A template that
rejects the messages (`raise_exception`, a missing field) is the caller's problem and
answers INVALID_ARGUMENT; a model without a template, or one whose template does not
parse, cannot take messages at all (FAILED_PRECONDITION: send token ids instead).
"""

from __future__ import annotations

import jinja2
from transformers import PreTrainedTokenizerBase

from attnstore.errors import FailedPrecondition, InvalidArgument


class ChatTemplate:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer

    def token_ids(self, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> list[int]:
        if not self._tokenizer.chat_template:
            raise FailedPrecondition(
                "the model has no chat template; send prompt_token_ids instead of messages"
            )
        try:
            ids = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
            )
        except jinja2.TemplateSyntaxError as exc:
            raise FailedPrecondition(
                f"the model's chat template is malformed (line {exc.lineno}: {exc.message}); "
                "send prompt_token_ids instead of messages"
            ) from exc
        except jinja2.TemplateError as exc:
            raise InvalidArgument(f"the model's chat template rejected the messages: {exc}") from exc
        return [int(token_id) for token_id in ids]

    def text_ids(self, text: str) -> list[int]:
        """Raw text as the tokenizer encodes it (with its BOS, if it adds one)."""
        return [int(token_id) for token_id in self._tokenizer(text, add_special_tokens=True)["input_ids"]]
