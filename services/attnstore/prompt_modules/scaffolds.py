"""Scaffolds: `<scaffold name="qa" modules="doc1 doc2 trip.hotel"/>`, declared directly in
<schema>. Their modules (dotted paths; a nested module needs its parent listed too) are encoded
together with the schema's anonymous text in one attention span; a prompt importing all of
them is served the scaffold's KV for those modules instead of the separately encoded KV."""

from __future__ import annotations

from collections.abc import Collection

from attnstore.prompt_modules.errors import DuplicateName, MalformedPml, UnionConflict, UnknownModule
from attnstore.prompt_modules.limits import PmlLimits
from attnstore.prompt_modules.names import ModulePath, check_name, format_path, parse_path
from attnstore.prompt_modules.nodes import Scaffold, Schema
from attnstore.prompt_modules.structure import walk_modules
from attnstore.prompt_modules.xml_tree import XmlElement, check_attributes


def parse_scaffold(element: XmlElement, limits: PmlLimits) -> Scaffold:
    where = element.describe()
    check_attributes(element, required=("name", "modules"))
    if element.children:
        raise MalformedPml(element.line, where, "a scaffold is an empty element")
    name = check_name(element.attributes["name"], element.line, where, limits)
    paths: list[ModulePath] = []
    for text in element.attributes["modules"].split():
        path = parse_path(text)
        for part in path:
            check_name(part, element.line, where, limits)
        if path in paths:
            raise DuplicateName(element.line, where, f"module {text!r} is listed twice")
        paths.append(path)
    if not paths:
        raise MalformedPml(element.line, where, "a scaffold lists at least one module")
    return Scaffold(name, tuple(paths), element.line)


def check_scaffolds(schema: Schema, elements: list[XmlElement]) -> None:
    """Every listed module exists, comes with its parent, and shares no union with another."""
    slots = {path: slot for path, _, slot in walk_modules(schema)}
    names: set[str] = set()
    for scaffold, element in zip(schema.scaffolds, elements, strict=True):
        where = element.describe()
        if scaffold.name in names:
            raise DuplicateName(element.line, where, f"a second scaffold {scaffold.name!r}")
        names.add(scaffold.name)
        listed = set(scaffold.modules)
        for path in scaffold.modules:
            if path not in slots:
                raise UnknownModule(element.line, where, f"no module {format_path(path)!r} in the schema")
            if len(path) > 1 and path[:-1] not in listed:
                raise MalformedPml(
                    element.line,
                    where,
                    f"{format_path(path)!r} is listed without its parent {format_path(path[:-1])!r}",
                )
        for path in scaffold.modules:
            # Two paths share a slot only as members of one union.
            rival = next((p for p in scaffold.modules if p != path and slots[p] is slots[path]), None)
            if rival is not None:
                raise UnionConflict(
                    element.line,
                    where,
                    f"{format_path(path)!r} and {format_path(rival)!r} are members of one union",
                )


def choose_scaffold(schema: Schema, imported: Collection[ModulePath]) -> Scaffold | None:
    """The scaffold with the most modules among those whose modules are all imported."""
    usable = [s for s in schema.scaffolds if all(p in imported for p in s.modules)]
    return max(usable, key=lambda s: len(s.modules), default=None)
