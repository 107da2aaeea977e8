"""Measurements of one PML case on an in-process turn engine beside a real daemon: TTFT
served from module KV vs the same tokens prefilled whole, the perplexity of a reference
continuation after each (teacher-forced), and the
greedy agreement of their answers; for prompts of several modules, the perplexity with
boundary repair at each budget of REPAIR_FRACTIONS, by first tokens and by KV deviation."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import KW_ONLY, dataclass, replace

import torch
from transformers import DynamicCache

from bench.modules.workload import Case
from inference_worker.kv_saver import KV
from inference_worker.modules.module_cache import ModuleCache
from inference_worker.modules.module_prompt import ModulePrompt, lay_out, module_sequence
from inference_worker.modules.repair_selection import RepairMethod, select_by_deviation
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import (
    KVSource,
    ModuleTurnInput,
    SamplingParams,
    TokenEvent,
    TurnInput,
    TurnStats,
)

Turn = Callable[[], AsyncIterator[TokenEvent | TurnStats]]  # starts one turn's events

REPAIR_FRACTIONS = (0.05, 0.10, 0.15)  # the budget curve: this share of each repaired module
# Which tokens a budget repairs: the served methods (RepairMethod), deviation measured at a
# deeper layer (8 of 30 computed in full to select: more cost, maybe better choices), and
# deviation on the prompt laid out compact (the worker's module_positions=compact: no gaps).
DEEP_DEVIATION_LAYER = 8
DEEP_DEVIATION = f"deviation-l{DEEP_DEVIATION_LAYER}"
COMPACT_DEVIATION = "deviation+compact"
REPAIR_METHODS = (RepairMethod.FIRST.value, RepairMethod.DEVIATION.value, DEEP_DEVIATION, COMPACT_DEVIATION)


@dataclass(frozen=True)
class RepairPoint:
    method: str
    fraction: float  # of each module's tokens (but the first module's)
    repaired_tokens: int
    ppl: float


@dataclass(frozen=True)
class CaseResult:
    workload: str
    label: str
    module_tokens: int  # served from module KV
    prompt_tokens: int
    ttft_full_ms: float
    ttft_modules_ms: float
    ppl_full: float
    ppl_modules: float
    agree_no_repair: float  # share of greedy tokens equal to the full prefill's, position by position
    # Prompts with more than one module (repair applies; empty otherwise): perplexity at
    # each budget and method; greedy agreement and TTFT at the largest budget.
    curve: tuple[RepairPoint, ...] = ()
    agree_repair: float | None = None  # first tokens
    agree_repair_deviation: float | None = None
    ttft_repair_deviation_ms: float | None = None  # deviation's selection included
    ppl_modules_compact: float | None = None  # laid out without gaps, no repair
    # Module KV stored in bf16 (module_kv_dtype=bfloat16), read into fp32: TTFT as served,
    # perplexity at schema positions (beside ppl_modules: the format's own cost).
    ttft_modules_bf16_ms: float | None = None
    ppl_modules_bf16: float | None = None
    agree_bf16: float | None = None  # greedy agreement with the full prefill, no repair
    # Every module read from the daemon's DRAM (the worker's module cache bypassed: a
    # prompt's first use of modules on this worker since they were read or evicted).
    ttft_modules_read_ms: float | None = None
    # The full prefill of the case's reordered prompt (its modules in another order, compact):
    # how far a change that keeps the prompt's meaning moves the same perplexity.
    ppl_full_reordered: float | None = None
    # The reference tokens scored (a case's NLL is this times log ppl: corpus_perplexity.py).
    reference_tokens: int | None = None
    # The process's CPU over a module turn (every thread: median of the timed runs); over
    # ttft_modules_ms, the cores the turn kept busy (1: one at a time; 2: both throughout).
    cpu_modules_ms: float | None = None

    @property
    def speedup(self) -> float:
        return self.ttft_full_ms / self.ttft_modules_ms

    @property
    def speedup_read(self) -> float | None:
        return None if self.ttft_modules_read_ms is None else self.ttft_full_ms / self.ttft_modules_read_ms

    @property
    def speedup_bf16(self) -> float | None:
        return None if self.ttft_modules_bf16_ms is None else self.ttft_full_ms / self.ttft_modules_bf16_ms

    def point(self, method: str, fraction: float) -> RepairPoint | None:
        return next((p for p in self.curve if p.method == method and p.fraction == fraction), None)


@dataclass
class CaseRunner:
    engine: TurnEngine
    source: KVSource
    _: KW_ONLY
    repeats: int
    continuation_tokens: int
    answer_tokens: int

    def __post_init__(self) -> None:
        self.tokenizer = self.engine.loaded.tokenizer

    async def run(self, case: Case) -> CaseResult:
        server = self.engine.modules.server
        async for _ in server.encode(self.source, case.schema):  # eager: the store holds every module
            pass
        await server.store.drain()
        default = server.compact_positions
        try:
            server.compact_positions = False  # the paper's layout, whatever the worker's default
            served = await server.serve(self.source, case.schema, case.prompt, 0)
            server.compact_positions = True
            compact = await server.serve(self.source, case.schema, case.prompt, 0)
            reordered = (
                await server.serve(self.source, case.schema, case.reordered, 0) if case.reordered else None
            )
        finally:
            server.compact_positions = default
        layout = lay_out(served.prompt)
        full_ids = list(layout.tokens_by_position)
        reference = self.tokenizer.encode(case.reference, add_special_tokens=False)[
            : self.continuation_tokens
        ]
        full_runs, module_runs = await alternated_runs(
            lambda: self.engine.run_turn(TurnInput(full_ids, SamplingParams(max_tokens=1)), None),
            lambda: self.engine.modules.run(self._turn(case, 1), self.source),
            self.repeats,
        )
        ttft_read = await self._ttft_read(case)
        full_answer = await self._tokens(
            self.engine.run_turn(TurnInput(full_ids, SamplingParams(max_tokens=self.answer_tokens)), None)
        )
        result = CaseResult(
            workload=case.workload,
            label=case.label,
            module_tokens=layout.cached_tokens,
            prompt_tokens=len(full_ids),
            ttft_full_ms=statistics.median(run.ttft for run in full_runs) * 1000,
            ttft_modules_ms=statistics.median(run.ttft for run in module_runs) * 1000,
            cpu_modules_ms=statistics.median(run.cpu for run in module_runs) * 1000,
            ttft_modules_read_ms=ttft_read * 1000,
            ppl_full=self._full_perplexity(full_ids, reference),
            ppl_modules=await self._module_perplexity(served.prompt, reference),
            agree_no_repair=_agreement(await self._answer(case), full_answer),
            reference_tokens=len(reference),
            ppl_modules_compact=await self._module_perplexity(compact.prompt, reference),
            ppl_full_reordered=self._full_perplexity(
                list(lay_out(reordered.prompt).tokens_by_position), reference
            )
            if reordered
            else None,
        )
        result = await self._bf16_store(case, result, reference, full_answer)
        if not lay_out(replace(served.prompt, repair_fraction=1.0)).repaired_tokens:
            return result  # one module, first: nothing to repair (its KV is exact)
        curve = []
        for fraction in REPAIR_FRACTIONS:
            for method in REPAIR_METHODS:
                laid_out = compact if method == COMPACT_DEVIATION else served
                prompt = await self._select(replace(laid_out.prompt, repair_fraction=fraction), method)
                repaired = lay_out(prompt).repaired_tokens
                curve.append(
                    RepairPoint(method, fraction, repaired, await self._module_perplexity(prompt, reference))
                )
        largest = REPAIR_FRACTIONS[-1]
        deviation_turn = self._turn(case, 1, largest, RepairMethod.DEVIATION)
        return replace(
            result,
            curve=tuple(curve),
            agree_repair=_agreement(await self._answer(case, largest, RepairMethod.FIRST), full_answer),
            agree_repair_deviation=_agreement(
                await self._answer(case, largest, RepairMethod.DEVIATION), full_answer
            ),
            ttft_repair_deviation_ms=1000
            * await self._ttft(lambda: self.engine.modules.run(deviation_turn, self.source)),
        )

    async def _ttft_read(self, case: Case) -> float:
        """The module turn's TTFT with every module read from the daemon (an empty module
        cache in place of the worker's, which is kept)."""
        store = self.engine.modules.server.store
        kept, store.cache = store.cache, ModuleCache(0)
        try:
            return await self._ttft(lambda: self.engine.modules.run(self._turn(case, 1), self.source))
        finally:
            store.cache = kept

    async def _bf16_store(
        self, case: Case, result: CaseResult, reference: list[int], full_answer: list[int]
    ) -> CaseResult:
        """`result` with the TTFT and perplexity of module KV stored in bf16 (encoded into
        that store first, as for the fp32 one)."""
        server = self.engine.modules.server
        default, compact = server.store.store_dtype, server.compact_positions
        try:
            server.store.store_dtype = torch.bfloat16
            async for _ in server.encode(self.source, case.schema):
                pass
            await server.store.drain()
            ttft = await self._ttft(lambda: self.engine.modules.run(self._turn(case, 1), self.source))
            agree = _agreement(await self._answer(case), full_answer)
            server.compact_positions = False  # as ppl_modules
            served = await server.serve(self.source, case.schema, case.prompt, 0)
            ppl = await self._module_perplexity(served.prompt, reference)
        finally:
            server.store.store_dtype, server.compact_positions = default, compact
        return replace(result, ttft_modules_bf16_ms=ttft * 1000, ppl_modules_bf16=ppl, agree_bf16=agree)

    async def _select(self, first: ModulePrompt, method: str) -> ModulePrompt:
        """`first` (its first tokens repaired) with `method`'s choice of as many tokens (in a
        thread: it waits for module layers the event loop reads)."""
        if method == RepairMethod.FIRST:
            return first
        layer = DEEP_DEVIATION_LAYER if method == DEEP_DEVIATION else None
        return await asyncio.to_thread(select_by_deviation, first, self.engine.loaded.model, layer=layer)

    @staticmethod
    def _turn(
        case: Case, max_tokens: int, fraction: float = 0.0, method: RepairMethod | None = None
    ) -> ModuleTurnInput:
        return ModuleTurnInput(
            case.schema,
            case.prompt,
            SamplingParams(max_tokens=max_tokens),
            repair_fraction=fraction,
            repair_method=method,
        )

    async def _answer(
        self, case: Case, fraction: float = 0.0, method: RepairMethod | None = None
    ) -> list[int]:
        return await self._tokens(
            self.engine.modules.run(self._turn(case, self.answer_tokens, fraction, method), self.source)
        )

    async def _ttft(self, turn: Turn) -> float:
        """The median TTFT (the turn's own stats) of `repeats` runs after one warm-up."""
        await timed_run(turn)
        return statistics.median([(await timed_run(turn)).ttft for _ in range(self.repeats)])

    @staticmethod
    async def _tokens(events: AsyncIterator[TokenEvent | TurnStats]) -> list[int]:
        return [event.token_id async for event in events if isinstance(event, TokenEvent)]

    def _full_perplexity(self, prompt: list[int], reference: list[int]) -> float:
        return perplexity(self.full_logits(prompt, reference), reference)

    async def _module_perplexity(self, prompt: ModulePrompt, reference: list[int]) -> float:
        return perplexity(await self.module_logits(prompt, reference), reference)

    @torch.no_grad()
    def full_logits(self, prompt: list[int], reference: list[int]) -> torch.Tensor:
        """The logits [reference, vocab] predicting `reference` after `prompt` prefilled whole."""
        model = self.engine.loaded.model
        ids = torch.tensor([prompt + reference])  # [1, prompt + reference]
        return model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()

    async def module_logits(self, prompt: ModulePrompt, reference: list[int]) -> torch.Tensor:
        """The logits [reference, vocab] predicting `reference`, teacher-forced: the prompt
        served from module KV by the engine (its last logits
        predict the first reference token), then the reference after it in one pass of the
        model over the served sequence's KV (its keys at their served positions, in slot
        order: attention does not depend on the order of the keys, and every one of them
        precedes the reference)."""
        engine = self.engine.engine
        seq, layout = module_sequence(
            prompt,
            self.source.namespace,
            engine.runner.geometry.num_layers,
            self.engine.modules.shift,
            engine.runner.device,
        )
        logits = None
        try:
            async for output in engine.generate(seq):  # max_new_tokens 0: the prompt's last logits only
                logits = output.logits
            kv = await asyncio.to_thread(engine.kv.span, seq.block_table, 0, len(seq))
        finally:
            engine.release(seq)
        if logits is None:
            raise RuntimeError(f"the engine gave sequence {seq.seq_id} no logits")
        after = max(layout.positions) + 1
        rest = self._continue(kv, reference[:-1], after)  # [reference - 1, vocab]
        return torch.cat([logits[None].float(), rest])

    @torch.no_grad()
    def _continue(self, kv: KV, tokens: list[int], start: int) -> torch.Tensor:
        """The logits [tokens, vocab] of `tokens` at positions start.. after the KV."""
        cache = DynamicCache([(k[None], v[None]) for k, v in kv])  # [1, kv_heads, slots, D]
        positions = torch.arange(start, start + len(tokens))[None]
        out = self.engine.loaded.model(
            input_ids=torch.tensor([tokens]), position_ids=positions, cache=cache, use_cache=True
        )
        return out.logits[0].float()


@dataclass(frozen=True)
class Run:
    ttft: float  # seconds, the turn's own stats
    cpu: float  # seconds of this process's CPU over the whole turn, every thread (not the daemon's)


async def alternated_runs(full: Turn, modules: Turn, repeats: int) -> tuple[list[Run], list[Run]]:
    """`repeats` timed runs of the full prefill and of the module turn after a warm-up of
    each, the two taken in turns (full first in even rounds, the module turn first in odd
    ones): both sides meet the machine in the same minutes, so a slow spell moves a prompt's
    two numbers together instead of one of them (a module turn is ~100 ms: its runs in a
    row fit inside one spell)."""
    await timed_run(full)
    await timed_run(modules)
    runs: tuple[list[Run], list[Run]] = ([], [])
    for round_ in range(repeats):
        for side in (0, 1) if round_ % 2 == 0 else (1, 0):
            runs[side].append(await timed_run((full, modules)[side]))
    return runs


async def timed_run(turn: Turn) -> Run:
    """One run of the turn: its TTFT and the process's CPU time."""
    started = time.process_time()
    stats = [event async for event in turn() if isinstance(event, TurnStats)]
    return Run(stats[0].ttft_seconds, time.process_time() - started)


def perplexity(logits: torch.Tensor, reference: list[int]) -> float:
    """logits [tokens, vocab] predicting `reference` [tokens]."""
    log_probs = torch.log_softmax(logits, dim=-1)[torch.arange(len(reference)), torch.tensor(reference)]
    return math.exp(-log_probs.mean().item())


def _agreement(mine: list[int], reference: list[int]) -> float:
    count = min(len(mine), len(reference))
    return sum(a == b for a, b in zip(mine[:count], reference[:count], strict=True)) / count if count else 0.0
