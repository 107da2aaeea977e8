"""The daemon's API limits its callers size their calls by, written once: the daemon's
setting defaults to them, a caller's setting is checked against the same number."""

from __future__ import annotations

# Keys (or write ids) one KVStore call may name: the daemon's max_keys_per_request default;
# the scheduler's hints.max_keys_per_call defaults to it too (a hint push splits into calls).
MAX_KEYS_PER_REQUEST = 4096
