"""The Worker service as the scheduler sees it: a real worker process (a tiny random-weight
model) beside a real daemon, readiness awaited through the ready file. Turns stream tokens
then their stats; a turn extending the last one reuses its KV and decodes the same greedy
tokens as recomputing; a conversation beyond the context window is truncated and reported
so; every RPC refuses bad input with the right status; health reports SERVING only after
the device check; bad context settings stop the worker at start. One daemon and one worker
serve the whole module."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from running_daemon import running_daemon
from transformers import AutoConfig, PreTrainedTokenizerFast

from attnstore.chunks.keys import NamespaceSpec, chunk_key_chain
from attnstore.kvstore_client import KVStoreClient
from attnstore.server.ports import free_port
from attnstore.worker.v1 import worker_pb2 as pb
from attnstore.worker.v1 import worker_pb2_grpc
from inference_worker.launcher import WorkerProcess
from inference_worker.model_store import model_digest
from kvstore_daemon.launcher import DaemonProcess

SERVICE = "attnstore.worker.v1.Worker"
MiB = 1024 * 1024
CHUNK_TOKENS = 16
WORKER_SETTINGS = {
    "chunk_tokens": CHUNK_TOKENS,
    "max_context_tokens": 128,  # of the model's 512: prompts of a few hundred tokens overflow
    "max_messages": 4,
    "max_message_chars": 200,
    "max_prompt_tokens": 256,
    "max_new_tokens": 32,
    "health_check_interval_seconds": 0.2,
    "shutdown_grace_seconds": 5,
    "log_level": "DEBUG",
}
VOCAB = 300  # the tiny tokenizer's
INVALID, PRECONDITION = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
USER = pb.ChatMessage(role="user", content="hello world, the capital of france is paris")


@dataclass
class Stack:
    daemon: DaemonProcess
    worker: WorkerProcess
    model_dir: Path
    metrics_port: int
    stub: worker_pb2_grpc.WorkerStub
    channel: grpc.Channel


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_saver: Callable[..., Path]) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("stack")
    # Peaked logits (initializer_range 0.2): greedy tokens never hinge on a near tie.
    model_dir = tiny_model_saver(root / "model", max_position_embeddings=512, initializer_range=0.2)
    with running_daemon(root, dram_bytes=64 * MiB, ssd_bytes=256 * MiB) as daemon:
        worker = WorkerProcess(
            root / "worker.log",
            model_dir=model_dir,
            kvstore_address=daemon.address,
            settings={**WORKER_SETTINGS, "metrics_port": 0},
        )
        worker.start()
        assert worker.metrics_port is not None
        channel = grpc.insecure_channel(worker.address)
        try:
            yield Stack(
                daemon, worker, model_dir, worker.metrics_port, worker_pb2_grpc.WorkerStub(channel), channel
            )
        finally:
            channel.close()
            assert worker.stop() == 0, worker.log_tail()


def sampling(max_tokens: int = 8, **fields: Any) -> pb.SamplingParams:
    return pb.SamplingParams(max_tokens=max_tokens, **fields)


def chat(*messages: pb.ChatMessage) -> pb.ChatMessages:
    return pb.ChatMessages(messages=list(messages))


def run_turn(stub: worker_pb2_grpc.WorkerStub, **fields: Any) -> tuple[list[pb.TokenChunk], pb.TurnStats]:
    """Sends one ExecuteTurn; the streamed tokens and the stats, checking stats come last."""
    replies = list(stub.ExecuteTurn(pb.ExecuteTurnRequest(**fields), timeout=60))
    kinds = [reply.WhichOneof("event") for reply in replies]
    assert kinds == ["token"] * (len(replies) - 1) + ["stats"], kinds
    return [reply.token for reply in replies[:-1]], replies[-1].stats


def namespace(stack: Stack, tenant: str) -> bytes:
    """The tenant's KV namespace, computed as the scheduler does."""
    return NamespaceSpec(
        model_digest(stack.model_dir), "float32", CHUNK_TOKENS, tenant.encode()
    ).namespace_id()


def wait_for_keys(stack: Stack, namespace: bytes, keys: list[bytes], timeout_seconds: float = 10.0) -> None:
    """Waits until the daemon holds every chunk of `keys` (saves are asynchronous)."""
    deadline = time.monotonic() + timeout_seconds
    with KVStoreClient(stack.daemon.address) as client:
        while (stored := client.lookup(namespace, keys).prefix_length) < len(keys):
            assert time.monotonic() < deadline, f"{stored} of {len(keys)} chunks stored"
            time.sleep(0.02)


def wait_until_stored(stack: Stack, tenant: str, token_ids: list[int]) -> int:
    """Waits until the daemon holds every full chunk of `token_ids` in the tenant's namespace;
    how many chunks."""
    keys = chunk_key_chain(namespace(stack, tenant), token_ids, CHUNK_TOKENS)
    wait_for_keys(stack, namespace(stack, tenant), keys)
    return len(keys)


# ---- serving ----------------------------------------------------------------------------------


def test_health_is_serving_for_the_server_and_the_service(stack: Stack) -> None:
    health = health_pb2_grpc.HealthStub(stack.channel)
    for service in ("", SERVICE):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_describe_model_matches_the_model(stack: Stack) -> None:
    config = AutoConfig.from_pretrained(stack.model_dir)
    model = stack.stub.DescribeModel(pb.DescribeModelRequest(), timeout=5)

    assert model.model_label == stack.model_dir.name
    assert model.model_digest == model_digest(stack.model_dir)
    assert model.dtype == "float32"
    assert (
        (model.num_layers, model.kv_heads, model.head_dim)
        == (2, 2, 8)
        == (
            config.num_hidden_layers,
            config.num_key_value_heads,
            config.hidden_size // config.num_attention_heads,
        )
    )
    assert model.chunk_tokens == CHUNK_TOKENS
    assert model.max_context_tokens == 128 < config.max_position_embeddings
    assert model.attention_sink_tokens == 4
    assert model.kv_bytes_per_token == 2 * 2 * 2 * 8 * 4  # K and V, layers, kv heads, head dim, fp32
    assert model.vocab_size == VOCAB
    assert (model.max_prompt_tokens, model.max_new_tokens, model.max_samples) == (256, 32, 16)
    assert model.kernels.device == "cpu" and model.kernels.cpu_capability
    assert model.kernels.linear.kernel in ("onednn", "torch") and model.kernels.linear.reason


def test_tokenize_applies_the_models_chat_template(
    stack: Stack, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    messages = [pb.ChatMessage(role="system", content="be brief"), USER]
    for add_generation_prompt in (True, False):
        reply = stack.stub.Tokenize(
            pb.TokenizeRequest(messages=messages, add_generation_prompt=add_generation_prompt), timeout=5
        )
        expected = tiny_tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=add_generation_prompt,
            return_dict=False,
        )
        assert list(reply.token_ids) == expected


def test_a_turn_streams_tokens_then_its_stats(stack: Stack, tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    prompt = stack.stub.Tokenize(pb.TokenizeRequest(messages=[USER], add_generation_prompt=True)).token_ids
    tokens, stats = run_turn(stack.stub, tenant="streams", messages=chat(USER), sampling=sampling(8))

    assert 1 <= len(tokens) <= 8 and stats.generated_tokens == len(tokens)
    assert stats.prompt_tokens == len(prompt)
    assert stats.reused_tokens == 0  # nothing stored for this tenant yet
    assert stats.fallback == pb.FALLBACK_NONE
    expected_finish = pb.FINISH_REASON_LENGTH if len(tokens) == 8 else pb.FINISH_REASON_STOP
    assert stats.finish_reason == expected_finish
    assert stats.ttft_ms > 0 and stats.compute_ms > 0
    ids = [token.token_id for token in tokens]
    assert "".join(token.text for token in tokens) == tiny_tokenizer.decode(ids, skip_special_tokens=True)
    # The same greedy turn again, as token ids: the same tokens.
    again, _ = run_turn(
        stack.stub, tenant="streams-ids", prompt_token_ids=pb.TokenIds(token_ids=prompt), sampling=sampling(8)
    )
    assert [token.token_id for token in again] == ids


def test_a_turn_extending_the_last_one_reuses_its_kv(stack: Stack) -> None:
    tokenize = stack.stub.Tokenize
    first_prompt = list(tokenize(pb.TokenizeRequest(messages=[USER], add_generation_prompt=True)).token_ids)
    tokens, first = run_turn(
        stack.stub, tenant="reuse", messages=chat(USER), sampling=sampling(12), save_generated=True
    )
    assert first.saved_chunks > 0
    stored_chunks = wait_until_stored(stack, "reuse", first_prompt)
    assert stored_chunks >= 1

    follow_up = pb.ChatMessage(role="user", content="how are you")
    history = first_prompt + [token.token_id for token in tokens]
    follow_up_ids = tokenize(pb.TokenizeRequest(messages=[follow_up], add_generation_prompt=True)).token_ids
    second_prompt = pb.TokenIds(token_ids=history + list(follow_up_ids))
    reused_tokens, reused = run_turn(
        stack.stub, tenant="reuse", prompt_token_ids=second_prompt, sampling=sampling(8)
    )
    recomputed_tokens, recomputed = run_turn(
        stack.stub, tenant="reuse-other-tenant", prompt_token_ids=second_prompt, sampling=sampling(8)
    )

    assert stored_chunks * CHUNK_TOKENS <= reused.reused_tokens <= len(history)
    assert reused.reused_tokens % CHUNK_TOKENS == 0
    assert reused.reused_dram_chunks + reused.reused_ssd_chunks == reused.reused_tokens // CHUNK_TOKENS
    assert reused.fallback == pb.FALLBACK_NONE
    assert recomputed.reused_tokens == 0  # another tenant never sees this tenant's KV
    assert [t.token_id for t in reused_tokens] == [t.token_id for t in recomputed_tokens]


def test_a_conversation_beyond_the_context_window_is_truncated(stack: Stack) -> None:
    prompt = [(7 * i) % VOCAB for i in range(200)]
    tokens, first = run_turn(
        stack.stub,
        tenant="long",
        prompt_token_ids=pb.TokenIds(token_ids=prompt),
        sampling=sampling(8, stop_token_ids=[]),
        save_generated=True,
    )
    # 200 + 8 tokens in a 128-token window: 80 must go, so chunk 0 but its 4 sinks and
    # chunks 1..5 do; the keys stay those of the untruncated tokens.
    assert (first.truncated_tokens, first.sink_tokens, first.prompt_tokens) == (92, 4, 200)
    history = prompt + [token.token_id for token in tokens]
    assert first.namespace == namespace(stack, "long")
    assert list(first.chunk_keys) == chunk_key_chain(first.namespace, history[:-1], CHUNK_TOKENS)
    # Saved: chunks 6.. (kept), and chunk 0, computed whole for the next turns' sinks.
    assert first.saved_chunks == 1 + len(first.chunk_keys) - 6
    wait_for_keys(stack, first.namespace, [first.chunk_keys[0], *first.chunk_keys[6:]])

    # The next turn asks for the session's truncation and reuses the kept chunks.
    second_prompt = pb.TokenIds(token_ids=history + [5, 6, 7])
    _, second = run_turn(
        stack.stub,
        tenant="long",
        prompt_token_ids=second_prompt,
        sampling=sampling(8, stop_token_ids=[]),
        truncated_tokens=first.truncated_tokens,
    )
    assert (second.truncated_tokens, second.sink_tokens) == (92, 4)
    assert second.reused_tokens == 4 + 6 * CHUNK_TOKENS  # the sinks and chunks 6..11
    assert second.fallback == pb.FALLBACK_NONE


def test_metrics_count_turns_and_reuse(stack: Stack) -> None:
    run_turn(stack.stub, tenant="metrics", messages=chat(USER), sampling=sampling(2))
    samples = scrape(stack)
    assert sum(v for k, v in samples.items() if k.startswith("attnstore_worker_turns_total{")) >= 1
    assert samples["attnstore_worker_ttft_seconds_count"] >= 1
    assert samples["attnstore_worker_reused_token_ratio_count"] >= 1
    assert samples['attnstore_rpc_duration_seconds_count{code="OK",method="ExecuteTurn"}'] >= 1


def scrape(stack: Stack) -> dict[str, float]:
    """The worker's Prometheus samples by name and labels."""
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=10).read().decode()
    )
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_concurrent_turns_share_forward_passes(stack: Stack) -> None:
    prompts = [[5, 6, 7, 8] * 5, [9, 10, 11] * 7]
    alone = [
        run_turn(stack.stub, tenant="batch", prompt_token_ids=pb.TokenIds(token_ids=p), sampling=sampling(32))
        for p in prompts
    ]
    before = scrape(stack)
    with ThreadPoolExecutor(2) as pool:
        together = list(
            pool.map(
                lambda p: run_turn(
                    stack.stub,
                    tenant="batch",
                    prompt_token_ids=pb.TokenIds(token_ids=p),
                    sampling=sampling(32),
                ),
                prompts,
            )
        )
    after = scrape(stack)
    for (alone_tokens, _), (tokens, _) in zip(alone, together, strict=True):
        assert [t.token_id for t in tokens] == [t.token_id for t in alone_tokens]
    single = 'attnstore_worker_batch_sequences_bucket{le="1.0"}'
    passes = (
        after["attnstore_worker_batch_sequences_count"] - before["attnstore_worker_batch_sequences_count"]
    )
    shared = passes - (after[single] - before[single])
    assert shared >= 1, "no forward pass ran both turns"


def test_parallel_samples_stream_tagged_tokens_and_per_sample_stats(stack: Stack) -> None:
    prompt = pb.TokenIds(token_ids=[11, 12, 13] * 9)
    greedy, _ = run_turn(stack.stub, tenant="samples", prompt_token_ids=prompt, sampling=sampling(12))
    tokens, stats = run_turn(
        stack.stub, tenant="samples", prompt_token_ids=prompt, sampling=sampling(12, n=3)
    )
    by_sample = [[t.token_id for t in tokens if t.sample_index == i] for i in range(3)]
    assert by_sample == [[t.token_id for t in greedy]] * 3  # greedy samples agree with n = 1
    assert [s.sample_index for s in stats.samples] == [0, 1, 2]
    assert [s.generated_tokens for s in stats.samples] == [len(greedy)] * 3
    assert stats.generated_tokens == 3 * len(greedy) == len(tokens)
    assert {s.finish_reason for s in stats.samples} == {stats.finish_reason}
    seeded = sampling(12, n=3, temperature=1.5, seed=4)
    first, _ = run_turn(stack.stub, tenant="samples", prompt_token_ids=prompt, sampling=seeded)
    again, _ = run_turn(stack.stub, tenant="samples", prompt_token_ids=prompt, sampling=seeded)
    sample_2 = [t.token_id for t in first if t.sample_index == 2]
    alone, _ = run_turn(
        stack.stub, tenant="samples", prompt_token_ids=prompt, sampling=sampling(12, temperature=1.5, seed=6)
    )
    assert sample_2 == [t.token_id for t in alone]  # sample i is seeded seed + i
    for i in range(3):
        assert [t.token_id for t in first if t.sample_index == i] == [
            t.token_id for t in again if t.sample_index == i
        ]


@pytest.mark.parametrize("samples", [1, 3])
def test_a_cancelled_turn_frees_its_blocks(stack: Stack, samples: int) -> None:
    request = pb.ExecuteTurnRequest(
        tenant="cancel", prompt_token_ids=pb.TokenIds(token_ids=[7] * 40), sampling=sampling(32, n=samples)
    )
    replies = stack.stub.ExecuteTurn(request, timeout=60)
    assert next(replies).WhichOneof("event") == "token"
    replies.cancel()
    deadline = time.monotonic() + 10
    while scrape(stack)['attnstore_worker_pool_blocks{state="used"}'] > 0:
        assert time.monotonic() < deadline, "the cancelled turn's blocks were not freed"
        time.sleep(0.05)


# ---- bad input --------------------------------------------------------------------------------

TOO_LONG = "x" * 201


def execute(**fields: Any) -> Callable[[worker_pb2_grpc.WorkerStub], object]:
    defaults: dict[str, Any] = {"tenant": "bad", "sampling": sampling()}
    if "prompt_token_ids" not in fields:
        defaults["messages"] = chat(USER)
    request = pb.ExecuteTurnRequest(**{**defaults, **fields})
    return lambda stub: list(stub.ExecuteTurn(request, timeout=30))


def tokenize(*messages: pb.ChatMessage) -> Callable[[worker_pb2_grpc.WorkerStub], object]:
    request = pb.TokenizeRequest(messages=list(messages), add_generation_prompt=True)
    return lambda stub: stub.Tokenize(request, timeout=30)


BAD_REQUESTS = {
    "no tenant": (execute(tenant=""), "tenant must not be empty"),
    "no prompt": (execute(messages=None), "prompt_token_ids must not be empty"),
    "no messages": (execute(messages=chat()), "messages must not be empty"),
    "unknown role": (execute(messages=chat(pb.ChatMessage(role="wizard", content="hi"))), "role is 'wizard'"),
    "long message": (execute(messages=chat(pb.ChatMessage(role="user", content=TOO_LONG))), "at most 200"),
    "many messages": (execute(messages=chat(*[USER] * 5)), "at most 4 are allowed"),
    "long prompt": (execute(prompt_token_ids=pb.TokenIds(token_ids=[5] * 257)), "at most 256"),
    "token out of vocab": (
        execute(prompt_token_ids=pb.TokenIds(token_ids=[5, VOCAB])),
        "prompt_token_ids[1]",
    ),
    "negative temperature": (execute(sampling=sampling(temperature=-0.5)), "temperature"),
    "top_p zero": (execute(sampling=sampling(top_p=0.0)), "top_p"),
    "top_p above one": (execute(sampling=sampling(top_p=1.5)), "top_p"),
    "no sampling": (execute(sampling=None), "max_tokens must be at least 1"),
    "max_tokens zero": (execute(sampling=sampling(0)), "max_tokens must be at least 1"),
    "max_tokens over the limit": (execute(sampling=sampling(33)), "at most 32"),
    "truncated_tokens beyond the prompt": (
        execute(prompt_token_ids=pb.TokenIds(token_ids=[5] * 40), truncated_tokens=100),
        "truncated_tokens is 100, but a prompt of 40 tokens can drop at most 28",
    ),
    "n over the limit": (
        execute(sampling=sampling(n=17)),
        "sampling.n is 17; at most 16 samples are allowed",
    ),
    "stop token out of vocab": (execute(sampling=sampling(stop_token_ids=[VOCAB + 1])), "stop_token_ids[0]"),
    "tokenize no messages": (tokenize(), "messages must not be empty"),
    "tokenize unknown role": (tokenize(pb.ChatMessage(role="", content="hi")), "role is ''"),
    "tokenize long message": (tokenize(pb.ChatMessage(role="user", content=TOO_LONG)), "at most 200"),
    "tokenize many messages": (tokenize(*[USER] * 5), "at most 4 are allowed"),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_input_is_refused_with_invalid_argument(stack: Stack, case: str) -> None:
    call, message = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as error:
        call(stack.stub)
    assert error.value.code() == INVALID, error.value.details()
    assert message in error.value.details()


# ---- without a daemon -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("daemon", "fallback"),
    [("none", pb.FALLBACK_NONE), ("gone", pb.FALLBACK_DAEMON_UNAVAILABLE)],
    ids=["no-daemon", "daemon-gone"],
)
def test_a_worker_without_its_daemon_still_answers_and_stops_cleanly(
    tmp_path: Path, tiny_model_saver: Callable[..., Path], daemon: str, fallback: int
) -> None:
    model_dir = tiny_model_saver(tmp_path / "model", max_position_embeddings=512)
    worker = WorkerProcess(
        tmp_path / "worker.log",
        model_dir=model_dir,
        kvstore_address=f"127.0.0.1:{free_port()}" if daemon == "gone" else None,  # nothing listens there
        settings={"chunk_tokens": CHUNK_TOKENS, "lookup_timeout_seconds": 0.2, "shutdown_grace_seconds": 5},
    )
    worker.start()
    try:
        with grpc.insecure_channel(worker.address) as channel:
            prompt = pb.TokenIds(token_ids=[5] * (3 * CHUNK_TOKENS))  # whole chunks to look up and save
            tokens, stats = run_turn(
                worker_pb2_grpc.WorkerStub(channel),
                tenant="t",
                prompt_token_ids=prompt,
                sampling=sampling(4, stop_token_ids=[]),
            )
        assert stats.generated_tokens == len(tokens) >= 1
        assert (stats.reused_tokens, stats.fallback) == (0, fallback)
    finally:
        assert worker.stop() == 0, worker.log_tail()


def test_bad_context_settings_stop_the_worker_at_start(
    tmp_path: Path, tiny_model_saver: Callable[..., Path]
) -> None:
    worker = WorkerProcess(
        tmp_path / "worker.log",
        model_dir=tiny_model_saver(tmp_path / "model", max_position_embeddings=512),
        settings={"chunk_tokens": CHUNK_TOKENS, "attention_sink_tokens": 17},
    )
    with pytest.raises(RuntimeError, match="exited with 2") as error:
        worker.start()
    assert "attention_sink_tokens is 17; it must lie in [0, chunk_tokens = 16]" in str(error.value)


# ---- prompt modules ----------------------------------------------------------------------------

SCHEMA = """<schema name="desk">Notes.<module name="doc">the capital of france is paris and the
capital of italy is rome</module><module name="tone">answer in one word</module></schema>"""
PML = '<prompt schema="desk"><doc/><tone/> what is the capital of france?</prompt>'


def test_a_pml_schema_is_encoded_with_progress_then_serves_prompts(stack: Stack) -> None:
    tenant = "modules"
    request = pb.EncodeSchemaRequest(tenant=tenant, schema=SCHEMA)
    progress = list(stack.stub.EncodeSchema(request, timeout=60))
    assert [(p.done, p.total) for p in progress] == [(1, 3), (2, 3), (3, 3)]
    assert [p.module for p in progress] == ["(root)", "doc", "tone"]
    # Each module's chunk keys, in the tenant's namespace: what the scheduler keeps protected.
    namespace = progress[0].namespace
    keys = [key for p in progress for key in p.chunk_keys]
    assert len(namespace) == 16 and all(p.namespace == namespace and p.chunk_keys for p in progress)
    assert len(set(keys)) == len(keys)
    pml = pb.PmlPrompt(schema=SCHEMA, prompt=PML)
    tokens, stats = run_turn(stack.stub, tenant=tenant, pml=pml, sampling=sampling(8))
    assert len(tokens) == stats.generated_tokens > 0
    assert stats.module_tokens == stats.reused_tokens > 0 and stats.encoded_modules == 0
    again = list(stack.stub.EncodeSchema(request, timeout=60))
    assert not any(p.encoded for p in again)  # all stored: encoding again only re-protects
    assert [key for p in again for key in p.chunk_keys] == keys
    with KVStoreClient(stack.daemon.address) as kv:
        assert all(kv.lookup(namespace, [key]).prefix_length == 1 for key in keys)  # stored
    _, repaired = run_turn(
        stack.stub,
        tenant=tenant,
        pml=pb.PmlPrompt(schema=SCHEMA, prompt=PML, repair_tokens=2),
        sampling=sampling(8),
    )
    assert repaired.repaired_tokens == 4 and repaired.reused_tokens == stats.reused_tokens - 4  # doc, tone
    assert len(stats.prompt_token_ids) == stats.prompt_tokens  # the prompt as served, by position

    # A budget by fraction: all of doc and tone (the root, first, is never repaired); the
    # first half of each (rounded down), or as many tokens chosen by KV deviation.
    def by_fraction(fraction: float, method: str) -> pb.TurnStats:
        pml = pb.PmlPrompt(schema=SCHEMA, prompt=PML, repair_fraction=fraction, repair_method=method)
        return run_turn(stack.stub, tenant=tenant, pml=pml, sampling=sampling(4))[1]

    doc_and_tone = by_fraction(1.0, "first").repaired_tokens
    assert 0 < doc_and_tone < stats.module_tokens
    half = by_fraction(0.5, "first").repaired_tokens
    assert doc_and_tone / 2 - 1 <= half <= doc_and_tone / 2  # rounded down
    assert by_fraction(0.5, "deviation").repaired_tokens == half


@pytest.mark.parametrize(
    ("pml", "message"),
    [
        (pb.PmlPrompt(schema=SCHEMA, prompt='<prompt schema="desk"><nope/></prompt>'), "line 1"),
        (pb.PmlPrompt(schema="<schema", prompt=PML), "line 1"),
        (pb.PmlPrompt(schema=SCHEMA, prompt=PML, repair_tokens=5000), "repair_tokens"),
        (pb.PmlPrompt(schema=SCHEMA, prompt=PML, repair_fraction=1.5), "repair_fraction is 1.5"),
        (pb.PmlPrompt(schema=SCHEMA, prompt=PML, repair_fraction=float("nan")), "repair_fraction"),
        (pb.PmlPrompt(schema=SCHEMA, prompt=PML, repair_tokens=2, repair_fraction=0.1), "not both"),
        (pb.PmlPrompt(schema=SCHEMA, prompt=PML, repair_tokens=2, repair_method="best"), "'best'"),
    ],
    ids=["unknown module", "malformed schema", "repair budget", "fraction", "nan fraction", "both", "method"],
)
def test_bad_pml_is_refused_with_invalid_argument(stack: Stack, pml: pb.PmlPrompt, message: str) -> None:
    with pytest.raises(grpc.RpcError) as error:
        run_turn(stack.stub, tenant="modules", pml=pml, sampling=sampling(4))
    assert error.value.code() == INVALID, error.value.details()
    assert message in error.value.details()
