"""The attach path's inputs (dist_attention/attach.py, address.py): addresses other workers
hand this one are checked (a segment's home: INVALID_ARGUMENT naming it; a lender's
daemon in DescribeLending: a malformed one is not dialled, its segments are appended);
a segment's chunk keys are chained over every token before it; the setting that
advertises a daemon needs one."""

from __future__ import annotations

import pydantic
import pytest
import torch

from attnstore.chunks.keys import chunk_key_chain
from attnstore.errors import InvalidArgument
from attnstore.worker.v1 import micro_attention_pb2 as pb
from inference_worker.dist_attention.address import check_address
from inference_worker.dist_attention.attach import ChunkAttacher, segment_keys
from inference_worker.dist_attention.held_kv import HeldKV
from inference_worker.dist_attention.limits import MicroAttentionLimits
from inference_worker.settings import WorkerSettings

NAMESPACE = bytes(range(16))
MALFORMED = ["", "a b:1", "host:1\n", "h" * 256]


@pytest.mark.parametrize("address", MALFORMED, ids=["empty", "space", "newline", "too-long"])
def test_a_malformed_address_is_an_invalid_argument_naming_it(address: str) -> None:
    with pytest.raises(InvalidArgument, match="kvstore_address .* is not a gRPC target"):
        check_address(address, "kvstore_address")
    assert check_address("node-1.example:50051", "kvstore_address") == "node-1.example:50051"


@pytest.mark.parametrize("home", MALFORMED[1:], ids=["space", "newline", "too-long"])
def test_a_segment_with_a_malformed_home_is_refused(home: str) -> None:
    held = HeldKV(MicroAttentionLimits())
    k = torch.zeros(2, 3, 1, 4)
    with pytest.raises(InvalidArgument, match="home .* is not a gRPC target"):
        held.append("s", 0, k, k, home=home)
    assert held.held_bytes == 0
    held.append("s", 0, k, k, home="home:1")  # a well-formed one, or none, is kept
    held.append("t", 0, k, k)
    assert held.held_for() == {"home:1": 2 * k.nbytes}


def test_the_daemons_peers_report_are_kept_when_well_formed() -> None:
    attacher = ChunkAttacher(None, None, chunk_tokens=8, timeout_seconds=1)
    attacher.learn("a:1", pb.DescribeLendingResponse(kvstore_address="daemon-a:7000"))
    attacher.learn("b:1", pb.DescribeLendingResponse(kvstore_address="daemon b:7000"))
    attacher.learn("c:1", pb.DescribeLendingResponse())
    assert attacher.daemons == {"a:1": "daemon-a:7000"}
    attacher.learn("a:1", pb.DescribeLendingResponse())  # no longer advertised: appended from now on
    assert attacher.daemons == {}


def test_segment_keys_are_chained_over_every_token_before() -> None:
    tokens = list(range(100, 140))
    # on chunk boundaries from the start: the plain chain, partial tail included
    assert segment_keys(NAMESPACE, tokens, 0, 20, 8) == chunk_key_chain(
        NAMESPACE, tokens[:20], 8, include_partial=True
    )
    keys = segment_keys(NAMESPACE, tokens, 13, 30, 8)
    assert len(keys) == 3  # 8 + 8 + 1 tokens
    changed_before = [*tokens[:5], 7, *tokens[6:]]
    assert set(segment_keys(NAMESPACE, changed_before, 13, 30, 8)).isdisjoint(keys)
    assert segment_keys(NAMESPACE, tokens, 13, 30, 8) == keys


def test_advertising_a_daemon_needs_one() -> None:
    with pytest.raises(pydantic.ValidationError, match="advertise_kvstore_address needs kvstore_address"):
        WorkerSettings(long_context={"advertise_kvstore_address": "node:7000"})
    settings = WorkerSettings(
        kvstore_address="127.0.0.1:7000", long_context={"advertise_kvstore_address": "node:7000"}
    )
    assert settings.long_context.advertise_kvstore_address == "node:7000"
