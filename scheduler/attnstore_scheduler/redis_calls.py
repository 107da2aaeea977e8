"""A Redis command of one of the scheduler's stores: Redis failing is UNAVAILABLE to the
caller, with the store named, never an unexpected error."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from redis.exceptions import RedisError

from attnstore.errors import Unavailable

T = TypeVar("T")


class RedisCalls:
    def __init__(self, store: str) -> None:
        self._store = store  # as the message names it: "session store"

    async def __call__(self, operation: Awaitable[T]) -> T:
        try:
            return await operation
        except RedisError as exc:
            raise Unavailable(f"the {self._store} (Redis) is unavailable: {exc}") from exc
