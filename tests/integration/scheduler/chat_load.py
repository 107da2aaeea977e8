"""Load for the failure tests: sessions chatting turn after turn through the public API,
each in its own thread, while a test breaks something underneath them.

A refused turn is retried with the same message, as an application would, and the
refusal's status is kept, so a test can say which failures it tolerates. A turn counts as
acknowledged once the client has its stats saying it was saved; an answer whose turn was
not saved (the session store failed under it) is sent again, as the API tells clients.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import grpc
from scheduler_stack import Stack, wait_for

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AttnStoreClient

MESSAGES = ("hello world, how are you", "the capital of france is paris", "system user assistant")
RETRY_PAUSE_SECONDS = 0.1


@dataclass(frozen=True)
class Turn:
    message: str
    answer: str
    stats: api.TurnStats
    acknowledged_at: float  # time.monotonic()


@dataclass
class SessionLoop:
    client: AttnStoreClient
    session_id: str
    max_tokens: int
    turns: list[Turn] = field(default_factory=list)
    refusals: list[grpc.StatusCode] = field(default_factory=list)
    unsaved: int = 0  # answers received whose turn the session store did not record

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            message = f"{MESSAGES[len(self.turns) % len(MESSAGES)]} {len(self.turns)}"
            try:
                answer = self.client.chat(self.session_id, message, max_tokens=self.max_tokens)
            except grpc.RpcError as exc:
                self.refusals.append(exc.code())
                time.sleep(RETRY_PAUSE_SECONDS)
                continue
            if not answer.stats.session_saved:
                self.unsaved += 1
                continue
            self.turns.append(Turn(message, answer.text, answer.stats, time.monotonic()))

    def turns_since(self, moment: float) -> list[Turn]:
        return [turn for turn in self.turns if turn.acknowledged_at > moment]

    def assert_every_acknowledged_turn_stored(self) -> None:
        """The stored conversation holds each acknowledged turn, in order. It may hold more:
        a turn stored whose reply never reached the client is sent again by it."""
        stored = self.client.get_session(self.session_id).messages
        pairs = [
            (question.content, answer.content)
            for question, answer in itertools.pairwise(stored)
            if (question.role, answer.role) == (api.ROLE_USER, api.ROLE_ASSISTANT)
        ]
        remaining = iter(pairs)
        for turn in self.turns:
            assert (turn.message, turn.answer) in remaining, f"acknowledged turn {turn.message!r} was lost"


class ChatLoad:
    """`sessions` conversations chatting concurrently until `stop()`."""

    def __init__(self, stack: Stack, sessions: int, *, max_tokens: int = 8, system_prompt: str = "") -> None:
        self.loops = []
        for _ in range(sessions):
            client = stack.client()
            session_id = client.create_session(system_prompt=system_prompt).session_id
            self.loops.append(SessionLoop(client, session_id, max_tokens))
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=loop.run, args=(self._stop,), daemon=True) for loop in self.loops
        ]

    def start(self) -> ChatLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=180)
            assert not thread.is_alive(), "a session's turn never ended"

    def wait_for_turns(self, per_session: int, *, since: float = 0.0, what: str) -> None:
        """Until every session has `per_session` acknowledged turns after `since`."""
        wait_for(
            lambda: all(len(loop.turns_since(since)) >= per_session for loop in self.loops),
            what=what,
            timeout_seconds=120,
        )

    @property
    def turns(self) -> list[Turn]:
        return [turn for loop in self.loops for turn in loop.turns]

    @property
    def refusals(self) -> list[grpc.StatusCode]:
        return [code for loop in self.loops for code in loop.refusals]
