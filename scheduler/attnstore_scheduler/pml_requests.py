"""The PML options of Generate and Chat requests (boundary repair, the generation prompt),
checked here and passed on as a PmlPrompt for the worker. The repair budget per module
(`repair_tokens`, at most the worker's limit) is checked by the worker, which knows it."""

from __future__ import annotations

import math
from typing import Protocol

from attnstore.api.v1 import api_pb2 as api
from attnstore.errors import InvalidArgument
from attnstore_scheduler.worker_types import PmlPrompt

_METHODS = {
    api.REPAIR_METHOD_UNSPECIFIED: "",  # the worker's setting
    api.REPAIR_METHOD_FIRST: "first",
    api.REPAIR_METHOD_DEVIATION: "deviation",
}


class RepairOptions(Protocol):
    """The repair fields GenerateRequest and ChatRequest share."""

    repair_tokens: int
    repair_method: int
    repair_fraction: float


def check_no_pml_options(request: RepairOptions, *, add_generation_prompt: bool = False) -> None:
    """A request without pml sets none of its options."""
    given = [
        name
        for name, value in (
            ("repair_tokens", request.repair_tokens),
            ("repair_method", request.repair_method),
            ("repair_fraction", request.repair_fraction),
            ("add_generation_prompt", add_generation_prompt),
        )
        if value
    ]
    if given:
        raise InvalidArgument(f"{', '.join(given)} apply to pml prompts only; this request has no pml")


def pml_prompt(
    schema_document: str, document: str, request: RepairOptions, *, add_generation_prompt: bool
) -> PmlPrompt:
    """The worker's PmlPrompt for `document` against the schema. Raises InvalidArgument."""
    fraction = request.repair_fraction
    if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
        raise InvalidArgument(f"repair_fraction is {fraction}; it must lie in [0, 1]")
    if request.repair_tokens and fraction:
        raise InvalidArgument("give repair_tokens or repair_fraction, not both")
    if request.repair_method not in _METHODS:
        raise InvalidArgument(
            f"repair_method {request.repair_method} is not a RepairMethod "
            f"(one of {', '.join(api.RepairMethod.Name(m) for m in _METHODS)})"
        )
    if request.repair_method != api.REPAIR_METHOD_UNSPECIFIED and not (request.repair_tokens or fraction):
        raise InvalidArgument("repair_method needs a repair budget: repair_tokens or repair_fraction")
    return PmlPrompt(
        schema=schema_document,
        prompt=document,
        repair_tokens=request.repair_tokens,
        repair_method=_METHODS[request.repair_method],
        repair_fraction=fraction,
        add_generation_prompt=add_generation_prompt,
    )
