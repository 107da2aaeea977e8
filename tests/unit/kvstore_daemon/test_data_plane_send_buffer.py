"""The data plane's SO_SNDBUF ask: made only where the kernel grants more than autotuning."""

from __future__ import annotations

import pytest

from kvstore_daemon.data_plane import granted_send_buffer

MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("asked", "wmem_max", "autotune_max", "expected"),
    [
        (8 * MiB, 4 * MiB, 4 * MiB, 4 * MiB),  # this machine's sysctls: 8 MiB granted, autotuning stops at 4
        (8 * MiB, 16 * MiB, 4 * MiB, 8 * MiB),  # the whole ask (16 MiB granted)
        (8 * MiB, 212992, 4 * MiB, None),  # Linux default wmem_max: 416 KiB, under autotuning
        (1 * MiB, 4 * MiB, 4 * MiB, None),  # 2 MiB granted: not past autotuning
        (0, 4 * MiB, 4 * MiB, None),  # off
        (8 * MiB, 0, 0, None),  # /proc did not say
    ],
)
def test_the_send_buffer_is_asked_for_only_past_autotuning(
    asked: int, wmem_max: int, autotune_max: int, expected: int | None
) -> None:
    assert granted_send_buffer(asked, wmem_max, autotune_max) == expected
