"""Python SDK of the public API (attnstore.api.v1.AttnStore), what application backends
import: `AttnStoreClient` (blocking) and `AsyncAttnStoreClient` (asyncio). Failures are
grpc.RpcError with the server's status code and message."""

from attnstore.api_client.async_client import AsyncAttnStoreClient
from attnstore.api_client.requests import Answer
from attnstore.api_client.sync_client import AttnStoreClient

__all__ = ["Answer", "AsyncAttnStoreClient", "AttnStoreClient"]
