"""DistAttention (Infinite-LLM): attention over a sequence whose KV lies in several places,
split into partial attentions merged exactly (docs/dist-attention.md)."""
