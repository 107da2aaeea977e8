"""Which conversation a request continues, inferred online from its chunk keys.

The Mooncake trace has no session ids: a request's `hash_ids` are its prompt's blocks.
A conversation's next request repeats every full block of the previous one (its last
block was partial, so its hash changes), so a request continues the session that last
used its deepest already-seen key when it covers all but at most that session's last
key. A shared system prompt is a short prefix of many sessions' chains and so never
counts as a continuation. Only requests already seen are consulted: nothing of the future.
"""

from __future__ import annotations

from collections.abc import Sequence


class ChainSessions:
    def __init__(self) -> None:
        self._last_user: dict[bytes, str] = {}  # key -> the session that used it last
        self._chain_length: dict[str, int] = {}
        self._count = 0

    def session_for(self, keys: Sequence[bytes]) -> str:
        """The session `keys` continue, or a new one; records the request."""
        session = None
        for depth in range(len(keys) - 1, -1, -1):  # the deepest key seen before
            owner = self._last_user.get(keys[depth])
            if owner is not None:
                if depth + 1 >= max(1, self._chain_length[owner] - 1):
                    session = owner
                break
        if session is None:
            session = f"inferred-{self._count}"
            self._count += 1
        for key in keys:
            self._last_user[key] = session
        self._chain_length[session] = len(keys)
        return session
