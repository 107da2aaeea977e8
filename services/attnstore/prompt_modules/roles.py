"""Role tags compiled through the model's chat template, which the caller supplies as a
callable: the package itself stays free of any model or tokenizer."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from attnstore.errors import FailedPrecondition
from attnstore.prompt_modules.names import ROLES
from attnstore.prompt_modules.nodes import Role

# (role, content) -> that one message as the chat template renders it, e.g.
# lambda role, content: tokenizer.apply_chat_template([{"role": role, "content": content}], tokenize=False)
RenderRole = Callable[[str, str], str]

# Survives templates that trim or capitalize nothing, and occurs in no real prompt.
_CONTENT_MARK = "\u27e6pml-content\u27e7"


@dataclass(frozen=True)
class RoleFrame:
    """The template's text before and after a message's content."""

    prefix: str
    suffix: str


RoleFrames = Mapping[Role, RoleFrame]
NO_ROLE_FRAMES: RoleFrames = {role: RoleFrame("", "") for role in ROLES}


def role_frames(render_role: RenderRole) -> RoleFrames:
    """Each role's frame, found by rendering a marker as the content and splitting around it."""
    frames: dict[Role, RoleFrame] = {}
    for role in ROLES:
        rendered = render_role(role, _CONTENT_MARK)
        if rendered.count(_CONTENT_MARK) != 1:
            raise ValueError(f"the role renderer must put the content exactly once in a {role} message")
        prefix, suffix = rendered.split(_CONTENT_MARK)
        frames[role] = RoleFrame(prefix, suffix)
    return frames


def plain_roles(role: str, content: str) -> str:
    """A renderer without framing, for models without a chat template and for tests."""
    return content


def messages_renderer(apply_template: Callable[[list[dict[str, str]]], str]) -> RenderRole:
    """A `RenderRole` from a whole-conversation renderer (`tokenizer.apply_chat_template` with
    `tokenize=False`). A message is rendered after an empty system message and that prefix cut
    off, so templates that open with BOS or inject a default system prompt when none is given
    (SmolLM2's does) frame every role with its own text only. The template first runs when a
    role tag needs it: a model whose template fails still serves everything else, and a
    prompt with role tags gets FailedPrecondition naming the template's error."""
    anchor = [{"role": "system", "content": ""}]

    def apply(messages: list[dict[str, str]]) -> str:
        try:
            return apply_template(messages)
        except Exception as exc:  # jinja2 errors, and whatever a template raises
            raise FailedPrecondition(f"the model's chat template cannot render role tags: {exc}") from exc

    @functools.cache
    def opening() -> str:
        return apply(anchor)

    def render(role: str, content: str) -> str:
        rendered = apply([*anchor, {"role": role, "content": content}])
        if not rendered.startswith(opening()):
            raise FailedPrecondition(
                "the chat template renders a conversation's start differently with more messages"
            )
        return rendered[len(opening()) :]

    return render
