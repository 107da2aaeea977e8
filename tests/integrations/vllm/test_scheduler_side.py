"""The connector's scheduler-side planning against a real daemon, without vLLM: what hit
it offers vLLM (whole chunks, never the last prompt token), which blocks a load writes,
which chunks each step saves, and that a failed load makes them saved again."""

from __future__ import annotations

from attnstore.chunks.format import encode_chunk
from attnstore.chunks.keys import chunk_key_chain
from attnstore.kvstore_client import KVStoreClient, Tier
from attnstore_vllm.namespaces import ModelShape, NamespaceRegistry, namespace_id
from attnstore_vllm.scheduler_side import SchedulerSide
from attnstore_vllm.settings import ConnectorSettings

BLOCK, CHUNK = 32, 64
SHAPE = ModelShape(
    label="tiny", digest="tiny-digest", dtype="float32", num_layers=1, kv_heads=1, head_dim=4, tp_size=1
)
PROMPT = list(range(10, 210))  # 200 tokens: three full chunks and a partial one


def side(address: str, **settings: object) -> SchedulerSide:
    config = ConnectorSettings(daemon=address, chunk_tokens=CHUNK, lookup_timeout_seconds=1.0, **settings)
    store = KVStoreClient(address, use_shm=False, timeout_seconds=1.0, verify_checksums=False)

    def register(namespace: bytes) -> None:
        store.call(
            store.aio.register_namespace(
                namespace, num_layers=1, kv_heads=1, head_dim=4, chunk_tokens=CHUNK, dtype="float32"
            ),
            1.0,
        )

    return SchedulerSide(config, SHAPE, BLOCK, store, NamespaceRegistry(register))


def store_chunks(address: str, tokens: list[int], count: int, tenant: str = "") -> list[bytes]:
    """Puts the first `count` chunks of `tokens` (zero KV) and returns all of their keys."""
    namespace = namespace_id(SHAPE, CHUNK, tenant, 0)
    keys = chunk_key_chain(namespace, tokens, CHUNK)
    zeros = bytes(CHUNK * 4 * 4)
    with KVStoreClient(address, use_shm=False) as client:
        client.register_namespace(
            namespace, num_layers=1, kv_heads=1, head_dim=4, chunk_tokens=CHUNK, dtype="float32"
        )
        chunks = [
            (
                key,
                encode_chunk(
                    namespace=namespace,
                    key=key,
                    dtype="float32",
                    kv_heads=1,
                    tokens=CHUNK,
                    head_dim=4,
                    base_position=i * CHUNK,
                    layers=[(zeros, zeros)],
                ),
            )
            for i, key in enumerate(keys[:count])
        ]
        client.put_chunks(namespace, chunks)
    return keys


def test_the_hit_is_whole_chunks_beyond_vllms_own_and_loads_into_the_right_blocks(daemon) -> None:
    keys = store_chunks(daemon.address, PROMPT, 3)
    scheduler = side(daemon.address)
    assert scheduler.matched_tokens("r", PROMPT, None, 0) == 3 * CHUNK
    assert scheduler.matched_tokens("r", PROMPT, None, 3 * CHUNK) == 0  # vLLM holds it all already
    # vLLM's own prefix cache holds the first block: the rest of the three chunks is offered.
    assert scheduler.matched_tokens("r", PROMPT, None, BLOCK) == 3 * CHUNK - BLOCK
    scheduler.after_alloc("r", 3 * CHUNK - BLOCK)
    blocks = [40, 41, 42, 43, 44, 45, 46]
    plan = scheduler.build_meta(
        new=[("r", blocks, 3 * CHUNK)], cached=[], scheduled_tokens={"r": 200 - 3 * CHUNK}
    )
    (load,) = plan.loads
    assert load.keys == (tuple(keys),) and load.block_ids == tuple(blocks[:6]) and load.skip_blocks == 1
    assert load.written_block_ids == tuple(blocks[1:6])
    assert plan.saves == []  # every full chunk of the prompt is stored already
    assert scheduler.hit_tiers("r", 3 * CHUNK - BLOCK) == {Tier.DRAM: 3 * CHUNK - BLOCK}


def test_the_chunk_holding_the_last_prompt_token_is_never_offered(daemon) -> None:
    prompt = PROMPT[: 3 * CHUNK]  # exactly three chunks, all stored
    store_chunks(daemon.address, prompt, 3)
    assert side(daemon.address).matched_tokens("r", prompt, None, 0) == 2 * CHUNK


def test_chunks_are_saved_in_the_step_that_completes_them_and_again_after_a_failed_load(daemon) -> None:
    prompt = [t + 1000 for t in PROMPT]
    keys = store_chunks(daemon.address, prompt, 1)
    scheduler = side(daemon.address)
    assert scheduler.matched_tokens("r", prompt, None, 0) == CHUNK
    scheduler.after_alloc("r", CHUNK)
    blocks = [7, 8, 9, 10, 11, 12, 13]
    first = scheduler.build_meta(new=[("r", blocks[:4], CHUNK)], cached=[], scheduled_tokens={"r": 80})
    assert [(s.keys[0], s.block_ids, s.base_position) for s in first.saves] == [(keys[1], (9, 10), CHUNK)]
    second = scheduler.build_meta(new=[], cached=[("r", blocks[4:], False, 144)], scheduled_tokens={"r": 56})
    assert [(s.keys[0], s.block_ids) for s in second.saves] == [(keys[2], (11, 12))]
    scheduler.on_invalid_blocks({7})  # the load of chunk 0 failed: vLLM recomputes from it
    third = scheduler.build_meta(new=[], cached=[("r", None, False, 0)], scheduled_tokens={"r": 200})
    assert [s.keys[0] for s in third.saves] == keys
    scheduler.finished("r")
    assert (
        scheduler.build_meta(new=[], cached=[("r", None, False, 0)], scheduled_tokens={"r": 200}).saves == []
    )


def test_tenants_do_not_share_chunks(daemon) -> None:
    prompt = [t + 2000 for t in PROMPT]
    store_chunks(daemon.address, prompt, 3, tenant="a")
    scheduler = side(daemon.address, tenant="a")
    assert scheduler.matched_tokens("r1", prompt, None, 0) == 3 * CHUNK
    assert scheduler.matched_tokens("r2", prompt, "b", 0) == 0


def test_a_daemon_that_does_not_answer_is_a_miss() -> None:
    assert side("127.0.0.1:1").matched_tokens("r", PROMPT, None, 0) == 0
