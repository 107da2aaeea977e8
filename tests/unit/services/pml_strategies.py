"""Hypothesis strategies for PML trees: names, verbatim texts, schemas and prompt content,
shaped so that every generated tree is valid (unique names, no param at the root, no nested
role tags, no adjacent texts)."""

from __future__ import annotations

import itertools
import string

from hypothesis import strategies as st

from attnstore.prompt_modules import (
    Import,
    Module,
    ModuleUnion,
    Param,
    PromptNode,
    PromptRole,
    RoleBlock,
    Scaffold,
    Schema,
    SchemaNode,
    Text,
)
from attnstore.prompt_modules.names import RESERVED

_FIRST = string.ascii_letters + "_"
NAMES = st.builds(
    str.__add__, st.sampled_from(_FIRST), st.text(_FIRST + string.digits + "-", max_size=8)
).filter(lambda name: name.lower() not in RESERVED)
# Any character XML 1.0 can carry (markup characters and line ends included); never blank,
# since whitespace-only text between elements is layout.
CHARACTERS = st.characters(
    exclude_categories=("Cs", "Cc"), exclude_characters="\ufffe\uffff", include_characters="\n\t\r"
)
TEXTS = st.text(CHARACTERS, min_size=1, max_size=12).filter(str.strip)
ROLES = st.sampled_from(["system", "user", "assistant"])


def merged(nodes: list) -> tuple:  # type: ignore[type-arg]
    """Adjacent texts as one, as the parser reads them."""
    out: list = []  # type: ignore[type-arg]
    for node in nodes:
        if out and isinstance(node, Text) and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text + node.text)
        else:
            out.append(node)
    return tuple(out)


@st.composite
def schema_content(
    draw: st.DrawFn, counter: itertools.count, depth: int, in_module: bool, in_role: bool
) -> tuple[SchemaNode, ...]:
    kinds = (
        ["text"]
        + ["param"] * in_module
        + ["module", "union"] * (depth > 0)
        + ["role"] * (depth > 0 and not in_role)
    )
    nodes: list[SchemaNode] = []
    for kind in draw(st.lists(st.sampled_from(kinds), max_size=4)):
        unique = f"{draw(NAMES)}{next(counter)}"  # names are unique at every level, hence in each scope
        if kind == "text":
            nodes.append(Text(draw(TEXTS)))
        elif kind == "param":
            nodes.append(Param(unique, draw(st.integers(1, 4096))))
        elif kind == "module":
            nodes.append(Module(unique, draw(schema_content(counter, depth - 1, True, in_role))))
        elif kind == "union":
            members = draw(
                st.lists(schema_content(counter, depth - 1, True, in_role), min_size=1, max_size=3)
            )
            nodes.append(ModuleUnion(tuple(Module(f"{unique}m{i}", c) for i, c in enumerate(members))))
        else:
            nodes.append(RoleBlock(draw(ROLES), draw(schema_content(counter, depth - 1, in_module, True))))
    return merged(nodes)


def top_modules(children: tuple[SchemaNode, ...]) -> list[str]:
    names: list[str] = []
    for node in children:
        if isinstance(node, Module):
            names.append(node.name)
        elif isinstance(node, RoleBlock):
            names.extend(top_modules(node.children))
    return names


@st.composite
def schemas(draw: st.DrawFn) -> Schema:
    children = draw(schema_content(itertools.count(), 3, False, False))
    candidates = top_modules(children)
    scaffolds = []
    for i in range(draw(st.integers(0, 2)) if candidates else 0):
        chosen = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3, unique=True))
        scaffolds.append(Scaffold(f"{draw(NAMES)}{i}", tuple((name,) for name in chosen)))
    return Schema(draw(NAMES), children, tuple(scaffolds))


@st.composite
def prompt_content(draw: st.DrawFn, depth: int, in_role: bool) -> tuple[PromptNode, ...]:
    kinds = ["text"] + ["import"] * (depth > 0) + ["role"] * (depth > 0 and not in_role)
    nodes: list[PromptNode] = []
    for kind in draw(st.lists(st.sampled_from(kinds), max_size=4)):
        if kind == "text":
            nodes.append(Text(draw(TEXTS)))
        elif kind == "import":
            arguments = draw(st.dictionaries(NAMES, st.text(CHARACTERS, max_size=8), max_size=3))
            nodes.append(
                Import(draw(NAMES), tuple(arguments.items()), draw(prompt_content(depth - 1, in_role)))
            )
        else:
            nodes.append(PromptRole(draw(ROLES), draw(prompt_content(depth - 1, True))))
    return merged(nodes)
