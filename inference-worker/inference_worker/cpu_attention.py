"""Grouped-query attention on a CPU without copying the cached K and V per query head.

Why: transformers' SDPA path repeats each KV head for its query heads (`repeat_kv`)
whenever it passes an attention mask, which it does on every turn that extends a cache:
for SmolLM2 (9 query heads, 3 KV heads) that is a copy of 3x the cached K and V in every
layer, a third of the CPU time of a 30-token turn on a 1300-token history. torch's CPU
flash-attention kernel takes grouped heads and a mask itself (`enable_gqa`), with
bit-identical logits here; transformers uses it only when told to
(TRANSFORMERS_SDPA_FORCE_GQA), because on CUDA a mask would send grouped heads to the slow
math kernel. Measured on the development machine: 30 new tokens on 1300 cached,
124-141 -> 110-118 ms per forward; a 450-token prefill unchanged.
"""

from __future__ import annotations

import os

from inference_worker.kernels import KernelChoice

FORCE_GQA_VARIABLE = "TRANSFORMERS_SDPA_FORCE_GQA"


def use_grouped_query_sdpa() -> KernelChoice:
    """Routes this process's SDPA attention through torch's grouped-head kernels (read by
    transformers on every attention call). Call it only for a model on a CPU."""
    if FORCE_GQA_VARIABLE not in os.environ:  # an explicit setting wins
        os.environ[FORCE_GQA_VARIABLE] = "1"
        return KernelChoice("sdpa-grouped-query", "CPU: torch's grouped-head SDPA, no repeated KV heads")
    if os.environ[FORCE_GQA_VARIABLE] == "1":
        return KernelChoice("sdpa-grouped-query", f"{FORCE_GQA_VARIABLE}=1 in the environment")
    return KernelChoice("sdpa", f"{FORCE_GQA_VARIABLE}={os.environ[FORCE_GQA_VARIABLE]} in the environment")
