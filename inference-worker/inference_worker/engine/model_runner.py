"""One batched forward pass over many sequences with paged KV, using the model's own
weights (Llama, Qwen2, Mistral: pre-norm decoder layers with rotate-half RoPE).

The batch is flattened (no padding): every sequence contributes the tokens it runs this
step (a prefill chunk, or its one decode token) as rows of one [tokens, hidden] tensor, so
the linear layers and MLPs run once for the whole batch; only attention is per sequence
(over its block table, attention.py): on a CPU every decode token of a layer in one call of
the decode kernel (decode_kernel.py), which reads the blocks in place (on a GPU one batched
torch call, decode_batched.py), and every prefill
chunk of fp32 pools in one call of the prefill kernel (prefill_kernel.py); the rest, and
whatever the kernels do not run, one SDPA call per sequence, with the blocks it reads
gathered once per layer for all sequences. Logits are computed for each sequence's
last row only. From 3 to 32 fp32 CPU rows (a 16-sequence decode step, a short question),
what a layer does around attention runs in C, one call and one parallel region between two
layers' attentions (layer_blocks.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from inference_worker.cpu_linear import FusedProjection, linear_plus
from inference_worker.dist_attention.partial import Partial
from inference_worker.engine.attention import (
    DecodeTables,
    PagedKV,
    SequenceSlice,
    paged_attention,
    slot_run,
    slots_of,
)
from inference_worker.engine.decode_batched import BatchedDecode
from inference_worker.engine.decode_kernel import DecodeAttention, load_paged_decode
from inference_worker.engine.far_kv import KERNEL_MAX_ROWS as FAR_KERNEL_MAX_ROWS
from inference_worker.engine.far_kv import FarKVLost, FarRows, attend_far
from inference_worker.engine.layer_blocks import AttentionPool, LayerBlocks, LayerWeights, load_layer_blocks
from inference_worker.engine.prefill_kernel import (
    KeySpan,
    PagedPrefillKernel,
    PrefillTables,
    load_paged_prefill,
)
from inference_worker.engine.prefix_in_place import (
    InPlacePrefix,
    SpanPrefix,
    attend_in_place,
    attends_in_place,
)
from inference_worker.engine.row_kernels import SILU_ACTIVATIONS, RowKernels, load_row_kernels, torch_rope
from inference_worker.engine.sequence import Sequence
from inference_worker.kernels import KernelChoice
from inference_worker.layerwise_cache import PrefixKV, PrefixLoadFailed
from inference_worker.model_geometry import ModelGeometry

SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})


class UnsupportedModel(ValueError):
    """The paged runner cannot run this model; the message says why."""


class SequenceFarLost(Exception):
    """Part of `seq`'s far KV (`Sequence.far`) is lost (FarKVLost as the cause): the forward
    pass was abandoned; its owner must place that KV again."""

    def __init__(self, seq: Sequence) -> None:
        super().__init__(f"sequence {seq.seq_id}: part of its far KV is lost")
        self.seq = seq


class SequencePrefixFailed(Exception):
    """The stored KV of `seq` did not arrive (PrefixLoadFailed as the cause): the forward
    pass was abandoned; `seq` must recompute that part."""

    def __init__(self, seq: Sequence) -> None:
        super().__init__(f"sequence {seq.seq_id}: its stored KV did not arrive")
        self.seq = seq


@dataclass(frozen=True)
class Work:
    """What one sequence runs in a step: its next `tokens` pending tokens."""

    seq: Sequence
    tokens: int


@dataclass
class Batch:
    """A step's inputs, flattened over its sequences."""

    input_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens]
    slots: torch.Tensor  # [tokens]: where each token's K and V go in the pool
    slices: list[SequenceSlice]
    gathered: torch.Tensor | None  # the blocks gathered for the slices without a run of their own
    decode: DecodeTables | None  # the decode tokens the kernel attends for (slices marked `kernel`)
    prefill: PrefillTables | None  # the prefill chunks the prefill kernel attends for (also `kernel`)
    last_rows: torch.Tensor  # [sequences]: the row of each sequence's last token
    prefixes: list[tuple[Sequence, PrefixKV, torch.Tensor | slice]]  # stored KV to write first, its slots
    seqs: list[Sequence] = field(default_factory=list)  # the sequence of each slice
    far: list[FarRows] = field(default_factory=list)  # the slices of sequences with far KV
    far_decode: DecodeTables | None = None  # the far rows the kernel attends, with log-sum-exp
    in_place: list[InPlacePrefix] = field(default_factory=list)  # stored KV attended where it was read


# (layer, its input hidden states [tokens, hidden], the batch): restore/capture.py saves them
LayerInputHook = Callable[[int, torch.Tensor, Batch], None]
DEFAULT_LAYER_TIMEOUT_SECONDS = 2.0  # the worker setting layer_timeout_seconds defaults to this


class PagedModelRunner:
    def __init__(
        self,
        model: PreTrainedModel,
        kv: PagedKV,
        *,
        layer_timeout_seconds: float = DEFAULT_LAYER_TIMEOUT_SECONDS,
        decode_kernel: bool = True,
        prefill_kernel: bool = True,
        row_kernels: bool = True,
        layer_blocks: bool = True,
    ) -> None:
        """`layer_timeout_seconds`: the longest wait for one layer of a sequence's stored KV.
        `decode_kernel`: decode tokens through the C kernel where it loads and runs the
        pool's device and dtype, on a GPU through one batched torch call a layer
        (decode_batched.py); False: torch's gather + SDPA per sequence, as without a compiler.
        `prefill_kernel`: prefill chunks through the C kernel likewise (False: SDPA).
        `row_kernels`: RMSNorm and RoPE of fp32 CPU rows in C where it loads (row_kernels.py).
        `layer_blocks`: each layer's blocks around attention in one C call each, at the rows
        where its linears run the panel kernel (layer_blocks.py; False: a call per op)."""
        config = model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(f"model type {config.model_type!r} has no paged forward")
        self.model = model
        self.kv = kv
        self.geometry = ModelGeometry.of(config)
        self.device = next(model.parameters()).device
        decoder = model.model
        self.layer_timeout_seconds = layer_timeout_seconds
        self.windows = [sliding_window(config, layer.self_attn) for layer in decoder.layers]
        self.layer_input_hook: LayerInputHook | None = None  # set while hidden states are captured
        kernel, self.decode_choice = (
            load_paged_decode() if decode_kernel else (None, KernelChoice("torch", "decode_kernel=False"))
        )
        if kernel is not None and not kernel.supports(kv.k.dtype, kv.k.device):
            kernel = None
            self.decode_choice = KernelChoice("torch", f"no decode kernel for {kv.k.dtype} on {kv.k.device}")
        self.decode_kernel: DecodeAttention | None = kernel
        if kernel is None and decode_kernel and BatchedDecode.supports(kv.k.dtype, kv.k.device):
            self.decode_kernel = BatchedDecode()
            self.decode_choice = KernelChoice(
                "torch-batched", f"all decode rows in one batch on {kv.k.device}"
            )
        self.prefill_kernel: PagedPrefillKernel | None
        self.prefill_kernel, self.prefill_choice = (
            load_paged_prefill() if prefill_kernel else (None, KernelChoice("torch", "prefill_kernel=False"))
        )
        if self.prefill_kernel is not None and not PagedPrefillKernel.supports(kv.k.dtype, kv.k.device):
            self.prefill_kernel = None
            self.prefill_choice = KernelChoice(
                "torch", f"no prefill kernel for {kv.k.dtype} on {kv.k.device}"
            )
        self.row_kernels: RowKernels | None
        self.row_choice: KernelChoice
        self.row_kernels, self.row_choice = (
            load_row_kernels() if row_kernels else (None, KernelChoice("torch", "row_kernels=False"))
        )
        weights = decoder.norm.weight  # the rows they norm and rotate have its dtype and device
        if self.row_kernels is not None and not RowKernels.supports(weights):
            self.row_kernels = None
            self.row_choice = KernelChoice("torch", f"no row kernels for {weights.dtype} on {weights.device}")
        self._pool_in_c = RowKernels.supports(kv.k)  # K and V written with RoPE's call (`_rope_write`)
        self.layer_blocks: LayerBlocks | None
        self.layer_blocks, self.layer_blocks_choice = (
            load_layer_blocks() if layer_blocks else (None, KernelChoice("torch", "layer_blocks=False"))
        )
        # each layer's, None for one the blocks do not run (its linears without panels)
        self.layer_weights = [LayerWeights.of(layer, self.geometry) for layer in decoder.layers]
        if self.layer_blocks is not None and not (self._pool_in_c and any(self.layer_weights)):
            self.layer_blocks = None
            self.layer_blocks_choice = KernelChoice(
                "torch", "the pool or the layers' linears are not fp32 panels"
            )

    def prepare(self, work: Seq[Work]) -> Batch:
        """The flattened inputs of `work` (each sequence's blocks already allocated)."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        slices: list[SequenceSlice] = []
        gathered: list[int] = []
        decodes: list[tuple[int, list[int], int]] = []  # the kernel's: row, block table, context tokens
        prefills: list[tuple[int, int, int, list[int]]] = []  # the prefill kernel's: row, new, start, table
        prefixes: list[tuple[Sequence, PrefixKV, torch.Tensor | slice]] = []
        far: list[FarRows] = []
        far_decodes: list[tuple[int, list[int], int]] = []  # as `decodes`, of far sequences
        in_place: list[InPlacePrefix] = []
        size = self.kv.block_tokens
        for item in work:
            seq, start = item.seq, item.seq.computed_tokens
            stop = start + item.tokens
            if stop > len(seq) or len(seq.block_table) * size < stop:
                raise ValueError(f"sequence {seq.seq_id}: tokens [{start}, {stop}) have no blocks or ids")
            rows = slice(len(ids), len(ids) + item.tokens)
            ids.extend(seq.token_ids[start:stop])
            positions.extend(seq.positions_of(start, stop))  # explicit ones: prompt modules
            table = seq.block_table[: -(-stop // size)]
            slots.extend(slots_of(table, size, start, stop))
            context_positions = None
            if seq.positions is not None:
                context_positions = torch.tensor(
                    seq.positions_of(0, stop), dtype=torch.long, device=self.device
                )
            part = SequenceSlice(rows, start, _block_run(table), context_positions, len(gathered) * size)
            if seq.far is not None:  # attended with its far partial (far_kv.py)
                part.far = True
                first = seq.positions_of(0, 1)[0]
                if self.decode_kernel is not None and item.tokens <= FAR_KERNEL_MAX_ROWS:
                    # its positions follow its slots: the kernel's case, with log-sum-exp, a
                    # prefill row as a decode row whose context ends at its own token
                    far.append(
                        FarRows(seq, seq.far, rows, None, range(first, first + stop), len(far_decodes))
                    )
                    far_decodes.extend((rows.start + i, table, start + i + 1) for i in range(item.tokens))
                else:
                    context_slots = torch.tensor(
                        slots_of(table, size, 0, stop), dtype=torch.long, device=self.device
                    )
                    far.append(FarRows(seq, seq.far, rows, context_slots, range(first, first + stop)))
            elif attends_in_place(seq, start, stop, self.windows, self.device):
                part.in_place = True
            elif self.decode_kernel is not None and part.is_decode:
                part.kernel = True
                decodes.append((rows.start, table, stop))
            elif self._prefills_in_kernel(part):
                part.kernel = True
                prefills.append((rows.start, item.tokens, start, table))
            elif part.blocks is None and self._reads_pool(part):
                gathered.extend(table)
            slices.append(part)
            if seq.prefix is not None:
                prefix_slots = slot_run(
                    slots_of(table, size, seq.prefix_skip, seq.prefix.prefix_tokens), self.device
                )
                if part.in_place:
                    spans = self.prefill_kernel is not None and isinstance(seq.prefix, SpanPrefix)
                    in_place.append(InPlacePrefix(seq, seq.prefix, rows, prefix_slots, by_spans=spans))
                else:
                    prefixes.append((seq, seq.prefix, prefix_slots))
        device = self.device
        return Batch(
            input_ids=torch.tensor(ids, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            slots=torch.tensor(slots, dtype=torch.long, device=device),
            slices=slices,
            gathered=torch.tensor(gathered, dtype=torch.long, device=device) if gathered else None,
            decode=DecodeTables.of(decodes, device) if decodes else None,
            prefill=PrefillTables.of(prefills, device) if prefills else None,
            last_rows=torch.tensor([part.rows.stop - 1 for part in slices], device=device),
            prefixes=prefixes,
            seqs=[item.seq for item in work],
            far=far,
            far_decode=DecodeTables.of(far_decodes, device) if far_decodes else None,
            in_place=in_place,
        )

    def _prefills_in_kernel(self, part: SequenceSlice) -> bool:
        """Whether the prefill kernel attends for `part`: a chunk of several tokens whose
        positions follow its slots, within every layer's window (the kernel has none)."""
        return (
            self.prefill_kernel is not None
            and part.new_tokens > 1
            and part.positions is None
            and all(w is None or part.context_tokens <= w for w in self.windows)
        )

    def _reads_pool(self, part: SequenceSlice) -> bool:
        """Whether some layer's attention reads `part`'s keys from the pool (paged_attention)."""
        return not part.self_contained or any(w is not None and part.new_tokens > w for w in self.windows)

    @torch.no_grad()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Writes the batch's K and V into the pool; the logits [sequences, vocab] (fp32)
        of each sequence's last token. A sequence's stored KV (`Sequence.prefix`) is written
        into its blocks layer by layer, each layer waited for only when the pass reaches it,
        so loading layer l+1 overlaps computing layer l (a module prompt's, when its computed
        tokens all follow it, is attended in place and copied after the step:
        prefix_in_place.py). Raises SequencePrefixFailed, SequenceFarLost."""
        with contextlib.ExitStack() as frozen:
            for part in batch.far:
                frozen.enter_context(part.far.frozen)  # no far KV moves during the step (DGFM)
            logits = self._forward(batch)
        for part in batch.in_place:  # copied into its blocks after the step's tokens are out
            self.kv.deferred.add(part)
        return logits

    def _forward(self, batch: Batch) -> torch.Tensor:
        decoder, geometry = self.model.model, self.geometry
        tokens = batch.input_ids.shape[0]
        hidden = decoder.embed_tokens(batch.input_ids)  # [tokens, hidden]
        rotary = rotary_of(decoder, hidden, batch.positions)
        blocks = self.layer_blocks if LayerBlocks.runs(hidden) else None
        # the layer's q, k, v where the blocks' call after the previous layer computed them
        qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        for index, layer in enumerate(decoder.layers):
            if self.layer_input_hook is not None:
                self.layer_input_hook(index, hidden, batch)
            attn = layer.self_attn
            weights = None if blocks is None else self.layer_weights[index]
            if qkv is not None:
                q, k, v = qkv
            elif blocks is not None and weights is not None:
                q, k, v = blocks.pre_attention(weights, hidden, self._attention_pool(index, batch, rotary))
            else:
                q, k, v = project(attn, self._norm(layer.input_layernorm, hidden), geometry)
                q, k = self._rope_write(index, batch.slots, q, k, v, rotary)
            for seq, prefix, slots in batch.prefixes:
                self._write_prefix(seq, prefix, index, slots)
            for part in batch.in_place:
                if part.by_spans:
                    part.spans = self._read_spans(part.seq, part.prefix, index)
                else:
                    part.layers.append(self._read_prefix(part.seq, part.prefix, index))
            far = [self._start_far(part, index, q, batch.positions, attn.scaling) for part in batch.far]
            out = paged_attention(
                q,
                k,
                v,
                self.kv,
                index,
                batch.slices,
                scale=attn.scaling,
                window=self.windows[index],
                gathered=batch.gathered,
            )  # [tokens, heads, D]
            if batch.decode is not None:
                self._decode(q, index, out, batch.decode, attn.scaling)
            if batch.prefill is not None:
                assert self.prefill_kernel is not None  # only then does `prepare` fill prefill tables
                self.prefill_kernel(
                    q, self.kv.k[index], self.kv.v[index], out, batch.prefill, scale=attn.scaling
                )
            lse = None
            if batch.far_decode is not None:  # far rows: with log-sum-exp, merged with their far partial
                lse = torch.empty(batch.far_decode.rows.shape[0], q.shape[1], device=q.device)
                self._decode(q, index, out, batch.far_decode, attn.scaling, lse)
            for part in batch.in_place:
                attend_in_place(q, k, v, part, attn.scaling, out, self.prefill_kernel)
            for part, partial in zip(batch.far, far, strict=True):
                with _far_lost_as(part.seq):
                    attend_far(q, self.kv.k[index], self.kv.v[index], part, partial, out,
                               scale=attn.scaling, window=self.windows[index], lse=lse)  # fmt: skip
            following = self.layer_weights[index + 1] if index + 1 < len(self.layer_weights) else None
            qkv = None
            if blocks is not None and weights is not None and following is not None:
                pool = self._attention_pool(index + 1, batch, rotary)
                hidden, qkv = blocks.between_layers(weights, out.reshape(tokens, -1), hidden, following, pool)
            elif blocks is not None and weights is not None:
                hidden = blocks.post_attention(weights, out.reshape(tokens, -1), hidden)
            else:
                hidden = linear_plus(attn.o_proj, out.reshape(tokens, -1), hidden)
                hidden = mlp(
                    layer.mlp, self._norm(layer.post_attention_layernorm, hidden), hidden, self.row_kernels
                )
        last = self._norm(decoder.norm, hidden[batch.last_rows])  # [sequences, hidden]
        return self.model.lm_head(last).float()  # [sequences, vocab]

    def _attention_pool(
        self, layer: int, batch: Batch, rotary: tuple[torch.Tensor, torch.Tensor]
    ) -> AttentionPool:
        return AttentionPool(self.kv.k[layer], self.kv.v[layer], batch.slots, rotary)

    def _norm(self, norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The layer's RMSNorm of rows x, in C where it runs them."""
        if self.row_kernels is None:
            return norm(x)
        return self.row_kernels.rms_norm(x, norm.weight, norm.variance_epsilon)

    def _rope_write(
        self,
        layer: int,
        slots: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k rotated, and k and v written into the layer's pool `slots`: one C call
        where the row kernels run the rows and the pool (a decode step at 16 sequences
        spent 2.7 ms in the two index_copy_ calls of `PagedKV.write`)."""
        cos, sin = rotary
        if self.row_kernels is not None and self._pool_in_c:
            return self.row_kernels.rope_into_pool(
                q, k, v, cos, sin, self.kv.k[layer], self.kv.v[layer], slots
            )
        q, k = (torch_rope if self.row_kernels is None else self.row_kernels.rope)(q, k, cos, sin)
        self.kv.write(layer, slots, k, v)
        return q, k

    def _decode(
        self,
        q: torch.Tensor,
        layer: int,
        out: torch.Tensor,
        decode: DecodeTables,
        scale: float,
        lse: torch.Tensor | None = None,
    ) -> None:
        """The kernel's decode rows of `out` (and their log-sum-exp into `lse`, when given)."""
        assert self.decode_kernel is not None  # only then does `prepare` fill decode tables
        self.decode_kernel(
            q, self.kv.k[layer], self.kv.v[layer], out, decode.rows, decode.tables, decode.lens,
            scale=scale, window=self.windows[layer], lse=lse,
        )  # fmt: skip

    def _start_far(
        self, part: FarRows, layer: int, q: torch.Tensor, positions: torch.Tensor, scale: float
    ) -> Callable[[], Partial]:
        """The far partial of the part's rows, started (remote calls in flight)."""
        with _far_lost_as(part.seq):
            return part.far.attend(
                layer, q[part.rows], positions[part.rows], scale=scale, window=self.windows[layer]
            )

    def _write_prefix(self, seq: Sequence, prefix: PrefixKV, layer: int, slots: torch.Tensor | slice) -> None:
        k, v = self._read_prefix(seq, prefix, layer)
        self.kv.write(layer, slots, k.transpose(0, 1), v.transpose(0, 1))

    def _read_prefix(self, seq: Sequence, prefix: PrefixKV, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [kv_heads, tokens, D] of the prefix's tokens the pool does not hold yet."""
        with _waiting(seq):
            k, v = prefix.wait_layer(layer, self.layer_timeout_seconds)  # [kv_heads, P, D]
        skip = seq.prefix_skip - prefix.start_tokens  # the prefix's first tokens the pool already had
        return k[:, skip:], v[:, skip:]

    def _read_spans(self, seq: Sequence, prefix: SpanPrefix, layer: int) -> list[KeySpan]:
        """The layer's spans of a prefix attended by spans (the whole prefix: no pool hit)."""
        with _waiting(seq):
            return prefix.spans(layer, self.layer_timeout_seconds)


@contextlib.contextmanager
def _waiting(seq: Sequence) -> Iterator[None]:
    """Counts the wait for `seq`'s stored KV; its failure as SequencePrefixFailed."""
    started = time.perf_counter()
    try:
        yield
    except PrefixLoadFailed as exc:
        raise SequencePrefixFailed(seq) from exc
    finally:
        seq.load_wait_seconds += time.perf_counter() - started


@contextlib.contextmanager
def _far_lost_as(seq: Sequence) -> Iterator[None]:
    try:
        yield
    except FarKVLost as exc:
        raise SequenceFarLost(seq) from exc


def rotary_of(
    decoder: torch.nn.Module, hidden: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [tokens, 1, D] of the rows' positions [tokens]."""
    cos, sin = decoder.rotary_emb(hidden, positions.unsqueeze(0))  # each [1, tokens, D]
    return cos[0].unsqueeze(1), sin[0].unsqueeze(1)


def project(
    attn: torch.nn.Module, x: torch.Tensor, geometry: ModelGeometry
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's q [tokens, heads, D], k, v [tokens, kv_heads, D] of the normed rows x
    (before the rotary embedding)."""
    tokens = x.shape[0]
    fused: FusedProjection | None = getattr(attn, "fused_qkv", None)
    q, k, v = fused(x) if fused is not None else (attn.q_proj(x), attn.k_proj(x), attn.v_proj(x))
    q = q.view(tokens, geometry.heads, geometry.head_dim)
    k = k.view(tokens, geometry.kv_heads, geometry.head_dim)
    v = v.view(tokens, geometry.kv_heads, geometry.head_dim)
    return q, k, v


def project_qkv(
    attn: torch.nn.Module, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], geometry: ModelGeometry
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`project`, the rotary embedding applied to q and k."""
    q, k, v = project(attn, x, geometry)
    q, k = torch_rope(q, k, *rotary)
    return q, k, v


def mlp(
    module: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor, row_kernels: RowKernels | None
) -> torch.Tensor:
    """residual + the layer's gated MLP (Llama, Qwen2, Mistral) of rows x [tokens, hidden];
    SiLU(gate) * up in one C pass and one parallel region where the row kernels run the rows
    (torch's silu then mul_: two of each; 300 rows of SmolLM2, one thread: 272 -> 178 us)."""
    fused: FusedProjection | None = getattr(module, "fused_gate_up", None)
    if fused is None:
        return residual + module(x)
    gate, up = fused(x)
    if row_kernels is not None and type(module.act_fn) in SILU_ACTIVATIONS and RowKernels.supports(gate):
        hidden = row_kernels.silu_mul(gate, up)
    else:
        hidden = module.act_fn(gate).mul_(up)  # in place: one [tokens, intermediate] allocation less
    return linear_plus(module.down_proj, hidden, residual)


def sliding_window(config: object, attn: object) -> int | None:
    """The layer's sliding window: Qwen2 names it per layer, Mistral in its config."""
    if getattr(config, "model_type", None) == "mistral":
        return getattr(config, "sliding_window", None)
    return getattr(attn, "sliding_window", None)


def _block_run(table: list[int]) -> slice | None:
    """The table as a run of consecutive pool blocks; None when it is not one."""
    if table and table[-1] - table[0] == len(table) - 1 and table == list(range(table[0], table[-1] + 1)):
        return slice(table[0], table[-1] + 1)
    return None
