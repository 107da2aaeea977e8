"""Blocking client of the public API.

with AttnStoreClient("127.0.0.1:50071", api_key="...") as client:
    session = client.create_session(system_prompt="Be brief.")
    answer = client.chat(session.session_id, "Hello!")
    print(answer.text, answer.stats.reused_tokens)
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

from attnstore.api.v1 import api_pb2 as api
from attnstore.api.v1 import api_pb2_grpc
from attnstore.api_client.requests import (
    CHANNEL_OPTIONS,
    Answer,
    SchemaEvent,
    StreamEvent,
    call_metadata,
    chat_request,
    event_of,
    options,
    page_request,
    pml_request,
    schema_event_of,
    sessions_of,
)
from attnstore.security.credentials import ClientCredentials, sync_channel


class AttnStoreClient:
    def __init__(
        self,
        address: str,
        api_key: str | None = None,
        *,
        timeout_seconds: float = 300.0,
        credentials: ClientCredentials | None = None,
    ) -> None:
        """`timeout_seconds` bounds each call, a whole streamed answer included.
        `credentials`: TLS to a scheduler that serves it, e.g.
        `ClientCredentials.from_pem(ca_pem)` (plus `certificate_chain` and `private_key`
        when it requires client certificates); None: plaintext."""
        self._channel = sync_channel(address, credentials, CHANNEL_OPTIONS)
        self._stub = api_pb2_grpc.AttnStoreStub(self._channel)
        self._metadata = call_metadata(api_key)
        self._timeout_seconds = timeout_seconds

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _kwargs(self) -> dict[str, Any]:
        return {"metadata": self._metadata, "timeout": self._timeout_seconds}

    def create_session(
        self, system_prompt: str = "", ttl_seconds: int = 0, *, expected_next_turn_seconds: float = 0.0
    ) -> api.Session:
        """`expected_next_turn_seconds`: the first turn is expected within this long (0: no expectation)."""
        request = api.CreateSessionRequest(
            system_prompt=system_prompt, ttl_seconds=ttl_seconds, expected_next_turn_seconds=expected_next_turn_seconds
        )
        return self._stub.CreateSession(request, **self._kwargs()).session

    def stream_chat(
        self, session_id: str, message: str, **options_and_expectation: Any
    ) -> Iterator[StreamEvent]:
        """The answer's TokenText messages as they come, then its TurnStats. `generation`:
        max_tokens, temperature, top_p, seed, stop. `expected_next_turn_seconds` (a follow-up
        expected within this long) or `conversation_over` tell the scheduler what comes next;
        `pml` (instead of message, the first turn of a session without system prompt) and
        its repair options as chat_request's."""
        request = chat_request(session_id, message, **options_and_expectation)
        for reply in self._stub.Chat(request, **self._kwargs()):
            yield event_of(reply)

    def chat(self, session_id: str, message: str, **options_and_expectation: Any) -> Answer:
        answer = Answer()
        for event in self.stream_chat(session_id, message, **options_and_expectation):
            answer.add(event)
        return answer

    def chat_pml(self, session_id: str, pml: str, **options_and_expectation: Any) -> Answer:
        """The first turn of a session as a PML prompt (its modules' KV reused); later turns are chat."""
        return self.chat(session_id, "", pml=pml, **options_and_expectation)

    def stream_generate(
        self, prompt: str, system_prompt: str = "", **generation: Any
    ) -> Iterator[StreamEvent]:
        request = api.GenerateRequest(
            system_prompt=system_prompt, prompt=prompt, options=options(**generation)
        )
        for reply in self._stub.Generate(request, **self._kwargs()):
            yield event_of(reply)

    def generate(self, prompt: str, system_prompt: str = "", **generation: Any) -> Answer:
        answer = Answer()
        for event in self.stream_generate(prompt, system_prompt, **generation):
            answer.add(event)
        return answer

    def get_session(self, session_id: str, tenant: str = "") -> api.Session:
        request = api.GetSessionRequest(session_id=session_id, tenant=tenant)
        return self._stub.GetSession(request, **self._kwargs()).session

    def delete_session(self, session_id: str, tenant: str = "") -> int:
        """Ends the session; how many KV chunks were released on its daemon."""
        request = api.DeleteSessionRequest(session_id=session_id, tenant=tenant)
        return self._stub.DeleteSession(request, **self._kwargs()).released_chunks

    def list_sessions(
        self, page_size: int = 0, page_token: str = "", tenant: str = ""
    ) -> tuple[list[api.Session], str]:
        """One page of sessions (oldest first) and the token of the next ("" at the end)."""
        reply = self._stub.ListSessions(page_request(page_size, page_token, tenant), **self._kwargs())
        return sessions_of(reply)

    def iter_sessions(self, page_size: int = 0, tenant: str = "") -> Iterator[api.Session]:
        token = ""
        while True:
            sessions, token = self.list_sessions(page_size, token, tenant)
            yield from sessions
            if not token:
                return

    def stream_register_schema(self, schema: str) -> Iterator[SchemaEvent]:
        """Registers (or replaces) a PML schema: each module's encoding progress (eager
        encoding), then the SchemaInfo."""
        request = api.RegisterSchemaRequest(schema=schema)
        for reply in self._stub.RegisterSchema(request, **self._kwargs()):
            yield schema_event_of(reply)

    def register_schema(self, schema: str) -> api.SchemaInfo:
        events = [event for event in self.stream_register_schema(schema)]
        last = events[-1] if events else None
        if not isinstance(last, api.SchemaInfo):
            raise TypeError("RegisterSchema's stream did not end with the schema")
        return last

    def list_schemas(self) -> list[api.SchemaInfo]:
        return list((self._stub.ListSchemas(api.ListSchemasRequest(), **self._kwargs())).schemas)

    def delete_schema(self, name: str) -> bool:
        """False when no schema of that name was registered."""
        request = api.DeleteSchemaRequest(name=name)
        return (self._stub.DeleteSchema(request, **self._kwargs())).deleted

    def stream_generate_pml(
        self, pml: str, repair_tokens: int = 0, add_generation_prompt: bool = False, **repair_and_generation: Any
    ) -> Iterator[StreamEvent]:
        """A one-off prompt in PML against a registered schema, streamed like generate;
        `add_generation_prompt` ends it with the chat template's opening of the answer;
        `repair_method` and `repair_fraction` (keywords) as requests.repair_fields."""
        for reply in self._stub.Generate(
            pml_request(pml, repair_tokens, add_generation_prompt, **repair_and_generation), **self._kwargs()
        ):
            yield event_of(reply)

    def generate_pml(
        self, pml: str, repair_tokens: int = 0, add_generation_prompt: bool = False, **repair_and_generation: Any
    ) -> Answer:
        answer = Answer()
        for event in self.stream_generate_pml(pml, repair_tokens, add_generation_prompt, **repair_and_generation):
            answer.add(event)
        return answer
