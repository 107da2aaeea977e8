"""What this machine has, for tests whose subject depends on it. Everything is detected at
run time; a test that needs a feature skips with the reason, never assumes the development
machine's CPU, memory or devices."""

from __future__ import annotations

import functools
import importlib.util

from attnstore.shm_arena import seqlock_reads_supported


@functools.cache
def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


# Lease-free shared-memory reads rely on loads staying in program order (x86-64's TSO); other
# CPUs take a lease for every read, so those tests have nothing to check there.
LEASE_FREE_READS = seqlock_reads_supported()
LEASE_FREE_READS_REASON = "lease-free reads need x86-64 memory ordering; this CPU leases every read"
