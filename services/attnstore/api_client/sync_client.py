"""Blocking client of the public API: AsyncAttnStoreClient's calls, each waited for on a
private event loop (attnstore.sync_facade), so the two clients cannot drift apart.

with AttnStoreClient("127.0.0.1:50071", api_key="...") as client:
    session = client.create_session(system_prompt="Be brief.")
    answer = client.chat(session.session_id, "Hello!")
    print(answer.text, answer.stats.reused_tokens)
"""

from __future__ import annotations

from typing import Unpack

from attnstore.api_client.async_client import AsyncAttnStoreClient, ClientOptions
from attnstore.sync_facade import SyncFacade, blocking, blocking_stream


class AttnStoreClient(SyncFacade[AsyncAttnStoreClient]):
    def __init__(self, address: str, api_key: str | None = None, **options: Unpack[ClientOptions]) -> None:
        """As AsyncAttnStoreClient."""
        super().__init__("attnstore-client", lambda: AsyncAttnStoreClient(address, api_key, **options))

    create_session = blocking(AsyncAttnStoreClient.create_session)
    stream_chat = blocking_stream(AsyncAttnStoreClient.stream_chat)
    chat = blocking(AsyncAttnStoreClient.chat)
    stream_generate = blocking_stream(AsyncAttnStoreClient.stream_generate)
    generate = blocking(AsyncAttnStoreClient.generate)
    get_session = blocking(AsyncAttnStoreClient.get_session)
    delete_session = blocking(AsyncAttnStoreClient.delete_session)
    list_sessions = blocking(AsyncAttnStoreClient.list_sessions)
    iter_sessions = blocking_stream(AsyncAttnStoreClient.iter_sessions)
    stream_register_schema = blocking_stream(AsyncAttnStoreClient.stream_register_schema)
    register_schema = blocking(AsyncAttnStoreClient.register_schema)
    list_schemas = blocking(AsyncAttnStoreClient.list_schemas)
    delete_schema = blocking(AsyncAttnStoreClient.delete_schema)
    stream_generate_pml = blocking_stream(AsyncAttnStoreClient.stream_generate_pml)
    generate_pml = blocking(AsyncAttnStoreClient.generate_pml)
    chat_pml = blocking(AsyncAttnStoreClient.chat_pml)
