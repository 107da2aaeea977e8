"""Layer-wise pre-loading: the forward pass waits for each layer's prefix KV only when it
reaches that layer, so loading layer l+1 overlaps computing layer l.

A loader (any thread) fills a `PrefixKV` layer by layer; a `LayerwiseCache` given to the
model's forward takes layer l from it on the first `update` of layer l, prepends it, and
from then on behaves as a plain `DynamicCache`.

Shapes: prefix K, V per layer [kv_heads, prefix_tokens, head_dim] (batch squeezed); the
cache's own tensors [batch, kv_heads, tokens, head_dim] as transformers expects.
"""

from __future__ import annotations

import threading
import time

import torch
from transformers import DynamicCache, PreTrainedConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


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

    def __init__(self, num_layers: int, prefix_tokens: int) -> None:
        self.num_layers = num_layers
        self.prefix_tokens = prefix_tokens
        self.created_at = time.monotonic()
        self.ready_at: list[float | None] = [None] * num_layers  # monotonic time each layer arrived
        self._layers: list[_Layer | None] = [None] * num_layers
        self._error: BaseException | None = None
        self._cond = threading.Condition()

    def put_layer(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, ready: torch.cuda.Event | None = None
    ) -> None:
        """Producer side: layer `layer`'s K and V, each [kv_heads, prefix_tokens, head_dim]."""
        if k.dim() != 3 or k.shape[1] != self.prefix_tokens or v.shape != k.shape:
            raise ValueError(
                f"layer {layer}: K {tuple(k.shape)} / V {tuple(v.shape)} are not "
                f"[kv_heads, {self.prefix_tokens}, head_dim]"
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


class LayerwiseCache(DynamicCache):
    """A DynamicCache whose layer l starts with `prefix`'s layer l, taken (waiting if needed)
    on the first `update` of layer l.

    Before a layer's prefix has arrived, `get_seq_length` and `get_mask_sizes` already
    count it: the model builds the causal mask and default position ids from them before
    its first layer runs. Pass position ids starting at `prefix.prefix_tokens` anyway.
    """

    def __init__(self, prefix: PrefixKV, config: PreTrainedConfig, *, layer_timeout_seconds: float) -> None:
        super().__init__(config=config)
        if len(self.layers) != prefix.num_layers:
            raise ValueError(f"prefix has {prefix.num_layers} layers, the model's cache {len(self.layers)}")
        for index, layer in enumerate(self.layers):
            if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
                raise ValueError(
                    f"layer-wise loading does not support {type(layer).__name__} (layer {index})"
                )
        self.prefix = prefix
        self.layer_timeout_seconds = layer_timeout_seconds
        self._pending = [True] * prefix.num_layers  # prefix not yet prepended to layer l
        self.wait_seconds = [0.0] * prefix.num_layers  # how long the forward blocked on layer l

    @property
    def exposed_load_seconds(self) -> float:
        """Time the forward pass spent waiting for prefix KV (the rest of the load was hidden)."""
        return sum(self.wait_seconds)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states, value_states: [batch, kv_heads, new_tokens, head_dim]
        if self._pending[layer_idx]:
            self._prepend_prefix(key_states, layer_idx)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def _prepend_prefix(self, key_states: torch.Tensor, layer_idx: int) -> None:
        started = time.perf_counter()
        k, v = self.prefix.wait_layer(layer_idx, self.layer_timeout_seconds)  # [kv_heads, P, head_dim]
        self.wait_seconds[layer_idx] = time.perf_counter() - started
        batch = key_states.shape[0]
        k = k.to(key_states.device, key_states.dtype).unsqueeze(0).expand(batch, -1, -1, -1)  # [B, H, P, D]
        v = v.to(key_states.device, key_states.dtype).unsqueeze(0).expand(batch, -1, -1, -1)  # [B, H, P, D]
        layer = self.layers[layer_idx]
        if type(layer) is DynamicLayer:
            # Adopt the loaded tensors as the layer's state: the append that follows is the only copy.
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
        else:
            layer.update(k, v)  # a sliding window keeps its own length bookkeeping
        self._pending[layer_idx] = False

    def get_seq_length(self, layer_idx: int = 0) -> int:
        own = super().get_seq_length(layer_idx)
        return own + self.prefix.prefix_tokens if self._pending[layer_idx] else own

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        """(kv_length, kv_offset) as the layer will answer once its prefix is in."""
        if not self._pending[layer_idx]:
            return super().get_mask_sizes(query_length, layer_idx)
        layer = self.layers[layer_idx]
        prefix_tokens = self.prefix.prefix_tokens
        if isinstance(layer, DynamicSlidingWindowLayer):
            window = layer.sliding_window
            return min(prefix_tokens, window - 1) + query_length, max(prefix_tokens - window + 1, 0)
        return prefix_tokens + query_length, 0
