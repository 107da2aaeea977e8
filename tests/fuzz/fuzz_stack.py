"""The fuzzed services: a LocalStack of one daemon, one worker (a tiny random-weight Llama)
and one scheduler with the embedded session store, real processes on loopback (the fixture
is in conftest.py).

Before any fuzzing, a canary tenant stores data the fuzzer can never name: a chunk under a
namespace only the canary knows, and a session of the canary tenant (the fuzzer calls with
another tenant's key). `FuzzStack.assert_intact()` checks that every server still serves
and that both canaries read back exactly. The fuzzer's own tenant gets a registered
namespace, stored chunks and sessions, offered to it as field values (`pools`) so that
fuzzed calls also reach real state."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.message import Message
from service_probes import is_serving

from attnstore.api.v1 import api_pb2 as api
from attnstore.api_client import AttnStoreClient
from attnstore.chunks.format import DTYPE_BYTES, encode_chunk
from attnstore.chunks.keys import chunk_key_chain
from attnstore.kvstore.v1 import kvstore_pb2 as kv_pb
from attnstore.kvstore_client import KVStoreClient
from attnstore.server.process import ServiceProcess
from attnstore.worker.v1 import micro_attention_pb2 as micro_pb
from attnstore.worker.v1 import worker_pb2 as worker_pb
from attnstore_cli.local_stack import LocalStack
from attnstore_cli.stack_spec import StackSpec, WorkerSpec
from attnstore_scheduler.launcher import SchedulerProcess
from inference_worker.launcher import WorkerProcess
from kvstore_daemon.launcher import DaemonProcess

MiB = 1024 * 1024
FUZZ_KEY, CANARY_KEY = "fuzz-key", "canary-key"
LAYOUT: dict[str, Any] = {
    "num_layers": 2,
    "kv_heads": 2,
    "head_dim": 8,
    "chunk_tokens": 16,
    "dtype": "float16",
}
FUZZ_NAMESPACE = bytes(range(16))
CANARY_NAMESPACE = os.urandom(16)  # a fresh secret every run: no fuzzed value can name it
DAEMON_SETTINGS = {
    "dram_capacity_bytes": 64 * MiB,
    "dram_block_bytes": 64 * 1024,
    "max_chunk_bytes": 16 * MiB,
    "ssd_capacity_bytes": 256 * MiB,
    "max_keys_per_request": 1024,
}
# Small limits so that fuzzed requests that pass them stay cheap on a tiny model.
WORKER_SETTINGS = {
    "chunk_tokens": 16,
    "max_prompt_tokens": 512,
    "max_new_tokens": 8,
    "max_messages": 8,
    "max_message_chars": 2000,
    "health_check_interval_seconds": 1.0,
    "micro_attention": {"max_held_bytes": 64 * 1024 * 1024},  # fuzzed appends cannot fill the machine
}
SCHEDULER_SETTINGS = {
    "max_message_chars": 2000,
    "max_session_tokens": 1024,
    "requests_per_second": 100_000,
    "requests_burst": 100_000,
    "worker_health_interval_seconds": 0.5,
}


def chunks_of(namespace: bytes, count: int, seed: int) -> dict[bytes, bytes]:
    """`count` chained chunks of LAYOUT with seeded random KV."""
    rng = random.Random(seed)
    tokens = LAYOUT["chunk_tokens"]
    half = LAYOUT["kv_heads"] * tokens * LAYOUT["head_dim"] * DTYPE_BYTES[LAYOUT["dtype"]]
    keys = chunk_key_chain(namespace, [rng.randrange(300) for _ in range(count * tokens)], tokens)
    return {
        key: encode_chunk(
            namespace=namespace,
            key=key,
            dtype=LAYOUT["dtype"],
            kv_heads=LAYOUT["kv_heads"],
            tokens=tokens,
            head_dim=LAYOUT["head_dim"],
            base_position=index * tokens,
            layers=[(rng.randbytes(half), rng.randbytes(half)) for _ in range(LAYOUT["num_layers"])],
        )
        for index, key in enumerate(keys)
    }


@dataclass
class FuzzStack:
    daemon: DaemonProcess
    worker: WorkerProcess
    scheduler: SchedulerProcess
    canary_chunks: dict[bytes, bytes]
    canary_session: api.Session
    pools: dict[str, list[Any]]  # field name -> values the servers know, for the fuzzer
    valid_requests: dict[str, Message]  # by method full name: what the fuzzer mutates

    @property
    def processes(self) -> dict[str, ServiceProcess]:
        return {"daemon": self.daemon, "worker": self.worker, "scheduler": self.scheduler}

    def assert_intact(self) -> None:
        for name, process in self.processes.items():
            assert process.running, f"the {name} died:\n{process.log_tail()}"
            assert is_serving(process.address), f"the {name} is not SERVING"
        with KVStoreClient(self.daemon.address) as kv:
            keys = list(self.canary_chunks)
            assert kv.get_whole_chunks(CANARY_NAMESPACE, keys) == list(self.canary_chunks.values())
        with AttnStoreClient(self.scheduler.address, CANARY_KEY) as client:
            now = client.get_session(self.canary_session.session_id)
        assert list(now.messages) == list(self.canary_session.messages)
        assert (now.turns, now.history_tokens) == (
            self.canary_session.turns,
            self.canary_session.history_tokens,
        )


FUZZ_SCHEMA = '<schema name="fuzz">hello<module name="m">world <param name="p" len="4"/></module></schema>'


def _valid_requests(keys: list[bytes], sizes: list[int], session_id: str) -> dict[str, Message]:
    """A request each RPC accepts, on the fuzzer's own state."""
    ns = FUZZ_NAMESPACE
    options = api.GenerationOptions(max_tokens=4, temperature=0.5, top_p=0.9, seed=7)
    hello = worker_pb.ChatMessage(role="user", content="hello world")
    kv_tensor = micro_pb.Tensor(shape=[2, 4, 2, 8], dtype="float32", data=bytes(2 * 4 * 2 * 8 * 4))
    query = micro_pb.Tensor(shape=[2, 4, 8], dtype="float32", data=bytes(2 * 4 * 8 * 4))
    requests: dict[str, Message] = {
        "KVStore.RegisterNamespace": kv_pb.RegisterNamespaceRequest(
            namespace=ns, layout=kv_pb.NamespaceLayout(**LAYOUT)
        ),
        "KVStore.OpenShm": kv_pb.OpenShmRequest(),
        "KVStore.OpenDataPlane": kv_pb.OpenDataPlaneRequest(),
        "KVStore.Lookup": kv_pb.LookupRequest(namespace=ns, keys=keys, promote=True),
        "KVStore.ReservePut": kv_pb.ReservePutRequest(
            namespace=ns, items=[kv_pb.PutItem(key=k, size_bytes=n) for k, n in zip(keys, sizes, strict=True)]
        ),
        "KVStore.WritePut": kv_pb.WritePutRequest(write_id=1, offset_bytes=0, data=b"x" * 64),
        "KVStore.CommitPut": kv_pb.CommitPutRequest(write_ids=[1, 2]),
        "KVStore.AbortPut": kv_pb.AbortPutRequest(write_ids=[1, 2]),
        "KVStore.Get": kv_pb.GetRequest(namespace=ns, keys=keys, layer_start=0, layer_end=2),
        "KVStore.GetShm": kv_pb.GetShmRequest(
            namespace=ns, keys=keys, lease_ttl_seconds=5, release_lease_ids=[1]
        ),
        "KVStore.ReleaseLease": kv_pb.ReleaseLeaseRequest(lease_ids=[1, 2]),
        "KVStore.Delete": kv_pb.DeleteRequest(namespace=ns, keys=keys[-1:]),
        "KVStore.Pin": kv_pb.PinRequest(namespace=ns, keys=keys, ttl_seconds=5),
        "KVStore.Unpin": kv_pb.UnpinRequest(namespace=ns, keys=keys),
        "KVStore.Hint": kv_pb.HintRequest(
            namespace=ns,
            entries=[kv_pb.HintEntry(keys=keys, action=kv_pb.HINT_ACTION_PREFETCH, queue_position=1)],
        ),
        "KVStore.Stats": kv_pb.StatsRequest(),
        "Worker.ExecuteTurn": worker_pb.ExecuteTurnRequest(
            tenant="fuzz",
            prompt_token_ids=worker_pb.TokenIds(token_ids=list(range(5, 45))),
            sampling=worker_pb.SamplingParams(
                max_tokens=4, temperature=0.7, top_p=0.9, seed=1, stop_token_ids=[2]
            ),
            save_generated=True,
        ),
        "Worker.Tokenize": worker_pb.TokenizeRequest(messages=[hello], add_generation_prompt=True),
        "Worker.DescribeModel": worker_pb.DescribeModelRequest(),
        "Worker.EncodeSchema": worker_pb.EncodeSchemaRequest(tenant="fuzz", schema=FUZZ_SCHEMA),
        "MicroAttention.AppendKV": micro_pb.AppendKVRequest(
            segment_id="fuzz", start_position=0, keys=kv_tensor, values=kv_tensor
        ),
        "MicroAttention.PartialAttention": micro_pb.PartialAttentionRequest(
            segment_id="fuzz", layer=1, queries=query, query_positions=[3, 4], scale=0.25, window=2
        ),
        "MicroAttention.ReadKV": micro_pb.ReadKVRequest(segment_id="fuzz", layer=0, piece_tokens=2),
        "MicroAttention.AttachChunks": micro_pb.AttachChunksRequest(
            segment_id="fuzz-d", namespace=ns, chunk_keys=keys
        ),
        "MicroAttention.ReleaseKV": micro_pb.ReleaseKVRequest(segment_id="fuzz"),
        "MicroAttention.DescribeLending": micro_pb.DescribeLendingRequest(),
        "MicroAttention.RecallKV": micro_pb.RecallKVRequest(creditor="127.0.0.1:1", max_bytes=1),
        "AttnStore.CreateSession": api.CreateSessionRequest(system_prompt="be brief", ttl_seconds=60),
        "AttnStore.Chat": api.ChatRequest(session_id=session_id, message="hello world", options=options),
        "AttnStore.Generate": api.GenerateRequest(
            system_prompt="be brief", prompt="hello world", options=options
        ),
        "AttnStore.GetSession": api.GetSessionRequest(session_id=session_id),
        "AttnStore.DeleteSession": api.DeleteSessionRequest(session_id=session_id),
        "AttnStore.ListSessions": api.ListSessionsRequest(page_size=2, page_token=session_id),
        "AttnStore.RegisterSchema": api.RegisterSchemaRequest(schema=FUZZ_SCHEMA),
        "AttnStore.ListSchemas": api.ListSchemasRequest(),
        "AttnStore.DeleteSchema": api.DeleteSchemaRequest(name="fuzz"),
    }
    packages = {
        "KVStore": "attnstore.kvstore.v1",
        "Worker": "attnstore.worker.v1",
        "MicroAttention": "attnstore.worker.v1",
        "AttnStore": "attnstore.api.v1",
    }
    return {f"{packages[name.split('.')[0]]}.{name}": request for name, request in requests.items()}


def _seed(
    daemon: DaemonProcess, scheduler: SchedulerProcess
) -> tuple[dict[bytes, bytes], api.Session, dict, dict]:
    """The canaries; the fuzzer's own registered namespace, chunks and sessions (as pools of
    field values), and a valid request of every RPC on them."""
    canary_chunks, fuzz_chunks = chunks_of(CANARY_NAMESPACE, 3, seed=1), chunks_of(FUZZ_NAMESPACE, 4, seed=2)
    with KVStoreClient(daemon.address) as kv:
        for namespace, chunks in ((CANARY_NAMESPACE, canary_chunks), (FUZZ_NAMESPACE, fuzz_chunks)):
            kv.register_namespace(namespace, **LAYOUT)
            assert kv.put_chunks(namespace, chunks, durable=True).stored == list(chunks)
    with AttnStoreClient(scheduler.address, CANARY_KEY) as canary:
        session = canary.create_session(system_prompt="you keep this conversation")
        canary.chat(session.session_id, "hello world", max_tokens=4)
        session = canary.get_session(session.session_id)
    with AttnStoreClient(scheduler.address, FUZZ_KEY) as fuzzer:
        session_ids = [fuzzer.create_session(system_prompt="fuzz").session_id for _ in range(3)]
    pools = {
        "namespace": [FUZZ_NAMESPACE],
        "key": list(fuzz_chunks),
        "keys": list(fuzz_chunks),
        "session_id": session_ids,
        "page_token": session_ids,
        "tenant": ["fuzz", "canary"],
        "role": ["system", "user", "assistant"],
    }
    sizes = [len(data) for data in fuzz_chunks.values()]
    return canary_chunks, session, pools, _valid_requests(list(fuzz_chunks), sizes, session_ids[0])


@contextlib.contextmanager
def running_fuzz_stack(root: Path, model_dir: Path) -> Iterator[FuzzStack]:
    """Starts the services under `root`, seeds them, and stops them on exit."""
    spec = StackSpec(
        work_dir=root,
        model_dir=model_dir,
        workers=(WorkerSpec("node"),),
        api_keys={"fuzz": FUZZ_KEY, "canary": CANARY_KEY},
        daemon_settings=DAEMON_SETTINGS,
        worker_settings=WORKER_SETTINGS,
        scheduler_settings=SCHEDULER_SETTINGS,
    )
    with LocalStack(spec) as stack:
        assert stack.scheduler is not None
        yield FuzzStack(stack.daemon, stack.worker, stack.scheduler, *_seed(stack.daemon, stack.scheduler))
