"""The paged forward against transformers' own: for Llama, Qwen2 and Mistral (sliding
window) models, sequences of different lengths batched together, prefilled in chunks, some
sharing a prefix through the pool, decoded greedily with fragmented block tables, give the
logits a plain forward over each sequence gives (1e-4, fp32)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from paged_batch import run_batch
from transformers import PreTrainedModel

from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.decode_kernel import load_paged_decode
from inference_worker.engine.model_runner import PagedModelRunner, UnsupportedModel, Work
from inference_worker.engine.sequence import Sequence
from inference_worker.model_geometry import ModelGeometry

TOLERANCE = 1e-4
BLOCK = 4


def reference_logits(model: PreTrainedModel, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1].float()  # [vocab]


def runner_for(
    model: PreTrainedModel,
    blocks: int = 64,
    *,
    decode_kernel: bool = True,
    prefill_kernel: bool = True,
    row_kernels: bool = True,
) -> tuple[PagedModelRunner, BlockPool]:
    kv = PagedKV(ModelGeometry.of(model.config), blocks, BLOCK, torch.float32, torch.device("cpu"))
    runner = PagedModelRunner(
        model, kv, decode_kernel=decode_kernel, prefill_kernel=prefill_kernel, row_kernels=row_kernels
    )
    assert runner.row_choice.kernel == ("row-ops-c" if row_kernels else "torch"), runner.row_choice.reason
    if decode_kernel:  # a machine without a C compiler must not pass for one with the kernel
        assert runner.decode_kernel is not None, load_paged_decode()[1].reason
    assert runner.decode_choice.kernel == ("paged-decode-c" if decode_kernel else "torch")
    if prefill_kernel:
        assert runner.prefill_kernel is not None, runner.prefill_choice.reason
    assert runner.prefill_choice.kernel == ("paged-prefill-c" if prefill_kernel else "torch")
    return runner, BlockPool(blocks, BLOCK)


def prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=generator).tolist() for n in lengths]


def assert_matches_reference(
    model: PreTrainedModel, seqs: list[Sequence], logits: list[list[torch.Tensor]]
) -> None:
    for seq, per_step in zip(seqs, logits, strict=True):
        prompt_tokens = len(seq) - (len(per_step) - 1)
        for step, got in enumerate(per_step):
            want = reference_logits(model, seq.token_ids[: prompt_tokens + step])
            torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("prefill_kernel", [False, True])
@pytest.mark.parametrize("row_kernels", [False, True])
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_batched_chunked_prefill_and_decode_match_transformers(
    family: str,
    row_kernels: bool,
    prefill_kernel: bool,
    tiny_llama_factory: Callable[..., PreTrainedModel],
    tiny_qwen2_factory: Callable[..., PreTrainedModel],
    tiny_mistral_factory: Callable[..., PreTrainedModel],
) -> None:
    factories = {"llama": tiny_llama_factory, "qwen2": tiny_qwen2_factory, "mistral": tiny_mistral_factory}
    model = factories[family]()
    runner, pool = runner_for(model, row_kernels=row_kernels, prefill_kernel=prefill_kernel)
    seqs = [Sequence.of(tokens) for tokens in prompts([1, 5, 13, 30])]
    logits = run_batch(runner, pool, seqs, chunk_tokens=7, decode_steps=6)  # decode fragments the tables
    assert_matches_reference(model, seqs, logits)


def test_a_sliding_window_masks_old_keys(tiny_mistral_factory: Callable[..., PreTrainedModel]) -> None:
    model = tiny_mistral_factory(sliding_window=6)
    runner, pool = runner_for(model)
    seqs = [Sequence.of(tokens) for tokens in prompts([3, 11, 20], seed=1)]
    logits = run_batch(runner, pool, seqs, chunk_tokens=5, decode_steps=4)
    assert_matches_reference(model, seqs, logits)


def test_a_prefix_found_in_the_pool_is_not_recomputed(tiny_llama: PreTrainedModel) -> None:
    runner, pool = runner_for(tiny_llama)
    (shared,) = prompts([18], seed=2)
    first = Sequence.of(shared + [1, 2])
    run_batch(runner, pool, [first], chunk_tokens=64, decode_steps=0)
    second, third = Sequence.of(shared + [3]), Sequence.of(shared[:9] + [4, 5])
    logits = run_batch(runner, pool, [second, third], chunk_tokens=64, decode_steps=3)
    assert second.block_table[:4] == first.block_table[:4] and third.block_table[:2] == first.block_table[:2]
    assert pool.usage().shared == 4
    assert_matches_reference(tiny_llama, [second, third], logits)


def test_forked_samples_copy_the_block_they_write_into(tiny_llama: PreTrainedModel) -> None:
    runner, pool = runner_for(tiny_llama)
    (prompt,) = prompts([10], seed=3)
    parent = Sequence.of(prompt)
    (parent_logits,) = run_batch(runner, pool, [parent], chunk_tokens=64, decode_steps=0)
    child = Sequence.of(prompt)
    pool.fork(parent, child)
    parent.token_ids.append(int(torch.argmax(parent_logits[0])))
    child.token_ids.append(int(torch.argsort(parent_logits[0])[-2]))  # diverges at once
    for seq in (parent, child):
        copy = pool.append_slot(seq)
        if copy is not None:
            runner.kv.copy_block(copy.src, copy.dst)
    out = runner.forward(runner.prepare([Work(parent, 1), Work(child, 1)]))
    assert parent.block_table[:2] == child.block_table[:2] and parent.block_table[2] != child.block_table[2]
    for row, seq in enumerate((parent, child)):
        torch.testing.assert_close(
            out[row], reference_logits(tiny_llama, seq.token_ids), atol=TOLERANCE, rtol=0
        )


def test_other_model_families_are_refused(tiny_model_dir: Callable[..., Any]) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("gpt2"))
    kv = PagedKV(ModelGeometry(1, 1, 1, 8, 8, 8), 1, 1, torch.float32, torch.device("cpu"))
    with pytest.raises(UnsupportedModel, match="gpt2"):
        PagedModelRunner(model, kv)


@pytest.mark.parametrize("prefill_kernel", [False, True])
@pytest.mark.parametrize("decode_kernel", [False, True])
@pytest.mark.parametrize("window", [None, 6])
def test_one_step_mixes_runs_gathered_tables_and_chunks(
    tiny_mistral_factory: Callable[..., PreTrainedModel],
    window: int | None,
    decode_kernel: bool,
    prefill_kernel: bool,
) -> None:
    """In one forward pass: a sequence whose blocks are one run (read in place), decodes of
    ragged lengths whose tables are scattered, a chunk on a scattered cached prefix shared
    with another sequence; without the kernels all gathered by one copy per layer, with the
    decode kernel every decode token in its one call, with the prefill kernel the chunk in
    its call (unless its context exceeds the window), the rest gathered; GQA, with and
    without a sliding window. Each matches its own plain forward."""
    model = tiny_mistral_factory(sliding_window=window)
    runner, pool = runner_for(model, decode_kernel=decode_kernel, prefill_kernel=prefill_kernel)
    lengths = [11, 14, 3, 22]  # each grows into a block allocated later: scattered tables
    scattered = [Sequence.of(tokens) for tokens in prompts(lengths, seed=4)]
    run_batch(runner, pool, scattered, chunk_tokens=5, decode_steps=2)  # interleaved: scattered tables
    shared = Sequence.of(scattered[3].token_ids[:16] + prompts([7], seed=5)[0])  # its first 4 blocks hit
    fresh = Sequence.of(prompts([6], seed=6)[0])
    pool.allocate(shared)
    assert shared.computed_tokens == 16
    run_batch(runner, pool, [fresh], chunk_tokens=64, decode_steps=0)
    fresh.token_ids.append(3)
    pool.append_slot(fresh)
    for seq in scattered:
        seq.token_ids.append(5)
        copy = pool.append_slot(seq)
        assert copy is None
    work = [Work(scattered[0], 1), Work(fresh, 1), Work(shared, shared.pending_tokens)]
    work += [Work(seq, 1) for seq in scattered[1:]]
    batch = runner.prepare(work)
    runs = [part.blocks is not None for part in batch.slices]
    assert runs == [False, True, False, False, False, False]
    chunk_in_kernel = prefill_kernel and window is None  # its context, 23 tokens, exceeds 6
    in_kernel = [decode_kernel, decode_kernel, chunk_in_kernel] + [decode_kernel] * 3
    assert [part.kernel for part in batch.slices] == in_kernel
    gathered = [
        block
        for item, kernel in zip(work, in_kernel, strict=True)
        if item.seq is not fresh and not kernel
        for block in item.seq.block_table[: pool.blocks_for(len(item.seq))]
    ]
    assert (batch.gathered.tolist() if batch.gathered is not None else []) == gathered
    if decode_kernel:
        assert batch.decode is not None
        assert batch.decode.rows.tolist() == [0, 1] + [2 + shared.pending_tokens + i for i in range(3)]
        assert batch.decode.lens.tolist() == [len(item.seq) for item in work if item.seq is not shared]
    else:
        assert batch.decode is None
    if chunk_in_kernel:
        assert batch.prefill is not None
        assert (batch.prefill.firsts.tolist(), batch.prefill.news.tolist()) == ([2], [shared.pending_tokens])
        assert batch.prefill.starts.tolist() == [16]
    else:
        assert batch.prefill is None
    out = runner.forward(batch)
    for row, item in enumerate(work):
        torch.testing.assert_close(
            out[row], reference_logits(model, item.seq.token_ids), atol=TOLERANCE, rtol=0
        )
