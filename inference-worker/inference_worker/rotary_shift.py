"""Re-positioning stored keys (position decoupling).

Chunks store keys already rotated for their positions, starting at the header's
base_position p0. RoPE rotates each pair of dims by an angle proportional to the
position, and rotations compose: R(p0 + delta) = R(delta) R(p0). So keys stored for
p0 serve at p_new by one more rotation by delta = p_new - p0; values carry no position.

Only Llama-style RoPE (the rotate_half pairing, full head_dim rotated, frequencies that
do not depend on the sequence length) is supported. cos/sin come from the model's own
rotary module, so static rope scaling (linear, llama3, yarn...) is honored.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from inference_worker.model_geometry import ModelGeometry

# Model types whose attention applies rotate_half RoPE over the whole head to q and k.
ROTATE_HALF_MODEL_TYPES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}
)
# Rope types whose frequencies change with the sequence length: a stored key's rotation
# cannot be composed with one computed for another length.
LENGTH_DEPENDENT_ROPE_TYPES = frozenset({"dynamic", "longrope"})


class PositionShiftUnsupported(NotImplementedError):
    """This model's keys cannot be re-positioned: reuse them only at their stored positions
    (or recompute)."""


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[..., head_dim] -> [..., head_dim]: (x1, x2) -> (-x2, x1) over the two halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryShift:
    """Rotates keys by a position delta with one model's rotary embedding."""

    def __init__(self, model: PreTrainedModel) -> None:
        config = model.config
        model_type = getattr(config, "model_type", type(model).__name__)
        rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
        if rotary is None:
            raise PositionShiftUnsupported(f"model type {model_type!r} has no rotary position embedding")
        if model_type not in ROTATE_HALF_MODEL_TYPES:
            raise PositionShiftUnsupported(
                f"model type {model_type!r}: re-positioning keys is only implemented for "
                f"{sorted(ROTATE_HALF_MODEL_TYPES)}"
            )
        rope_type = getattr(rotary, "rope_type", None)
        if not isinstance(rope_type, str) or rope_type in LENGTH_DEPENDENT_ROPE_TYPES:
            raise PositionShiftUnsupported(
                f"model type {model_type!r}: rope type {rope_type!r} is not shiftable"
            )
        head_dim = ModelGeometry.of(config).head_dim
        if rotary.inv_freq.numel() * 2 != head_dim:
            raise PositionShiftUnsupported(f"model type {model_type!r}: partial rotary embedding")
        self.rotary = rotary
        self.head_dim = head_dim

    def cos_sin(self, delta: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [head_dim] in fp32 of a rotation by `delta` positions."""
        probe = torch.empty(0, device=device, dtype=torch.float32)  # fixes device and dtype only
        position_ids = torch.tensor([[delta]], device=device)  # [1, 1]
        cos, sin = self.rotary(probe, position_ids)  # each [1, 1, head_dim]
        # The module multiplies both by its attention scaling (yarn); stored keys already
        # carry it once, so the extra rotation must be a pure rotation.
        scale = self.rotary.attention_scaling
        return cos.reshape(-1) / scale, sin.reshape(-1) / scale

    def shift_keys(self, keys: torch.Tensor, delta: int) -> torch.Tensor:
        """Keys [..., tokens, head_dim] rotated for positions p moved to p + delta (any sign).
        Computed in fp32, returned in the keys' dtype; `keys` itself when delta is 0."""
        if delta == 0:
            return keys
        if keys.shape[-1] != self.head_dim:
            raise ValueError(f"keys have head_dim {keys.shape[-1]}, the model {self.head_dim}")
        cos, sin = self.cos_sin(delta, keys.device)  # [head_dim], broadcast over tokens
        return rotate(keys, cos, sin)


def rotate(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Keys [..., tokens, head_dim] rotated by cos, sin (broadcast: [head_dim] or [tokens,
    head_dim]): k * cos + rotate_half(k) * sin in fp32, returned in the keys' dtype as a
    new tensor. `keys` is not modified."""
    out = torch.empty(keys.shape, dtype=torch.float32, device=keys.device)
    rotate_into(out, keys, cos, sin)
    return out.to(keys.dtype)


def rotate_into(out: torch.Tensor, keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """`rotate` written into `out` (the keys' shape, any view; computed in fp32): three
    passes, no rotate_half copy (a prompt's module spans are rotated straight into their
    joined layer, ~1,000 keys a layer on the TTFT path)."""
    if out.dtype != torch.float32:
        out.copy_(rotate(keys, cos, sin))
        return
    k = keys.float()  # [..., tokens, head_dim]
    half = k.shape[-1] // 2
    torch.mul(k, cos, out=out)
    out[..., :half].addcmul_(k[..., half:], sin[..., :half], value=-1)
    out[..., half:].addcmul_(k[..., :half], sin[..., half:])
