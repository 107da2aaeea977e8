"""The cached-vs-recomputed check on the real default model (SmolLM2-135M-Instruct, fp32,
CPU): a chat of more than 512 tokens whose second turn reuses the first turn's KV through a
real daemon, over shared memory and gRPC. Prints TTFT with reuse and with recomputation."""

from __future__ import annotations

import pytest
import torch
from turn_events import collect_turn

from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker.decoding import IncrementalDetokenizer
from inference_worker.model_store import LoadedModel, default_model_dir, load_model
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from inference_worker.turn_types import KVSource, SamplingParams, TurnInput, TurnStats
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(300)

CHUNK_TOKENS = 64
ANSWER_TOKENS = 32
LOGITS_TOLERANCE = 1e-4
DOCUMENT = """\
The lighthouse on the northern headland was built in 1871, after three ships were lost on
the reef in a single winter. Its first keeper, a former ship's carpenter named Elias Brandt,
kept a log of every vessel that passed, the weather at each watch, and the amount of oil
burned each night. The tower is thirty-two metres tall and made of local granite, hauled up
the cliff path on sledges pulled by oxen. The original lens, a first-order Fresnel lens made
in Paris, weighed nearly four tonnes and floated on a bath of mercury so that a single
clockwork mechanism could turn it. The keeper had to wind that mechanism every four hours.
In 1908 the oil lamp was replaced by an incandescent paraffin burner, which tripled the
range of the light. Electricity arrived only in 1954, when a cable was laid along the
headland; until then the keepers grew their own vegetables and kept goats, because the road
to the village was often closed by snow for weeks. During the storm of 1927 the sea broke
two windows in the lantern room, and the keeper's daughter, Marta, held a canvas over the
gap for most of the night so that the flame would not go out. The light was automated in
1989 and the last keepers left the following spring. Today the cottages house a small
museum with the logbooks, the old clockwork, and a collection of objects washed up on the
shore over a century and a half: bottles, buoys, a ship's bell, and a wooden figurehead
that nobody has ever identified. Volunteers still climb the tower once a month to clean the
lens, and on clear nights the beam can be seen from forty kilometres out at sea.
The logbooks are the museum's most precious possession. They fill forty-one volumes, bound
in green cloth, and record not only ships and weather but also births, weddings and
quarrels in the keepers' families, the price of paraffin, and the arrival of the first
motor car on the headland road in 1923. Historians from the university have used them to
reconstruct a century of storms on this coast, and a local choir once set a page of Elias
Brandt's entries to music. Visitors may read copies in the reading room; the originals are
kept in a cool, dark cabinet and are taken out only once a year, on the anniversary of the
first lighting.
"""
FIRST_QUESTION = "Retell the history of this lighthouse in your own words, in detail."
SECOND_QUESTION = "What did Marta do during the storm, and why did it matter?"


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    return load_model(default_model_dir(), torch.float32, "cpu")


async def run_turn(
    engine: TurnEngine, prompt: list[int], source: KVSource | None
) -> tuple[list[int], TurnStats]:
    turn = TurnInput(prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=ANSWER_TOKENS))
    return await collect_turn(engine.run_turn(turn, source))


def second_prompt(model: LoadedModel, first_prompt: list[int], answer: list[int]) -> list[int]:
    """Turn 2's prompt at the token level, as a scheduler keeping the token history builds it:
    history, the end of the answer, the next user message, the assistant's header."""
    tokenizer = model.tokenizer
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    history = first_prompt + answer + ([] if answer[-1] == end_of_turn else [end_of_turn])
    follow_up = f"\n<|im_start|>user\n{SECOND_QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    return history + tokenizer.encode(follow_up, add_special_tokens=False)


@pytest.mark.parametrize("use_shm", [True, False], ids=["shm", "grpc"])
async def test_cached_turn_matches_recompute_on_the_real_model(
    smollm2: LoadedModel, daemon: DaemonProcess, use_shm: bool
) -> None:
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"{DOCUMENT}\n{FIRST_QUESTION}"},
    ]
    first_prompt = list(
        smollm2.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    async with AsyncKVStoreClient(daemon.address, use_shm=use_shm) as client:
        assert await client.open_shm() is use_shm
        engine = TurnEngine(smollm2, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
        source = await engine.namespace_for(b"tenant")
        answer, first = await run_turn(engine, first_prompt, source)
        assert first.saved_chunks == (len(first_prompt) + len(answer) - 1) // CHUNK_TOKENS
        await engine.drain_saves()
        prompt = second_prompt(smollm2, first_prompt, answer)
        assert len(prompt) > 8 * CHUNK_TOKENS

        cached = await engine.prefiller.prefill(prompt, source)
        recomputed = await engine.prefiller.prefill(prompt, None)
        max_diff = (cached.logits - recomputed.logits).abs().max().item()
        assert cached.reused_tokens == first.saved_chunks * CHUNK_TOKENS and cached.fallback is None
        assert max_diff <= LOGITS_TOLERANCE

        tokens, stats = await run_turn(engine, prompt, source)
        reference, reference_stats = await run_turn(engine, prompt, None)
        assert stats.reused_tokens == cached.reused_tokens and stats.fallback is None
        assert tokens == reference and len(tokens) == ANSWER_TOKENS
        await engine.drain_saves()
    print(
        f"\n[{'shm' if use_shm else 'grpc'}] prompt {len(prompt)} tokens, reused {stats.reused_tokens}; "
        f"max |logits diff| {max_diff:.2e}; TTFT cached {stats.ttft_seconds * 1000:.1f} ms "
        f"(KV load {stats.kv_load_seconds * 1000:.1f} ms, exposed {stats.kv_load_exposed_seconds * 1000:.1f} ms, "
        f"compute {stats.compute_seconds * 1000:.1f} ms) vs recompute {reference_stats.ttft_seconds * 1000:.1f} ms "
        f"= {reference_stats.ttft_seconds / stats.ttft_seconds:.1f}x; answer {smollm2.tokenizer.decode(tokens)!r}"
    )


def test_incremental_detokenization_reassembles_the_text(smollm2: LoadedModel) -> None:
    tokenizer = smollm2.tokenizer
    text = "Grüße aus 東京 🙂, naïve café — done.<|im_end|>"
    tokens = tokenizer.encode(text, add_special_tokens=False)
    prompt = tokenizer.encode("Say hello.", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [detokenizer.add(token, final=index == len(tokens) - 1) for index, token in enumerate(tokens)]
    assert "".join(pieces) == tokenizer.decode(tokens, skip_special_tokens=True)
    assert "\ufffd" not in "".join(pieces)
