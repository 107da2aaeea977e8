"""The scheduler's worker requests on the wire (worker_messages.py, used only by its
WorkerClient): each kind of prompt fills its own oneof field, an absent top_p or seed
stays absent (the worker then does not cut or picks its own seed), and every field of the
model card the scheduler reads comes across."""

from __future__ import annotations

from attnstore.worker.v1 import worker_pb2
from attnstore_scheduler import worker_messages
from attnstore_scheduler.worker_types import (
    ChatMessages,
    ModelCard,
    PmlPrompt,
    SamplingParams,
    TokenIds,
    TurnRequest,
)

GREEDY = SamplingParams(max_tokens=4)


def test_token_ids_fill_prompt_token_ids_and_the_session_fields() -> None:
    request = TurnRequest("acme", TokenIds((5, 6, 7)), GREEDY, 2, True, 3, ("w2:1",))
    message = worker_messages.turn_request(request)
    assert message.WhichOneof("prompt") == "prompt_token_ids"
    assert list(message.prompt_token_ids.token_ids) == [5, 6, 7]
    assert (message.tenant, message.truncated_tokens, message.save_generated, message.history_tokens) == (
        "acme",
        2,
        True,
        3,
    )
    assert list(message.long_context_peers) == ["w2:1"]
    assert request.prompt_token_ids() == (5, 6, 7)


def test_messages_and_pml_fill_their_own_fields_and_name_no_token_ids() -> None:
    chat = TurnRequest("t", ChatMessages((("system", "be brief"), ("user", "hi"))), GREEDY)
    message = worker_messages.turn_request(chat)
    assert message.WhichOneof("prompt") == "messages"
    assert [(m.role, m.content) for m in message.messages.messages] == [
        ("system", "be brief"),
        ("user", "hi"),
    ]
    pml = PmlPrompt(
        "<schema/>", "<prompt/>", repair_tokens=2, repair_method="first", add_generation_prompt=True
    )
    message = worker_messages.turn_request(TurnRequest("t", pml, GREEDY))
    assert message.WhichOneof("prompt") == "pml"
    assert message.pml == worker_pb2.PmlPrompt(
        schema="<schema/>",
        prompt="<prompt/>",
        repair_tokens=2,
        repair_method="first",
        add_generation_prompt=True,
    )
    assert chat.prompt_token_ids() is None and TurnRequest("t", pml, GREEDY).prompt_token_ids() is None


def test_an_absent_top_p_or_seed_stays_absent_and_a_given_one_is_sent() -> None:
    greedy = worker_messages.turn_request(TurnRequest("t", TokenIds((1,)), GREEDY)).sampling
    assert not greedy.HasField("top_p") and not greedy.HasField("seed") and greedy.max_tokens == 4
    sampled = SamplingParams(max_tokens=8, temperature=0.5, top_p=0.9, seed=0, stop_strings=("##",), n=3)
    sent = worker_messages.turn_request(TurnRequest("t", TokenIds((1,)), sampled)).sampling
    assert sent.HasField("seed") and sent.seed == 0  # seed 0 is a seed, not "absent"
    assert abs(sent.top_p - 0.9) < 1e-6 and abs(sent.temperature - 0.5) < 1e-6
    assert (list(sent.stop_strings), sent.n) == (["##"], 3)


def test_the_model_card_keeps_every_limit_the_worker_reports() -> None:
    reply = worker_pb2.DescribeModelResponse(
        model_label="smol",
        chunk_tokens=16,
        kv_bytes_per_token=1024,
        max_context_tokens=2048,
        max_prompt_tokens=100_000,
        max_new_tokens=512,
        max_samples=4,
        max_turn_context_tokens=1024,
        num_layers=30,
    )
    assert worker_messages.model_card(reply) == ModelCard("smol", 16, 1024, 2048, 100_000, 512, 4, 1024)
