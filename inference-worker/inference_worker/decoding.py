"""Decoding: choosing each next token and turning tokens into streamed text.

The loop itself is the engine's (engine/engine.py: sample, stream, feed the token back,
until a stop token or the token limit). `Sampler` picks greedily (temperature 0) or samples with temperature and top-p from a
seeded `torch.Generator`, on the CPU so a seed gives the same tokens on every device.
`stop_token_ids` gathers the model's end-of-turn tokens. `IncrementalDetokenizer` emits
the text each token adds, holding back bytes of a character that is not complete yet.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from attnstore.errors import InvalidArgument
from inference_worker.turn_types import SamplingParams

# Special tokens that end an assistant turn in the chat templates of the supported families
# (ChatML, Llama 3, Phi, Gemma), counted only when the tokenizer has them as special tokens.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
# Prompt tokens decoded in front of the first generated token, as vLLM does: sentencepiece
# tokenizers drop a leading space when a token is decoded on its own.
_CONTEXT_TOKENS = 5


def check_sampling(params: SamplingParams) -> None:
    """Raises InvalidArgument for sampling parameters no turn can run with."""
    if params.max_tokens < 1:
        raise InvalidArgument(f"max_tokens must be at least 1, got {params.max_tokens}")
    if params.temperature < 0:
        raise InvalidArgument(f"temperature must not be negative, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise InvalidArgument(f"top_p must lie in (0, 1], got {params.top_p}")
    if params.n < 1:
        raise InvalidArgument(f"n must be at least 1, got {params.n}")


def sample_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sample `index`'s parameters of a turn with `params.n` samples: seed + index (so a
    seeded turn is reproducible sample by sample), unseeded ones each a fresh seed."""
    if params.seed is None:
        return params
    return replace(params, seed=(params.seed + index) % 2**64)


def stop_token_ids(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, extra: tuple[int, ...] = ()
) -> frozenset[int]:
    """The tokenizer's eos, the generation config's eos (one id or a list), the template's
    end-of-turn tokens, and `extra`."""
    found: set[int] = set(extra)
    candidates: list[object] = [tokenizer.eos_token_id]
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    candidates.extend(eos if isinstance(eos, list | tuple) else [eos])
    special = set(tokenizer.all_special_tokens) | {
        token.content for token in getattr(tokenizer, "added_tokens_decoder", {}).values() if token.special
    }
    candidates.extend(tokenizer.convert_tokens_to_ids(t) for t in END_OF_TURN_TOKENS if t in special)
    found.update(c for c in candidates if isinstance(c, int) and c >= 0)
    return frozenset(found)


class Sampler:
    """The next token from the last position's logits, per `params`."""

    def __init__(self, params: SamplingParams) -> None:
        self.temperature = params.temperature
        self.top_p = params.top_p
        self.generator: torch.Generator | None = None
        if self.temperature > 0:
            self.generator = torch.Generator(device="cpu")
            if params.seed is None:
                self.generator.seed()  # non-deterministic, as asked
            else:
                self.generator.manual_seed(params.seed)

    def __call__(self, logits: torch.Tensor) -> int:
        """`logits` [vocab] (any device and float dtype) -> a token id."""
        if self.generator is None:
            return int(torch.argmax(logits))
        logits = logits.detach().float().cpu()  # [vocab]
        # Max first: a tiny temperature then sends the rest to -inf, not everything to +-inf
        # (whose softmax is NaN); the top token keeps 0, so the choice tends to greedy.
        scaled = (logits - logits.max()) / self.temperature  # [vocab]
        probs = torch.softmax(scaled, dim=-1)  # [vocab]
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)  # each [vocab]
            before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass ahead of each token
            # The smallest set whose mass reaches top_p: tokens whose predecessors fall short.
            sorted_probs[before >= self.top_p] = 0.0  # the top token always survives (before = 0)
            choice = int(torch.multinomial(sorted_probs, 1, generator=self.generator))
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=self.generator))


class IncrementalDetokenizer:
    """Text deltas of a growing token sequence; concatenated they give the decoded text
    (special tokens skipped)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.tokens = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0  # start of the window decoded for context
        self.read_offset = len(self.tokens)  # text up to here has been emitted

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def add(self, token_id: int, *, final: bool = False) -> str:
        """The text `token_id` completes. Bytes of an unfinished character wait for the next
        token, unless `final` (then they come out as U+FFFD)."""
        self.tokens.append(token_id)
        prefix_text = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.tokens[self.prefix_offset :])
        if len(full_text) <= len(prefix_text) or (full_text.endswith("\ufffd") and not final):
            return ""  # a skipped special token, or a character still missing bytes
        self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        return full_text[len(prefix_text) :]


def completes_stop_string(before: str, added: str, stop_strings: tuple[str, ...]) -> bool:
    """Whether `added` completes a stop string: only the text that ends in it is searched."""
    return bool(added) and any(
        stop in (before[-(len(stop) - 1) :] if len(stop) > 1 else "") + added for stop in stop_strings
    )


class StopStrings:
    """Whether a sequence's answer text now contains one of `stop_strings`, asked once per
    generated token on the engine's thread (so the sequence ends on the token that
    completes it, like a stop token); a detokenizer of its own, apart from the streamed one."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int], stop_strings: tuple[str, ...]
    ) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids)
        self._stop_strings = stop_strings
        self._text = ""

    def __call__(self, token_id: int) -> bool:
        added = self._detokenizer.add(token_id)
        done = completes_stop_string(self._text, added, self._stop_strings)
        self._text += added
        return done
