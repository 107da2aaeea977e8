"""Turns through a real daemon on a tiny random-weight Llama: the second turn of a
conversation reuses the first turn's saved KV and gives what full recomputation gives
(last-token logits within 1e-4, the same 32 greedy tokens), over shared memory and gRPC;
any failure of the cache path (daemon killed, chunk corrupt, daemon frozen past the
deadline) falls back to recomputation with the same tokens."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Sequence

import grpc
import pytest
from turn_events import collect_turn, random_tokens

from attnstore.chunks.keys import chunk_key_chain
from attnstore.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from attnstore.kvstore_client import AsyncKVStoreClient, LookupResult
from attnstore.shm_arena import SharedArena
from inference_worker.model_store import LoadedModel
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import Fallback, KVSource, SamplingParams, TurnInput, TurnStats
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(120)

CHUNK_TOKENS = 16
FIRST_PROMPT_TOKENS = 40
ANSWER_TOKENS = 32
NEW_TOKENS = 20
# Turn 1 saves the chunks its KV covers: 40 prompt + 31 fed-back answer tokens = 4 full
# chunks, and the partial fifth (7 tokens) for a next turn that knows where history ends.
SAVED_CHUNKS = (FIRST_PROMPT_TOKENS + ANSWER_TOKENS - 1) // CHUNK_TOKENS
HISTORY_TOKENS = FIRST_PROMPT_TOKENS + ANSWER_TOKENS
LOGITS_TOLERANCE = 1e-4


async def run_turn(
    engine: TurnEngine, prompt: Sequence[int], source: KVSource | None, history_tokens: int = 0
) -> tuple[list[int], TurnStats]:
    turn = TurnInput(
        prompt_token_ids=list(prompt),
        sampling=SamplingParams(max_tokens=ANSWER_TOKENS),
        history_tokens=history_tokens,
    )
    return await collect_turn(engine.run_turn(turn, source))


async def first_turn(engine: TurnEngine, source: KVSource) -> list[int]:
    """Runs turn 1 (nothing cached), waits for its saves; turn 2's prompt, which extends it."""
    prompt = random_tokens(FIRST_PROMPT_TOKENS, seed=1)
    answer, stats = await run_turn(engine, prompt, source)
    assert len(answer) == ANSWER_TOKENS and stats.finish_reason == "length"
    assert stats.reused_tokens == 0 and stats.fallback is None
    assert stats.saved_chunks == SAVED_CHUNKS  # full ones; the partial one is saved too, uncounted
    await engine.drain_saves()
    return prompt + answer + random_tokens(NEW_TOKENS, seed=2)


async def prefill_matches_recompute(engine: TurnEngine, prompt: list[int], source: KVSource) -> None:
    """The prompt's prefill reuses the first turn's saved full chunks, and its last-token
    logits are recomputation's."""
    cached = await engine.prefiller.prefill(prompt, source)
    recomputed = await engine.prefiller.prefill(prompt, None)
    assert cached.reused_tokens == SAVED_CHUNKS * CHUNK_TOKENS and cached.fallback is None
    assert (cached.logits - recomputed.logits).abs().max().item() <= LOGITS_TOLERANCE


async def turn_matches_recompute(
    engine: TurnEngine, prompt: list[int], source: KVSource
) -> tuple[TurnStats, TurnStats]:
    """The turn with the stored KV gives recomputation's greedy tokens, reusing the saved full
    chunks; returns its stats and recomputation's."""
    tokens, stats = await run_turn(engine, prompt, source)
    reference, reference_stats = await run_turn(engine, prompt, None)
    assert tokens == reference and len(tokens) == ANSWER_TOKENS
    assert stats.reused_tokens == SAVED_CHUNKS * CHUNK_TOKENS and stats.fallback is None
    return stats, reference_stats


@pytest.mark.parametrize("use_shm", [True, False], ids=["shm", "grpc"])
async def test_second_turn_reuses_kv_and_matches_recompute(
    tiny_model: LoadedModel, daemon: DaemonProcess, use_shm: bool
) -> None:
    async with AsyncKVStoreClient(daemon.address, use_shm=use_shm) as client:
        assert await client.open_shm() is use_shm
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
        source = await engine.namespace_for(b"tenant-a")
        prompt = await first_turn(engine, source)

        await prefill_matches_recompute(engine, prompt, source)

        stats, reference_stats = await turn_matches_recompute(engine, prompt, source)
        assert stats.reused_dram_chunks == SAVED_CHUNKS and stats.reused_ssd_chunks == 0
        assert stats.prompt_tokens == len(prompt) and stats.generated_tokens == ANSWER_TOKENS
        assert 0 < stats.ttft_seconds and 0 <= stats.kv_load_exposed_seconds <= stats.kv_load_seconds
        assert stats.saved_chunks == (len(prompt) + ANSWER_TOKENS - 1) // CHUNK_TOKENS - SAVED_CHUNKS
        assert reference_stats.reused_tokens == 0 and reference_stats.saved_chunks == 0

        # Another tenant's namespace shares nothing.
        other = await engine.namespace_for(b"tenant-b")
        assert other.namespace != source.namespace
        assert (await engine.prefiller.prefill(prompt, other)).reused_tokens == 0
        await engine.drain_saves()


@pytest.mark.parametrize("use_shm", [True, False], ids=["shm", "grpc"])
async def test_the_next_turn_also_reuses_the_partial_chunk_that_ends_the_history(
    tiny_model: LoadedModel, daemon: DaemonProcess, use_shm: bool
) -> None:
    """Told where the history ends, turn 2 loads turn 1's partial last chunk after the full
    ones, so it recomputes only the new tokens (and the answer's last token, whose KV turn 1
    never computed); it gives what recomputation gives, and the tail it read is replaced by
    the full chunk over it."""
    async with AsyncKVStoreClient(daemon.address, use_shm=use_shm) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
        source = await engine.namespace_for(b"tenant-a")
        prompt = await first_turn(engine, source)

        cached = await engine.prefiller.prefill(prompt, source, history_tokens=HISTORY_TOKENS)
        recomputed = await engine.prefiller.prefill(prompt, None)
        assert cached.reused_tokens == HISTORY_TOKENS - 1 and cached.fallback is None
        assert (cached.logits - recomputed.logits).abs().max().item() <= LOGITS_TOLERANCE
        # A history end that is not where turn 1 stopped names another tail: no such chunk.
        elsewhere = await engine.prefiller.prefill(prompt, source, history_tokens=HISTORY_TOKENS - 3)
        assert elsewhere.reused_tokens == SAVED_CHUNKS * CHUNK_TOKENS

        tokens, stats = await run_turn(engine, prompt, source, HISTORY_TOKENS)
        reference, _ = await run_turn(engine, prompt, None)
        assert tokens == reference and stats.fallback is None
        assert stats.reused_tokens == HISTORY_TOKENS - 1
        assert stats.reused_dram_chunks == SAVED_CHUNKS + 1
        await engine.drain_saves()
        keys = chunk_key_chain(source.namespace, prompt, CHUNK_TOKENS)
        assert (
            await client.lookup(source.namespace, keys[: SAVED_CHUNKS + 1])
        ).prefix_length == SAVED_CHUNKS + 1
        again = await engine.prefiller.prefill(prompt, source, history_tokens=HISTORY_TOKENS)
        assert again.reused_tokens == SAVED_CHUNKS * CHUNK_TOKENS  # the tail read once is gone


async def test_a_turn_right_after_the_first_waits_for_its_saves(
    tiny_model: LoadedModel, daemon: DaemonProcess
) -> None:
    """No drain between the turns: the second turn's lookup waits for the first turn's saves
    in flight instead of missing them and recomputing. The wait is bounded by
    `layer_timeout_seconds` (2 s by default, which a save on a machine at load 14 outlasted):
    generous here, since the property is that the lookup waits at all."""
    async with AsyncKVStoreClient(daemon.address) as client:
        settings = WorkerSettings(chunk_tokens=CHUNK_TOKENS, layer_timeout_seconds=120.0)
        engine = TurnEngine(tiny_model, client, settings)
        source = await engine.namespace_for(b"tenant-a")
        prompt = random_tokens(FIRST_PROMPT_TOKENS, seed=1)
        answer, first = await run_turn(engine, prompt, source)
        assert first.saved_chunks == SAVED_CHUNKS
        _, second = await run_turn(engine, prompt + answer + random_tokens(NEW_TOKENS, seed=2), source)
        assert second.reused_tokens == SAVED_CHUNKS * CHUNK_TOKENS and second.fallback is None
        await engine.drain_saves()


async def test_daemon_killed_before_the_second_turn(tiny_model: LoadedModel, daemon: DaemonProcess) -> None:
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
        source = await engine.namespace_for(b"tenant")
        prompt = await first_turn(engine, source)
        daemon.kill9()

        tokens, stats = await run_turn(engine, prompt, source)
        reference, _ = await run_turn(engine, prompt, None)
        assert stats.fallback is Fallback.DAEMON_UNAVAILABLE and stats.reused_tokens == 0
        assert tokens == reference
        await engine.drain_saves()  # the saves fail, logged, without raising


def corrupt_last_byte(daemon: DaemonProcess, namespace: bytes, key: bytes) -> None:
    """Flips the chunk's last byte in the daemon's DRAM arena, as a memory fault would: the
    daemon does not notice, every reader's checksum check of the last layer does."""
    with grpc.insecure_channel(daemon.address) as channel:
        stub = kvstore_pb2_grpc.KVStoreStub(channel)
        arena_file = stub.OpenShm(kvstore_pb2.OpenShmRequest())
        located = stub.GetShm(kvstore_pb2.GetShmRequest(namespace=namespace, keys=[key]))
        arena = SharedArena(daemon.shm_dir / os.path.basename(arena_file.path), arena_file.size_bytes)
        try:
            offset, length = (
                located.chunks[0].extents[-1].offset_bytes,
                located.chunks[0].extents[-1].length_bytes,
            )
            arena.view[offset + length - 1] ^= 0xFF
        finally:
            arena.close()
            stub.ReleaseLease(kvstore_pb2.ReleaseLeaseRequest(lease_ids=[located.lease_id]))


@pytest.mark.parametrize("client_verifies", [True, False], ids=["client-verifies", "loader-verifies"])
@pytest.mark.parametrize("use_shm", [True, False], ids=["shm", "grpc"])
async def test_corrupt_chunk_is_recomputed_and_replaced(
    tiny_model: LoadedModel, daemon: DaemonProcess, use_shm: bool, client_verifies: bool
) -> None:
    """The worker's own client does not verify (its prefix loader checks the copies it
    makes); either check alone catches the damage."""
    async with AsyncKVStoreClient(
        daemon.address, use_shm=use_shm, verify_checksums=client_verifies
    ) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
        source = await engine.namespace_for(b"tenant")
        prompt = await first_turn(engine, source)
        keys = chunk_key_chain(source.namespace, prompt, source.chunk_tokens)
        corrupt_last_byte(daemon, source.namespace, keys[SAVED_CHUNKS - 1])

        tokens, stats = await run_turn(engine, prompt, source)
        reference, _ = await run_turn(engine, prompt, None)
        assert stats.fallback is Fallback.CHUNK_INVALID and stats.reused_tokens == 0
        assert tokens == reference

        # The turn's save replaced the bad chunk: the next turn reuses again.
        await engine.drain_saves()
        again, stats = await run_turn(engine, prompt, source)
        assert stats.fallback is None and stats.reused_tokens >= SAVED_CHUNKS * CHUNK_TOKENS
        assert again == reference
        await engine.drain_saves()


class FreezesDaemonAfterLookup(AsyncKVStoreClient):
    """Stops the daemon process (SIGSTOP) right after a lookup answered: the daemon has the
    chunks but serves them too late."""

    def __init__(self, daemon: DaemonProcess, **kwargs: object) -> None:
        super().__init__(daemon.address, **kwargs)  # type: ignore[arg-type]
        self.daemon = daemon
        self.freeze = False

    async def lookup(self, namespace: bytes, keys: Sequence[bytes], *, promote: bool = False) -> LookupResult:
        result = await super().lookup(namespace, keys, promote=promote)
        if self.freeze and self.daemon.pid is not None:
            os.kill(self.daemon.pid, signal.SIGSTOP)
        return result


async def test_frozen_daemon_past_the_deadline(tiny_model: LoadedModel, daemon: DaemonProcess) -> None:
    async with FreezesDaemonAfterLookup(daemon, timeout_seconds=5.0) as client:
        engine = TurnEngine(
            tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS, layer_timeout_seconds=0.3)
        )
        source = await engine.namespace_for(b"tenant")
        prompt = await first_turn(engine, source)

        client.freeze = True
        try:
            tokens, stats = await run_turn(engine, prompt, source)
        finally:
            assert daemon.pid is not None
            os.kill(daemon.pid, signal.SIGCONT)
        reference, _ = await run_turn(engine, prompt, None)
        assert stats.fallback is Fallback.DEADLINE and stats.reused_tokens == 0
        assert stats.kv_load_exposed_seconds >= 0.3
        assert tokens == reference
        await engine.drain_saves()


async def test_a_daemon_down_at_registration_is_registered_later(
    tiny_model: LoadedModel, daemon: DaemonProcess
) -> None:
    daemon.kill9()
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
        engine.namespaces.retry_seconds = 0.0
        source = await engine.namespace_for(b"tenant")  # does not fail
        prompt = random_tokens(FIRST_PROMPT_TOKENS, seed=1)
        tokens, stats = await run_turn(engine, prompt, source)
        assert stats.fallback is Fallback.DAEMON_UNAVAILABLE
        await engine.drain_saves()

        daemon.start()  # same port
        deadline = time.monotonic() + 20
        while not await engine.namespaces.ensure_registered(source):  # the channel reconnects
            assert time.monotonic() < deadline, "the namespace never got registered"
            await asyncio.sleep(0.05)
        again, stats = await run_turn(engine, prompt, source)
        assert again == tokens and stats.fallback is None and stats.saved_chunks == SAVED_CHUNKS
        await engine.drain_saves()
        _, stats = await run_turn(engine, prompt, source)
        assert stats.reused_tokens == 2 * CHUNK_TOKENS  # the reusable part of a 40-token prompt
        await engine.drain_saves()
