"""The hit-rate replay gives the predictive policy no future information: two workloads
that agree up to a moment and differ after it (other later turns, more sessions) make
the scheduler push exactly the same hints, and the daemon answer exactly the same
lookups, up to that moment, against a real daemon."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop
from running_daemon import running_daemon

from attnstore.chunks.keys import chunk_key
from attnstore.kvstore_client import AsyncKVStoreClient
from attnstore_scheduler.lookahead import NodeCapacity
from attnstore_scheduler.session_activity import SessionActivity
from bench.hitrate.run import DAEMON_SETTINGS
from bench.hitrate.sim import Replay
from bench.hitrate.workloads import CHUNK_BYTES, Session, Turn, Workload, chunk_layout, namespace_for

CHUNK_TOKENS = 256
NS = namespace_for(CHUNK_TOKENS)
MOMENT_S = 50.0  # the workloads agree before this simulated second


def chain(session: int, length: int, salt: int = 0) -> tuple[bytes, ...]:
    keys: list[bytes] = []
    for index in range(length):
        keys.append(chunk_key(NS, keys[-1] if keys else None, [session, index, salt if index >= 8 else 0]))
    return tuple(keys)


def workload(future: int) -> Workload:
    """Six conversations of two turns before MOMENT_S; session 0's third turn comes after it
    (its think time and keys) depends on `future`, as do the sessions that arrive after it."""
    sessions = []
    for number in range(6):
        turns = [Turn(chain(number, 4), 2, 0.5, 0.0), Turn(chain(number, 8), 4, 0.5, 10.0 + number)]
        if number == 0:
            turns.append(Turn(chain(number, 12, salt=future), 8, 0.5, 60.0 + 10 * future))
        sessions.append(Session(float(number), tuple(turns), end_s=30.0 if number == 5 else None))
    sessions += [
        Session(MOMENT_S + 10 + i, (Turn(chain(100 + future * 10 + i, 6), 0, 0.5, 0.0),))
        for i in range(future)
    ]
    return Workload("sharegpt", CHUNK_TOKENS, sessions)


class RecordingKV:
    """The real client, with every Hint call recorded beside the replay's simulated time."""

    def __init__(self, inner: AsyncKVStoreClient) -> None:
        self.inner = inner
        self.clock: Callable[[], float] = lambda: 0.0
        self.calls: list[tuple[float, Any]] = []

    async def hint(self, namespace: bytes, entries: Any, **options: Any) -> Any:
        self.calls.append((self.clock(), namespace, [tuple(entry) for entry in entries], options))
        return await self.inner.hint(namespace, entries, **options)

    async def lookup(self, namespace: bytes, keys: Any, **options: Any) -> Any:
        found = await self.inner.lookup(namespace, keys, **options)
        self.calls.append((self.clock(), namespace, tuple(keys), found.prefix_length))
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def calls_before_the_moment(directory: Path, future: int) -> list[tuple[float, Any]]:
    """One replay against a fresh daemon: the hints pushed and lookups answered before MOMENT_S."""
    directory.mkdir()
    settings = {**DAEMON_SETTINGS, "eviction_policy": "predictive"}
    with running_daemon(
        directory, dram_bytes=1024 * 1024, ssd_bytes=1024 * 1024, settings=settings
    ) as daemon:
        return uvloop.run(pushes_before_the_moment(daemon.address, future))


async def pushes_before_the_moment(address: str, future: int) -> list[tuple[float, Any]]:
    async with AsyncKVStoreClient(address) as client:
        await client.register_namespace(NS, **chunk_layout(CHUNK_TOKENS))
        kv = RecordingKV(client)
        run = Replay(
            workload(future),
            kv,
            NodeCapacity(64 * CHUNK_BYTES, 640 * CHUNK_BYTES),
            slots=2,  # type: ignore[arg-type]
            push_hints=True,
            hint_interval_s=0.2,
            on_turn_done=lambda: None,
            activity=SessionActivity(),
            predict_interval_s=1.0,
        )
        kv.clock = lambda: run.now
        await run.run()
        assert any(when >= MOMENT_S for when, *_ in kv.calls)  # the futures did differ in what was pushed
        return [call for call in kv.calls if call[0] < MOMENT_S]


def test_pushes_and_lookups_up_to_a_moment_do_not_depend_on_what_comes_after(tmp_path: Path) -> None:
    one = calls_before_the_moment(tmp_path / "one", future=1)
    other = calls_before_the_moment(tmp_path / "other", future=3)
    hints = [call for call in one if isinstance(call[2], list)]
    assert any(entry[1].name == "PREDICT" for call in hints for entry in call[2]), (
        "no predictions before the moment"
    )
    assert any(call[3] > 0 for call in one if isinstance(call[2], tuple)), "no lookup hit before the moment"
    assert one == other
