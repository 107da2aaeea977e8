"""PML in the worker: a schema document and a prompt document become a `ModulePrompt`
(module KV pieces from the store, uncached text and arguments at their positions), and a
schema can be encoded ahead of use (eager encoding at registration).

Parsing and positions are the shared `attnstore.prompt_modules` package's; this file
supplies the model's tokenizer and chat template, and maps each served piece to the KV it
comes from: the module's own, or a scaffold's (the scaffold's pieces, concatenated in
position order, are one KV).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass

import blake3
import jinja2
from transformers import PreTrainedTokenizerBase

from attnstore.errors import FailedPrecondition
from attnstore.prompt_modules import (
    DEFAULT_LIMITS,
    ModulePath,
    ModuleSegment,
    PmlLimits,
    RenderRole,
    SchemaLayout,
    Tokenize,
    layout_prompt,
    layout_schema,
    messages_renderer,
    module_key,
    parse_prompt,
    parse_schema,
    plain_roles,
)
from inference_worker.modules.module_prompt import CachedPiece, ModulePrompt, TextPart
from inference_worker.modules.module_store import ModuleSpec, ModuleStore, Origin
from inference_worker.turn_types import KVSource

MAX_CACHED_SCHEMAS = 64  # parsed and laid-out schemas kept (parsing is cheap; tokenizing is not free)


@dataclass(frozen=True)
class ServedPrompt:
    prompt: ModulePrompt
    stored_modules: int  # module KVs read from the daemon
    encoded_modules: int  # module KVs computed for this prompt (first use, or evicted)


@dataclass(frozen=True)
class EncodeProgress:
    done: int
    total: int
    path: str  # the module (or "scaffold:<name>") just done
    origin: Origin
    namespace: bytes  # where its KV's chunks are (the tenant's, or its module format's: ModuleStore)
    chunk_keys: tuple[bytes, ...]  # its KV's chunks in the store


_KVId = tuple[ModulePath, str | None]  # a module alone, or a scaffold's KV (path ())


class PmlServer:
    def __init__(
        self,
        store: ModuleStore,
        tokenize: Tokenize,
        render_role: RenderRole,
        generation_prompt: str | Exception,
        limits: PmlLimits = DEFAULT_LIMITS,
        compact_positions: bool = False,
    ) -> None:
        """`generation_prompt`: the chat template's opening of an answer, appended to prompts
        that ask for it; the template's error when it cannot render one. `compact_positions`:
        prompts are laid out without gaps (`layout_prompt(compact=True)`)."""
        self.compact_positions = compact_positions
        self._generation_prompt = generation_prompt
        self.generation_prompt = (
            tuple(tokenize(generation_prompt))
            if isinstance(generation_prompt, str) and generation_prompt
            else ()
        )
        self.store = store
        self.tokenize = tokenize
        self.render_role = render_role
        self.limits = limits
        self._layouts: OrderedDict[bytes, SchemaLayout] = OrderedDict()

    def schema(self, document: str) -> SchemaLayout:
        """The schema parsed and laid out (cached). Raises PmlError."""
        digest = blake3.blake3(document.encode()).digest()
        if digest in self._layouts:
            self._layouts.move_to_end(digest)
            return self._layouts[digest]
        layout = layout_schema(parse_schema(document, self.limits), self.tokenize, self.render_role)
        self._layouts[digest] = layout
        while len(self._layouts) > MAX_CACHED_SCHEMAS:
            self._layouts.popitem(last=False)
        return layout

    async def serve(
        self,
        source: KVSource,
        schema_document: str,
        prompt_document: str,
        repair_tokens: int,
        add_generation_prompt: bool = False,
        repair_fraction: float = 0.0,
    ) -> ServedPrompt:
        """The prompt's module KV pieces (read or encoded) and computed text. Raises PmlError."""
        layout = self.schema(schema_document)
        served = layout_prompt(
            layout,
            parse_prompt(prompt_document, self.limits),
            self.tokenize,
            self.render_role,
            compact=self.compact_positions,
        )
        modules = [segment for segment in served.segments if isinstance(segment, ModuleSegment)]
        ids = list(dict.fromkeys(self._kv_id(segment) for segment in modules))
        # Looked up (and read or encoded) all at once: one after the other, four lookups
        # made a 3-document prompt's turn wait 20-30 ms before its forward pass (load 5).
        found = await self.store.get_all(source, [self._spec(source, layout, *i) for i in ids])
        kvs = dict(zip(ids, found, strict=True))
        pieces: list[CachedPiece] = []
        text: list[TextPart] = []
        for segment in served.segments:
            if not isinstance(segment, ModuleSegment):
                text.append(TextPart(segment.token_ids, tuple(segment.positions)))
                continue
            kv_id = self._kv_id(segment)
            offset = self._offset(layout, segment)
            pieces.append(CachedPiece(kvs[kv_id][0], offset, len(segment.token_ids), segment.start))
        if add_generation_prompt and isinstance(self._generation_prompt, Exception):
            raise FailedPrecondition(
                f"the model's chat template cannot open an answer: {self._generation_prompt}"
            ) from self._generation_prompt
        if add_generation_prompt and self.generation_prompt:
            after = served.next_position
            text.append(
                TextPart(self.generation_prompt, tuple(range(after, after + len(self.generation_prompt))))
            )
        origins = [origin for _, origin in kvs.values()]
        return ServedPrompt(
            ModulePrompt(tuple(pieces), tuple(text), repair_tokens, repair_fraction=repair_fraction),
            stored_modules=origins.count(Origin.STORED),
            encoded_modules=origins.count(Origin.ENCODED),
        )

    async def encode(self, source: KVSource, schema_document: str) -> AsyncIterator[EncodeProgress]:
        """Makes every module's KV (and every scaffold's) stored: found (not read), else
        encoded and saved; one progress report per module."""
        layout = self.schema(schema_document)
        ids: list[_KVId] = [(path, None) for path, module in layout.modules.items() if module.token_ids]
        ids += [((), scaffold.name) for scaffold in layout.schema.scaffolds]
        for done, kv_id in enumerate(ids, start=1):
            spec = self._spec(source, layout, *kv_id)
            origin = await self.store.ensure(source, spec)
            name = f"scaffold:{kv_id[1]}" if kv_id[1] else ".".join(kv_id[0]) or "(root)"
            keys = tuple(self.store.chunk_keys(source, spec))
            yield EncodeProgress(
                done, len(ids), name, origin, self.store.stored_source(source).namespace, keys
            )

    def chunk_keys(self, source: KVSource, schema_document: str) -> list[bytes]:
        """The store keys of the chunks of every module's KV of a schema (tests, tools)."""
        layout = self.schema(schema_document)
        specs = [
            self._spec(source, layout, path, None)
            for path, module in layout.modules.items()
            if module.token_ids
        ]
        return [key for spec in specs for key in self.store.chunk_keys(source, spec)]

    @staticmethod
    def _spec(source: KVSource, layout: SchemaLayout, path: ModulePath, scaffold: str | None) -> ModuleSpec:
        key = module_key(source.namespace, layout.digest, path, scaffold=scaffold)
        if scaffold is None:
            module, context = layout.module(path), layout.context_pieces(path)
            return ModuleSpec(
                key,
                module.token_ids,
                module.positions,
                tuple(t for piece in context for t in piece.token_ids),
                tuple(p for piece in context for p in range(piece.start, piece.end)),
            )
        pieces = [piece for _, piece in layout.scaffold_pieces(scaffold)]
        return ModuleSpec(
            key,
            tuple(t for piece in pieces for t in piece.token_ids),
            tuple(p for piece in pieces for p in range(piece.start, piece.end)),
        )

    @staticmethod
    def _kv_id(segment: ModuleSegment) -> _KVId:
        return ((), segment.scaffold) if segment.scaffold else (segment.path, None)

    @staticmethod
    def _offset(layout: SchemaLayout, segment: ModuleSegment) -> int:
        """Index of the segment's first token in the KV it is served from."""
        if segment.scaffold is None:
            return segment.module_offset
        offset = 0
        for path, piece in layout.scaffold_pieces(segment.scaffold):
            if path == segment.path and piece.index == segment.piece:
                return offset
            offset += len(piece.token_ids)
        raise ValueError(f"piece {segment.piece} of {segment.path} is not in scaffold {segment.scaffold!r}")


def model_tokenize(tokenizer: PreTrainedTokenizerBase) -> Tokenize:
    """Text to ids without special tokens (module pieces are parts of one prompt)."""
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_role_renderer(tokenizer: PreTrainedTokenizerBase) -> RenderRole:
    """Role tags through the model's chat template (none: role tags add nothing)."""
    if not getattr(tokenizer, "chat_template", None):
        return plain_roles
    return messages_renderer(lambda messages: str(tokenizer.apply_chat_template(messages, tokenize=False)))


def generation_prompt(tokenizer: PreTrainedTokenizerBase) -> str | Exception:
    """What the chat template writes to open the assistant's answer ("" without a template);
    the template's error when it fails, so such a model still starts and serves the rest."""
    if not getattr(tokenizer, "chat_template", None):
        return ""
    anchor = [{"role": "system", "content": ""}]
    try:
        before = str(tokenizer.apply_chat_template(anchor, tokenize=False))
        after = str(tokenizer.apply_chat_template(anchor, tokenize=False, add_generation_prompt=True))
    except jinja2.TemplateError as exc:  # a broken template, or one that raises on these messages
        return exc
    return after.removeprefix(before)
