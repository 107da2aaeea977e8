"""Checks on the worker's requests, with messages that name the field and the limit.
Each check returns the value in the form the turn engine takes, or raises InvalidArgument."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from attnstore.errors import InvalidArgument
from attnstore.worker.v1 import worker_pb2 as pb
from inference_worker.decoding import check_sampling as check_decodable
from inference_worker.modules.repair_selection import RepairMethod
from inference_worker.turn_types import SamplingParams

ROLES = ("system", "user", "assistant")
MAX_TENANT_BYTES = 256
MAX_STOP_TOKEN_IDS = 64
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_REPAIR_TOKENS = 4096  # per module; a module's own length bounds it anyway
REPAIR_METHODS = tuple(method.value for method in RepairMethod)


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for: the settings' limits capped by the model."""

    vocab_size: int  # token ids are below this
    max_prompt_tokens: int  # the untruncated conversation
    max_new_tokens: int
    max_samples: int  # parallel samples of one prompt (SamplingParams.n)
    max_message_chars: int
    max_messages: int


def check_tenant(tenant: str) -> bytes:
    """The tenant's namespace salt."""
    salt = tenant.encode()
    if not salt:
        raise InvalidArgument("tenant must not be empty (it isolates the tenant's KV)")
    if len(salt) > MAX_TENANT_BYTES:
        raise InvalidArgument(f"tenant is {len(salt)} bytes long; at most {MAX_TENANT_BYTES} are allowed")
    return salt


def check_messages(messages: Sequence[pb.ChatMessage], limits: RequestLimits) -> list[dict[str, str]]:
    """The messages as the chat template takes them."""
    if not messages:
        raise InvalidArgument("messages must not be empty")
    if len(messages) > limits.max_messages:
        raise InvalidArgument(
            f"messages holds {len(messages)} messages; at most {limits.max_messages} are allowed"
        )
    for index, message in enumerate(messages):
        if message.role not in ROLES:
            raise InvalidArgument(
                f"messages[{index}].role is {message.role!r}; expected one of {', '.join(ROLES)}"
            )
        if len(message.content) > limits.max_message_chars:
            raise InvalidArgument(
                f"messages[{index}].content is {len(message.content)} characters long; "
                f"at most {limits.max_message_chars} are allowed"
            )
    return [{"role": message.role, "content": message.content} for message in messages]


def check_text(text: str, with_messages: bool, limits: RequestLimits) -> str:
    """TokenizeRequest.text: raw text, never together with messages."""
    if with_messages:
        raise InvalidArgument("give either text or messages, not both")
    if len(text) > limits.max_message_chars:
        raise InvalidArgument(
            f"text is {len(text)} characters long; at most {limits.max_message_chars} are allowed"
        )
    return text


def check_token_ids(token_ids: Sequence[int], limits: RequestLimits, field: str) -> list[int]:
    for index, token_id in enumerate(token_ids):
        if token_id >= limits.vocab_size:
            raise InvalidArgument(
                f"{field}[{index}] is {token_id}, "
                f"outside the model's vocabulary of {limits.vocab_size} tokens"
            )
    return list(token_ids)


def check_prompt(
    token_ids: Sequence[int], limits: RequestLimits, field: str = "prompt_token_ids"
) -> list[int]:
    if not token_ids:
        raise InvalidArgument(f"{field} must not be empty")
    if len(token_ids) > limits.max_prompt_tokens:
        raise InvalidArgument(
            f"the prompt has {len(token_ids)} tokens; at most {limits.max_prompt_tokens} are allowed"
        )
    return check_token_ids(token_ids, limits, field)


def check_history_tokens(history_tokens: int, prompt_tokens: int) -> int:
    if history_tokens > prompt_tokens:
        raise InvalidArgument(
            f"history_tokens is {history_tokens}, more than the prompt's {prompt_tokens} tokens"
        )
    return history_tokens


def check_repair(pml: pb.PmlPrompt) -> tuple[int, float, str | None]:
    """A PML prompt's boundary repair: (tokens per module, fraction, method or None for
    the worker's setting)."""
    if pml.repair_tokens > MAX_REPAIR_TOKENS:
        raise InvalidArgument(
            f"pml.repair_tokens is {pml.repair_tokens}; at most {MAX_REPAIR_TOKENS} are allowed"
        )
    if not 0.0 <= pml.repair_fraction <= 1.0:  # NaN fails too
        raise InvalidArgument(f"pml.repair_fraction is {pml.repair_fraction}; it must lie in [0, 1]")
    if pml.repair_tokens and pml.repair_fraction:
        raise InvalidArgument("give pml.repair_tokens or pml.repair_fraction, not both")
    if pml.repair_method and pml.repair_method not in REPAIR_METHODS:
        raise InvalidArgument(
            f"pml.repair_method is {pml.repair_method!r}; it must be one of {', '.join(REPAIR_METHODS)} "
            "(or empty: the worker's setting)"
        )
    return pml.repair_tokens, pml.repair_fraction, pml.repair_method or None


def check_sampling(sampling: pb.SamplingParams, limits: RequestLimits) -> SamplingParams:
    if sampling.max_tokens > limits.max_new_tokens:
        raise InvalidArgument(
            f"sampling.max_tokens is {sampling.max_tokens}; at most {limits.max_new_tokens} are allowed"
        )
    if len(sampling.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidArgument(
            f"sampling.stop_token_ids holds {len(sampling.stop_token_ids)} ids; at most {MAX_STOP_TOKEN_IDS}"
        )
    if len(sampling.stop_strings) > MAX_STOP_STRINGS or not all(
        0 < len(stop) <= MAX_STOP_STRING_CHARS for stop in sampling.stop_strings
    ):
        raise InvalidArgument(
            f"sampling.stop_strings: at most {MAX_STOP_STRINGS} texts of 1 to {MAX_STOP_STRING_CHARS} characters"
        )
    if sampling.n > limits.max_samples:
        raise InvalidArgument(f"sampling.n is {sampling.n}; at most {limits.max_samples} samples are allowed")
    if not math.isfinite(sampling.temperature):
        raise InvalidArgument(f"sampling.temperature must be a finite number, got {sampling.temperature}")
    params = SamplingParams(
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p if sampling.HasField("top_p") else SamplingParams.top_p,
        seed=sampling.seed if sampling.HasField("seed") else None,
        stop_token_ids=tuple(check_token_ids(sampling.stop_token_ids, limits, "sampling.stop_token_ids")),
        stop_strings=tuple(sampling.stop_strings),
        n=sampling.n or 1,
    )
    try:
        check_decodable(params)
    except InvalidArgument as exc:
        raise InvalidArgument(f"sampling.{exc}") from None
    return params
