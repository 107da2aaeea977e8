"""The model's shape as the KV cache sees it, read from its config in one place (the
runner, the model card, the rotary shift and the paged KV pool all take it from here)."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig


@dataclass(frozen=True)
class ModelGeometry:
    num_layers: int
    heads: int  # query heads
    kv_heads: int  # grouped-query attention: heads % kv_heads == 0
    head_dim: int
    max_positions: int  # max_position_embeddings
    vocab_size: int

    @classmethod
    def of(cls, config: PretrainedConfig) -> ModelGeometry:
        """Configs without num_key_value_heads have one KV head per query head; without
        head_dim, hidden_size / heads (the transformers defaults for these families)."""
        heads = int(config.num_attention_heads)
        return cls(
            num_layers=int(config.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            max_positions=int(config.max_position_embeddings),
            vocab_size=int(config.vocab_size),
        )

    def kv_bytes_per_token(self, element_bytes: int) -> int:
        """K and V of every layer for one token."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * element_bytes
