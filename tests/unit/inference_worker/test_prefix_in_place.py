"""A module prompt's first step attends its loaded module KV where the read put it and copies
it into its blocks afterwards (prefix_in_place.py): two modules (the second re-positioned),
then a question, give the logits and greedy tokens of the model run over the same KV
(1e-4, fp32, tiny Llama), whole or with the question split over two steps (the second
reads the blocks), at the first token and at every decode after it, which reads the
blocks the deferred copy filled: with the spans where they were read (the second's queries
rotated back) and the question's rows in one call of the prefill kernel, and without it
(the spans joined, two flash calls merged), the spans joined (for the blocks, for flash) in
C and by torch's ops; a finished sequence's blocks hold the modules' KV when its owner
reads them; a released sequence's copy is dropped; tokens that interleave with the modules
(boundary repair) keep the masked path."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel

from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.engine import Engine
from inference_worker.engine.model_runner import PagedModelRunner
from inference_worker.engine.prefix_in_place import DeferredWrites, InPlacePrefix, attends_in_place
from inference_worker.engine.sequence import Sequence
from inference_worker.kv_saver import KV
from inference_worker.layerwise_cache import PrefixKV
from inference_worker.model_geometry import ModelGeometry
from inference_worker.modules.module_kv import ModuleKV, encode_module
from inference_worker.modules.module_prompt import CachedPiece, ModulePrompt, TextPart, module_sequence
from inference_worker.rotary_shift import RotaryShift

BLOCK = 4
STEPS = 6
TOLERANCE = 1e-4
NAMESPACE = bytes(16)
FIRST, SECOND, QUESTION = list(range(10, 27)), list(range(40, 53)), list(range(90, 97))


def make_engine(model: PreTrainedModel, max_batch_tokens: int = 64, prefill_kernel: bool = True) -> Engine:
    kv = PagedKV(ModelGeometry.of(model.config), 64, BLOCK, torch.float32, torch.device("cpu"))
    return Engine(
        PagedModelRunner(model, kv, prefill_kernel=prefill_kernel),
        BlockPool(64, BLOCK),
        max_batch_tokens=max_batch_tokens,
        max_batch_sequences=4,
    )


async def two_modules_then_question(
    model: PreTrainedModel, engine: Engine, join_in_c: bool = True
) -> tuple[Sequence, ModulePrompt]:
    """Modules encoded apart at position 0, the second served after the first (its keys
    re-positioned), the question after both; the spans joined by the runner's C kernel
    (RowKernels.join_span), as a module turn joins them, or by torch's ops."""
    a = await encode_module(engine, FIRST, range(len(FIRST)), NAMESPACE)
    b = await encode_module(engine, SECOND, range(len(SECOND)), NAMESPACE)
    start = len(FIRST) + len(SECOND)
    text = TextPart(tuple(QUESTION), tuple(range(start, start + len(QUESTION))))
    prompt = ModulePrompt((CachedPiece.whole(a, 0), CachedPiece.whole(b, len(FIRST))), (text,))
    runner = engine.runner
    kernels = runner.row_kernels if join_in_c else None
    assert kernels is not None or not join_in_c  # the C join must be what is tested
    shift = RotaryShift(model)
    seq, _ = module_sequence(prompt, NAMESPACE, runner.geometry.num_layers, shift, runner.device, kernels)
    return seq, prompt


def served_kv(prompt: ModulePrompt, shift: RotaryShift) -> KV:
    """The modules' KV as served: slot order, keys at their served positions."""
    layers = []
    for layer in range(len(prompt.pieces[0].module.kv)):
        keys = [shift.shift_keys(p.module.kv[layer][0], p.delta) for p in prompt.pieces]
        layers.append(
            (torch.cat(keys, dim=1), torch.cat([p.module.kv[layer][1] for p in prompt.pieces], dim=1))
        )
    return layers


@torch.no_grad()
def reference(model: PreTrainedModel, kv: KV, tokens: list[int], start: int) -> torch.Tensor:
    """The last logits [vocab] of `tokens` at positions start.. after `kv`."""
    cache = DynamicCache([(k[None].clone(), v[None].clone()) for k, v in kv])
    positions = torch.arange(start, start + len(tokens))[None]
    out = model(input_ids=torch.tensor([tokens]), position_ids=positions, cache=cache, use_cache=True)
    return out.logits[0, -1].float()


@pytest.mark.parametrize("join_in_c", [True, False])
@pytest.mark.parametrize("prefill_kernel", [True, False])
@pytest.mark.parametrize("max_batch_tokens", [64, 4])  # 4: the question's last 3 tokens in a later step
async def test_modules_attended_in_place_then_decoded_from_blocks(
    tiny_llama: PreTrainedModel, max_batch_tokens: int, prefill_kernel: bool, join_in_c: bool
) -> None:
    engine = make_engine(tiny_llama, max_batch_tokens, prefill_kernel)
    seq, prompt = await two_modules_then_question(tiny_llama, engine, join_in_c)
    cached = prompt.module_tokens
    assert attends_in_place(seq, cached, len(seq), engine.runner.windows, engine.runner.device)
    seq.max_new_tokens = STEPS
    logits = [output.logits async for output in engine.generate(seq) if output.logits is not None]
    engine.release(seq)
    kv = served_kv(prompt, RotaryShift(tiny_llama))
    tokens = list(QUESTION)
    for step, got in enumerate(logits):
        want = reference(tiny_llama, kv, tokens, cached)
        torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0)
        assert int(got.argmax()) == int(want.argmax())
        assert seq.token_ids[len(seq) - STEPS + step] == int(want.argmax())
        tokens.append(int(want.argmax()))
    await engine.close()


async def test_a_finished_sequence_s_blocks_hold_its_modules_kv(tiny_llama: PreTrainedModel) -> None:
    engine = make_engine(tiny_llama)
    seq, prompt = await two_modules_then_question(tiny_llama, engine)
    async for _ in engine.generate(seq):  # prefill only: it finishes in the step that loads the modules
        pass
    read = engine.kv.span(seq.block_table, 0, prompt.module_tokens)  # the deferred copy comes first
    engine.release(seq)
    for (k, v), (want_k, want_v) in zip(read, served_kv(prompt, RotaryShift(tiny_llama)), strict=True):
        torch.testing.assert_close(k, want_k, atol=1e-6, rtol=0)
        torch.testing.assert_close(v, want_v, atol=1e-6, rtol=0)
    await engine.close()


def test_a_released_sequence_s_copy_is_dropped_and_the_rest_flushed() -> None:
    written: list[int] = []
    deferred = DeferredWrites(lambda layer, slots, k, v: written.append(layer))
    kv = [(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))] * 3
    for seq_id in (0, 1):
        seq = Sequence.of([1, 2, 3], seq_id=seq_id)
        deferred.add(InPlacePrefix(seq, PrefixKV(3, 2), slice(2, 3), slice(0, 2), kv))
    deferred.discard(0)
    deferred.flush()
    assert written == [0, 1, 2]  # sequence 1's three layers, once
    deferred.flush()
    assert written == [0, 1, 2]


@pytest.mark.parametrize("window", [None, 4])
def test_tokens_among_the_modules_or_past_a_window_keep_the_masked_path(
    tiny_llama: PreTrainedModel, window: int | None
) -> None:
    kv = [(torch.zeros(2, 4, 16), torch.zeros(2, 4, 16))] * 3
    module = ModuleKV((1, 2, 3, 4), (0, 1, 2, 3), kv)
    after = ModulePrompt((CachedPiece.whole(module, 0),), (TextPart((5, 6), (4, 5)),))
    among = ModulePrompt((CachedPiece.whole(module, 0),), (TextPart((5, 6), (4, 5)),), repaired=((1,),))
    cpu = torch.device("cpu")
    for prompt, in_place in ((after, window is None), (among, False)):
        seq, layout = module_sequence(prompt, NAMESPACE, 3, None, cpu)
        windows = [window] * 3
        assert attends_in_place(seq, layout.cached_tokens, len(seq), windows, cpu) is in_place
