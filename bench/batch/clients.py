"""Drives one concurrency level against one system: every dialogue is a session that sends
its turns one after another (the next as soon as the answer ended), all sessions at once.
Each side keeps its own answers as the history (attnstore: the session; vLLM: the
messages this client sends back), greedy, the same max_tokens.

    attnstore  the public API (AsyncAttnStoreClient.stream_chat), one token per event
    vLLM       its OpenAI-compatible /v1/chat/completions, streamed; a thread per session
               (http.client), each SSE event with content counted as a token's arrival (a
               token that completes no character arrives with the next one)
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AsyncAttnStoreClient
from bench.batch.stats import TurnRecord
from bench.peers.vllm import Usage, VllmServer
from bench.peers.workload import Dialogue

GRPC_TIMEOUT_SECONDS = 1800.0  # a batch-1 turn at 32 sessions waits behind the other 31


async def attnstore_level(
    address: str, dialogues: list[Dialogue], turns: int, max_tokens: int
) -> list[TurnRecord]:
    async with AsyncAttnStoreClient(address, timeout_seconds=GRPC_TIMEOUT_SECONDS) as client:
        sessions = [(await client.create_session()).session_id for _ in dialogues]
        per_session = await asyncio.gather(
            *(
                _attnstore_session(client, index, session_id, dialogue, turns, max_tokens)
                for index, (session_id, dialogue) in enumerate(zip(sessions, dialogues, strict=True))
            )
        )
        for session_id in sessions:
            await client.delete_session(session_id)
    return [record for records in per_session for record in records]


async def _attnstore_session(
    client: AsyncAttnStoreClient, index: int, session_id: str, dialogue: Dialogue, turns: int, max_tokens: int
) -> list[TurnRecord]:
    records = []
    for turn in range(1, turns + 1):
        record = TurnRecord(index, turn, started=time.perf_counter(), ended=0.0)
        stream = client.stream_chat(
            session_id, dialogue.messages[turn - 1], max_tokens=max_tokens, temperature=0.0
        )
        async for event in stream:
            if isinstance(event, api.TurnStats):
                record.prompt_tokens, record.output_tokens = event.prompt_tokens, event.generated_tokens
            else:
                record.token_times.append(time.perf_counter())
        record.ended = time.perf_counter()
        records.append(record)
    return records


def vllm_level(
    server: VllmServer, dialogues: list[Dialogue], turns: int, max_tokens: int
) -> list[TurnRecord]:
    with ThreadPoolExecutor(len(dialogues)) as pool:
        futures = [
            pool.submit(_vllm_session, server, index, dialogue, turns, max_tokens)
            for index, dialogue in enumerate(dialogues)
        ]
        return [record for future in futures for record in future.result()]


def _vllm_session(
    server: VllmServer, index: int, dialogue: Dialogue, turns: int, max_tokens: int
) -> list[TurnRecord]:
    messages: list[dict[str, str]] = []
    records = []
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": dialogue.messages[turn - 1]})
        record, text = _vllm_turn(server, index, turn, messages, max_tokens)
        messages.append({"role": "assistant", "content": text})
        records.append(record)
    return records


def _vllm_turn(
    server: VllmServer, index: int, turn: int, messages: list[dict[str, str]], max_tokens: int
) -> tuple[TurnRecord, str]:
    record, pieces = TurnRecord(index, turn, started=time.perf_counter(), ended=0.0), []
    for event in server.stream_chat(messages, max_tokens):
        if isinstance(event, Usage):
            record.prompt_tokens, record.output_tokens = event.prompt_tokens, event.completion_tokens
        else:
            record.token_times.append(time.perf_counter())
            pieces.append(event)
    record.ended = time.perf_counter()
    return record, "".join(pieces)
