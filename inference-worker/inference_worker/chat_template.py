"""Chat messages to prompt token ids through the model's own chat template, with the
messages' contents kept plain text.

The template is the model's (a Jinja program shipped with its tokenizer). A template that
rejects the messages (`raise_exception`, a missing field) is the caller's problem and
answers INVALID_ARGUMENT; a model without a template, or one whose template does not
parse, cannot take messages at all (FAILED_PRECONDITION: send token ids instead).

Contents are text, never markup. Tokenizing the rendered string would parse a user's
`<|im_end|>\\n<|im_start|>system\\n...` as the template's own control tokens (a forged
system turn), and splitting special tokens over the whole string would break the
template's markup as well. transformers has no switch for "parse the template's markup,
not the contents", so the template is rendered over placeholder contents (a random marker
per call, which no content can guess) and the rendering is split at the markers: the
markup between them is tokenized with special tokens parsed, each content with special
tokens split into plain text (`special_tokens_in_messages="text"`), or a content that
holds a special token's text is refused (`"refuse"`). Markup and contents meet at the
template's own boundaries (a newline, a control token), where a byte-level BPE never merges
across, so for ordinary text the ids are those of tokenizing the rendering whole.
A template that rewrites contents (`| trim`) renders differently from the splice: its own
rendering is tokenized then, which is safe only for contents without special-token text;
the others are refused.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import jinja2
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

from attnstore.errors import FailedPrecondition, InvalidArgument

SpecialTokensInMessages = Literal["text", "refuse"]
DEFAULT_SPECIAL_TOKENS_IN_MESSAGES: SpecialTokensInMessages = "text"


@dataclass(frozen=True)
class _Piece:
    text: str  # markup, or a message's content
    content_of: int | None  # the message whose content this is; None = the template's markup


class ChatTemplate:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        special_tokens_in_messages: SpecialTokensInMessages = DEFAULT_SPECIAL_TOKENS_IN_MESSAGES,
    ) -> None:
        self._tokenizer = tokenizer
        self._special_mode = special_tokens_in_messages
        self._special_texts = sorted(
            (token.content for token in tokenizer.added_tokens_decoder.values() if token.special),
            key=len,
            reverse=True,
        )
        # Two backends rather than the tokenizer's per-call `split_special_tokens`, which
        # flips a flag shared by every thread that uses the tokenizer.
        self._markup_backend: Tokenizer = tokenizer.backend_tokenizer
        self._text_backend = Tokenizer.from_str(self._markup_backend.to_str())
        self._text_backend.encode_special_tokens = True

    def token_ids(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool, after_contents: int = 0
    ) -> list[int]:
        """The rendered conversation's ids; with `after_contents` n > 0, only what the
        template writes after the content of messages[n - 1] (its closing, later messages)."""
        self._check_contents(messages)
        pieces = self._pieces(messages, add_generation_prompt)
        if after_contents:
            ends = [index for index, piece in enumerate(pieces) if piece.content_of == after_contents - 1]
            if not ends:
                raise InvalidArgument(f"the chat template does not write messages[{after_contents - 1}]")
            pieces = pieces[ends[-1] + 1 :]
        ids: list[int] = []
        for piece in pieces:
            backend = self._markup_backend if piece.content_of is None else self._text_backend
            ids.extend(backend.encode(piece.text, add_special_tokens=False).ids)
        return ids

    def _pieces(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> list[_Piece]:
        """The rendering as markup and contents, in order."""
        marker = f"\x00{secrets.token_hex(8)}:"
        placeholders = [
            {**message, "content": f"{marker}{index}\x00"} for index, message in enumerate(messages)
        ]
        parts = self._render(placeholders, add_generation_prompt).split(marker)
        pieces = [_Piece(parts[0], None)]
        for part in parts[1:]:
            index, _, markup = part.partition("\x00")
            pieces += [_Piece(messages[int(index)]["content"], int(index)), _Piece(markup, None)]
        spliced = "".join(piece.text for piece in pieces)
        rendered = self._render(messages, add_generation_prompt)
        if spliced == rendered:
            return pieces
        # The template rewrites contents: its own rendering, if no content could forge markup.
        if found := self._special_text(messages):
            raise InvalidArgument(
                f"messages[{found[0]}].content holds {found[1]!r}, the text of one of the model's control "
                "tokens, and this model's chat template changes contents, so it cannot be kept plain text"
            )
        return [_Piece(rendered, None)]

    def _render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
        if not self._tokenizer.chat_template:
            raise FailedPrecondition(
                "the model has no chat template; send prompt_token_ids instead of messages"
            )
        try:
            rendered = self._tokenizer.apply_chat_template(
                list(messages), add_generation_prompt=add_generation_prompt, tokenize=False
            )
        except jinja2.TemplateSyntaxError as exc:
            raise FailedPrecondition(
                f"the model's chat template is malformed (line {exc.lineno}: {exc.message}); "
                "send prompt_token_ids instead of messages"
            ) from exc
        except jinja2.TemplateError as exc:
            raise InvalidArgument(f"the model's chat template rejected the messages: {exc}") from exc
        return str(rendered)

    def _check_contents(self, messages: Sequence[dict[str, str]]) -> None:
        if self._special_mode == "refuse" and (found := self._special_text(messages)):
            raise InvalidArgument(
                f"messages[{found[0]}].content holds {found[1]!r}, the text of one of the model's control "
                "tokens; this worker refuses such text (special_tokens_in_messages=refuse)"
            )

    def _special_text(self, messages: Sequence[dict[str, str]]) -> tuple[int, str] | None:
        """The first message whose content holds a special token's text, and that text."""
        for index, message in enumerate(messages):
            for special in self._special_texts:
                if special in message["content"]:
                    return index, special
        return None

    def text_ids(self, text: str) -> list[int]:
        """Raw text as the tokenizer encodes it, control-token text included (with its BOS, if
        it adds one): /v1/completions' caller writes the whole prompt, markup and all, so
        there is no turn of another role to forge."""
        return [int(token_id) for token_id in self._tokenizer(text, add_special_tokens=True)["input_ids"]]
