"""The paged-KV engine (PagedAttention): a block pool, attention over block tables, and
one batched forward pass over many sequences."""
