"""One turn whose prompt is PML: module KV (stored, else encoded) loaded into the sequence's
first blocks, the rest computed, then decoding as for any turn, batched with the others.
Nothing is saved afterwards: module KV is saved when encoded, and a one-off prompt has no
history."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from transformers import PreTrainedTokenizerBase

from attnstore.errors import InvalidArgument
from inference_worker.decoding import IncrementalDetokenizer, StopStrings, check_sampling
from inference_worker.engine.engine import Engine
from inference_worker.layerwise_cache import PrefixLoadFailed
from inference_worker.modules.module_prompt import ModuleLayoutError, module_sequence
from inference_worker.modules.pml_server import PmlServer
from inference_worker.modules.repair_selection import RepairMethod, select_by_deviation
from inference_worker.rotary_shift import PositionShiftUnsupported, RotaryShift
from inference_worker.turn_types import KVSource, ModuleTurnInput, TokenEvent, TurnStats


class ModuleTurns:
    def __init__(
        self,
        engine: Engine,
        server: PmlServer,
        tokenizer: PreTrainedTokenizerBase,
        shift: RotaryShift | None,
        stop_ids: frozenset[int],
        max_context_tokens: int,
        repair_method: RepairMethod,
    ) -> None:
        """`max_context_tokens`: the worker's context window; a module prompt's positions
        (gaps included) and its answer must fit in it (module prompts are never truncated).
        `repair_method`: a turn's default choice of repaired tokens."""
        self.repair_method = repair_method
        self.max_context_tokens = max_context_tokens
        self.engine = engine
        self.server = server
        self.tokenizer = tokenizer
        self.shift = shift
        self.stop_ids = stop_ids

    async def run(self, turn: ModuleTurnInput, source: KVSource) -> AsyncIterator[TokenEvent | TurnStats]:
        """Streams a TokenEvent per token, then one TurnStats. Raises InvalidArgument (a PML
        error names line and element) before any event."""
        started = time.perf_counter()
        check_sampling(turn.sampling)
        served = await self.server.serve(
            source,
            turn.schema,
            turn.prompt,
            turn.repair_tokens,
            turn.add_generation_prompt,
            turn.repair_fraction,
        )
        paged = self.engine.runner
        prompt = served.prompt
        method = self.repair_method if turn.repair_method is None else RepairMethod(turn.repair_method)
        if method is RepairMethod.DEVIATION and (prompt.repair_tokens or prompt.repair_fraction):
            with contextlib.suppress(PrefixLoadFailed):  # a module's read failed: its tokens are computed
                prompt = await asyncio.to_thread(select_by_deviation, prompt, paged.model)
        try:
            seq, layout = module_sequence(
                prompt,
                source.namespace,
                paged.geometry.num_layers,
                self.shift,
                paged.device,
                paged.row_kernels,
            )
        except (ModuleLayoutError, PositionShiftUnsupported) as exc:
            raise InvalidArgument(f"the prompt cannot be served from its modules: {exc}") from exc
        if max(layout.positions) + turn.sampling.max_tokens >= self.max_context_tokens:
            raise InvalidArgument(
                f"the prompt reaches position {max(layout.positions)}; with max_tokens "
                f"{turn.sampling.max_tokens} it passes the context window of {self.max_context_tokens} tokens"
            )
        seq.sampling, seq.max_new_tokens = turn.sampling, turn.sampling.max_tokens
        seq.stops = self.stop_ids | frozenset(turn.sampling.stop_token_ids)
        if turn.sampling.stop_strings:
            seq.stop_text = StopStrings(self.tokenizer, seq.token_ids, turn.sampling.stop_strings)
        detokenizer = IncrementalDetokenizer(self.tokenizer, seq.token_ids)
        first_token_at: float | None = None
        try:
            async with contextlib.aclosing(self.engine.generate(seq)) as outputs:
                async for output in outputs:
                    if output.token is None:
                        continue
                    first_token_at = first_token_at or time.perf_counter()
                    yield TokenEvent(output.token, detokenizer.add(output.token, final=output.finished))
        finally:
            self.engine.release(seq)
        ttft = (first_token_at or time.perf_counter()) - started
        yield TurnStats(
            prompt_tokens=len(layout.token_ids),
            reused_tokens=0 if seq.load_failure else layout.cached_tokens,
            reused_dram_chunks=0,
            reused_ssd_chunks=0,
            generated_tokens=len(seq.generated),
            ttft_seconds=ttft,
            kv_load_seconds=0.0,
            kv_load_exposed_seconds=seq.load_wait_seconds,
            compute_seconds=ttft,
            saved_chunks=0,
            finish_reason=seq.finish_reason or "length",
            namespace=source.namespace,
            module_tokens=served.prompt.module_tokens,
            repaired_tokens=layout.repaired_tokens,
            encoded_modules=served.encoded_modules,
            prompt_token_ids=layout.tokens_by_position,
        )
