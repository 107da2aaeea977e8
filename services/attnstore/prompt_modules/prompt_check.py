"""Binding a prompt to its schema: every import names a module declared at that level, no
module is imported twice, at most one member of each union, and arguments match params."""

from __future__ import annotations

from collections.abc import Iterator

from attnstore.prompt_modules.errors import (
    ArgumentError,
    DuplicateName,
    SchemaMismatch,
    UnionConflict,
    UnknownModule,
)
from attnstore.prompt_modules.names import ModulePath, format_path
from attnstore.prompt_modules.nodes import Import, Prompt, PromptNode, PromptRole, Schema, SchemaNode
from attnstore.prompt_modules.structure import child_slots, params_of, walk_modules


def check_prompt(prompt: Prompt, schema: Schema) -> None:
    if prompt.schema != schema.name:
        raise SchemaMismatch(
            prompt.line, f'<prompt schema="{prompt.schema}">', f"checked against schema {schema.name!r}"
        )
    _check_level(prompt.children, schema.children, (), schema)


def imports_in(nodes: tuple[PromptNode, ...]) -> Iterator[Import]:
    """The imports of one level, through role tags."""
    for node in nodes:
        if isinstance(node, Import):
            yield node
        elif isinstance(node, PromptRole):
            yield from imports_in(node.children)


def _check_level(
    nodes: tuple[PromptNode, ...], declared: tuple[SchemaNode, ...], path: ModulePath, schema: Schema
) -> None:
    members = {m.name: (slot, m) for slot in child_slots(declared) for m in slot.members}
    taken: dict[int, str] = {}  # id of a slot -> the name imported from it
    for imp in imports_in(nodes):
        where = f"<{imp.name}>"
        if imp.name not in members:
            raise UnknownModule(imp.line, where, _unknown(imp.name, path, schema))
        slot, module = members[imp.name]
        if id(slot) in taken:
            if taken[id(slot)] == imp.name:
                raise DuplicateName(imp.line, where, f"module {imp.name!r} is imported twice")
            raise UnionConflict(
                imp.line, where, f"{imp.name!r} and {taken[id(slot)]!r} are members of one union"
            )
        taken[id(slot)] = imp.name
        _check_arguments(imp, module.children)
        _check_level(imp.children, module.children, (*path, imp.name), schema)


def _check_arguments(imp: Import, declared: tuple[SchemaNode, ...]) -> None:
    params = [p.name for p in params_of(declared)]
    for name, _ in imp.arguments:
        if name not in params:
            raise ArgumentError(imp.line, f"<{imp.name}>", f"module {imp.name!r} has no parameter {name!r}")
    given = imp.argument_map()
    for name in params:
        if name not in given:
            raise ArgumentError(
                imp.line, f"<{imp.name}>", f'missing argument {name!r} (the attribute {name}="...")'
            )


def _unknown(name: str, path: ModulePath, schema: Schema) -> str:
    where = f"module {format_path(path)!r}" if path else "the schema root"
    elsewhere = [format_path(p) for p, _, _ in walk_modules(schema) if p[-1] == name]
    hint = f"; it is declared as {', '.join(elsewhere)}: import it inside its parent" if elsewhere else ""
    return f"no module {name!r} in {where} of schema {schema.name!r}{hint}"
