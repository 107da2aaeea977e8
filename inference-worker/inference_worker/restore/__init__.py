"""KV restored from stored per-layer hidden states, KV and recomputation (HCache,
docs/hidden-states.md)."""
