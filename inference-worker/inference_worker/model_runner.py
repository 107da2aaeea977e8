"""The model on its device: its geometry, the prompt check, and a single-sequence forward
over a transformers DynamicCache.

Turns run on the paged engine (engine/); this forward remains for the reuse benchmark's
floor (bench/history_cache.py: a prefix already in memory, no pool). It is blocking torch
code, run in a worker thread, and the lock keeps two callers from computing at once.
"""

from __future__ import annotations

import threading
import time

import torch
from transformers import DynamicCache

from attnstore.errors import InvalidArgument
from inference_worker.kv_codec import DTYPE_NAMES
from inference_worker.model_geometry import ModelGeometry
from inference_worker.model_store import LoadedModel


class ModelRunner:
    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.device = loaded.device
        self.geometry = ModelGeometry.of(loaded.config)
        self.dtype_name = DTYPE_NAMES[loaded.dtype]
        self._lock = threading.Lock()

    def check_prompt(self, token_ids: list[int]) -> None:
        """Raises InvalidArgument unless the prompt holds tokens, all of them in the vocabulary
        (whether it fits the context window is the truncation plan's business)."""
        if not token_ids:
            raise InvalidArgument("the prompt holds no tokens")
        if min(token_ids) < 0 or max(token_ids) >= self.geometry.vocab_size:
            raise InvalidArgument(f"prompt token ids must lie in [0, {self.geometry.vocab_size})")

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.loaded.config)

    def forward(
        self, token_ids: list[int], first_position: int, cache: DynamicCache
    ) -> tuple[torch.Tensor, float]:
        """Runs `token_ids` at positions first_position, first_position + 1, ... on top of
        `cache` (which it extends); the last token's logits [vocab] in fp32, and the seconds
        the forward took (waiting for the lock not counted)."""
        with self._lock, torch.no_grad():
            started = time.perf_counter()
            input_ids = torch.tensor([token_ids], device=self.device)  # [1, T]
            positions = torch.arange(first_position, first_position + len(token_ids), device=self.device)
            out = self.loaded.model(
                input_ids=input_ids,
                position_ids=positions.unsqueeze(0),  # [1, T]
                cache=cache,
                use_cache=True,
                logits_to_keep=1,  # only the last position's logits are needed
            )
            logits = out.logits[0, -1].float()  # [vocab]
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return logits, time.perf_counter() - started
