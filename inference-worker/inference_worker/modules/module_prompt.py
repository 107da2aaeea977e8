"""A prompt served from module KV: the modules' stored KV goes into the sequence's first
blocks (re-positioned where a module is served at another offset than it was encoded at),
and only the rest is computed: the uncached text (and arguments), plus, with boundary
repair, some tokens of the modules (the first of each, or any chosen set: repair_selection.py).

    slots:      | module A KV | module B KV | ... | repaired + uncached tokens by position |
                 prefix (loaded, PrefixKV)          computed by the engine
    positions:  explicit per token (Sequence.positions): gaps where modules are omitted

Decisions:
- Attention follows positions, not slots (engine/attention.py): a computed token sees the
  keys at positions up to its own, whichever module holds them. A module encoded alone at
  position 0 followed by text is then exactly a full prefill, and a repaired token sees
  every module before it, as it would in a full prefill (CacheBlend's partial recompute).
- The token at the highest position is always computed: its logits start the decoding.
- Repair recomputes the first `repair_tokens` tokens of every module but the first one
  (nothing precedes it, so its KV is already what a full prefill computes): those of each
  piece that starts a module (offset 0); or, given `repaired`, exactly the tokens it names
  per piece (CacheBlend's selection by KV deviation, repair_selection.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from inference_worker.engine.prefill_kernel import KeySpan
from inference_worker.engine.row_kernels import RowKernels
from inference_worker.engine.sequence import Sequence as EngineSequence
from inference_worker.kv_saver import KV
from inference_worker.layerwise_cache import PrefixKV
from inference_worker.modules.module_kv import LayerFeed, ModuleKV, layout_namespace
from inference_worker.rotary_shift import PositionShiftUnsupported, RotaryShift, rotate_into


class ModuleLayoutError(ValueError):
    """A module prompt whose parts overlap or that has no token (INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class CachedPiece:
    """Tokens [offset, offset + tokens) of a module's KV, served with the first at `position`
    (the rest keep their distances: a module's own gaps move with it)."""

    module: ModuleKV
    offset: int
    tokens: int
    position: int
    # The KV of the piece's tokens in the first layers, computed over the whole prompt
    # (deviation repair's selection pass: exact, keys at the served positions); loaded
    # instead of the module's in those layers.
    exact_layers: KV = field(default=(), compare=False)

    @classmethod
    def whole(cls, module: ModuleKV, position: int) -> CachedPiece:
        return cls(module, 0, len(module), position)

    @property
    def delta(self) -> int:
        return self.position - self.module.positions[self.offset]

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.module.token_ids[self.offset : self.offset + self.tokens]

    @property
    def positions(self) -> list[int]:
        return [p + self.delta for p in self.module.positions[self.offset : self.offset + self.tokens]]


@dataclass(frozen=True)
class TextPart:
    """Uncached tokens (text, an argument) at their positions."""

    token_ids: tuple[int, ...]
    positions: tuple[int, ...]


@dataclass(frozen=True)
class ModulePrompt:
    pieces: tuple[CachedPiece, ...]
    text: tuple[TextPart, ...]
    # Recomputed tokens at the start of each piece that starts a module (the first piece
    # of the prompt excepted).
    repair_tokens: int = 0
    # Else, per piece, the indices (within the piece) of its recomputed tokens.
    repaired: tuple[tuple[int, ...], ...] | None = None
    # Without repair_tokens: the share of each such piece recomputed from its start (rounded
    # down: a budget is at most this share).
    repair_fraction: float = 0.0

    def repair_indices(self) -> tuple[tuple[int, ...], ...]:
        """Per piece, the indices of its tokens computed instead of loaded."""
        if self.repaired is not None:
            return self.repaired
        first = min((part.position for part in self.pieces), default=None)
        return tuple(
            tuple(range(0 if part.position == first or part.offset else self._first_repaired(part.tokens)))
            for part in self.pieces
        )

    def _first_repaired(self, tokens: int) -> int:
        if self.repair_tokens:
            return min(self.repair_tokens, tokens)
        return math.floor(self.repair_fraction * tokens)

    @property
    def module_tokens(self) -> int:
        return sum(piece.tokens for piece in self.pieces)

    @property
    def text_tokens(self) -> int:
        return sum(len(part.token_ids) for part in self.text)


@dataclass(frozen=True)
class CachedSpan:
    """Tokens [start, stop) of a served piece whose KV is loaded."""

    part: CachedPiece
    start: int
    stop: int

    @property
    def last_position(self) -> int:
        return self.part.positions[self.stop - 1]


@dataclass(frozen=True)
class ServedLayout:
    """A module prompt laid out for the engine: the cached spans' tokens, then the
    computed ones by position."""

    token_ids: list[int]
    positions: list[int]
    spans: list[CachedSpan]
    repaired_tokens: int  # module tokens computed instead of loaded (the last one excepted)

    @property
    def cached_tokens(self) -> int:
        return sum(span.stop - span.start for span in self.spans)

    @property
    def tokens_by_position(self) -> tuple[int, ...]:
        """The prompt's tokens in position order (what a full prefill of it runs)."""
        return tuple(token for _, token in sorted(zip(self.positions, self.token_ids, strict=True)))


def lay_out(prompt: ModulePrompt) -> ServedLayout:
    """Which tokens are loaded and which computed, in slot order. Raises ModuleLayoutError."""
    spans: list[CachedSpan] = []
    computed: list[tuple[int, int]] = []  # (token, position)
    repaired = 0
    chosen_per_piece = prompt.repair_indices()
    if len(chosen_per_piece) != len(prompt.pieces):
        raise ModuleLayoutError("repair names the tokens of another number of pieces than the prompt has")
    for part, chosen in zip(prompt.pieces, chosen_per_piece, strict=True):
        indices = sorted(set(chosen))
        if indices and (indices[0] < 0 or indices[-1] >= part.tokens):
            raise ModuleLayoutError(f"a repaired token index is outside its piece of {part.tokens} tokens")
        ids, places = part.token_ids, part.positions
        computed += [(ids[i], places[i]) for i in indices]
        spans += _cached_runs(part, indices)
        repaired += len(indices)
    for text in prompt.text:
        if len(text.token_ids) != len(text.positions):
            raise ModuleLayoutError("a text part needs one position per token")
        computed += zip(text.token_ids, text.positions, strict=True)
    positions = [p for span in spans for p in span.part.positions[span.start : span.stop]] + [
        p for _, p in computed
    ]
    if not positions:
        raise ModuleLayoutError("the prompt has no token")
    if len(set(positions)) != len(positions):
        raise ModuleLayoutError("two tokens of the prompt share a position (overlapping modules or text)")
    if min(positions) < 0:
        raise ModuleLayoutError("a module is served at a negative position")
    last = max(range(len(spans)), key=lambda i: spans[i].last_position, default=None)
    if last is not None and (not computed or spans[last].last_position > max(p for _, p in computed)):
        span = spans[last]  # the prompt ends inside a module: its last token is computed
        computed.append((span.part.token_ids[span.stop - 1], span.last_position))
        spans[last] = CachedSpan(span.part, span.start, span.stop - 1)
    spans = [span for span in spans if span.stop > span.start]
    computed.sort(key=lambda pair: pair[1])
    tokens = [t for span in spans for t in span.part.token_ids[span.start : span.stop]]
    places = [p for span in spans for p in span.part.positions[span.start : span.stop]]
    return ServedLayout(
        token_ids=tokens + [token for token, _ in computed],
        positions=places + [position for _, position in computed],
        spans=spans,
        repaired_tokens=repaired,
    )


def _cached_runs(part: CachedPiece, repaired: list[int]) -> list[CachedSpan]:
    """The runs of the piece's tokens not in `repaired` (sorted indices), in order."""
    runs, start = [], 0
    for index in [*repaired, part.tokens]:
        if index > start:
            runs.append(CachedSpan(part, start, index))
        start = index + 1
    return runs


def module_sequence(
    prompt: ModulePrompt,
    namespace: bytes,
    num_layers: int,
    shift: RotaryShift | None,
    device: torch.device,
    kernels: RowKernels | None = None,
) -> tuple[EngineSequence, ServedLayout]:
    """The engine sequence of a module prompt, its cached spans' KV in `seq.prefix` (keys
    re-positioned, layer by layer as the forward pass asks; by `kernels` where given: the
    runner's). Raises ModuleLayoutError, PositionShiftUnsupported."""
    layout = lay_out(prompt)
    seq = EngineSequence.of(
        layout.token_ids,
        layout_namespace(namespace, layout.positions, layout.cached_tokens),
        positions=layout.positions,
    )
    if layout.cached_tokens:
        seq.prefix = ModulePrefix(layout.spans, layout.cached_tokens, num_layers, shift, device, kernels)
    return seq, layout


class ModulePrefix(PrefixKV):
    """The cached spans' KV, assembled for each layer when the forward pass reaches it: each
    span's module layer (waited for while a stored module is still being read: layer-wise
    loading), keys re-positioned, in slot order [kv_heads, tokens, head_dim]; or, for the
    step's rows to attend them where they lie, the layer's spans with their rotations
    (`spans`, prefix_in_place.py: then joined only for the blocks, after the first token).
    Raises PrefixLoadFailed when a module's read failed or was late (the engine then computes
    the tokens). With `kernels` (the runner's), an fp32 span is copied into its joined layer
    and its keys re-positioned in one C pass (RowKernels.join_span), else by torch's ops."""

    def __init__(
        self,
        spans: Sequence[CachedSpan],
        tokens: int,
        num_layers: int,
        shift: RotaryShift | None,
        device: torch.device,
        kernels: RowKernels | None = None,
    ) -> None:
        if shift is None and any(span.part.delta for span in spans):
            raise PositionShiftUnsupported(
                "a module is served at another position and keys cannot be re-positioned"
            )
        super().__init__(num_layers, tokens)
        self.pieces, self.device, self._kernels = spans, device, kernels
        # Each moved span's rotation to its served position (cos, sin [head_dim]), computed
        # once a prompt; keys are rotated as they are copied into a joined layer (the kernel
        # attending the spans where they lie rotates the queries back by it instead).
        self._rotations = {
            delta: shift.cos_sin(delta, device)
            for delta in {span.part.delta for span in spans} - {0}
            if shift is not None
        }

    def wait_layer(self, layer: int, timeout_seconds: float) -> tuple[torch.Tensor, torch.Tensor]:
        """`timeout_seconds`: the longest wait for each module's layer still being read."""
        parts = self.spans(layer, timeout_seconds)
        if len(parts) == 1 and parts[0][2] is None:
            # A module served whole at its own position: its read's tensors, not a copy (188 MB at 4,096 tokens).
            return parts[0][0], parts[0][1]
        first = parts[0][0]
        shape = (first.shape[0], self.prefix_tokens, first.shape[2])
        keys, values = first.new_empty(shape), first.new_empty(shape)
        at = 0
        for k, v, rotation in parts:
            end = at + k.shape[1]
            into = keys[:, at:end], values[:, at:end]
            if self._kernels is not None and self._kernels.joins(k, v, *into):
                self._kernels.join_span(k, v, *into, rotation)
            else:
                if rotation is None:
                    into[0].copy_(k)
                else:
                    rotate_into(into[0], k, *rotation)
                into[1].copy_(v)
            at = end
        return keys, values

    def spans(self, layer: int, timeout_seconds: float) -> list[KeySpan]:
        """The layer's spans in slot order: K, V [kv_heads, span tokens, D] where the read put
        them (not re-positioned) and the rotation that re-positions the keys (None: none)."""
        parts = [self._span_layer(span, layer, timeout_seconds) for span in self.pieces]
        return [(k, v, self._rotations[delta] if delta else None) for k, v, delta in parts]

    def _span_layer(
        self, span: CachedSpan, layer: int, timeout_seconds: float
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The span's K, V [kv_heads, span tokens, D] in `layer` and the delta its keys
        still need (exact layers are at their served positions already)."""
        if layer < len(span.part.exact_layers):
            k, v = span.part.exact_layers[layer]  # [kv_heads, piece tokens, D], served positions
            first, last, delta = span.start, span.stop, 0
        else:
            kv = span.part.module.kv
            # [kv_heads, module tokens, D]
            k, v = kv.wait(layer, timeout_seconds) if isinstance(kv, LayerFeed) else kv[layer]
            first, last = span.part.offset + span.start, span.part.offset + span.stop
            delta = span.part.delta
        return k[:, first:last].to(self.device), v[:, first:last].to(self.device), delta
