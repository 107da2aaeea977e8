"""The forward pass of one sequence whose KV lies in several places (DistAttention).

Per layer: the new tokens' K and V go to the sequence's tail segment (here), then the
queries attend each place separately, remote places first (one call per peer, whatever
the number of segments it holds, on a thread pool while the local partials compute), and
the partials merge exactly. The rest of the layer is the model's own (the same pre-norm
Llama/Qwen2/Mistral layer as the paged runner). One sequence at a time: a context that
needs other nodes' memory is not batched.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from transformers import PreTrainedModel

from inference_worker.dist_attention.partial import Partial, merge
from inference_worker.dist_attention.remote import RemoteSegment, attend_on_peer
from inference_worker.dist_attention.segment import KVPlace, LocalSegment
from inference_worker.engine.model_runner import (
    SUPPORTED_MODEL_TYPES,
    UnsupportedModel,
    project_qkv,
    rotary_of,
    sliding_window,
)
from inference_worker.model_geometry import ModelGeometry


class DistributedRunner:
    def __init__(self, model: PreTrainedModel, remote_threads: int = 8) -> None:
        config = model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(f"model type {config.model_type!r} has no distributed forward")
        self.model = model
        self.geometry = ModelGeometry.of(config)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.windows = [sliding_window(config, layer.self_attn) for layer in model.model.layers]
        self._remote = ThreadPoolExecutor(remote_threads, thread_name_prefix="micro-attention")

    def close(self) -> None:
        self._remote.shutdown(wait=False, cancel_futures=True)

    def new_segment(self, start: int, capacity_tokens: int) -> LocalSegment:
        g = self.geometry
        return LocalSegment(
            g.num_layers, g.kv_heads, g.head_dim,
            start=start, capacity_tokens=capacity_tokens, dtype=self.dtype, device=self.device,
        )  # fmt: skip

    @torch.no_grad()
    def forward(
        self, token_ids: Sequence[int], start: int, places: Sequence[KVPlace], tail: LocalSegment
    ) -> torch.Tensor:
        """Runs tokens at positions [start, start + n) with earlier KV in `places`; their K
        and V are appended to `tail` (which may be one of `places`, or not, then it is
        attended too). The logits [vocab] (fp32) of the last token. Raises what a remote
        place raises (remote.PlaceLost)."""
        decoder, g = self.model.model, self.geometry
        n = len(token_ids)
        positions = torch.arange(start, start + n, device=self.device)
        hidden = decoder.embed_tokens(torch.tensor(token_ids, device=self.device))  # [n, hidden]
        rotary = rotary_of(decoder, hidden, positions)
        everywhere = list(places) if any(p is tail for p in places) else [*places, tail]
        tail.reserve(n)
        for index, layer in enumerate(decoder.layers):
            attn = layer.self_attn
            q, k, v = project_qkv(attn, layer.input_layernorm(hidden), rotary, g)
            tail.write(index, k, v)
            out = self.start_attend(
                everywhere, index, q, positions, scale=attn.scaling, window=self.windows[index]
            )()
            hidden = hidden + attn.o_proj(out.out.to(hidden.dtype).reshape(n, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.lm_head(decoder.norm(hidden[-1:]))[0].float()  # [vocab]

    def start_attend(
        self,
        places: Sequence[KVPlace],
        layer: int,
        q: torch.Tensor,
        positions: torch.Tensor,
        *,
        scale: float,
        window: int | None,
    ) -> Callable[[], Partial]:
        """Starts the merged partial of q over every place: one call per peer (all the
        segments it holds) in flight from now on; calling the result computes the local
        places meanwhile, waits for the peers and merges."""
        peers: dict[str, list[RemoteSegment]] = defaultdict(list)
        for place in places:
            if isinstance(place, RemoteSegment):
                peers[place.address].append(place)
        remote: list[Future[Partial]] = [
            self._remote.submit(attend_on_peer, segments, layer, q, positions, scale=scale, window=window)
            for segments in peers.values()
        ]

        def result() -> Partial:
            local = [
                p.partial(layer, q, positions, scale=scale, window=window)
                for p in places
                if not isinstance(p, RemoteSegment)
            ]
            return merge([*local, *(f.result() for f in remote)])

        return result
