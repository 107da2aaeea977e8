"""Schema positions, the core of Prompt Cache: every module is encoded at its absolute offset
in the schema. Text runs take their token count, a param reserves `len` positions, a child
module its whole length, and a union one start for all members and its longest member's
length; so omitted modules and short arguments leave gaps, which rotary positions tolerate."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from attnstore.prompt_modules.errors import UnknownModule
from attnstore.prompt_modules.identity import schema_digest
from attnstore.prompt_modules.names import ROOT, ModulePath, format_path
from attnstore.prompt_modules.nodes import Schema, SchemaNode
from attnstore.prompt_modules.roles import RenderRole, plain_roles, role_frames
from attnstore.prompt_modules.structure import Slot, TextRun, flatten

# text -> token ids, without special tokens (no BOS: the caller adds what its model needs).
Tokenize = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class PieceLayout:
    """A run of a module's own text (anonymous text and role frames), tokenized as one string."""

    index: int  # among the module's pieces
    text: str
    token_ids: tuple[int, ...]
    start: int  # absolute schema position of its first token
    offset: int  # index of its first token in the module's own token ids (its KV)

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class ParamLayout:
    name: str
    start: int
    len: int  # positions reserved; an argument may use fewer
    line: int


@dataclass(frozen=True)
class SlotLayout:
    """Child modules: one, or a union's members, all starting at `start`."""

    names: tuple[str, ...]
    union: bool
    start: int
    length: int  # the longest member's


LayoutItem = PieceLayout | ParamLayout | SlotLayout


@dataclass(frozen=True)
class ModuleLayout:
    path: ModulePath  # () for the schema root, whose pieces are the always-included text
    start: int
    length: int  # positions spanned, children and params included
    items: tuple[LayoutItem, ...]  # in schema order

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def pieces(self) -> tuple[PieceLayout, ...]:
        return tuple(item for item in self.items if isinstance(item, PieceLayout))

    @property
    def params(self) -> tuple[ParamLayout, ...]:
        return tuple(item for item in self.items if isinstance(item, ParamLayout))

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The module's own tokens, whose KV is cached: its pieces, concatenated."""
        return tuple(t for piece in self.pieces for t in piece.token_ids)

    @property
    def positions(self) -> tuple[int, ...]:
        """The schema position of each of `token_ids`: where the module's KV is encoded."""
        return tuple(p for piece in self.pieces for p in range(piece.start, piece.end))


@dataclass(frozen=True)
class SchemaLayout:
    schema: Schema
    digest: bytes  # schema_digest(schema)
    modules: Mapping[ModulePath, ModuleLayout]  # every module, the root () first, in document order

    @property
    def length(self) -> int:
        return self.modules[ROOT].length

    def module(self, path: ModulePath) -> ModuleLayout:
        if path not in self.modules:
            raise UnknownModule(0, f'<schema name="{self.schema.name}">', f"no module {format_path(path)!r}")
        return self.modules[path]

    def context_pieces(self, path: ModulePath) -> tuple[PieceLayout, ...]:
        """The pieces of the module's ancestors (the root's included) that precede it: a
        prompt importing the module always serves them before it, so the module is encoded
        with them in its attention span (they are not part of its KV)."""
        start = self.module(path).start
        return tuple(
            piece
            for depth in range(len(path))
            for piece in self.modules[path[:depth]].pieces
            if piece.start < start
        )

    def scaffold_pieces(self, name: str) -> tuple[tuple[ModulePath, PieceLayout], ...]:
        """What a scaffold encodes in one attention span, in position order: the root's pieces
        and those of its modules (params and omitted modules are gaps)."""
        scaffold = next((s for s in self.schema.scaffolds if s.name == name), None)
        if scaffold is None:
            raise UnknownModule(0, f'<schema name="{self.schema.name}">', f"no scaffold {name!r}")
        pieces = [(path, piece) for path in (ROOT, *scaffold.modules) for piece in self.modules[path].pieces]
        return tuple(sorted(pieces, key=lambda entry: entry[1].start))


def layout_schema(schema: Schema, tokenize: Tokenize, render_role: RenderRole = plain_roles) -> SchemaLayout:
    frames = role_frames(render_role)
    modules: dict[ModulePath, ModuleLayout] = {}

    def lay(path: ModulePath, children: tuple[SchemaNode, ...], start: int) -> int:
        modules[path] = ModuleLayout(path, start, 0, ())  # holds the document-order place
        items: list[LayoutItem] = []
        position, offset = start, 0
        for item in flatten(children, frames):
            if isinstance(item, TextRun):
                ids = tuple(tokenize(item.text))
                if ids:
                    index = sum(isinstance(done, PieceLayout) for done in items)
                    items.append(PieceLayout(index, item.text, ids, position, offset))
                    position, offset = position + len(ids), offset + len(ids)
            elif isinstance(item, Slot):
                length = max(lay((*path, m.name), m.children, position) for m in item.members)
                items.append(SlotLayout(item.names(), item.union, position, length))
                position += length
            else:
                items.append(ParamLayout(item.name, position, item.len, item.line))
                position += item.len
        modules[path] = ModuleLayout(path, start, position - start, tuple(items))
        return position - start

    lay(ROOT, schema.children, 0)
    return SchemaLayout(schema, schema_digest(schema), MappingProxyType(modules))
