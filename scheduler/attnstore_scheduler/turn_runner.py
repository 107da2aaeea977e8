"""Runs one turn on a worker and survives the worker dying mid-turn.

Tokens are forwarded live. When the worker fails (UNAVAILABLE, a crash, a timeout...),
the turn is queued again ahead of new work and replayed from scratch on another worker;
the tokens the client already has are checked against the replay and skipped, so the
client receives one answer: exactly the replay's (with n answers, each answer's tokens are
checked against that answer's replay: their interleaving may differ). Replays are deterministic because
decoding is greedy or seeded (the scheduler picks a seed when the client gives none) and
every worker runs the same model. If a replay still differs from what was sent (another
device's floating point), the call fails with UNAVAILABLE rather than splice two answers.
Errors that are the request's fault (INVALID_ARGUMENT...) are passed on, never retried.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import grpc
import structlog

from attnstore import errors
from attnstore_scheduler import metrics
from attnstore_scheduler.dispatcher import Dispatcher
from attnstore_scheduler.job_queue import QueuedJob
from attnstore_scheduler.turn_types import Token, TurnOutcome, WorkerStats
from attnstore_scheduler.worker_registry import WorkerHandle, WorkerRegistry
from attnstore_scheduler.worker_types import TurnRequest

log = structlog.get_logger("attnstore_scheduler.turns")

_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.CANCELLED,  # the worker shut down under the turn
}
_PASSED_ON: dict[grpc.StatusCode, type[errors.ServiceError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: errors.InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
}
RETRY_PRIORITY_BOOST = 1  # a replay runs before new turns of the same priority

# Builds the worker request on the worker that will run it (a chat turn tokenizes there).
PrepareTurn = Callable[[WorkerHandle], Awaitable[TurnRequest]]


@dataclass(frozen=True)
class TurnSpec:
    tenant: str
    session_id: str  # "" for a one-off Generate
    prepare: PrepareTurn
    node: str | None  # where the KV it reads lives (affinity); None = anywhere
    priority: int = 0
    namespace: bytes = b""
    chunk_keys: Sequence[bytes] = ()  # the stored KV it will read, for look-ahead hints
    kv_bytes: int = 0


class _Finished(NamedTuple):
    request: TurnRequest
    stats: WorkerStats
    produced: dict[int, list[Token]]  # per answer


class _AttemptFailed(Exception):
    """A worker failed the turn in a way another worker may not (crash, timeout...)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code


class TurnRunner:
    def __init__(
        self,
        dispatcher: Dispatcher,
        registry: WorkerRegistry,
        *,
        retry_attempts: int,
        attempt_timeout_seconds: float,
        long_context_peers: int = 0,
    ) -> None:
        """`long_context_peers`: most other workers named to the worker with each turn."""
        self._dispatcher = dispatcher
        self._registry = registry
        self._retry_attempts = retry_attempts
        self._timeout_seconds = attempt_timeout_seconds
        self._long_context_peers = long_context_peers
        self._job_ids = itertools.count()  # unique within the one queue this runner feeds

    async def run(self, spec: TurnSpec) -> AsyncIterator[Token | TurnOutcome]:
        """Streams the answer's tokens, then one TurnOutcome."""
        sent: dict[int, list[Token]] = {}  # tokens the caller already has, per answer
        failed: list[WorkerHandle] = []
        waited, last_error = 0.0, "no attempt ran"
        for attempt in range(1, self._retry_attempts + 2):
            if failed and all(worker in failed for worker in self._registry.workers()):
                break  # no other worker to replay on: its job would wait for the caller's deadline
            slot = await self._dispatcher.admit(self._job(spec, attempt), exclude=failed, retry=attempt > 1)
            waited += slot.waited_seconds
            try:
                async with contextlib.aclosing(self._attempt(slot.worker, spec, sent)) as events:
                    async for event in events:
                        if isinstance(event, Token):
                            yield event
                            continue
                        request, stats, produced = event
                        first = produced.get(0, [])
                        yield TurnOutcome(
                            stats=stats,
                            prompt_token_ids=request.prompt_token_ids(),
                            token_ids=tuple(token.token_id for token in first),
                            text="".join(token.text for token in first),
                            node=slot.worker.node,
                            attempts=attempt,
                            queue_wait_seconds=waited,
                        )
                        return
            except _AttemptFailed as failure:
                last_error = str(failure)
                metrics.WORKER_FAILURES.labels(failure.code).inc()
                log.warning(
                    "turn_attempt_failed",
                    session_id=spec.session_id,
                    worker=slot.worker.address,
                    attempt=attempt,
                    tokens_sent=sum(map(len, sent.values())),
                    error=last_error,
                )
                self._registry.mark_failed(slot.worker)
                failed.append(slot.worker)
            finally:
                self._dispatcher.finish(slot)
        raise errors.Unavailable(f"the turn failed on {len(failed)} worker(s); last error: {last_error}")

    async def _attempt(
        self, worker: WorkerHandle, spec: TurnSpec, sent: dict[int, list[Token]]
    ) -> AsyncIterator[Token | _Finished]:
        """One worker's run of the turn: the tokens the caller does not have yet (appended
        to `sent`), then what the worker ran and reported; _AttemptFailed to try another."""
        try:
            request = await spec.prepare(worker)
            request.long_context_peers = tuple(
                self._registry.peer_addresses(worker, self._long_context_peers)
            )
            produced: dict[int, list[Token]] = {}
            replies = worker.client.execute_turn(request, timeout_seconds=self._timeout_seconds)
            async with contextlib.aclosing(replies):  # leaving early cancels the worker's call
                async for event in replies:
                    if isinstance(event, WorkerStats):
                        for sample, tokens in sent.items():
                            _check_replay_covers(tokens, produced.get(sample, []))
                        yield _Finished(request, event, produced)
                        return
                    answer, had = produced.setdefault(event.sample, []), sent.setdefault(event.sample, [])
                    answer.append(event)
                    if len(answer) <= len(had):  # a replay: the caller has this one
                        _check_replayed(had, answer)
                    else:
                        had.append(event)
                        yield event
        except grpc.aio.AioRpcError as exc:
            passed_on = _PASSED_ON.get(exc.code())
            if passed_on is not None:
                raise passed_on(f"the worker refused the turn: {exc.details()}") from exc
            raise _AttemptFailed(exc.code().name, exc.details() or "") from exc
        raise _AttemptFailed("INCOMPLETE", "the worker ended the stream without the turn's stats")

    def _job(self, spec: TurnSpec, attempt: int) -> QueuedJob:
        return QueuedJob(
            job_id=f"turn-{next(self._job_ids)}",
            tenant=spec.tenant,
            session_id=spec.session_id or f"generate-{next(self._job_ids)}",
            priority=spec.priority + (RETRY_PRIORITY_BOOST if attempt > 1 else 0),
            chunk_keys=tuple(spec.chunk_keys),
            namespace=spec.namespace,
            kv_bytes=spec.kv_bytes,
            node=spec.node,
            enqueued_at=time.monotonic(),
        )


def _check_replayed(sent: list[Token], produced: list[Token]) -> None:
    index = len(produced) - 1
    if produced[index].token_id != sent[index].token_id:
        raise errors.Unavailable(
            f"a worker failed mid-turn and the replay on another worker differs at token {index}; "
            "the answer cannot be completed, retry the turn"
        )


def _check_replay_covers(sent: list[Token], produced: list[Token]) -> None:
    if len(produced) < len(sent):
        raise errors.Unavailable(
            f"a worker failed mid-turn and the replay on another worker ended after {len(produced)} "
            f"of the {len(sent)} tokens already sent; retry the turn"
        )
