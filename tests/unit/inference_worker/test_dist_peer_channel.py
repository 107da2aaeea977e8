"""The channel to a peer's MicroAttention repeats DescribeLending (read-only) when the peer
answers UNAVAILABLE, and nothing else: a busy peer's failed first handshake must not make a
long turn look as if no peer had room, while a call with effects is never sent twice."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from attnstore.worker.v1 import micro_attention_pb2 as pb
from attnstore.worker.v1 import micro_attention_pb2_grpc
from inference_worker.dist_attention.remote import peer_channel


class _UnavailableOnce(micro_attention_pb2_grpc.MicroAttentionServicer):
    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _first_unavailable(self, method: str, context: grpc.ServicerContext) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        if self.calls[method] == 1:
            context.abort(grpc.StatusCode.UNAVAILABLE, "still starting")

    def DescribeLending(
        self, request: pb.DescribeLendingRequest, context: grpc.ServicerContext
    ) -> pb.DescribeLendingResponse:
        self._first_unavailable("DescribeLending", context)
        return pb.DescribeLendingResponse(held_bytes=7, max_held_bytes=100)

    def RecallKV(self, request: pb.RecallKVRequest, context: grpc.ServicerContext) -> pb.RecallKVResponse:
        self._first_unavailable("RecallKV", context)
        return pb.RecallKVResponse()


@pytest.fixture
def peer() -> Iterator[tuple[str, _UnavailableOnce]]:
    servicer = _UnavailableOnce()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    micro_attention_pb2_grpc.add_MicroAttentionServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None)


def test_describe_lending_is_retried_and_recall_is_not(peer: tuple[str, _UnavailableOnce]) -> None:
    address, servicer = peer
    channel = peer_channel(address)
    try:
        stub = micro_attention_pb2_grpc.MicroAttentionStub(channel)
        answer = stub.DescribeLending(pb.DescribeLendingRequest(), timeout=30)
        assert (answer.held_bytes, servicer.calls["DescribeLending"]) == (7, 2)
        with pytest.raises(grpc.RpcError) as failed:
            stub.RecallKV(pb.RecallKVRequest(), timeout=30)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert servicer.calls["RecallKV"] == 1
    finally:
        channel.close()
