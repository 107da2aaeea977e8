"""Checks on the public API's requests, with messages that name the field and the limit.
Each check returns the value in the form the scheduler uses, or raises InvalidArgument."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

from attnstore.api.v1 import api_pb2 as api
from attnstore.errors import InvalidArgument, ResourceExhausted, Unavailable
from attnstore_scheduler.session_activity import Expectation
from attnstore_scheduler.session_record import check_session_id
from attnstore_scheduler.turn_types import GenerationOptions
from attnstore_scheduler.worker_types import ModelCard, SamplingParams

MAX_TEMPERATURE = 2.0
MAX_STOP_STRINGS = 4  # as OpenAI's API
MAX_STOP_CHARS = 256
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 50


@dataclass(frozen=True)
class ApiLimits:
    max_message_chars: int
    max_session_tokens: int
    default_max_tokens: int
    max_samples: int  # answers one request may draw (GenerationOptions.n)
    session_ttl_seconds: int
    max_session_ttl_seconds: int


def check_text(text: str, field: str, limits: ApiLimits, *, required: bool) -> str:
    if required and not text.strip():
        raise InvalidArgument(f"{field} must not be empty")
    if len(text) > limits.max_message_chars:
        raise InvalidArgument(
            f"{field} is {len(text)} characters long; at most {limits.max_message_chars} are allowed"
        )
    return text


def check_ttl(ttl_seconds: int, limits: ApiLimits) -> int:
    if ttl_seconds > limits.max_session_ttl_seconds:
        raise InvalidArgument(
            f"ttl_seconds is {ttl_seconds}; at most {limits.max_session_ttl_seconds} are allowed"
        )
    return ttl_seconds or limits.session_ttl_seconds


def check_expectation(next_turn_seconds: float, over: bool, limits: ApiLimits) -> Expectation | None:
    """The application's expectation of the next turn (Chat, CreateSession); None when it
    gave none. A follow-up further away than the longest TTL is no expectation a session can keep."""
    if over and next_turn_seconds:
        raise InvalidArgument("conversation_over and expected_next_turn_seconds exclude each other")
    if not math.isfinite(next_turn_seconds) or next_turn_seconds < 0:
        raise InvalidArgument(
            f"expected_next_turn_seconds must be finite and not negative, got {next_turn_seconds}"
        )
    if next_turn_seconds > limits.max_session_ttl_seconds:
        raise InvalidArgument(
            f"expected_next_turn_seconds is {next_turn_seconds:g}; at most {limits.max_session_ttl_seconds} "
            "(the longest session TTL) are allowed"
        )
    if not over and not next_turn_seconds:
        return None
    return Expectation(next_turn_seconds or None, over)


def check_page(request: api.ListSessionsRequest) -> tuple[int, str]:
    """(page size, id to continue after)."""
    if request.page_size > MAX_PAGE_SIZE:
        raise InvalidArgument(f"page_size is {request.page_size}; at most {MAX_PAGE_SIZE} are allowed")
    after_id = check_session_id(request.page_token, "page_token") if request.page_token else ""
    return request.page_size or DEFAULT_PAGE_SIZE, after_id


def sampling(
    options: GenerationOptions,
    limits: ApiLimits,
    model: ModelCard,
    *,
    session: bool = False,
) -> SamplingParams:
    """The worker's sampling parameters. Sampled decoding always gets a seed, so a turn
    replayed on another worker after a failure produces the same tokens. A `session`
    turn keeps one answer, so it draws one."""
    max_tokens = options.max_tokens or min(limits.default_max_tokens, model.max_new_tokens)
    if max_tokens > model.max_new_tokens:
        raise InvalidArgument(
            f"options.max_tokens is {max_tokens}; the model allows at most {model.max_new_tokens}"
        )
    temperature = options.temperature if options.temperature is not None else 0.0
    if not math.isfinite(temperature) or not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise InvalidArgument(
            f"options.temperature is {temperature}; expected a number in [0, {MAX_TEMPERATURE}]"
        )
    if options.top_p is not None and (not math.isfinite(options.top_p) or not 0.0 < options.top_p <= 1.0):
        raise InvalidArgument(f"options.top_p is {options.top_p}; expected a number in (0, 1]")
    if len(options.stop) > MAX_STOP_STRINGS or not all(0 < len(s) <= MAX_STOP_CHARS for s in options.stop):
        raise InvalidArgument(
            f"options.stop: at most {MAX_STOP_STRINGS} texts of 1 to {MAX_STOP_CHARS} characters each"
        )
    n = check_samples(options.n or 1, limits, model, session=session)
    seed = None
    if temperature > 0:
        seed = options.seed if options.seed is not None else secrets.randbits(63)
    return SamplingParams(max_tokens, temperature, options.top_p, seed, options.stop, n)


def check_samples(n: int, limits: ApiLimits, model: ModelCard, *, session: bool) -> int:
    if session and n > 1:
        raise InvalidArgument(
            f"options.n is {n}: a session's turn keeps one answer, so it draws one (ask Generate for n answers)"
        )
    most = min(limits.max_samples, model.max_samples or 1)  # a worker that names none draws one
    if n > most:
        raise InvalidArgument(
            f"options.n is {n}; at most {most} answers are allowed (the scheduler's max_samples "
            f"{limits.max_samples}, the worker's {model.max_samples or 1})"
        )
    return n


def check_session_tokens(prompt_tokens: int, max_tokens: int, limits: ApiLimits) -> None:
    if prompt_tokens + max_tokens > limits.max_session_tokens:
        raise ResourceExhausted(
            f"the conversation has {prompt_tokens} tokens with this message; with up to {max_tokens} "
            f"more for the answer it would pass the limit of {limits.max_session_tokens}: "
            "start a new session (or ask for fewer options.max_tokens)"
        )


def check_turn_context(prompt_tokens: int, max_tokens: int, model: ModelCard) -> None:
    """Admits a turn up to the longest context a worker serves (its KV pool, or with peers
    for long turns its long_context.max_context_tokens); a prompt beyond the context window
    counts as truncated to it. A worker that reports no limit (0) decides itself."""
    context = min(prompt_tokens + max_tokens, model.max_context_tokens)
    if model.max_turn_context_tokens and context > model.max_turn_context_tokens:
        raise ResourceExhausted(
            f"the turn needs a context of {context} tokens ({prompt_tokens} in the prompt, up to {max_tokens} "
            f"to generate, within the {model.max_context_tokens}-token window); a worker serves at most "
            f"{model.max_turn_context_tokens} (its KV pool, or its long_context.max_context_tokens with peers): "
            "ask for fewer options.max_tokens or start a new session"
        )


def check_system_prompt_tokens(tokens: int, limits: ApiLimits, model: ModelCard) -> None:
    """A session whose system prompt leaves no room for a message and an answer would fail
    every Chat: refused at creation (INVALID_ARGUMENT: the request itself can never pass)."""
    room = min(limits.max_session_tokens, model.max_prompt_tokens + 1) - 2  # a message token, an answer token
    if tokens > room:
        raise InvalidArgument(
            f"system_prompt is {tokens} tokens under the model's chat template; a session allows at "
            f"most {room} for it (max_session_tokens {limits.max_session_tokens}, the worker's "
            f"max_prompt_tokens {model.max_prompt_tokens}, room for a message and an answer)"
        )


def require_model(model: ModelCard | None) -> ModelCard:
    if model is None:
        raise Unavailable("no healthy worker is registered yet; retry later")
    return model
