"""Measurements of one PML case on an in-process turn engine beside a real daemon: TTFT
served from module KV vs the same tokens prefilled whole, the perplexity of a reference
continuation after each (teacher-forced: one engine pass per continuation token), and the
greedy agreement of their answers."""

from __future__ import annotations

import math
import statistics
from collections.abc import AsyncIterator, Callable
from dataclasses import KW_ONLY, dataclass

import torch

from bench.modules.workload import Case
from inference_worker.engine.engine import Engine
from inference_worker.engine.sequence import Sequence as EngineSequence
from inference_worker.modules.module_prompt import ModulePrompt, TextPart, lay_out, module_sequence
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


@dataclass(frozen=True)
class CaseResult:
    workload: str
    label: str
    module_tokens: int  # served from module KV
    prompt_tokens: int
    repaired_tokens: int
    ttft_full_ms: float
    ttft_modules_ms: float
    ppl_full: float
    ppl_modules: float
    ppl_repair: float  # the first tokens of each module repaired
    ppl_repair_deviation: float  # as many tokens repaired, chosen by KV deviation
    agree_no_repair: float  # share of greedy tokens equal to the full prefill's, position by position
    agree_repair: float
    agree_repair_deviation: float
    ttft_repair_deviation_ms: float  # deviation's selection included

    @property
    def speedup(self) -> float:
        return self.ttft_full_ms / self.ttft_modules_ms


@dataclass
class CaseRunner:
    engine: TurnEngine
    source: KVSource
    _: KW_ONLY
    repeats: int
    continuation_tokens: int
    answer_tokens: int
    repair_fraction: float

    def __post_init__(self) -> None:
        self.tokenizer = self.engine.loaded.tokenizer

    async def run(self, case: Case) -> CaseResult:
        server = self.engine.modules.server
        async for _ in server.encode(self.source, case.schema):  # eager: the store holds every module
            pass
        await server.store.drain()
        served = await server.serve(self.source, case.schema, case.prompt, 0)
        layout = lay_out(served.prompt)
        full_ids = [
            token
            for token, _ in sorted(zip(layout.token_ids, layout.positions, strict=True), key=lambda p: p[1])
        ]
        repair = max(1, math.ceil(self.repair_fraction * max(p.tokens for p in served.prompt.pieces)))
        repaired = ModulePrompt(served.prompt.pieces, served.prompt.text, repair)
        deviated = select_by_deviation(repaired, self.engine.loaded.model)
        reference = self.tokenizer.encode(case.reference, add_special_tokens=False)[
            : self.continuation_tokens
        ]

        ttft_full = await self._ttft(
            lambda: self.engine.run_turn(TurnInput(full_ids, SamplingParams(max_tokens=1)), None)
        )
        module_turn = ModuleTurnInput(case.schema, case.prompt, SamplingParams(max_tokens=1))
        ttft_modules = await self._ttft(lambda: self.engine.modules.run(module_turn, self.source))
        deviation_turn = ModuleTurnInput(
            case.schema,
            case.prompt,
            SamplingParams(max_tokens=1),
            repair_tokens=repair,
            repair_method=RepairMethod.DEVIATION,
        )
        ttft_deviation = await self._ttft(lambda: self.engine.modules.run(deviation_turn, self.source))

        full_answer = await self._tokens(
            self.engine.run_turn(TurnInput(full_ids, SamplingParams(max_tokens=self.answer_tokens)), None)
        )
        answers = [
            await self._tokens(
                self.engine.modules.run(
                    ModuleTurnInput(
                        case.schema,
                        case.prompt,
                        SamplingParams(max_tokens=self.answer_tokens),
                        repair_tokens=r,
                        repair_method=method,
                    ),
                    self.source,
                )
            )
            for r, method in ((0, None), (repair, RepairMethod.FIRST), (repair, RepairMethod.DEVIATION))
        ]
        return CaseResult(
            workload=case.workload,
            label=case.label,
            module_tokens=layout.cached_tokens,
            prompt_tokens=len(full_ids),
            repaired_tokens=lay_out(repaired).repaired_tokens,
            ttft_full_ms=ttft_full * 1000,
            ttft_modules_ms=ttft_modules * 1000,
            ppl_full=self._full_perplexity(full_ids, reference),
            ppl_modules=await self._module_perplexity(served.prompt, reference),
            ppl_repair=await self._module_perplexity(repaired, reference),
            ppl_repair_deviation=await self._module_perplexity(deviated, reference),
            agree_no_repair=_agreement(answers[0], full_answer),
            agree_repair=_agreement(answers[1], full_answer),
            agree_repair_deviation=_agreement(answers[2], full_answer),
            ttft_repair_deviation_ms=ttft_deviation * 1000,
        )

    async def _ttft(self, turn: Callable[[], AsyncIterator[TokenEvent | TurnStats]]) -> float:
        """The median TTFT (the turn's own stats) of `repeats` runs after one warm-up."""
        times = []
        for _ in range(self.repeats + 1):
            stats = [event async for event in turn() if isinstance(event, TurnStats)]
            times.append(stats[0].ttft_seconds)
        return statistics.median(times[1:])

    @staticmethod
    async def _tokens(events: AsyncIterator[TokenEvent | TurnStats]) -> list[int]:
        return [event.token_id async for event in events if isinstance(event, TokenEvent)]

    @torch.no_grad()
    def _full_perplexity(self, prompt: list[int], reference: list[int]) -> float:
        model = self.engine.loaded.model
        ids = torch.tensor([prompt + reference])  # [1, prompt + reference]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [reference, vocab]
        return _perplexity(logits, reference)

    async def _module_perplexity(self, prompt: ModulePrompt, reference: list[int]) -> float:
        """Teacher-forced: the logits after the prompt plus the first k reference tokens
        (uncached text after the prompt's last position), for each k."""
        engine = self.engine.engine
        after = max(lay_out(prompt).positions) + 1
        rows = []
        for k in range(len(reference)):
            extra = TextPart(tuple(reference[:k]), tuple(range(after, after + k)))
            served = ModulePrompt(
                prompt.pieces,
                (*prompt.text, extra) if k else prompt.text,
                prompt.repair_tokens,
                prompt.repaired,
            )
            seq, _ = module_sequence(
                served,
                self.source.namespace,
                engine.runner.geometry.num_layers,
                self.engine.modules.shift,
                engine.runner.device,
            )
            rows.append(await _last_logits(engine, seq))
        return _perplexity(torch.stack(rows), reference)


async def _last_logits(engine: Engine, seq: EngineSequence) -> torch.Tensor:
    logits = None
    try:
        async for output in engine.generate(seq):  # max_new_tokens 0: the prompt's last logits only
            logits = output.logits
    finally:
        engine.release(seq)
    if logits is None:
        raise RuntimeError(f"the engine gave sequence {seq.seq_id} no logits")
    return logits


def _perplexity(logits: torch.Tensor, reference: list[int]) -> float:
    """logits [tokens, vocab] predicting `reference` [tokens]."""
    log_probs = torch.log_softmax(logits, dim=-1)[torch.arange(len(reference)), torch.tensor(reference)]
    return math.exp(-log_probs.mean().item())


def _agreement(mine: list[int], reference: list[int]) -> float:
    count = min(len(mine), len(reference))
    return sum(a == b for a, b in zip(mine[:count], reference[:count], strict=True)) / count if count else 0.0
