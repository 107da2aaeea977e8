"""A conversation's KV held in the benchmark process: the in-memory floor of the reuse
benchmark, and the source of the answers' KV that goes to the store (encoded with the
worker's own codec, so the chunks are those a worker would save).

The floor is what reuse costs when the prefix KV needs no loading at all: a DynamicCache
already in this process, with the worker's own ModelRunner prefilling only the new
tokens on top of it, in a worker thread as the worker runs it. Timing it beside the
daemon paths isolates the store's overhead (Lookup, layer-wise loading and the CPU it
takes from the forward pass) from the compute both share.
"""

from __future__ import annotations

import asyncio
import time

import torch
from transformers import DynamicCache

from attnstore.chunks.keys import chunk_key_chain
from bench.reuse.stack import Timing
from inference_worker.kv_codec import encode_chunks
from inference_worker.model_runner import ModelRunner
from inference_worker.prefill import history_tail


class HistoryCache:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.tokens: list[int] = []
        self.cache = runner.new_cache()  # KV of self.tokens, token i at position i

    def prefix(self, tokens: int) -> DynamicCache:
        """A new cache holding a copy of the first `tokens` tokens' KV."""
        copy = self.runner.new_cache()
        if tokens:
            for index, layer in enumerate(self.cache.layers):
                # [batch, kv_heads, tokens, head_dim] each; update copies them into the new cache
                copy.update(layer.keys[:, :, :tokens], layer.values[:, :, :tokens], index)
        return copy

    def chunks(self, namespace: bytes, chunk_tokens: int, first_chunk: int) -> list[tuple[bytes, bytes]]:
        """(key, chunk) of the history's full chunks from `first_chunk` on."""
        end = len(self.tokens) // chunk_tokens * chunk_tokens
        start = first_chunk * chunk_tokens
        if end <= start:
            return []
        keys = chunk_key_chain(namespace, self.tokens[:end], chunk_tokens)[first_chunk:]
        # per layer K, V [kv_heads, end - start, head_dim] (batch 0)
        kv = [(layer.keys[0, :, start:end], layer.values[0, :, start:end]) for layer in self.cache.layers]
        return list(zip(keys, encode_chunks(namespace, keys, kv, chunk_tokens, start), strict=True))

    def tail_chunk(self, namespace: bytes, chunk_tokens: int) -> tuple[bytes, bytes] | None:
        """(key, chunk) of the partial chunk a worker saves after decoding this history: its
        KV ends one token short (the last generated token is never fed back)."""
        keys = chunk_key_chain(namespace, self.tokens, chunk_tokens)
        tail = history_tail(self.tokens, keys, len(self.tokens), namespace, chunk_tokens)
        if tail is None:
            return None
        start = tail.full_chunks * chunk_tokens
        end = start + tail.tokens
        kv = [(layer.keys[0, :, start:end], layer.values[0, :, start:end]) for layer in self.cache.layers]
        (chunk,) = encode_chunks(namespace, [tail.key], kv, chunk_tokens, start, include_partial=True)
        return tail.key, chunk

    async def time_turn(self, prompt: list[int], reused_tokens: int) -> Timing:
        """The floor for a turn that reused `reused_tokens`: the rest of `prompt` prefilled on
        a cache that already holds their KV (copied before the clock starts)."""
        if prompt[:reused_tokens] != self.tokens[:reused_tokens]:
            raise ValueError("the prompt does not extend the history held here")
        return await self._prefill(prompt[reused_tokens:], reused_tokens, self.prefix(reused_tokens))

    async def extend(self, tokens: list[int]) -> Timing:
        """Appends `tokens` to the history, computing their KV on top of all of it: timed, it
        is the floor of a turn whose whole history is in memory (no chunk tail to recompute)."""
        timing = await self._prefill(tokens, len(self.tokens), self.cache)
        self.tokens += tokens
        return timing

    async def _prefill(self, tokens: list[int], first_position: int, cache: DynamicCache) -> Timing:
        started = time.perf_counter()
        logits, compute_seconds = await asyncio.to_thread(self.runner.forward, tokens, first_position, cache)
        int(torch.argmax(logits))  # the first token, picked greedily as the workers do
        ttft = time.perf_counter() - started
        return Timing(ttft_ms=ttft * 1000, reused_tokens=first_position, compute_ms=compute_seconds * 1000)
