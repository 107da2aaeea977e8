"""What to serve for a prompt: cached module pieces at their schema positions, arguments on
their params' reserved positions and uncached text after what precedes it, in the order the
prompt writes them. Where earlier content has already passed a piece's schema position (text
longer than the gap before a module, modules imported out of schema order), the piece is
served at the next free position instead and the worker re-positions its keys (rotary shift
by `ModuleSegment.shift`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from attnstore.prompt_modules.errors import ArgumentTooLong
from attnstore.prompt_modules.layout import ParamLayout, PieceLayout, SchemaLayout, SlotLayout, Tokenize
from attnstore.prompt_modules.names import ROOT, ModulePath
from attnstore.prompt_modules.nodes import Import, Prompt, PromptNode, PromptRole, Text
from attnstore.prompt_modules.prompt_check import check_prompt, imports_in
from attnstore.prompt_modules.roles import RenderRole, RoleFrames, plain_roles, role_frames
from attnstore.prompt_modules.scaffolds import choose_scaffold


class _Placed:
    """Tokens served at consecutive positions from `start`."""

    start: int
    token_ids: tuple[int, ...]

    @property
    def positions(self) -> range:
        return range(self.start, self.start + len(self.token_ids))


@dataclass(frozen=True)
class ModuleSegment(_Placed):
    """A piece of an imported module, served from cached KV."""

    cached: ClassVar[bool] = True
    path: ModulePath
    piece: int  # index among the module's pieces
    token_ids: tuple[int, ...]
    schema_start: int  # where its KV was encoded
    start: int  # where it is served
    module_offset: int  # index of its first token in the module's KV
    scaffold: str | None  # served from this scaffold's KV; None: from the module's own

    @property
    def shift(self) -> int:
        """Positions to rotate the cached keys by (0 when served where encoded)."""
        return self.start - self.schema_start


@dataclass(frozen=True)
class ArgumentSegment(_Placed):
    """An argument, computed at serve time on its param's reserved positions."""

    cached: ClassVar[bool] = False
    path: ModulePath
    param: str
    text: str
    token_ids: tuple[int, ...]
    start: int
    reserved: int  # the param's len; token_ids never exceed it


@dataclass(frozen=True)
class TextSegment(_Placed):
    """Uncached text (role frames of the prompt's own role tags included), computed."""

    cached: ClassVar[bool] = False
    text: str
    token_ids: tuple[int, ...]
    start: int


Segment = ModuleSegment | ArgumentSegment | TextSegment


@dataclass(frozen=True)
class PromptLayout:
    schema_digest: bytes
    segments: tuple[Segment, ...]  # in serving order
    modules: tuple[ModulePath, ...]  # imported modules in serving order, the root () first
    scaffold: str | None  # the scaffold whose KV serves its modules (and the root)
    next_position: int  # the first position after everything served: where generation continues

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(t for segment in self.segments for t in segment.token_ids)

    @property
    def positions(self) -> tuple[int, ...]:
        return tuple(p for segment in self.segments for p in segment.positions)

    @property
    def cached_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.cached)

    @property
    def computed_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if not s.cached)


def layout_prompt(
    schema_layout: SchemaLayout,
    prompt: Prompt,
    tokenize: Tokenize,
    render_role: RenderRole = plain_roles,
    *,
    compact: bool = False,
) -> PromptLayout:
    """`compact`: every segment at the cursor (no gap: omitted modules, union members
    shorter than their union and short arguments take no position), so the prompt has the
    positions of its tokens prefilled whole; pieces away from their schema position are
    re-positioned as in the default layout."""
    check_prompt(prompt, schema_layout.schema)
    imported = set(_imported_paths(prompt.children, ROOT))
    scaffold = choose_scaffold(schema_layout.schema, imported)
    server = _Server(
        schema_layout, tokenize, role_frames(render_role), scaffold.modules if scaffold else (), compact
    )
    scaffold_name = scaffold.name if scaffold else None
    server.serve(ROOT, prompt.children, {}, prompt.line, scaffold_name)
    return PromptLayout(
        schema_layout.digest, tuple(server.segments), tuple(server.modules), scaffold_name, server.cursor
    )


def _imported_paths(nodes: tuple[PromptNode, ...], path: ModulePath) -> Iterator[ModulePath]:
    for imp in imports_in(nodes):
        yield (*path, imp.name)
        yield from _imported_paths(imp.children, (*path, imp.name))


class _Server:
    """Walks a prompt, keeping `cursor`: the first position after everything served so far."""

    def __init__(
        self,
        layout: SchemaLayout,
        tokenize: Tokenize,
        frames: RoleFrames,
        scaffolded: tuple[ModulePath, ...],
        compact: bool,
    ) -> None:
        self._layout = layout
        self._compact = compact
        self._tokenize = tokenize
        self._frames = frames
        self._scaffolded = {ROOT, *scaffolded}
        self.cursor = 0
        self.segments: list[Segment] = []
        self.modules: list[ModulePath] = []

    def serve(
        self,
        path: ModulePath,
        nodes: tuple[PromptNode, ...],
        arguments: dict[str, str],
        line: int,
        scaffold: str | None,
    ) -> None:
        """One import: the module's items in schema order, its child imports at their slots,
        the prompt's text after the items before the next import (after all, if none follows)."""
        module = self._layout.module(path)
        self.modules.append(path)
        scaffold_here = scaffold if path in self._scaffolded else None
        slot_of = {
            n: i for i, item in enumerate(module.items) if isinstance(item, SlotLayout) for n in item.names
        }
        served = 0  # items before this index are served (or skipped, for slots)

        def serve_items_until(index: int) -> None:
            nonlocal served
            for item in module.items[served:index]:
                if isinstance(item, PieceLayout):
                    self._piece(path, item, scaffold_here)
                elif isinstance(item, ParamLayout):
                    self._argument(path, item, arguments[item.name], line)
            served = max(served, index)

        events = list(self._events(nodes))
        for i, event in enumerate(events):
            if isinstance(event, Import):
                serve_items_until(slot_of[event.name])
                served = max(served, slot_of[event.name] + 1)
                self.serve((*path, event.name), event.children, event.argument_map(), event.line, scaffold)
                continue
            following = next((e for e in events[i + 1 :] if isinstance(e, Import)), None)
            serve_items_until(slot_of[following.name] if following else len(module.items))
            self._text(event)
        serve_items_until(len(module.items))

    def _events(self, nodes: tuple[PromptNode, ...]) -> Iterator[str | Import]:
        """Imports, and text with the prompt's role frames, adjacent texts merged."""
        pending: list[str] = []
        for node in self._flat(nodes):
            if isinstance(node, str):
                pending.append(node)
                continue
            if "".join(pending):
                yield "".join(pending)
            pending.clear()
            yield node
        if "".join(pending):
            yield "".join(pending)

    def _flat(self, nodes: tuple[PromptNode, ...]) -> Iterator[str | Import]:
        for node in nodes:
            if isinstance(node, Text):
                yield node.text
            elif isinstance(node, PromptRole):
                yield self._frames[node.role].prefix
                yield from self._flat(node.children)
                yield self._frames[node.role].suffix
            else:
                yield node

    def _piece(self, path: ModulePath, piece: PieceLayout, scaffold: str | None) -> None:
        start = self._place(piece.start)
        self.segments.append(
            ModuleSegment(path, piece.index, piece.token_ids, piece.start, start, piece.offset, scaffold)
        )
        self.cursor = start + len(piece.token_ids)

    def _argument(self, path: ModulePath, param: ParamLayout, text: str, line: int) -> None:
        ids = tuple(self._tokenize(text))
        if len(ids) > param.len:
            raise ArgumentTooLong(
                line,
                f"<{path[-1]}>",
                f"argument {param.name!r} is {len(ids)} tokens, over its len={param.len}",
            )
        if ids:
            start = self._place(param.start)
            self.segments.append(ArgumentSegment(path, param.name, text, ids, start, param.len))
            self.cursor = start + len(ids)

    def _place(self, schema_start: int) -> int:
        """Where schema content is served: at its schema position unless the cursor passed
        it (or the layout is compact)."""
        return self.cursor if self._compact else max(schema_start, self.cursor)

    def _text(self, text: str) -> None:
        ids = tuple(self._tokenize(text))
        if ids:
            self.segments.append(TextSegment(text, ids, self.cursor))
            self.cursor += len(ids)
