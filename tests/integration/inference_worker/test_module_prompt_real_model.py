"""Prompt modules on the real model (SmolLM2-135M-Instruct, fp32, CPU), in the paged engine:
a module encoded alone at position 0 and followed by contiguous text serves the same logits
(1e-4) and greedy tokens as a full prefill; text after a gap in positions too; a module's
keys re-positioned by the rotary shift equal the keys encoded at the new positions; and
boundary repair of a whole second module recovers the full prefill exactly; repair of the
tokens chosen by KV deviation comes closer to the full prefill than repair of as many first
tokens, and at 100% it is the full prefill."""

from __future__ import annotations

import pytest
import torch

from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.engine import Engine
from inference_worker.engine.model_runner import PagedModelRunner
from inference_worker.engine.sequence import Sequence
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import LoadedModel, default_model_dir, load_model
from inference_worker.modules.module_kv import ModuleKV, encode_module
from inference_worker.modules.module_prompt import CachedPiece, ModulePrompt, TextPart, module_sequence
from inference_worker.modules.repair_selection import DEVIATION_LAYER, select_by_deviation
from inference_worker.rotary_shift import RotaryShift

pytestmark = pytest.mark.timeout(600)

STEPS = 16
TOLERANCE = 1e-4
NAMESPACE = bytes(16)
MODULE = (
    "The lighthouse on the northern headland was built in 1871, after three ships were lost on the "
    "reef in a single winter. Its first keeper, a former ship's carpenter named Elias Brandt, kept a "
    "log of every vessel that passed, the weather at each watch, and the oil burned each night."
)
SECOND = "The tower is thirty-two metres tall and made of local granite, hauled up the cliff on sledges."
QUESTION = " Question: who was the first keeper of the lighthouse, and what did he record? Answer:"


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model(default_model_dir(), torch.float32, "cpu")


@pytest.fixture
def engine(model: LoadedModel) -> Engine:
    kv = PagedKV(ModelGeometry.of(model.model.config), 96, 16, torch.float32, torch.device("cpu"))
    return Engine(
        PagedModelRunner(model.model, kv), BlockPool(96, 16), max_batch_tokens=512, max_batch_sequences=8
    )


def ids(model: LoadedModel, text: str) -> list[int]:
    return model.tokenizer(text, add_special_tokens=False)["input_ids"]


async def run(engine: Engine, seq: Sequence) -> list[torch.Tensor]:
    """The logits after the prompt and after each greedy token."""
    seq.max_new_tokens = STEPS
    logits = [output.logits async for output in engine.generate(seq) if output.logits is not None]
    engine.release(seq)
    return logits


def assert_same(mine: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    assert [int(x.argmax()) for x in mine] == [int(x.argmax()) for x in theirs]
    assert max((a - b).abs().max().item() for a, b in zip(mine, theirs, strict=True)) <= TOLERANCE


def serve(engine: Engine, prompt: ModulePrompt, shift: RotaryShift | None = None) -> Sequence:
    """The engine sequence of `prompt` as a module turn lays it out (spans joined by the
    runner's C kernel: RowKernels.join_span)."""
    runner = engine.runner
    seq, _ = module_sequence(
        prompt, NAMESPACE, runner.geometry.num_layers, shift, runner.device, runner.row_kernels
    )
    return seq


async def test_module_at_zero_then_text_is_a_full_prefill(model: LoadedModel, engine: Engine) -> None:
    module, question = ids(model, MODULE), ids(model, QUESTION)
    encoded = await encode_module(engine, module, range(len(module)), NAMESPACE)
    text = TextPart(tuple(question), tuple(range(len(module), len(module) + len(question))))
    served = await run(engine, serve(engine, ModulePrompt((CachedPiece.whole(encoded, 0),), (text,))))
    full = await run(engine, Sequence.of(module + question))
    assert_same(served, full)


async def test_text_after_a_gap_matches_a_full_prefill_with_the_same_positions(
    model: LoadedModel, engine: Engine
) -> None:
    module, question = ids(model, MODULE), ids(model, QUESTION)
    gap_start = len(module) + 100  # an omitted module of 100 tokens
    positions = tuple(range(gap_start, gap_start + len(question)))
    encoded = await encode_module(engine, module, range(len(module)), NAMESPACE)
    served = await run(
        engine,
        serve(
            engine, ModulePrompt((CachedPiece.whole(encoded, 0),), (TextPart(tuple(question), positions),))
        ),
    )
    full = Sequence.of(module + question, positions=[*range(len(module)), *positions])
    assert_same(served, await run(engine, full))


async def test_repositioned_module_keys_equal_keys_encoded_there(model: LoadedModel, engine: Engine) -> None:
    module, offset = ids(model, MODULE), 337
    at_zero = await encode_module(engine, module, range(len(module)), NAMESPACE)
    there = await encode_module(engine, module, range(offset, offset + len(module)), NAMESPACE)
    shift = RotaryShift(model.model)
    for (k0, v0), (k1, v1) in zip(at_zero.kv, there.kv, strict=True):
        assert (shift.shift_keys(k0, offset) - k1).abs().max().item() <= 1e-3
        assert (v0 - v1).abs().max().item() <= 1e-3
    # and served from position 0 moved to `offset`, it answers as if encoded there
    question = ids(model, QUESTION)
    after = tuple(range(offset + len(module), offset + len(module) + len(question)))
    moved = ModulePrompt((CachedPiece.whole(at_zero, offset),), (TextPart(tuple(question), after),))
    native = ModulePrompt((CachedPiece.whole(there, offset),), (TextPart(tuple(question), after),))
    mine, theirs = (
        await run(engine, serve(engine, moved, shift)),
        await run(engine, serve(engine, native, shift)),
    )
    assert [int(x.argmax()) for x in mine] == [int(x.argmax()) for x in theirs]


async def two_modules(
    model: LoadedModel, engine: Engine, first: list[int], second: list[int]
) -> tuple[tuple[CachedPiece, ...], tuple[TextPart, ...], list[torch.Tensor]]:
    """Modules A and B encoded apart, then the question; and the full prefill's logits."""
    question = ids(model, QUESTION)
    a = await encode_module(engine, first, range(len(first)), NAMESPACE)
    b = await encode_module(engine, second, range(len(first), len(first) + len(second)), NAMESPACE)
    start = len(first) + len(second)
    text = (TextPart(tuple(question), tuple(range(start, start + len(question)))),)
    full = await run(engine, Sequence.of(first + second + question))
    return (CachedPiece.whole(a, 0), CachedPiece.whole(b, len(first))), text, full


async def test_repairing_a_whole_module_recovers_the_full_prefill(model: LoadedModel, engine: Engine) -> None:
    second = ids(model, SECOND)
    modules, text, full = await two_modules(model, engine, ids(model, MODULE), second)
    plain = await run(engine, serve(engine, ModulePrompt(modules, text)))
    assert (plain[0] - full[0]).abs().max().item() > 1e-2  # encoded apart, B never saw A
    repaired = await run(engine, serve(engine, ModulePrompt(modules, text, repair_tokens=len(second))))
    assert_same(repaired, full)


async def test_deviation_repair_beats_first_token_repair_at_the_same_budget(
    model: LoadedModel, engine: Engine
) -> None:
    second = ids(model, MODULE)  # B: a long module, encoded apart from A (the same text)
    modules, text, full = await two_modules(model, engine, ids(model, SECOND), second)
    budget = len(second) // 5
    by_first = ModulePrompt(modules, text, repair_tokens=budget)
    by_deviation = select_by_deviation(by_first, model.model)
    assert [len(chosen) for chosen in by_deviation.repair_indices()] == [0, budget]
    assert by_deviation.repair_indices() != by_first.repair_indices()
    errors = {}
    for name, prompt in (("first", by_first), ("deviation", by_deviation)):
        logits = (await run(engine, serve(engine, prompt)))[0]  # after the prompt
        errors[name] = (logits - full[0]).abs()
    assert errors["deviation"].max() < errors["first"].max(), errors
    assert errors["deviation"].mean() < errors["first"].mean(), errors
    whole = select_by_deviation(by_first, model.model, budget=len(second))
    assert_same(await run(engine, serve(engine, whole)), full)


async def test_deviation_repair_loads_the_layers_its_selection_computed_in_full(
    model: LoadedModel, engine: Engine
) -> None:
    """The selection pass computes the first DEVIATION_LAYER layers over the whole prompt:
    every cached token is loaded with that exact KV in those layers, the module's beyond."""
    first, second = ids(model, SECOND), ids(model, MODULE)
    modules, text, _ = await two_modules(model, engine, first, second)
    chosen = select_by_deviation(ModulePrompt(modules, text, repair_tokens=4), model.model)
    whole = await encode_module(engine, first + second, range(len(first) + len(second)), NAMESPACE)
    seq = serve(engine, chosen)
    assert seq.prefix is not None
    cached = [len(first) + i for i in range(len(second)) if i not in chosen.repair_indices()[1]]
    loaded = [seq.prefix.wait_layer(layer, 1.0) for layer in range(DEVIATION_LAYER + 1)]
    for layer, (k, v) in enumerate(loaded):  # [kv_heads, cached tokens, D]: A's, then B's cached ones
        b_keys, b_values = k[:, len(first) :], v[:, len(first) :]
        if layer < DEVIATION_LAYER:
            assert torch.allclose(b_keys, whole.kv[layer][0][:, cached], atol=1e-4)
            assert torch.allclose(b_values, whole.kv[layer][1][:, cached], atol=1e-4)
        else:  # B's own KV, encoded apart from A
            offsets = [p - len(first) for p in cached]
            assert torch.equal(b_values, modules[1].module.kv[layer][1][:, offsets])
            assert not torch.allclose(b_values, whole.kv[layer][1][:, cached], atol=1e-3)


def test_module_kv_checks_its_shape() -> None:
    with pytest.raises(ValueError, match="positions must increase"):
        ModuleKV((1, 2), (3, 3), [(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))])
