"""The two edges that build the scheduler's GenerationOptions: the gRPC request's (where an
absent optional field must stay absent, not become 0) and the OpenAI body's."""

from __future__ import annotations

from attnstore.api.v1 import api_pb2 as api
from attnstore_scheduler.openai_api.models import CompletionRequest
from attnstore_scheduler.openai_api.routes import options_of as openai_options
from attnstore_scheduler.servicer import options_of
from attnstore_scheduler.turn_types import GenerationOptions


def test_absent_optional_fields_stay_absent() -> None:
    assert options_of(api.GenerationOptions()) == GenerationOptions()


def test_zero_valued_optional_fields_are_kept() -> None:
    # seed 0 is a seed (the answer must be reproducible), not "pick one"
    options = api.GenerationOptions(max_tokens=7, temperature=0.0, top_p=1.0, seed=0, stop=["a", "b"], n=2)
    assert options_of(options) == GenerationOptions(
        max_tokens=7, temperature=0.0, top_p=1.0, seed=0, stop=("a", "b"), n=2
    )


def test_an_openai_body_maps_to_the_same_options() -> None:
    body = CompletionRequest(model="m", prompt="p", max_tokens=5, temperature=0.5, seed=0, stop="x", n=2)
    assert openai_options(body) == GenerationOptions(
        max_tokens=5, temperature=0.5, top_p=None, seed=0, stop=("x",), n=2
    )
