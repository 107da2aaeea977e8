"""asyncio client of the public API; the same calls as AttnStoreClient, awaited.

async with AsyncAttnStoreClient("127.0.0.1:50071", api_key="...") as client:
    session = await client.create_session()
    async for event in client.stream_chat(session.session_id, "Hello!"):
        ...  # TokenText pieces, then TurnStats
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypedDict

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
from attnstore.closable import AsyncClosable
from attnstore.security.credentials import ClientCredentials, aio_channel


class ClientOptions(TypedDict, total=False):
    """AsyncAttnStoreClient's keyword arguments, for the blocking client to pass on."""

    timeout_seconds: float
    credentials: ClientCredentials | None


class AsyncAttnStoreClient(AsyncClosable):
    def __init__(
        self,
        address: str,
        api_key: str | None = None,
        *,
        timeout_seconds: float = 300.0,
        credentials: ClientCredentials | None = None,
    ) -> None:
        """Create it inside a running event loop. `timeout_seconds` bounds each call, a whole
        streamed answer included. `credentials`: TLS to a scheduler that serves it, e.g.
        `ClientCredentials.from_pem(ca_pem)` (plus `certificate_chain` and `private_key`
        when it requires client certificates); None: plaintext."""
        self._channel = aio_channel(address, credentials, CHANNEL_OPTIONS)
        self._stub = api_pb2_grpc.AttnStoreStub(self._channel)
        self._metadata = call_metadata(api_key)
        self._timeout_seconds = timeout_seconds

    async def close(self) -> None:
        await self._channel.close()

    def _kwargs(self) -> dict[str, Any]:
        return {"metadata": self._metadata, "timeout": self._timeout_seconds}

    async def create_session(
        self, system_prompt: str = "", ttl_seconds: int = 0, *, expected_next_turn_seconds: float = 0.0
    ) -> api.Session:
        """`expected_next_turn_seconds`: the first turn is expected within this long (0: no expectation)."""
        request = api.CreateSessionRequest(
            system_prompt=system_prompt,
            ttl_seconds=ttl_seconds,
            expected_next_turn_seconds=expected_next_turn_seconds,
        )
        return (await self._stub.CreateSession(request, **self._kwargs())).session

    async def stream_chat(
        self, session_id: str, message: str, **options_and_expectation: Any
    ) -> AsyncIterator[StreamEvent]:
        """The answer's TokenText messages as they come, then its TurnStats. `generation`:
        max_tokens, temperature, top_p, seed, stop. `expected_next_turn_seconds` (a follow-up
        expected within this long) or `conversation_over` tell the scheduler what comes next;
        `pml` (instead of message, the first turn of a session without system prompt) and
        its repair options as chat_request's."""
        request = chat_request(session_id, message, **options_and_expectation)
        async for reply in self._stub.Chat(request, **self._kwargs()):
            yield event_of(reply)

    async def chat(self, session_id: str, message: str, **options_and_expectation: Any) -> Answer:
        answer = Answer()
        async for event in self.stream_chat(session_id, message, **options_and_expectation):
            answer.add(event)
        return answer

    async def chat_pml(self, session_id: str, pml: str, **options_and_expectation: Any) -> Answer:
        """The first turn of a session as a PML prompt (its modules' KV reused); later turns are chat."""
        return await self.chat(session_id, "", pml=pml, **options_and_expectation)

    async def stream_generate(
        self, prompt: str, system_prompt: str = "", **generation: Any
    ) -> AsyncIterator[StreamEvent]:
        request = api.GenerateRequest(
            system_prompt=system_prompt, prompt=prompt, options=options(**generation)
        )
        async for reply in self._stub.Generate(request, **self._kwargs()):
            yield event_of(reply)

    async def generate(self, prompt: str, system_prompt: str = "", **generation: Any) -> Answer:
        answer = Answer()
        async for event in self.stream_generate(prompt, system_prompt, **generation):
            answer.add(event)
        return answer

    async def get_session(self, session_id: str, tenant: str = "") -> api.Session:
        request = api.GetSessionRequest(session_id=session_id, tenant=tenant)
        return (await self._stub.GetSession(request, **self._kwargs())).session

    async def delete_session(self, session_id: str, tenant: str = "") -> int:
        """Ends the session; how many KV chunks were released on its daemon."""
        request = api.DeleteSessionRequest(session_id=session_id, tenant=tenant)
        return (await self._stub.DeleteSession(request, **self._kwargs())).released_chunks

    async def list_sessions(
        self, page_size: int = 0, page_token: str = "", tenant: str = ""
    ) -> tuple[list[api.Session], str]:
        """One page of sessions (oldest first) and the token of the next ("" at the end)."""
        reply = await self._stub.ListSessions(page_request(page_size, page_token, tenant), **self._kwargs())
        return sessions_of(reply)

    async def iter_sessions(self, page_size: int = 0, tenant: str = "") -> AsyncIterator[api.Session]:
        token = ""
        while True:
            sessions, token = await self.list_sessions(page_size, token, tenant)
            for session in sessions:
                yield session
            if not token:
                return

    async def stream_register_schema(self, schema: str) -> AsyncIterator[SchemaEvent]:
        """Registers (or replaces) a PML schema: each module's encoding progress (eager
        encoding), then the SchemaInfo."""
        request = api.RegisterSchemaRequest(schema=schema)
        async for reply in self._stub.RegisterSchema(request, **self._kwargs()):
            yield schema_event_of(reply)

    async def register_schema(self, schema: str) -> api.SchemaInfo:
        events = [event async for event in self.stream_register_schema(schema)]
        last = events[-1] if events else None
        if not isinstance(last, api.SchemaInfo):
            raise TypeError("RegisterSchema's stream did not end with the schema")
        return last

    async def list_schemas(self) -> list[api.SchemaInfo]:
        return list((await self._stub.ListSchemas(api.ListSchemasRequest(), **self._kwargs())).schemas)

    async def delete_schema(self, name: str) -> bool:
        """False when no schema of that name was registered."""
        request = api.DeleteSchemaRequest(name=name)
        return (await self._stub.DeleteSchema(request, **self._kwargs())).deleted

    async def stream_generate_pml(
        self,
        pml: str,
        repair_tokens: int = 0,
        add_generation_prompt: bool = False,
        **repair_and_generation: Any,
    ) -> AsyncIterator[StreamEvent]:
        """A one-off prompt in PML against a registered schema, streamed like generate;
        `add_generation_prompt` ends it with the chat template's opening of the answer;
        `repair_method` and `repair_fraction` (keywords) as requests.repair_fields."""
        async for reply in self._stub.Generate(
            pml_request(pml, repair_tokens, add_generation_prompt, **repair_and_generation), **self._kwargs()
        ):
            yield event_of(reply)

    async def generate_pml(
        self,
        pml: str,
        repair_tokens: int = 0,
        add_generation_prompt: bool = False,
        **repair_and_generation: Any,
    ) -> Answer:
        answer = Answer()
        async for event in self.stream_generate_pml(
            pml, repair_tokens, add_generation_prompt, **repair_and_generation
        ):
            answer.add(event)
        return answer
