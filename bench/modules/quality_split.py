"""Where the perplexity gap of prompts served from modules comes from (issue 23): each
prompt of bench-modules' quality workloads (document QA, code, personalization, travel),
laid out compact (the worker's default), is served from module KV altered one way at a
time, and its delta to the full prefill is measured, as bench-modules does
(|ppl / ppl_full - 1|, teacher-forced reference), with the mean KL divergence from the full
prefill's next-token distributions over the reference (less swung by single tokens).

    python -m bench.modules.quality_split [--quick] [--only doc_qa,code]

Variants (the name in the table):
- `served`: as served (modules encoded apart at schema positions after their context).
- (a) `positions`: each module encoded again, apart, after its context, at the positions
  the prompt serves it at (context included): what remains is not the positions.
- (c) `no_context`: each module encoded alone at its served positions, without the text
  before it (every module starts a sequence of its own: the attention-sink effect that the
  context removes).
- (b) cross-attention: `exact_L`: the full prefill's KV for every module token in layers
  < L, the module's beyond; `band_A_B`: the full prefill's in layers [A, B) only;
  `exact_last`: the last module of the prompt exact in every layer (the one before the
  question), the others as served. `exact_30` is the full prefill (a check of the method).
- repair curve: `first` and the SELECTIONS below (`--selections`) at `--fractions` of
  each module but the first: `deviation` (values at layer 2 after two exact layers: the
  worker's default), `cacheblend` (keys at layer 1 after one exact layer, as CacheBlend's
  code selects), deeper layers, CacheBlend's gradual filtering, and oracles (deviation in
  the late or every layer; not servable: they need the full prefill).

Results: a table, bench/results/<results>.json, the JSON summary (mean delta per variant)
last. Quality is not timed, but the run is long: run it under the bench lock.
"""

from __future__ import annotations

import inference_worker.openmp_waiting  # noqa: F401  # isort: skip  -- before torch: as bench-modules

import argparse
import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from bench.common.results import print_report, save_results, work_dir
from bench.modules.measure import CaseRunner, perplexity
from bench.modules.run import SEED, quality_workloads, serving
from bench.modules.workload import Case
from inference_worker.engine.model_runner import project_qkv, rotary_of
from inference_worker.kv_saver import KV
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import default_model_dir, load_model
from inference_worker.modules.module_kv import ModuleKV, encode_module
from inference_worker.modules.module_prompt import CachedPiece, ModulePrompt, lay_out
from inference_worker.modules.repair_selection import eligible_pieces, largest
from inference_worker.restore.hidden_states import recompute_layers
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource

REPAIR_FRACTIONS = (0.05, 0.10, 0.15, 0.25, 0.50)
# Layer choices for the default model, SmolLM2-135M-Instruct (30 layers; checked at start).
MODEL_LAYERS = 30
EXACT_LAYERS = (2, 8, 15, 22, 30)
BANDS = ((0, 10), (10, 20), (20, 30))


@dataclass(frozen=True)
class Selection:
    """Which module tokens a repair budget recomputes: the largest deviation of K (0) or V
    (1) from the full prefill's in `compared` layers (each normalised by its mean when
    several), with the first `exact` layers loaded from the full prefill for every token
    (what the selection pass computes in full). `weighted`: the deviation times the share of
    attention the prompt's computed text gives the token at layer `exact` (the question
    asks which tokens it reads). `narrowed`: first keep `narrowed` times the
    budget by V at layer 2, then choose among those (CacheBlend's gradual filtering; here
    scored with the full prefill's values, an upper bound of what the filter's recompute
    would see)."""

    which: int
    compared: tuple[int, ...]
    exact: int
    narrowed: int = 0
    weighted: bool = False  # times the attention the uncached text pays the token at layer `exact`


LATE = tuple(range(MODEL_LAYERS // 2, MODEL_LAYERS))
SELECTIONS: dict[str, Selection] = {
    "deviation": Selection(1, (2,), 2),  # the worker's
    "cacheblend": Selection(0, (1,), 1),  # CacheBlend's code: keys at its check layer 1
    "deviation-l4": Selection(1, (4,), 4),
    "deviation-l8": Selection(1, (8,), 8),
    "narrowed-l8": Selection(1, (8,), 2, narrowed=2),
    "narrowed-late": Selection(1, LATE, 2, narrowed=2),
    "attended": Selection(1, (2,), 2, weighted=True),
    "attended-l4": Selection(1, (4,), 4, weighted=True),
    "oracle-late": Selection(1, LATE, 2),  # not servable: needs the full prefill's late layers
    "oracle": Selection(1, tuple(range(1, MODEL_LAYERS)), 2),  # not servable
}

Exact = Callable[[int, int], bool]  # (piece index, layer) -> the full prefill's KV there


class Split:
    """The variants of one case's compact prompt, each measured against the full prefill."""

    def __init__(
        self, runner: CaseRunner, engine: TurnEngine, source: KVSource, args: argparse.Namespace
    ) -> None:
        self.runner, self.engine, self.source, self.args = runner, engine, source, args
        self.model = engine.loaded.model
        self.layers = self.model.config.num_hidden_layers
        if self.layers != MODEL_LAYERS:
            raise SystemExit(
                f"the variants' layers are chosen for {MODEL_LAYERS} layers; this model has {self.layers}"
            )

    async def run(self, case: Case) -> dict[str, Any]:
        server = self.engine.modules.server
        async for _ in server.encode(self.source, case.schema):
            pass
        await server.store.drain()
        server.compact_positions = True
        prompt = (await server.serve(self.source, case.schema, case.prompt, 0)).prompt
        # The module KV as plain tensors (a stored module's read fills them from another task).
        pieces = await asyncio.to_thread(lambda: tuple(_materialized(p) for p in prompt.pieces))
        prompt = replace(prompt, pieces=pieces)
        full_ids = list(lay_out(prompt).tokens_by_position)
        if max(lay_out(prompt).positions) != len(full_ids) - 1:
            raise RuntimeError(f"{case.label}: a compact prompt has positions 0..{len(full_ids) - 1}")
        reference = self.runner.tokenizer.encode(case.reference, add_special_tokens=False)[
            : self.runner.continuation_tokens
        ]
        self.reference = reference
        self.full = self.runner.full_logits(full_ids, reference)
        self.full_ids = full_ids
        with torch.no_grad():
            ids = torch.tensor(full_ids)
            self.full_kv, _ = recompute_layers(self.model, ids, torch.arange(len(full_ids)), self.layers)
        self.ppl_full = perplexity(self.full, reference)
        row: dict[str, Any] = {"workload": case.workload, "label": case.label, "ppl_full": self.ppl_full}
        row["module_tokens"] = prompt.module_tokens
        row["prompt_tokens"] = len(full_ids)
        variants: dict[str, ModulePrompt] = {"served": prompt}
        if not self.args.curve_only:
            await self._split(case, prompt, variants)
        for name, variant in variants.items():
            row[name] = await self._measure(variant)
        repairable = sum(len(chosen) for chosen in replace(prompt, repair_fraction=1.0).repair_indices())
        row["repairable_tokens"] = repairable
        if repairable:
            for fraction in self.args.fractions:
                first = replace(prompt, repair_fraction=fraction)
                budget = sum(len(chosen) for chosen in first.repair_indices())
                for name in self.args.selections:
                    selected = first if name == "first" else self._selected(prompt, name, budget)
                    row[f"{name}@{fraction}"] = await self._measure(selected) | {"repaired": budget}
        return row

    async def _split(self, case: Case, prompt: ModulePrompt, variants: dict[str, ModulePrompt]) -> None:
        variants["positions"] = await self._reencoded(case, prompt, with_context=True)
        variants["no_context"] = await self._reencoded(case, prompt, with_context=False)
        for count in EXACT_LAYERS:
            variants[f"exact_{count}"] = self._hybrid(prompt, lambda _, layer, c=count: layer < c)
        for low, high in BANDS:
            variants[f"band_{low}_{high}"] = self._hybrid(
                prompt, lambda _, layer, a=low, b=high: a <= layer < b
            )
        last = max(range(len(prompt.pieces)), key=lambda i: prompt.pieces[i].position)
        variants["exact_last"] = self._hybrid(prompt, lambda index, _: index == last)

    async def _measure(self, prompt: ModulePrompt) -> dict[str, float]:
        logits = await self.runner.module_logits(prompt, self.reference)
        ppl = perplexity(logits, self.reference)
        kl = torch.nn.functional.kl_div(
            torch.log_softmax(logits, -1),
            torch.log_softmax(self.full, -1),
            log_target=True,
            reduction="batchmean",
        )
        return {"ppl": ppl, "delta": ppl / self.ppl_full - 1, "kl": kl.item()}

    def _shifted(self, piece: CachedPiece, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The piece's module KV in `layer`, keys at its served positions."""
        k, v = piece.module.kv[layer]
        k, v = (
            k[:, piece.offset : piece.offset + piece.tokens],
            v[:, piece.offset : piece.offset + piece.tokens],
        )
        return self.engine.modules.shift.shift_keys(k, piece.delta), v

    def _exact(self, piece: CachedPiece, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.full_kv[layer]
        rows = piece.positions  # compact: a token's row in the full prefill is its position
        return k[:, rows], v[:, rows]

    def _hybrid(self, prompt: ModulePrompt, exact: Exact) -> ModulePrompt:
        """`prompt` with every piece served at its positions from KV that is the full
        prefill's where `exact(piece, layer)`, its module's elsewhere."""
        pieces = []
        for index, piece in enumerate(prompt.pieces):
            kv: KV = [
                self._exact(piece, layer) if exact(index, layer) else self._shifted(piece, layer)
                for layer in range(self.layers)
            ]
            module = ModuleKV(piece.token_ids, tuple(piece.positions), kv)
            pieces.append(CachedPiece.whole(module, piece.position))
        return replace(prompt, pieces=tuple(pieces))

    def _selected(self, prompt: ModulePrompt, name: str, budget: int) -> ModulePrompt:
        """`budget` tokens of the modules but the first, chosen by `name`'s deviation, with
        its exact layers loaded for every module token."""
        selection = SELECTIONS[name]
        eligible = eligible_pieces(prompt)
        scores = self._deviation(prompt, eligible, selection.which, selection.compared)
        if selection.weighted:
            mass = self._attention_mass(prompt, selection.exact)
            scores *= torch.cat([mass[prompt.pieces[i].positions] for i in eligible])
        if selection.narrowed:
            kept = self._deviation(prompt, eligible, 1, (2,)).topk(
                min(budget * selection.narrowed, scores.numel())
            )
            scores = torch.full_like(scores, -1.0).index_copy_(0, kept.indices, scores[kept.indices])
        hybrid = self._hybrid(prompt, lambda _, at: at < selection.exact)
        return replace(hybrid, repaired=largest(prompt, eligible, scores, budget))

    @torch.no_grad()
    def _attention_mass(self, prompt: ModulePrompt, layer: int) -> torch.Tensor:
        """[prompt tokens]: the mean attention weight the computed text's rows (every head)
        give each position at `layer`, under full attention (compact: row = position)."""
        positions = torch.arange(len(self.full_ids))
        _, hidden = recompute_layers(self.model, torch.tensor(self.full_ids), positions, layer)
        rows = torch.tensor([p for part in prompt.text for p in part.positions])
        decoder, geometry = self.model.model, ModelGeometry.of(self.model.config)
        attn = decoder.layers[layer].self_attn
        x = decoder.layers[layer].input_layernorm(hidden[rows])
        q, _, _ = project_qkv(attn, x, rotary_of(decoder, x, rows), geometry)  # [rows, heads, D]
        keys = self.full_kv[layer][0].repeat_interleave(geometry.heads // geometry.kv_heads, dim=0)
        scores = torch.einsum("rhd,htd->hrt", q, keys) * attn.scaling  # [heads, rows, tokens]
        scores = scores.masked_fill(positions[None, None, :] > rows[None, :, None], float("-inf"))
        return torch.softmax(scores, dim=-1).mean(dim=(0, 1))

    def _deviation(
        self, prompt: ModulePrompt, eligible: list[int], which: int, layers: tuple[int, ...]
    ) -> torch.Tensor:
        """Each eligible piece's tokens' squared distance of K or V to the full prefill's,
        summed over `layers` (each normalised by its mean when several)."""
        scores = torch.zeros(sum(prompt.pieces[i].tokens for i in eligible))
        for at in layers:
            deviation = torch.cat(
                [
                    (
                        (
                            self._exact(prompt.pieces[i], at)[which]
                            - self._shifted(prompt.pieces[i], at)[which]
                        )
                        ** 2
                    )
                    .sum(dim=(0, 2))
                    .float()
                    for i in eligible
                ]
            )
            scores += deviation / deviation.mean() if len(layers) > 1 else deviation
        return scores

    async def _reencoded(self, case: Case, prompt: ModulePrompt, *, with_context: bool) -> ModulePrompt:
        """Each module encoded again apart at the positions the prompt serves its tokens at,
        after its context at the context's served positions (or alone)."""
        layout = self.engine.modules.server.schema(case.schema)
        served = {
            schema_position: position
            for piece in prompt.pieces
            for schema_position, position in zip(
                piece.module.positions[piece.offset : piece.offset + piece.tokens],
                piece.positions,
                strict=True,
            )
        }
        paths = {(m.token_ids, m.positions): path for path, m in layout.modules.items() if m.token_ids}
        encoded: dict[int, ModuleKV] = {}
        pieces = []
        for piece in prompt.pieces:
            key = id(piece.module)
            if key not in encoded:
                path = paths[(piece.module.token_ids, piece.module.positions)]
                context = layout.context_pieces(path) if with_context else []
                context_ids = [t for c in context for t in c.token_ids]
                context_positions = [served[p] for c in context for p in range(c.start, c.end)]
                module = await encode_module(
                    self.engine.engine,
                    piece.module.token_ids,
                    [served[p] for p in piece.module.positions],
                    self.source.namespace,
                    (context_ids, context_positions),
                )
                encoded[key] = module
            module = encoded[key]
            pieces.append(CachedPiece(module, piece.offset, piece.tokens, piece.position))
        return replace(prompt, pieces=tuple(pieces))


def _materialized(piece: CachedPiece) -> CachedPiece:
    module = piece.module
    kv = [module.kv[layer] for layer in range(len(module.kv))]
    return replace(piece, module=replace(module, kv=kv))


CURVES = ("first", *SELECTIONS)


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The mean |delta| and mean KL of each variant over the rows that have it."""
    names = list(
        dict.fromkeys(name for row in rows for name, value in row.items() if isinstance(value, dict))
    )
    summary: dict[str, float] = {}
    for name in names:
        have = [row[name] for row in rows if name in row]
        if have:
            summary[f"{name}:delta"] = round(sum(abs(x["delta"]) for x in have) / len(have), 5)
            summary[f"{name}:kl"] = round(sum(x["kl"] for x in have) / len(have), 5)
    return summary


def table(rows: list[dict[str, Any]], summary: dict[str, float]) -> str:
    labels = [row["label"].split(":")[0] for row in rows]
    names = [n for n in summary if n.endswith(":delta")]
    lines = [f"{'variant':<18}" + "".join(f"{label:>8}" for label in labels) + f"{'mean|d|':>9}{'KL':>8}"]
    for name in names:
        variant = name.removesuffix(":delta")
        cells = "".join(f"{row[variant]['delta']:>+8.1%}" if variant in row else f"{'':>8}" for row in rows)
        lines.append(f"{variant:<18}{cells}{summary[name]:>9.2%}{summary[variant + ':kl']:>8.4f}")
    return "\n".join(lines)


async def split(args: argparse.Namespace) -> None:
    loaded = load_model(default_model_dir(), torch.float32, "cpu")
    workloads = quality_workloads(loaded.tokenizer, args.quick)
    cases = [case for name in workloads if name in args.only for case in workloads[name]()]
    rows = []
    async with serving(loaded, work_dir(args.results)) as (engine, source):
        runner = CaseRunner(engine, source, repeats=0, continuation_tokens=32, answer_tokens=0)
        measure = Split(runner, engine, source, args)
        for case in cases:
            rows.append(await measure.run(case))
            print(
                case.label,
                json.dumps({k: v for k, v in rows[-1].items() if k in ("served", "exact_30")}),
                flush=True,
            )
    summary = summarize(rows)
    save_results(args.results, {"quick": args.quick, "seed": SEED, "rows": rows, "summary": summary})
    print_report(table(rows, summary), [], summary)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="bench-modules' quick prompts (5)")
    parser.add_argument("--only", default="doc_qa,code,persona,travel", help="comma-separated workloads")
    parser.add_argument(
        "--fractions", default=",".join(map(str, REPAIR_FRACTIONS)), help="comma-separated repair budgets"
    )
    parser.add_argument(
        "--selections",
        default="first,deviation,cacheblend,oracle",
        help=f"of {', '.join(CURVES)}",
    )
    parser.add_argument(
        "--curve-only", action="store_true", help="the repair curve alone (no split variants)"
    )
    parser.add_argument("--results", help="bench/results/<name>.json (default modules-split[-quick])")
    args = parser.parse_args(argv)
    args.only = set(args.only.split(","))
    args.fractions = [float(f) for f in args.fractions.split(",")]
    args.selections = args.selections.split(",")
    if not set(args.selections) <= set(CURVES):
        parser.error(f"--selections takes {', '.join(CURVES)}")
    args.results = args.results or ("modules-split-quick" if args.quick else "modules-split")
    asyncio.run(split(args))


if __name__ == "__main__":
    main()
