"""A module's content flattened into the sequence that positions follow: text runs (anonymous
text and role frames, tokenized as one string), params and child slots (a module, or a union
of modules sharing one slot). Role blocks add text and no level: their modules are children
of the enclosing module."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from attnstore.prompt_modules.names import ModulePath
from attnstore.prompt_modules.nodes import Module, ModuleUnion, Param, RoleBlock, Schema, SchemaNode, Text
from attnstore.prompt_modules.roles import NO_ROLE_FRAMES, RoleFrames


@dataclass(frozen=True)
class TextRun:
    text: str


@dataclass(frozen=True)
class Slot:
    """Where child modules go: one module, or every member of a union (`union` is True)."""

    members: tuple[Module, ...]
    union: bool
    line: int

    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)


Item = TextRun | Param | Slot


def flatten(children: tuple[SchemaNode, ...], frames: RoleFrames) -> list[Item]:
    items: list[Item] = []
    for node in _expand(children, frames):
        if isinstance(node, str):
            if items and isinstance(items[-1], TextRun):
                items[-1] = TextRun(items[-1].text + node)
            elif node:
                items.append(TextRun(node))
        else:
            items.append(node)
    return items


def _expand(children: tuple[SchemaNode, ...], frames: RoleFrames) -> Iterator[str | Param | Slot]:
    for node in children:
        if isinstance(node, Text):
            yield node.text
        elif isinstance(node, RoleBlock):
            yield frames[node.role].prefix
            yield from _expand(node.children, frames)
            yield frames[node.role].suffix
        elif isinstance(node, Module):
            yield Slot((node,), union=False, line=node.line)
        elif isinstance(node, ModuleUnion):
            yield Slot(node.members, union=True, line=node.line)
        else:
            yield node


def child_slots(children: tuple[SchemaNode, ...]) -> list[Slot]:
    return [item for item in _expand(children, NO_ROLE_FRAMES) if isinstance(item, Slot)]


def params_of(children: tuple[SchemaNode, ...]) -> list[Param]:
    return [item for item in _expand(children, NO_ROLE_FRAMES) if isinstance(item, Param)]


def walk_modules(schema: Schema) -> Iterator[tuple[ModulePath, Module, Slot]]:
    """Every module at every depth with its path and the slot holding it, in document order."""

    def walk(
        children: tuple[SchemaNode, ...], prefix: ModulePath
    ) -> Iterator[tuple[ModulePath, Module, Slot]]:
        for slot in child_slots(children):
            for module in slot.members:
                path = (*prefix, module.name)
                yield path, module, slot
                yield from walk(module.children, path)

    return walk(schema.children, ())


def module_paths(schema: Schema) -> tuple[ModulePath, ...]:
    """Every module's path at every depth, in document order (the root () not included)."""
    return tuple(path for path, _, _ in walk_modules(schema))
