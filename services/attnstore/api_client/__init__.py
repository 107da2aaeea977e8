"""Python SDK of the public API (attnstore.api.v1.AttnStore), what application backends
import: `AttnStoreClient` (blocking) and `AsyncAttnStoreClient` (asyncio). Failures are
grpc.RpcError with the server's status code and message. `ClientCredentials` configures
TLS to a scheduler that serves it."""

from attnstore.api_client.async_client import AsyncAttnStoreClient
from attnstore.api_client.requests import Answer
from attnstore.api_client.sync_client import AttnStoreClient
from attnstore.security.credentials import ClientCredentials

__all__ = ["Answer", "AsyncAttnStoreClient", "AttnStoreClient", "ClientCredentials"]
