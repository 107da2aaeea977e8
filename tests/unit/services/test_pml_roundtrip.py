"""Printing then parsing is the identity, on generated schemas and prompts."""

from hypothesis import given, settings
from pml_strategies import NAMES, prompt_content, schemas

from attnstore.prompt_modules import (
    Prompt,
    PromptNode,
    Schema,
    parse_prompt,
    parse_schema,
    print_prompt,
    print_schema,
)


@settings(max_examples=100, deadline=None)
@given(schemas())
def test_print_then_parse_is_the_identity_on_schemas(schema: Schema) -> None:
    assert parse_schema(print_schema(schema)) == schema


@settings(max_examples=60, deadline=None)
@given(NAMES, prompt_content(3, False))
def test_print_then_parse_is_the_identity_on_prompts(name: str, children: tuple[PromptNode, ...]) -> None:
    prompt = Prompt(name, children)
    assert parse_prompt(print_prompt(prompt)) == prompt
