"""The load: N concurrent sessions of multi-turn chat through the public API (asyncio).

Each session loops: CreateSession (a system prompt), `turns_per_session` Chat turns with
short seeded messages, each sent as soon as the previous answer ended (plus `think_seconds`),
then DeleteSession, and again, until `stop()`; a turn in flight then finishes. TTFT is measured where the application sees it: from sending Chat to the first
streamed token (queueing in the scheduler included). A failed call is recorded with its
status and the session goes on.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AsyncAttnStoreClient

SYSTEM_PROMPT = "You are a concise assistant. Answer in one short sentence."
MESSAGES = (
    "What is the capital of France?",
    "Name a prime number larger than ten.",
    "Why is the sky blue?",
    "Give me a synonym for quick.",
    "How many legs does a spider have?",
    "What does a KV cache store?",
    "Translate 'good morning' into Spanish.",
    "Is a tomato a fruit?",
    "Suggest a name for a cat.",
    "What is two plus two?",
)
SESSIONS_PER_CHANNEL = 32  # one HTTP/2 connection per group of sessions, as from several app servers
START_SPREAD_SECONDS = 2.0  # sessions start at random points in this window, not all at once


@dataclass(frozen=True)
class TurnRecord:
    started: float  # on the driver's clock
    ended: float
    session_turn: int  # 1 = the session's first turn
    ttft_ms: float | None  # None: a failed turn
    prompt_tokens: int = 0
    reused_tokens: int = 0
    error: str | None = None  # the status of a failed turn
    details: str = ""  # and its message


@dataclass(frozen=True)
class LoadConfig:
    sessions: int
    turns_per_session: int
    max_tokens: int
    think_seconds: float
    seed: int


class LoadDriver:
    def __init__(self, address: str, api_key: str, config: LoadConfig, clock: Callable[[], float]) -> None:
        self._address = address
        self._api_key = api_key
        self._config = config
        self._clock = clock
        self.turns: list[TurnRecord] = []
        self.failed_session_calls: list[str] = []  # CreateSession / DeleteSession failures
        self._stopping = False

    def stop(self) -> None:
        """Sessions start no new turn; `run` returns once the turns in flight end."""
        self._stopping = True

    async def run(self) -> None:
        """Runs every session until `stop()`."""
        config = self._config
        clients = [
            AsyncAttnStoreClient(self._address, self._api_key, timeout_seconds=600)
            for _ in range(math.ceil(config.sessions / SESSIONS_PER_CHANNEL))
        ]
        try:
            await asyncio.gather(
                *(
                    self._session_loop(
                        clients[index // SESSIONS_PER_CHANNEL],
                        random.Random(config.seed * 100_003 + index),
                    )
                    for index in range(config.sessions)
                )
            )
        finally:
            await asyncio.gather(*(client.close() for client in clients))

    async def _session_loop(self, client: AsyncAttnStoreClient, rng: random.Random) -> None:
        await asyncio.sleep(rng.uniform(0, START_SPREAD_SECONDS))
        while not self._stopping:
            try:
                session_id = (await client.create_session(system_prompt=SYSTEM_PROMPT)).session_id
            except grpc.RpcError as exc:
                self.failed_session_calls.append(exc.code().name)
                await asyncio.sleep(0.1)
                continue
            for turn in range(1, self._config.turns_per_session + 1):
                if self._stopping:
                    break
                self.turns.append(await self._turn(client, session_id, turn, rng.choice(MESSAGES)))
                await asyncio.sleep(self._config.think_seconds)
            try:
                await client.delete_session(session_id)
            except grpc.RpcError as exc:
                self.failed_session_calls.append(exc.code().name)

    async def _turn(
        self, client: AsyncAttnStoreClient, session_id: str, turn: int, message: str
    ) -> TurnRecord:
        started, first_token = self._clock(), None
        sent = time.perf_counter()
        try:
            async for event in client.stream_chat(session_id, message, max_tokens=self._config.max_tokens):
                if isinstance(event, api.TurnStats):  # an empty answer's first event is its stats
                    ttft_ms = ((first_token or time.perf_counter()) - sent) * 1000
                    return TurnRecord(
                        started, self._clock(), turn, ttft_ms, event.prompt_tokens, event.reused_tokens
                    )
                first_token = first_token or time.perf_counter()
        except grpc.RpcError as exc:
            return TurnRecord(
                started, self._clock(), turn, None, error=exc.code().name, details=exc.details() or ""
            )
        return TurnRecord(started, self._clock(), turn, None, error="NO_STATS")
