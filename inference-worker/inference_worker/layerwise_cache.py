"""Layer-wise pre-loading: the forward pass waits for each layer's prefix KV only when it
reaches that layer, so loading layer l+1 overlaps computing layer l.

A loader (any thread) fills a `PrefixKV` layer by layer; the engine's paged forward
(engine/model_runner.py) takes layer l from it when it reaches layer l and writes it into
the sequence's pool blocks before that layer's attention.

Shapes: prefix K, V per layer [kv_heads, prefix_tokens - start_tokens, head_dim]: tokens
[start_tokens, prefix_tokens) of the sequence (the ones before are in the worker's pool).
"""

from __future__ import annotations

import threading
import time

import torch


class PrefixLoadFailed(Exception):
    """The prefix KV could not be delivered (loader error or deadline): recompute instead.
    The cache that raised it is half-filled and must be discarded."""


_Layer = tuple[torch.Tensor, torch.Tensor, "torch.cuda.Event | None"]  # K, V, copy-done event


class PrefixKV:
    """The prefix KV of one request, handed from a loader to the forward pass.

    Each layer:   pending --put_layer--> ready --wait_layer--> taken
    The whole:    loading --fail(exc)--> failed: every later wait on a layer that is not
                                         ready raises PrefixLoadFailed (from exc)
    On CUDA the loader may pass the event recorded after its copy; the consumer's stream
    waits on it, so the forward never reads a half-copied layer.
    """

    def __init__(self, num_layers: int, prefix_tokens: int, start_tokens: int = 0) -> None:
        self.num_layers = num_layers
        self.prefix_tokens = prefix_tokens  # where the prefix ends in the sequence
        self.start_tokens = start_tokens  # where it starts: the pool holds the tokens before
        self.created_at = time.monotonic()
        self.ready_at: list[float | None] = [None] * num_layers  # monotonic time each layer arrived
        self._layers: list[_Layer | None] = [None] * num_layers
        self._error: BaseException | None = None
        self._cond = threading.Condition()

    def put_layer(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, ready: torch.cuda.Event | None = None
    ) -> None:
        """Producer side: layer `layer`'s K and V, each [kv_heads, prefix - start tokens, head_dim]."""
        tokens = self.prefix_tokens - self.start_tokens
        if k.dim() != 3 or k.shape[1] != tokens or v.shape != k.shape:
            raise ValueError(
                f"layer {layer}: K {tuple(k.shape)} / V {tuple(v.shape)} are not [kv_heads, {tokens}, head_dim]"
            )
        with self._cond:
            if self._error is not None:
                return  # already failed: the consumer no longer takes layers
            if self._layers[layer] is not None:
                raise ValueError(f"layer {layer} was put twice")
            self._layers[layer] = (k, v, ready)
            self.ready_at[layer] = time.monotonic()
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """Producer side: give up; waits on layers not yet delivered raise PrefixLoadFailed."""
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    def wait_layer(self, layer: int, timeout_seconds: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Consumer side: blocks until layer `layer` is ready, the loader fails or the timeout passes."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._layers[layer] is not None or self._error is not None, timeout_seconds
            )
            entry, error = self._layers[layer], self._error
        if entry is None:
            if error is not None:
                raise PrefixLoadFailed(f"prefix load failed before layer {layer}: {error!r}") from error
            raise PrefixLoadFailed(f"layer {layer} of the prefix did not arrive within {timeout_seconds}s")
        k, v, event = entry
        if event is not None:
            torch.cuda.current_stream(k.device).wait_event(event)
        return k, v

    @property
    def load_seconds(self) -> float | None:
        """From creation until the last layer arrived; None while some layer is missing."""
        if any(t is None for t in self.ready_at):
            return None
        return max(t for t in self.ready_at if t is not None) - self.created_at
