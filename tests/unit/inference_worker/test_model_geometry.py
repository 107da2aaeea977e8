"""The model geometry: one reading of the config for the runner, the model card and the pool."""

from __future__ import annotations

from transformers import LlamaConfig, Qwen2Config

from inference_worker.model_geometry import ModelGeometry


def test_geometry_reads_grouped_heads_and_explicit_head_dim() -> None:
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    geometry = ModelGeometry.of(config)
    assert (geometry.heads, geometry.kv_heads, geometry.head_dim) == (4, 2, 32)
    assert geometry.kv_bytes_per_token(4) == 2 * config.num_hidden_layers * 2 * 32 * 4


def test_geometry_falls_back_to_one_kv_head_per_head_and_hidden_over_heads() -> None:
    config = Qwen2Config(hidden_size=64, num_attention_heads=8, num_hidden_layers=3, vocab_size=99)
    config.num_key_value_heads = None
    geometry = ModelGeometry.of(config)
    assert (geometry.kv_heads, geometry.head_dim, geometry.num_layers, geometry.vocab_size) == (8, 8, 3, 99)
