"""Server-sent events, and noticing a client that went away.

A non-streamed answer is computed while the client's connection is watched: if the
client disconnects first, the work (and with it the turn on the worker, and its slot) is
cancelled. A streamed answer gets the same from Starlette's StreamingResponse, which
cancels the stream when the client disconnects."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel

from attnstore_scheduler.openai_api import http_metrics
from attnstore_scheduler.openai_api.errors import ApiError

T = TypeVar("T")
DONE = "data: [DONE]\n\n"


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def event(body: BaseModel | ApiError) -> str:
    data = body.body() if isinstance(body, ApiError) else body.model_dump(mode="json")
    return f"data: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; ClientGone (and `work` cancelled) when the client leaves first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, gone):
            pending.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if task.cancelled():
        http_metrics.DISCONNECTS.inc()
        raise ClientGone
    return task.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def counting_disconnects(frames: AsyncIterator[str]) -> AsyncIterator[str]:
    """`frames`, counting a stream that Starlette cancels because its client left."""
    try:
        async for frame in frames:
            yield frame
    except asyncio.CancelledError:
        http_metrics.DISCONNECTS.inc()
        raise
