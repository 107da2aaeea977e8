"""The node-local KV-store daemon: a shared-memory DRAM tier and an SSD tier of KV chunks."""
