"""Role tags take their framing from the caller's chat template."""

import pytest
from pml_fixtures import word_tokens

from attnstore.prompt_modules import (
    RoleFrame,
    layout_prompt,
    layout_schema,
    messages_renderer,
    parse_prompt,
    parse_schema,
    role_frames,
)


def smollm2_like(messages: list[dict[str, str]]) -> str:
    """SmolLM2's template: a default system prompt when the conversation opens without one."""
    out = ""
    for i, message in enumerate(messages):
        if i == 0 and message["role"] != "system":
            out += "<|im_start|>system\nYou are SmolLM.<|im_end|>\n"
        out += f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n"
    return out


def test_frames_are_what_the_template_puts_around_the_content() -> None:
    frames = role_frames(lambda role, content: f"<{role}>{content}</{role}>")
    assert frames["assistant"] == RoleFrame("<assistant>", "</assistant>")


def test_a_renderer_that_drops_the_content_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        role_frames(lambda role, content: role)


def test_a_whole_conversation_template_frames_each_role_without_its_default_system_prompt() -> None:
    frames = role_frames(messages_renderer(smollm2_like))
    assert frames["user"] == RoleFrame("<|im_start|>user\n", "<|im_end|>\n")
    assert frames["system"] == RoleFrame("<|im_start|>system\n", "<|im_end|>\n")


def test_role_tags_in_schema_and_prompt_render_like_the_whole_conversation() -> None:
    def chars(text: str) -> list[int]:
        return [ord(c) for c in text]

    render = messages_renderer(smollm2_like)
    schema = layout_schema(
        parse_schema('<schema name="s"><system>Be brief.</system><module name="doc">Doc.</module></schema>'),
        chars,
        render,
    )
    served = layout_prompt(
        schema, parse_prompt('<prompt schema="s"><user><doc/> Why?</user></prompt>'), chars, render
    )
    conversation = smollm2_like(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Doc. Why?"},
        ]
    )
    assert "".join(map(chr, served.token_ids)) == conversation
    assert served.positions == tuple(range(len(conversation))) and served.next_position == len(conversation)


def test_next_position_follows_the_last_served_token() -> None:
    schema = layout_schema(
        parse_schema('<schema name="s"><module name="a">x y</module>z</schema>'), word_tokens
    )
    served = layout_prompt(schema, parse_prompt('<prompt schema="s">q</prompt>'), word_tokens)
    assert served.positions == (2, 3) and served.next_position == 4  # a is a gap
