"""K and V rebuilt from a layer's input hidden states, and the first layers recomputed.

HCache stores a layer's input H (the residual stream before the layer's input norm)
instead of its K and V; both come back with two projections:

    K = RoPE(W_k · norm(H)) at the tokens' positions      V = W_v · norm(H)

For a multi-head model H has as many values per token as K alone: half the bytes of KV,
and two [hidden x hidden] matmuls instead of a whole layer (attention, output projection,
MLP), over 6x less compute. The positions are where the tokens sit now, so hidden states
need no re-positioning after a truncation: they carry no rotation.

The math is the paged forward's (engine/model_runner.py), op for op, so rebuilt K and V
equal the forward's bit for bit in fp32 on the same device. Where the model's linears run
on oneDNN (cpu_linear.py, the worker's default on a CPU), K and V come from one GEMM over
[W_k | W_v] (`FusedProjection`, each output bitwise its own linear's): the GEMM is 85-90%
of a projection (12 x 768 MHA Llama, 256-token chunks, load 7: 38 of 42-44 us per token
and layer; the norm and RoPE about 1 us each), and the whole projection ran 1.12-1.17x
faster than on torch's default linears (interleaved, load 6: best 24.0-24.5 us against
27.7-28.2, median 46.9-56.6 against 54.0-63.2).

Shapes: H [tokens, hidden]; positions [tokens]; K, V [kv_heads, tokens, head_dim].
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from inference_worker.cpu_linear import FusedProjection, OneDnnLinear
from inference_worker.engine.model_runner import project_qkv, rotary_of, sliding_window
from inference_worker.model_geometry import ModelGeometry
from inference_worker.rotary_shift import rotate_half

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer K, V [kv_heads, tokens, head_dim]


@torch.no_grad()
def project_kv(
    model: PreTrainedModel,
    layer: int,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V [kv_heads, tokens, head_dim] of `layer` from its input hidden states H
    [tokens, hidden] at `positions` [tokens]; `cos_sin` (from `rotary_of`) saves
    recomputing the rotation per layer."""
    geometry = ModelGeometry.of(model.config)
    decoder_layer = model.model.layers[layer]
    attn = decoder_layer.self_attn
    tokens = hidden.shape[0]
    k, v = _kv_projection(attn)(decoder_layer.input_layernorm(hidden))
    k = k.view(tokens, geometry.kv_heads, geometry.head_dim)  # [tokens, kv_heads, D]
    v = v.view(tokens, geometry.kv_heads, geometry.head_dim)
    cos, sin = cos_sin if cos_sin is not None else rotary_of(model.model, hidden, positions)
    k = k * cos + rotate_half(k) * sin
    return k.transpose(0, 1), v.transpose(0, 1)


def _kv_projection(attn: torch.nn.Module) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """K and V (before RoPE) of normed rows: one oneDNN GEMM over [W_k | W_v] where the
    layer's linears run on oneDNN, made on first use (only a worker that projects keeps its
    packed copy of the weights); else the two linears."""
    fused: FusedProjection | None = getattr(attn, "fused_kv", None)
    if fused is None and isinstance(attn.k_proj, OneDnnLinear) and isinstance(attn.v_proj, OneDnnLinear):
        fused = attn.fused_kv = FusedProjection((attn.k_proj, attn.v_proj))
    return fused if fused is not None else lambda x: (attn.k_proj(x), attn.v_proj(x))


@torch.no_grad()
def recompute_layers(
    model: PreTrainedModel,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    count: int,
    layer_input: Callable[[int, torch.Tensor], None] | None = None,
) -> tuple[KV, torch.Tensor]:
    """Runs the first `count` layers over `token_ids` [tokens] (a prefix starting at the
    sequence's first token, causal) at `positions` [tokens]: their K and V, and the input
    hidden states [tokens, hidden] of layer `count` (what a HIDDEN layer after them would
    have stored). `layer_input(layer, H)` sees each recomputed layer's input on the way."""
    decoder = model.model
    geometry = ModelGeometry.of(model.config)
    hidden = decoder.embed_tokens(token_ids)  # [tokens, hidden]
    tokens = hidden.shape[0]
    cos_sin = rotary_of(decoder, hidden, positions)
    kv: KV = []
    for index in range(count):
        if layer_input is not None:
            layer_input(index, hidden)
        layer = decoder.layers[index]
        attn = layer.self_attn
        q, k, v = project_qkv(attn, layer.input_layernorm(hidden), cos_sin, geometry)  # [tokens, *heads, D]
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [*heads, tokens, D]
        out = F.scaled_dot_product_attention(
            q.unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=_window_mask(model.config, attn, tokens, hidden.device),
            is_causal=sliding_window(model.config, attn) is None,
            scale=attn.scaling,
            enable_gqa=True,
        )  # [1, heads, tokens, D]
        hidden = hidden + attn.o_proj(out[0].transpose(0, 1).reshape(tokens, -1))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        kv.append((k, v))
    return kv, hidden


def _window_mask(config: object, attn: object, tokens: int, device: torch.device) -> torch.Tensor | None:
    """[tokens, tokens] True where a query may attend, for a sliding-window layer; else None."""
    window = sliding_window(config, attn)
    if window is None:
        return None
    position = torch.arange(tokens, device=device)
    query, key = position[:, None], position[None, :]
    return (key <= query) & (key > query - window)
