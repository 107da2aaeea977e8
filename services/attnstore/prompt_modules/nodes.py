"""The parsed forms of schemas and prompts. Line numbers are kept for error messages and left
out of equality, so a reprinted and reparsed document compares equal to the original."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from attnstore.prompt_modules.names import ModulePath

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Text:
    """Verbatim text: anonymous in a schema (cached with its module), uncached in a prompt."""

    text: str
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Param:
    """A placeholder reserving `len` positions for an argument given at serve time."""

    name: str
    len: int
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Module:
    name: str
    children: tuple[SchemaNode, ...]
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ModuleUnion:
    """Mutually exclusive modules sharing one start position; as long as the longest member."""

    members: tuple[Module, ...]
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class RoleBlock:
    """A chat turn: its content framed by the model's chat template for `role`."""

    role: Role
    children: tuple[SchemaNode, ...]
    line: int = field(default=0, compare=False)


SchemaNode = Text | Param | Module | ModuleUnion | RoleBlock


@dataclass(frozen=True)
class Scaffold:
    """Modules encoded together in one attention span, used when a prompt imports them all."""

    name: str
    modules: tuple[ModulePath, ...]
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Schema:
    name: str
    children: tuple[SchemaNode, ...]
    scaffolds: tuple[Scaffold, ...] = ()
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Import:
    """A module imported by a prompt: arguments for its params, nested imports, uncached text."""

    name: str
    arguments: tuple[tuple[str, str], ...]  # (param name, argument text) in document order
    children: tuple[PromptNode, ...]
    line: int = field(default=0, compare=False)

    def argument_map(self) -> dict[str, str]:
        return dict(self.arguments)


@dataclass(frozen=True)
class PromptRole:
    """A chat turn in a prompt; its frame and text are computed, its imports served from cache."""

    role: Role
    children: tuple[PromptNode, ...]
    line: int = field(default=0, compare=False)


PromptNode = Text | Import | PromptRole


@dataclass(frozen=True)
class Prompt:
    schema: str  # the schema's name
    children: tuple[PromptNode, ...]
    line: int = field(default=0, compare=False)
