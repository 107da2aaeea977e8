"""A lender worker killed while its node's daemon lives: the segments it held are attached
again through another lender worker reading that daemon (lender_siblings.py, remote.py's
`_move`), nothing recomputed.

A sequence whose home is this test process ("home") keeps its oldest KV on lender worker
"a"; "a" and "b" lend through one daemon (one node), which is in the pool's ledger (a
private Redis), and both list themselves there as lenders. The home learned only "a" (its
placement asked "a" alone) and finds "b" in the ledger. "a" is killed (-9) and not
restarted: the next decode steps fail at once on "a", attach its segments on "b" from the
daemon's chunks (digests checked) and go on within 1e-4 of the plain forward, with no
recomputation and no peer lost; "b" holds them for home. "b" killed too, no lender is left
on the node: the existing fallback applies (the peer lost, the context re-planned over the
peers left; none here: UNAVAILABLE), never an answer without that KV. Both ways of placing: appended (the lender put the chunks) and attached (the home
did). And through ExecuteTurn: a home worker's turn over both lenders, "a" killed while it
decodes, answers with the greedy tokens of plain forwards (up to its EOS), its segments
moved to "b"."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import torch
from far_kv_checks import decode, lending, plain_greedy, run_turn
from polling import poll
from running_workers import running_workers
from test_attach_pool import (
    CHUNK_TOKENS,
    KV_BYTES_PER_TOKEN,
    LOCAL_TOKENS,
    NEW_TOKENS,
    PROMPT_TOKENS,
    SEGMENT_TOKENS,
    daemon_in_the_ledger,
    lender_settings,
)
from transformers import AutoModelForCausalLM

from attnstore.pool_lenders import publish_lender
from attnstore.worker.v1 import micro_attention_pb2 as mpb
from inference_worker.dist_attention.attach import ChunkAttacher
from inference_worker.dist_attention.context import ContextUnavailable, LongContext
from inference_worker.dist_attention.ledger_room import LedgerRoom
from inference_worker.dist_attention.lender_siblings import LenderSiblings
from inference_worker.dist_attention.remote import PeerChannels, RemoteSegment, peer_channel
from inference_worker.dist_attention.runner import DistributedRunner
from inference_worker.model_store import LoadedModel
from kvstore_daemon.launcher import DaemonProcess

TIMEOUT_SECONDS = 5.0  # the home's wait for a peer call: bounds the fallback's wait on a dead one


def listed_lender(daemon: DaemonProcess, redis_url: str, attach: bool) -> dict[str, object]:
    """A worker lending through `daemon` (test_attach_pool's) that lists itself in the ledger."""
    settings = lender_settings(daemon, attach=attach)
    settings["long_context"] = {**settings["long_context"], "pool_redis_url": redis_url}  # type: ignore[dict-item]
    return settings


@pytest.mark.parametrize("attach", [False, True], ids=["appended", "attached"])
def test_a_dead_lenders_segments_move_to_another_lender_on_its_daemon(
    pool: tuple[str, Path], tiny_model: LoadedModel, attach: bool
) -> None:
    redis_url, root = pool
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    with daemon_in_the_ledger(redis_url, root) as daemon:
        lenders = {name: listed_lender(daemon, redis_url, attach) for name in ("a", "b")}
        with running_workers(root, tiny_model.model_dir, lenders) as started:
            a, b = started["a"].address, started["b"].address
            channels = PeerChannels(None)
            ledger = LedgerRoom(redis_url, timeout_seconds=10)
            pool_daemon = lending(channels[a]).pool_daemon
            assert pool_daemon and lending(channels[b]).pool_daemon == pool_daemon  # one daemon, one node
            poll(lambda: ledger.lenders_on(pool_daemon, "home") == sorted([a, b]), "both lenders listed")
            siblings = LenderSiblings(ledger, "home")
            siblings.learn(a, lending(channels[a]))  # "b" is not asked: the ledger names it
            attacher = None
            if attach:
                attacher = ChunkAttacher(None, None, chunk_tokens=CHUNK_TOKENS, timeout_seconds=10)
                attacher.learn(a, lending(channels[a]))
            context = LongContext(DistributedRunner(model), channels, lambda: {a: 400}, local_tokens=LOCAL_TOKENS,
                                  segment_tokens=SEGMENT_TOKENS, chunk_tokens=CHUNK_TOKENS,
                                  timeout_seconds=TIMEOUT_SECONDS, home="home", attacher=attacher,
                                  siblings=siblings)  # fmt: skip
            prompt = torch.randint(0, 300, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(41))
            logits = decode(model, context, context.prefill(prompt.tolist(), NEW_TOKENS), steps=2)
            remote = [p for p in context.places if isinstance(p, RemoteSegment)]
            assert len(remote) == 3 and {p.address for p in remote} == {a}
            debt = sum(p.nbytes for p in remote)

            started["a"].kill9()  # not restarted: its daemon still holds the segments' chunks
            logits = decode(model, context, logits, steps=3)
            assert context.recomputations == 0 and context.lost == set()
            assert {p.address for p in context.places if isinstance(p, RemoteSegment)} == {b}
            assert {(e.home, e.bytes) for e in lending(channels[b]).held_for} == {("home", debt)}

            started["b"].kill9()  # no lender left on the node: the peer is lost, nowhere to go
            with pytest.raises(ContextUnavailable):
                context.decode(int(torch.argmax(logits)))
            assert b in context.lost
            context.close()
            channels.close()
            ledger.close()


def test_a_turn_whose_lender_dies_answers_from_another_lender_on_its_daemon(
    pool: tuple[str, Path], tiny_model: LoadedModel
) -> None:
    """Through ExecuteTurn: a home worker whose pool holds 256 tokens finds "a" and "b" (one
    daemon) in the ledger and places a 600-token prompt's oldest KV on both. Once the turn
    decodes, "a" is killed (-9): its segments move to "b", and the turn's 200 greedy tokens
    are those of plain forwards over the whole sequence (up to EOS, where the turn stops)."""
    redis_url, root = pool
    prompt = torch.randint(0, 300, (600,), generator=torch.Generator().manual_seed(43)).tolist()
    max_tokens = 200
    with daemon_in_the_ledger(redis_url, root) as daemon:
        lenders = {name: listed_lender(daemon, redis_url, False) for name in ("a", "b")}
        with running_workers(root, tiny_model.model_dir, lenders) as started:
            a, b = started["a"], started["b"]
            home = {"kv_memory_bytes": 256 * KV_BYTES_PER_TOKEN,
                    "long_context": {"pool_redis_url": redis_url, "segment_tokens": SEGMENT_TOKENS,
                                     "peer_timeout_seconds": 30}}  # fmt: skip
            with running_workers(root, tiny_model.model_dir, {"home": home}) as homes:
                log = homes["home"].log_path
                outcome: dict[str, object] = {}
                turn = threading.Thread(
                    target=run_turn, args=(homes["home"].address, prompt, max_tokens, outcome)
                )
                turn.start()
                poll(
                    lambda: "long_context_turn" in log.read_text(),
                    "the far part placed, decoding",
                    interval_seconds=0.02,
                )
                assert a.address in log.read_text() and b.address in log.read_text()  # both hold some
                a.kill9()
                turn.join(timeout=300)
                assert not turn.is_alive() and "error" not in outcome, outcome
                assert (
                    "far_segments_moved" in log.read_text()
                    and "dist_attention_peer_lost" not in log.read_text()
                )
            with peer_channel(b.address) as channel:
                assert lending(channel).held_bytes == 0  # released after the turn
    model = AutoModelForCausalLM.from_pretrained(tiny_model.model_dir, dtype=torch.float32).eval()
    tokens = outcome["tokens"]
    assert isinstance(tokens, list) and tokens == plain_greedy(model, prompt, max_tokens)[: len(tokens)]
    assert len(tokens) == max_tokens or tokens[-1] == tiny_model.tokenizer.eos_token_id  # stopped at EOS


def test_a_sibling_is_the_same_daemons_other_lender_never_the_home_or_another_daemons(
    pool: tuple[str, Path],
) -> None:
    """On the ledger alone: siblings come from the peers learned on the same daemon, then the
    ledger's lenders on it; never the peer itself, the home, or a lender of another daemon;
    a peer whose daemon is unknown has none."""
    redis_url = pool[0]

    async def publish() -> None:
        client = aioredis.Redis.from_url(redis_url)
        for address, daemon in (("a:1", "d1"), ("b:1", "d1"), ("home:1", "d1"), ("c:1", "d2")):
            await publish_lender(client, address, daemon, "node", 60.0)
        await client.aclose()

    asyncio.run(publish())
    ledger = LedgerRoom(redis_url, timeout_seconds=10)
    siblings = LenderSiblings(ledger, "home:1")
    siblings.learn("a:1", mpb.DescribeLendingResponse(pool_daemon="d1"))
    siblings.learn("x:1", mpb.DescribeLendingResponse(kvstore_address="d1"))  # advertised, outside the ledger
    siblings.learn("y:1", mpb.DescribeLendingResponse())  # no daemon named
    assert siblings.others("a:1") == ["x:1", "b:1"]
    assert siblings.others("b:1") == ["a:1", "x:1"]  # learned from the ledger by the call before
    assert siblings.others("y:1") == [] and siblings.others("unknown:1") == []
    ledger.close()
