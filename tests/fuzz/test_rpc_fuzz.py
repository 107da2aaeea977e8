"""Every RPC of the services (attnstore.kvstore.v1.KVStore, attnstore.worker.v1.Worker and
MicroAttention, attnstore.api.v1.AttnStore) fuzzed against real processes: random and malformed fields
(proto_strategies.py), and bytes that are no message at all. Every call must end with a
status the service means (never UNKNOWN or INTERNAL, never a hang), every server must still
serve afterwards, and the canary data must read back unchanged (fuzz_stack.py).

ATTNSTORE_FUZZ_EXAMPLES sets the examples per RPC and test (default 150: under a minute here)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import grpc
import pytest
from fuzz_stack import FUZZ_KEY, FuzzStack
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proto_strategies import ProtoStrategies, request_class, response_class, wire_garbage

from attnstore.api.v1 import api_pb2
from attnstore.kvstore.v1 import kvstore_pb2
from attnstore.worker.v1 import micro_attention_pb2, worker_pb2

SERVICES = {
    "daemon": kvstore_pb2.DESCRIPTOR.services_by_name["KVStore"],
    "worker": worker_pb2.DESCRIPTOR.services_by_name["Worker"],
    "scheduler": api_pb2.DESCRIPTOR.services_by_name["AttnStore"],
}
METHODS = [(server, method) for server, service in SERVICES.items() for method in service.methods] + [
    ("worker", method) for method in micro_attention_pb2.DESCRIPTOR.services_by_name["MicroAttention"].methods
]
CODE = grpc.StatusCode
# What a service may answer a request it did not ask for: an answer, or a refusal it means.
ALLOWED = {
    CODE.OK,
    CODE.INVALID_ARGUMENT,
    CODE.NOT_FOUND,
    CODE.ALREADY_EXISTS,
    CODE.OUT_OF_RANGE,
    CODE.RESOURCE_EXHAUSTED,
    CODE.FAILED_PRECONDITION,
    CODE.UNAUTHENTICATED,
    CODE.PERMISSION_DENIED,
}
CALL_TIMEOUT_SECONDS = 60.0
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
FUZZ = settings(
    max_examples=int(os.environ.get("ATTNSTORE_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
# Mostly the fuzzing tenant's key (so calls get past authentication), sometimes none or a wrong one.
CREDENTIALS = st.sampled_from(
    [(("x-api-key", FUZZ_KEY),)] * 3
    + [
        (("authorization", f"Bearer {FUZZ_KEY}"),),
        (),
        (("x-api-key", "wrong"),),
        (("authorization", "Basic x"),),
    ]
)


@pytest.fixture(scope="module")
def channels(fuzz_stack: FuzzStack) -> Iterator[dict[str, grpc.Channel]]:
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    opened = {
        name: grpc.insecure_channel(p.address, options=options) for name, p in fuzz_stack.processes.items()
    }
    try:
        yield opened
    finally:
        for channel in opened.values():
            channel.close()


def invoke(
    channel: grpc.Channel,
    method: MethodDescriptor,
    requests: Sequence[Message | bytes],
    metadata: tuple[tuple[str, str], ...],
) -> tuple[grpc.StatusCode, str]:
    """Calls `method` with `requests` (one, or a stream for client-streaming methods);
    raw bytes go out as they are. The status and its details."""
    raw = bool(requests) and isinstance(requests[0], bytes)
    kind = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }[(method.client_streaming, method.server_streaming)]
    rpc = kind(
        f"/{method.containing_service.full_name}/{method.name}",
        request_serializer=None if raw else request_class(method).SerializeToString,
        response_deserializer=None if raw else response_class(method).FromString,
    )
    try:
        reply = rpc(
            iter(requests) if method.client_streaming else requests[0],
            timeout=CALL_TIMEOUT_SECONDS,
            metadata=metadata,
        )
        if method.server_streaming:
            list(reply)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return CODE.OK, ""


def requests_for(method: MethodDescriptor, stack: FuzzStack) -> st.SearchStrategy[list[Message]]:
    """Random messages, and the method's valid request with some fields fuzzed."""
    strategies = ProtoStrategies(stack.pools)
    message = st.one_of(
        strategies.message(method.input_type), strategies.mutated(stack.valid_requests[method.full_name])
    )
    return (
        st.lists(message, max_size=3)
        if method.client_streaming
        else st.lists(message, min_size=1, max_size=1)
    )


def credentials_for(server: str) -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    return CREDENTIALS if server == "scheduler" else st.just(())


def describe(requests: Sequence[Message | bytes]) -> str:
    return repr([request if isinstance(request, bytes) else str(request)[:300] for request in requests])[
        :1000
    ]


def wire_bytes_for(method: MethodDescriptor, stack: FuzzStack) -> st.SearchStrategy[list[bytes]]:
    """Bytes that are no message of the method's request type, or one with wrong wire types."""
    return st.lists(wire_garbage(method.input_type), min_size=1, max_size=2 if method.client_streaming else 1)


INPUTS = {"fields": requests_for, "wire bytes": wire_bytes_for}


@pytest.mark.parametrize("inputs", INPUTS)
@pytest.mark.parametrize(("server", "method"), METHODS, ids=[m.full_name for _, m in METHODS])
def test_fuzzed_calls_get_a_meant_status(
    fuzz_stack: FuzzStack,
    channels: dict[str, grpc.Channel],
    server: str,
    method: MethodDescriptor,
    inputs: str,
) -> None:
    @FUZZ
    @given(requests=INPUTS[inputs](method, fuzz_stack), metadata=credentials_for(server))
    def fuzz(requests: list[Message | bytes], metadata: tuple[tuple[str, str], ...]) -> None:
        code, details = invoke(channels[server], method, requests, metadata)
        assert code in ALLOWED, f"{method.full_name} answered {code.name} ({details}) to {describe(requests)}"

    fuzz()
    fuzz_stack.assert_intact()


@pytest.mark.parametrize(("server", "method"), METHODS, ids=[m.full_name for _, m in METHODS])
def test_a_corrupt_wire_format_is_invalid_argument(
    fuzz_stack: FuzzStack, channels: dict[str, grpc.Channel], server: str, method: MethodDescriptor
) -> None:
    metadata = (("x-api-key", FUZZ_KEY),) if server == "scheduler" else ()
    code, details = invoke(
        channels[server], method, [b"\x0a\xff\xff\xff\x0f"], metadata
    )  # a length past the end
    assert (code, details.split(":")[0]) == (CODE.INVALID_ARGUMENT, "the request could not be parsed")
