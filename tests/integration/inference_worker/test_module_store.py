"""Prompt modules through a real daemon on the tiny model: a module is encoded on first use
and saved like any chunk, read back by the next prompt (same tokens as the first), re-encoded
transparently when its chunks were evicted or cannot be read, still stored after a daemon
restart (SSD tier),
encoded eagerly with progress, never read by another tenant, stored in bf16 when asked; a module is encoded after
the text that precedes it in every prompt; a scaffold answers as a full
prefill of its tokens; role tags and the generation prompt go through the chat template."""

from __future__ import annotations

import math

import pytest
import torch

from attnstore.errors import InvalidArgument
from attnstore.kvstore_client import AsyncKVStoreClient
from inference_worker import turn_types
from inference_worker.kv_saver import ChunkRun
from inference_worker.model_store import LoadedModel
from inference_worker.modules.module_kv import LayerFeed, encode_module
from inference_worker.modules.module_prompt import lay_out
from inference_worker.modules.module_store import Origin
from inference_worker.modules.pml_server import generation_prompt
from inference_worker.settings import WorkerSettings
from inference_worker.turn_engine import TurnEngine
from kvstore_daemon.launcher import DaemonProcess

pytestmark = pytest.mark.timeout(180)

CHUNK_TOKENS = 16
# A read that outlasts this re-encodes the module (by design) and changes the counts these
# tests check; on a loaded machine one read once took longer than the 5 s default.
READ_TIMEOUT = 60.0
# The same bound for a layer the forward pass waits for (a late one recomputes the prompt).
TIMEOUTS = {"module_read_timeout_seconds": READ_TIMEOUT, "layer_timeout_seconds": READ_TIMEOUT}
SCHEMA = """<schema name="library">
Reference desk notes.
<module name="doc">The lighthouse on the northern headland was built in 1871 after three ships
were lost on the reef. Its first keeper kept a log of every vessel that passed.</module>
<module name="style">Answer briefly and cite the year.</module>
</schema>"""
PROMPT = '<prompt schema="library"><doc/><style/> Who kept the log?</prompt>'


async def run(
    engine: TurnEngine, source: turn_types.KVSource, prompt: str = PROMPT
) -> tuple[list[int], turn_types.TurnStats]:
    turn = turn_types.ModuleTurnInput(SCHEMA, prompt, turn_types.SamplingParams(max_tokens=12))
    events = [event async for event in engine.modules.run(turn, source)]
    stats = events.pop()
    assert isinstance(stats, turn_types.TurnStats) and all(
        isinstance(e, turn_types.TokenEvent) for e in events
    )
    return [e.token_id for e in events], stats  # type: ignore[union-attr]


async def test_modules_are_encoded_once_then_read_and_re_encoded_when_evicted(
    tiny_model: LoadedModel, daemon: DaemonProcess
) -> None:
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS, **TIMEOUTS))
        source = await engine.namespace_for(b"tenant-a")
        first, stats = await run(engine, source)
        assert stats.encoded_modules == 3  # the root's text, doc, style
        assert stats.module_tokens > 0 and stats.reused_tokens == stats.module_tokens  # text ends the prompt
        await engine.modules.server.store.drain()
        keys = engine.modules.server.chunk_keys(source, SCHEMA)
        assert (await client.lookup(source.namespace, keys)).prefix_length == len(keys)

        again, stats = await run(engine, source)
        assert again == first and stats.encoded_modules == 0

        await client.delete(source.namespace, keys[-1:])  # evicted: one chunk of one module
        evicted, stats = await run(engine, source)
        assert evicted == first and stats.encoded_modules == 1
        await engine.modules.server.store.drain()
        assert (await client.lookup(source.namespace, keys)).prefix_length == len(keys)

        # Another tenant finds none of them: its namespace, its keys.
        other = await engine.namespace_for(b"tenant-b")
        theirs, stats = await run(engine, other)
        assert stats.encoded_modules == 3 and theirs == first
        await engine.modules.server.store.drain()


async def test_a_stored_module_that_cannot_be_read_is_computed_and_encoded_again_next_time(
    tiny_model: LoadedModel, daemon: DaemonProcess
) -> None:
    """Stored modules are read layer by layer while the prompt is computed: a read that fails
    after the lookup found every chunk (here chunks of another length under style's keys)
    makes the engine compute the modules' tokens (the full prefill's answer, nothing reused;
    deviation's selection, which reads a module layer, gives up too), and deletes the
    module's chunks so that the next prompt encodes it again."""
    async with AsyncKVStoreClient(daemon.address) as client:
        settings = WorkerSettings(chunk_tokens=CHUNK_TOKENS, **TIMEOUTS)
        engine = TurnEngine(tiny_model, client, settings)
        known = await engine.namespace_for(b"tenant-a")
        first, _ = await run(engine, known)
        served = await engine.modules.server.serve(known, SCHEMA, PROMPT, 0)
        store = engine.modules.server.store
        await store.drain()
        style = next(
            p.module for p in served.prompt.pieces if "cite" in tiny_model.tokenizer.decode(p.token_ids)
        )
        assert isinstance(style.kv, LayerFeed)

        source = await engine.namespace_for(b"tenant-b")  # nothing of it stored yet
        keys = engine.modules.server.chunk_keys(source, SCHEMA)
        style_keys = keys[-math.ceil(len(style) / CHUNK_TOKENS) :]  # the last module's chunks
        short = await encode_module(
            engine.engine, style.token_ids[:-1], style.positions[:-1], source.namespace
        )
        assert store.saver is not None and len(style) % CHUNK_TOKENS != 1  # as many chunks, one token short
        store.saver.save(
            source,
            [ChunkRun(style_keys, short.kv, style.positions[0])],
            before_put=lambda: engine.namespaces.ensure_registered(source),
        )
        await store.drain()

        turn = turn_types.ModuleTurnInput(
            SCHEMA,
            PROMPT,
            turn_types.SamplingParams(max_tokens=12),
            repair_fraction=0.5,
            repair_method="deviation",
        )
        events = [event async for event in engine.modules.run(turn, source)]
        stats = events.pop()
        assert (
            isinstance(stats, turn_types.TurnStats)
            and stats.encoded_modules == 2
            and stats.reused_tokens == 0
        )
        full = engine.run_turn(
            turn_types.TurnInput(list(stats.prompt_token_ids), turn_types.SamplingParams(max_tokens=12)), None
        )
        expected = [e.token_id async for e in full if isinstance(e, turn_types.TokenEvent)]
        assert [e.token_id for e in events if isinstance(e, turn_types.TokenEvent)] == expected
        await store.drain()
        assert (await client.lookup(source.namespace, keys)).prefix_length == len(keys) - len(style_keys)

        again, stats = await run(engine, source)
        assert again == first and stats.encoded_modules == 1 and stats.reused_tokens == stats.module_tokens
        await store.drain()


async def test_module_kv_survives_a_daemon_restart(tiny_model: LoadedModel, daemon: DaemonProcess) -> None:
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS, **TIMEOUTS))
        source = await engine.namespace_for(b"tenant-a")
        progress = [step async for step in engine.modules.server.encode(source, SCHEMA)]
        assert [(p.done, p.total, p.origin) for p in progress] == [(i, 3, Origin.ENCODED) for i in (1, 2, 3)]
        await engine.modules.server.store.drain()
        first, _ = await run(engine, source)
    daemon.stop()
    daemon.start()
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS, **TIMEOUTS))
        source = await engine.namespace_for(b"tenant-a")
        again = [step.origin async for step in engine.modules.server.encode(source, SCHEMA)]
        assert again == [Origin.STORED] * 3  # found, neither read nor encoded
        tokens, stats = await run(engine, source)
        assert stats.encoded_modules == 0 and tokens == first


async def test_a_bfloat16_module_store_has_its_own_namespace_and_serves_what_it_encoded(
    tiny_model: LoadedModel, daemon: DaemonProcess
) -> None:
    """module_kv_dtype=bfloat16: module KV is saved in bf16 under a namespace derived from
    the tenant's (registered as bfloat16: the daemon refuses bf16 chunks in an fp32 one),
    read back into the model's dtype, and equal to the fp32 encoding rounded to bf16; a
    prompt answers the same whether its modules were just encoded or read (the encoded KV
    is served rounded too); a worker storing the model's dtype finds none of it."""
    async with AsyncKVStoreClient(daemon.address) as client:
        settings = WorkerSettings(chunk_tokens=CHUNK_TOKENS, module_kv_dtype="bfloat16", **TIMEOUTS)
        engine = TurnEngine(tiny_model, client, settings)
        source = await engine.namespace_for(b"tenant-a")
        store = engine.modules.server.store
        stored = store.stored_source(source)
        assert stored.namespace != source.namespace and stored.dtype == "bfloat16"
        progress = [step async for step in engine.modules.server.encode(source, SCHEMA)]
        assert {step.namespace for step in progress} == {stored.namespace}
        await store.drain()
        keys = engine.modules.server.chunk_keys(source, SCHEMA)
        assert (await client.lookup(stored.namespace, keys)).prefix_length == len(keys)

        read, stats = await run(engine, source)
        assert stats.encoded_modules == 0 and stats.reused_tokens == stats.module_tokens
        served = await engine.modules.server.serve(source, SCHEMA, PROMPT, 0)
        doc = served.prompt.pieces[1].module
        assert isinstance(doc.kv, LayerFeed)

        exact = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS, **TIMEOUTS))
        served = await exact.modules.server.serve(source, SCHEMA, PROMPT, 0)
        assert served.encoded_modules == 3  # the fp32 store never reads the bf16 chunks
        doc_fp32 = served.prompt.pieces[1].module
        for (k, v), (k32, v32) in zip(doc.kv, doc_fp32.kv, strict=True):
            assert k.dtype == v.dtype == torch.float32
            torch.testing.assert_close(k, k32.bfloat16().float(), rtol=0, atol=1e-6)
            torch.testing.assert_close(v, v32.bfloat16().float(), rtol=0, atol=1e-6)
        assert any(not torch.equal(k, k32) for (k, _), (k32, _) in zip(doc.kv, doc_fp32.kv, strict=True))
        await exact.modules.server.store.drain()

        other = await engine.namespace_for(b"tenant-b")  # encoded now, served rounded
        encoded, stats = await run(engine, other)
        assert stats.encoded_modules == 3 and encoded == read
        await store.drain()


async def test_deviation_repair_recomputes_as_many_tokens_as_first_token_repair(
    tiny_model: LoadedModel,
) -> None:
    """The method from the worker's setting, or from the turn; the same budget either way."""
    engine = TurnEngine(
        tiny_model, None, WorkerSettings(chunk_tokens=CHUNK_TOKENS, module_repair_method="deviation")
    )
    source = await engine.namespace_for(b"tenant-a")
    counts = {}
    for method in (None, "first", "deviation"):
        turn = turn_types.ModuleTurnInput(
            SCHEMA, PROMPT, turn_types.SamplingParams(max_tokens=4), repair_tokens=3, repair_method=method
        )
        events = [event async for event in engine.modules.run(turn, source)]
        stats = events.pop()
        assert isinstance(stats, turn_types.TurnStats) and stats.generated_tokens == len(events) > 0
        counts[method] = (stats.repaired_tokens, stats.reused_tokens)
    assert counts[None] == counts["first"] == counts["deviation"] == (6, counts["first"][1])  # doc, style


async def test_pml_errors_are_invalid_arguments(tiny_model: LoadedModel) -> None:
    engine = TurnEngine(tiny_model, None, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
    source = await engine.namespace_for(b"tenant-a")
    with pytest.raises(InvalidArgument, match="line 1"):
        await run(engine, source, '<prompt schema="library"><nope/></prompt>')


async def test_role_tags_use_the_chat_template_and_the_generation_prompt_ends_the_prompt(
    tiny_model: LoadedModel,
) -> None:
    engine = TurnEngine(tiny_model, None, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
    source = await engine.namespace_for(b"tenant-a")
    prompt = '<prompt schema="library"><doc/><user>Who kept the log?</user></prompt>'
    opening = generation_prompt(tiny_model.tokenizer)
    assert opening  # the tiny tokenizer has a chat template
    plain = turn_types.ModuleTurnInput(SCHEMA, prompt, turn_types.SamplingParams(max_tokens=4))
    answered = turn_types.ModuleTurnInput(
        SCHEMA, prompt, turn_types.SamplingParams(max_tokens=4), add_generation_prompt=True
    )
    stats = [[e async for e in engine.modules.run(turn, source)][-1] for turn in (plain, answered)]
    added = len(tiny_model.tokenizer.encode(opening, add_special_tokens=False))
    assert stats[1].prompt_tokens == stats[0].prompt_tokens + added


SCAFFOLDED = SCHEMA.replace("</schema>", '<scaffold name="both" modules="doc style"/></schema>')


async def test_a_scaffold_serves_its_modules_encoded_together_as_a_full_prefill(
    tiny_model: LoadedModel, daemon: DaemonProcess
) -> None:
    """A prompt importing every module of a scaffold, in schema order, is served the
    scaffold's KV: one attention span, so the same answer as prefilling its tokens whole."""
    async with AsyncKVStoreClient(daemon.address) as client:
        engine = TurnEngine(tiny_model, client, WorkerSettings(chunk_tokens=CHUNK_TOKENS, **TIMEOUTS))
        source = await engine.namespace_for(b"tenant-a")
        progress = [p async for p in engine.modules.server.encode(source, SCAFFOLDED)]
        assert [p.path for p in progress] == ["(root)", "doc", "style", "scaffold:both"]
        turn = turn_types.ModuleTurnInput(SCAFFOLDED, PROMPT, turn_types.SamplingParams(max_tokens=12))
        events = [event async for event in engine.modules.run(turn, source)]
        stats = events.pop()
        assert isinstance(stats, turn_types.TurnStats) and stats.encoded_modules == 0
        served = await engine.modules.server.serve(source, SCAFFOLDED, PROMPT, 0)
        pairs = sorted(
            zip(lay_out(served.prompt).token_ids, lay_out(served.prompt).positions, strict=True),
            key=lambda p: p[1],
        )
        assert [p for _, p in pairs] == list(range(len(pairs)))  # no gap, nothing re-positioned
        full = [
            e
            async for e in engine.run_turn(
                turn_types.TurnInput([t for t, _ in pairs], turn_types.SamplingParams(max_tokens=12)), None
            )
        ]
        assert [e.token_id for e in events] == [
            e.token_id for e in full if isinstance(e, turn_types.TokenEvent)
        ]
        await engine.modules.server.store.drain()


async def test_a_module_is_encoded_after_the_text_before_it_as_a_full_prefill_computes_it(
    tiny_model: LoadedModel,
) -> None:
    """The root's text always precedes `doc`, so `doc` is encoded with it in its attention
    span: its KV is the KV a full prefill of the two computes (no first token of its own
    acting as the sequence's start), and the root's text is not part of it."""
    engine = TurnEngine(tiny_model, None, WorkerSettings(chunk_tokens=CHUNK_TOKENS))
    source = await engine.namespace_for(b"tenant-a")
    served = await engine.modules.server.serve(source, SCHEMA, '<prompt schema="library"><doc/></prompt>', 0)
    root, doc = (piece.module for piece in served.prompt.pieces)
    assert doc.positions[0] == len(root) and doc.positions == tuple(range(len(root), len(root) + len(doc)))
    whole = await encode_module(
        engine.engine, root.token_ids + doc.token_ids, range(len(root) + len(doc)), source.namespace
    )
    alone = await encode_module(engine.engine, doc.token_ids, doc.positions, source.namespace)
    for (k, v), (wk, wv), (ak, _) in zip(doc.kv, whole.kv, alone.kv, strict=True):
        assert torch.allclose(k, wk[:, len(root) :], atol=1e-5)
        assert torch.allclose(v, wv[:, len(root) :], atol=1e-5)
    assert not torch.allclose(doc.kv[-1][0], alone.kv[-1][0], atol=1e-3)  # the context changed it


async def test_compact_positions_serve_without_gaps_and_full_repair_is_the_full_prefill(
    tiny_model: LoadedModel,
) -> None:
    prompt = '<prompt schema="library"><style/> Who kept the log?</prompt>'  # doc omitted
    layouts = {}
    for positions in ("schema", "compact"):
        settings = WorkerSettings(chunk_tokens=CHUNK_TOKENS, module_positions=positions)
        engine = TurnEngine(tiny_model, None, settings)
        source = await engine.namespace_for(b"tenant-a")
        layouts[positions] = lay_out((await engine.modules.server.serve(source, SCHEMA, prompt, 0)).prompt)
    schema, compact = layouts["schema"], layouts["compact"]
    assert compact.tokens_by_position == schema.tokens_by_position
    assert sorted(compact.positions) == list(range(len(compact.positions)))
    assert max(schema.positions) >= len(schema.positions)  # doc's positions are a gap there

    turn = turn_types.ModuleTurnInput(
        SCHEMA, prompt, turn_types.SamplingParams(max_tokens=12), repair_fraction=1.0
    )
    events = [event async for event in engine.modules.run(turn, source)]  # the compact engine
    full = engine.run_turn(
        turn_types.TurnInput(list(compact.tokens_by_position), turn_types.SamplingParams(max_tokens=12)), None
    )
    expected = [e.token_id async for e in full if isinstance(e, turn_types.TokenEvent)]
    assert [e.token_id for e in events if isinstance(e, turn_types.TokenEvent)] == expected
