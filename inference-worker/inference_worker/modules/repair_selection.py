"""Which module tokens boundary repair recomputes: the first of each module (`first`), or,
CacheBlend-style, those whose KV deviates most from what a full prefill computes
(`deviation`), at the same budget.

Deviation: the prompt's first layers are computed in full (every token, by position,
causal; DEVIATION_LAYER of them), which gives the next layer's values under full attention;
a token's deviation is the squared distance between those and the values its module was
encoded with. The tokens of largest deviation, over all the modules, are recomputed through
every layer (the simpler variant of CacheBlend, which recomputes the selection in the later
layers only and reuses the layers it computed in full).

Decisions:
- Not the first layer: its K/V depend on the token alone, so they never deviate. The third
  layer (two computed in full), not the second as in CacheBlend: on SmolLM2-135M the second
  layer's deviation picked tokens no better than the first tokens. Values, not keys: keys carry the rotary position, and a module served at
  another offset would need its keys shifted first to compare; values do not.
- The extra cost is DEVIATION_LAYER layers of a full prefill (2/30 of it on SmolLM2-135M).
- Sliding-window layers are computed with full causal attention (SmolLM2 has none).
- The first module is never selected: nothing precedes it, so its KV is already exact.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

import torch
from transformers import PreTrainedModel

from inference_worker.kv_saver import KV
from inference_worker.modules.module_prompt import ModulePrompt
from inference_worker.restore.hidden_states import recompute_layers

# Measured on SmolLM2-135M (two modules encoded apart, 10% and 20% budgets): layer 2's
# deviation picks better tokens than layer 1's; deeper layers better still, at more cost.
DEVIATION_LAYER = 2


class RepairMethod(StrEnum):
    FIRST = "first"
    DEVIATION = "deviation"


@torch.no_grad()
def select_by_deviation(
    prompt: ModulePrompt, model: PreTrainedModel, budget: int | None = None, layer: int | None = None
) -> ModulePrompt:
    """The prompt with `repaired` set: the `budget` module tokens (default: as many as the
    first-token method repairs) whose values at `layer` (default: DEVIATION_LAYER, or the
    last layer of a shallower model) deviate most. Raises ValueError for a layer outside
    [1, layers)."""
    layers = model.config.num_hidden_layers
    layer = min(DEVIATION_LAYER, layers - 1) if layer is None else layer
    if not 1 <= layer < layers:
        raise ValueError(f"the deviation layer is {layer}; it must lie in [1, {layers}) for this model")
    if budget is None:
        budget = sum(len(chosen) for chosen in prompt.repair_indices())
    eligible = eligible_pieces(prompt)
    if budget <= 0 or not eligible:
        return replace(prompt, repaired=tuple(() for _ in prompt.pieces))
    tokens = [(t, p) for part in prompt.pieces for t, p in zip(part.token_ids, part.positions, strict=True)]
    tokens += [pair for text in prompt.text for pair in zip(text.token_ids, text.positions, strict=True)]
    order = sorted({p for _, p in tokens})
    row = {position: index for index, position in enumerate(order)}
    by_position = {p: t for t, p in tokens}
    early, values = _layer_values(model, [by_position[p] for p in order], order, layer)
    deviations = []
    for index in eligible:
        part = prompt.pieces[index]
        _, cached = part.module.kv[layer]  # [kv_heads, module tokens, D]
        cached = cached[:, part.offset : part.offset + part.tokens].transpose(0, 1).reshape(part.tokens, -1)
        full = values[[row[p] for p in part.positions]]
        deviations.append(((full.float() - cached.to(full.device).float()) ** 2).sum(dim=-1))
    repaired = largest(prompt, eligible, torch.cat(deviations), budget)
    pieces = tuple(
        replace(part, exact_layers=[(k[:, rows], v[:, rows]) for k, v in early])
        for part in prompt.pieces
        for rows in [[row[p] for p in part.positions]]
    )
    return replace(prompt, pieces=pieces, repaired=repaired)


def eligible_pieces(prompt: ModulePrompt) -> list[int]:
    """The pieces repair may select from: all but those of the prompt's first module (nothing
    precedes it, so its KV is already exact)."""
    first = min((part.position for part in prompt.pieces), default=None)
    return [i for i, part in enumerate(prompt.pieces) if part.position != first]


def largest(
    prompt: ModulePrompt, eligible: list[int], scores: torch.Tensor, budget: int
) -> tuple[tuple[int, ...], ...]:
    """Per piece, the indices of its tokens among the `budget` of largest `scores` (one per
    token of the `eligible` pieces, in their order)."""
    top = set(torch.topk(scores, min(budget, scores.numel())).indices.tolist())
    repaired: list[tuple[int, ...]] = [() for _ in prompt.pieces]
    start = 0
    for index in eligible:
        count = prompt.pieces[index].tokens
        repaired[index] = tuple(i - start for i in range(start, start + count) if i in top)
        start += count
    return tuple(repaired)


def _layer_values(
    model: PreTrainedModel, token_ids: list[int], positions: list[int], layer: int
) -> tuple[KV, torch.Tensor]:
    """The KV of the layers before `layer` ([kv_heads, tokens, D] each), computed in full
    and causal over the tokens (in position order), and layer `layer`'s values after them
    [tokens, kv_heads * D]."""
    device = next(model.parameters()).device
    ids = torch.tensor(token_ids, device=device)
    early, hidden = recompute_layers(
        model, ids, torch.tensor(positions, device=device), layer
    )  # layer's input
    target = model.model.layers[layer]
    return early, target.self_attn.v_proj(target.input_layernorm(hidden))
