"""Chunk keys and the chunk byte format, computed the same way in every process."""
