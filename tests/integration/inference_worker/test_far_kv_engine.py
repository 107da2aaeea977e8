"""A sequence whose oldest KV lies on another worker (a real worker process on a loopback
port) runs inside the engine's batched steps beside an ordinary sequence: its far part
prefilled segment by segment in the engine's steps (far_prefill.py) while the other
sequence decodes in the same forward passes, then uploaded to the peers; its newest tokens
in the pool, prefilled in chunks and decoded in the same forward passes as the other
sequence's (the engine's batch metric), their attention merged with the peer's partials.
Both give the logits of a plain forward of their whole sequence (1e-4, fp32).
A peer killed mid-decode: the engine hands the sequence back, its far KV is placed again
on the peer left, and the logits stay those of the plain forward. DGFM recalling the far
KV home (before the near part's prefill, and between two decode steps) changes no logit
either."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from plain_logits import assert_plain_logits
from running_workers import running_workers
from transformers import AutoModelForCausalLM, PreTrainedModel

from inference_worker.dist_attention.context import LongContext
from inference_worker.dist_attention.dgfm import DebtSwaps
from inference_worker.dist_attention.far_prefill import place_far
from inference_worker.dist_attention.held_kv import HeldKV
from inference_worker.dist_attention.limits import MicroAttentionLimits
from inference_worker.dist_attention.long_settings import DgfmSettings
from inference_worker.dist_attention.remote import PeerChannels, RemoteSegment, peer_channel
from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.dist_attention.segment import RecalledSegment
from inference_worker.engine.attention import PagedKV
from inference_worker.engine.block_pool import BlockPool
from inference_worker.engine.engine import Engine, StepOutput
from inference_worker.engine.model_runner import Batch, PagedModelRunner
from inference_worker.engine.sequence import Sequence
from inference_worker.launcher import WorkerProcess
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import LoadedModel

BLOCK = 4
LIMITS = {"max_held_bytes": 4 << 20, "max_query_tokens": 64, "max_inflight_key_tokens": 4096}
NEAR_TOKENS = 48  # what the far sequence keeps in the pool (room for its new tokens included)
NEW_TOKENS = 6
PLAIN_NEW_TOKENS = 60  # the plain sequence decodes while the far part is prefilled (5+ steps)


PEERS = {name: {"micro_attention": LIMITS} for name in ("peer-a", "peer-b")}


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory, tiny_model: LoadedModel) -> Iterator[list[WorkerProcess]]:
    with running_workers(tmp_path_factory.mktemp("peers"), tiny_model.model_dir, PEERS) as started:
        yield list(started.values())


@pytest.fixture
def doomed_peers(tmp_path: Path, tiny_model: LoadedModel) -> Iterator[list[WorkerProcess]]:
    """Peers of one test, which kills one."""
    with running_workers(tmp_path, tiny_model.model_dir, PEERS) as started:
        yield list(started.values())


def make_engine(model: PreTrainedModel, blocks: int) -> Engine:
    kv = PagedKV(ModelGeometry.of(model.config), blocks, BLOCK, torch.float32, torch.device("cpu"))
    return Engine(
        PagedModelRunner(model, kv), BlockPool(blocks, BLOCK), max_batch_tokens=24, max_batch_sequences=8
    )


async def far_sequence(
    engine: Engine, model: PreTrainedModel, peers: list[WorkerProcess], prompt: list[int], home: str = ""
) -> Sequence:
    """`prompt`'s oldest KV prefilled in `engine`'s steps and placed on `peers` (room for
    80 tokens each, segments of 24: on both), its newest tokens as an engine sequence with
    that KV as its far part."""
    channels = {p.address: peer_channel(p.address) for p in peers}
    for channel in channels.values():  # as a worker's first DescribeLending would: at load 14 a
        grpc.channel_ready_future(channel).result(timeout=60)  # first AppendKV's handshake timed out
    context = LongContext(
        DistributedRunner(model), channels, lambda: dict.fromkeys(channels, 80),
        local_tokens=NEAR_TOKENS, segment_tokens=24, chunk_tokens=16, timeout_seconds=5.0, home=home,
    )  # fmt: skip
    start = await place_far(engine, context, prompt, NEW_TOKENS)
    assert start == len(prompt) + NEW_TOKENS - NEAR_TOKENS
    return Sequence.of(prompt[start:], bytes(range(16)), positions=list(range(start, len(prompt))),
                       far=context, max_new_tokens=NEW_TOKENS)  # fmt: skip


async def generate(engine: Engine, seq: Sequence, on_output=None) -> list[StepOutput]:
    """Greedy outputs of `seq`; a sequence handed back (its far KV lost) is placed again
    and resubmitted, as long_turn.py does."""
    outputs = []
    async with contextlib.aclosing(engine.generate(seq)) as stream:
        async for output in stream:
            if output.preempted:
                context: LongContext = seq.far  # type: ignore[assignment]
                await place_far(engine, context, context.token_ids, NEW_TOKENS)
                engine.submit(seq)
                continue
            outputs.append(output)
            if on_output is not None:
                on_output(len(outputs))
    engine.release(seq)
    return outputs


async def test_far_part_prefilled_and_decoded_in_the_steps_of_a_decoding_sequence(
    tiny_model: LoadedModel, peers: list[WorkerProcess]
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(3)
    long_prompt = torch.randint(0, 300, (150,), generator=generator).tolist()
    short_prompt = torch.randint(0, 300, (20,), generator=generator).tolist()
    engine = make_engine(model, blocks=32)  # 128 tokens: the whole long sequence would not fit
    plain = Sequence.of(short_prompt, max_new_tokens=PLAIN_NEW_TOKENS)
    far_start = 150 + NEW_TOKENS - NEAR_TOKENS
    shared: list[bool] = []  # per step: the far part prefilled while the plain sequence decodes

    def watch(layer: int, hidden: torch.Tensor, batch: Batch) -> None:
        if layer == 0:
            rows = {seq: part.rows for seq, part in zip(batch.seqs, batch.slices, strict=True)}
            far_rows = [
                r for seq, r in rows.items() if seq is not plain and int(batch.positions[r].min()) < far_start
            ]
            shared.append(plain in rows and rows[plain].stop - rows[plain].start == 1 and bool(far_rows))

    engine.runner.layer_input_hook = watch

    decoding = asyncio.Event()

    async def long_turn() -> tuple[Sequence, list[StepOutput]]:
        await decoding.wait()  # placed from the plain sequence's first token on: 59 decode steps left
        far = await far_sequence(engine, model, peers, long_prompt)
        return far, await generate(engine, far)

    try:
        (far, far_outputs), plain_outputs = await asyncio.gather(
            long_turn(), generate(engine, plain, on_output=lambda _: decoding.set())
        )
    finally:
        await engine.close()
    context: LongContext = far.far  # type: ignore[assignment]
    remote = [p for p in context.places if isinstance(p, RemoteSegment)]
    context.close()
    assert sum(p.tokens for p in remote) == far_start
    assert_plain_logits(model, long_prompt, far_outputs, NEW_TOKENS)
    assert_plain_logits(model, short_prompt, plain_outputs, PLAIN_NEW_TOKENS)
    assert any(shared)  # the far part's prefill ran in the plain sequence's decode steps
    assert engine.stats.max_batch_sequences == 2  # they ran in the same forward passes
    assert all(p.traffic.remote_calls > 0 for p in remote)  # the peers computed their partials
    assert engine.pool.usage().used == 0


async def test_a_killed_peer_hands_the_sequence_back_and_it_is_placed_again(
    tiny_model: LoadedModel, doomed_peers: list[WorkerProcess]
) -> None:
    peers = doomed_peers
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    prompt = torch.randint(0, 300, (100,), generator=torch.Generator().manual_seed(4)).tolist()
    engine = make_engine(model, blocks=16)
    far = await far_sequence(engine, model, peers, prompt)
    context: LongContext = far.far  # type: ignore[assignment]
    assert {p.address for p in context.places if isinstance(p, RemoteSegment)} == {p.address for p in peers}
    try:
        outputs = await generate(engine, far, on_output=lambda n: n == 2 and peers[0].kill9())
        holders = {p.address for p in context.places if isinstance(p, RemoteSegment)}
    finally:
        await engine.close()
        context.close()
    assert_plain_logits(model, prompt, outputs, NEW_TOKENS)
    assert context.lost == {peers[0].address} and context.recomputations == 1
    assert holders == {peers[1].address}


async def test_a_peer_killed_during_the_far_prefill_is_left_out(
    tiny_model: LoadedModel, doomed_peers: list[WorkerProcess]
) -> None:
    """The peer holding the first segment dies while the engine prefills the second one
    over it: the staging sequence is handed back and the far part placed again, all on
    the peer left."""
    peers = {p.address: p for p in doomed_peers}
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    prompt = torch.randint(0, 300, (100,), generator=torch.Generator().manual_seed(6)).tolist()
    engine = make_engine(model, blocks=16)
    killed: list[str] = []

    def kill_first_holder(layer: int, hidden: torch.Tensor, batch: Batch) -> None:
        contexts = [seq.far for seq in batch.seqs if isinstance(seq.far, LongContext) and seq.far.places]
        if layer == 0 and contexts and not killed:
            killed.append(contexts[0].places[0].address)  # type: ignore[attr-defined]
            peers[killed[0]].kill9()

    engine.runner.layer_input_hook = kill_first_holder
    try:
        far = await far_sequence(engine, model, doomed_peers, prompt)
        engine.runner.layer_input_hook = None
        context: LongContext = far.far  # type: ignore[assignment]
        holders = {p.address for p in context.places if isinstance(p, RemoteSegment)}
        outputs = await generate(engine, far)
    finally:
        await engine.close()
    context.close()
    assert_plain_logits(model, prompt, outputs, NEW_TOKENS)
    assert len(killed) == 1 and context.lost == set(killed) and context.recomputations == 1
    assert holders == set(peers) - set(killed)


async def test_far_kv_recalled_home_between_steps_changes_no_logit(
    tiny_model: LoadedModel, peers: list[WorkerProcess]
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    prompt = torch.randint(0, 300, (150,), generator=torch.Generator().manual_seed(5)).tolist()
    engine = make_engine(model, blocks=32)
    far = await far_sequence(engine, model, peers, prompt, home="home")
    context: LongContext = far.far  # type: ignore[assignment]
    held = HeldKV(MicroAttentionLimits(), node="home")
    swaps = DebtSwaps(held, DgfmSettings(), PeerChannels(None), 10)
    far_bytes = sum(p.nbytes for p in context.places if isinstance(p, RemoteSegment))
    moved: list[int] = []

    def recall(outputs: int) -> None:  # waits for the engine's step to end (context.frozen)
        if outputs == 2:
            moved.append(swaps.recall(peers[1].address, 1 << 30))

    try:
        with swaps.live(context):
            moved.append(swaps.recall(peers[0].address, 1 << 30))  # before the prefill: its queries too
            outputs = await generate(engine, far, on_output=recall)
        kinds = {type(p) for p in context.places}
    finally:
        await engine.close()
        context.close()
    assert_plain_logits(model, prompt, outputs, NEW_TOKENS)
    assert sum(moved) == far_bytes and kinds == {RecalledSegment}
    assert held.held_bytes == 0  # released with the sequence
