"""The worker's health check: a real tiny tensor operation on the model's device, so a
lost or wedged GPU (or a broken CUDA runtime) shows up as NOT_SERVING."""

from __future__ import annotations

import asyncio

import torch


class DeviceCheckFailed(RuntimeError):
    """The device did not compute a tiny matrix product correctly, or not in time."""


def _tiny_matmul(device: torch.device, dtype: torch.dtype) -> None:
    x = torch.arange(4, device=device).reshape(2, 2).to(dtype)  # [2, 2]: [[0, 1], [2, 3]]
    total = float((x @ x).sum().item())  # .item() waits for the device; x @ x = [[2, 3], [6, 11]]
    if total != 22.0:
        raise DeviceCheckFailed(f"a 2x2 matrix product on {device} summed to {total}, not 22")


async def check_device(device: torch.device, dtype: torch.dtype, timeout_seconds: float) -> None:
    """Raises DeviceCheckFailed unless the operation succeeds within `timeout_seconds`
    (it runs in a thread: a hung device leaves that thread behind, not the event loop)."""
    try:
        await asyncio.wait_for(asyncio.to_thread(_tiny_matmul, device, dtype), timeout_seconds)
    except TimeoutError as exc:
        raise DeviceCheckFailed(f"a 2x2 matrix product on {device} took over {timeout_seconds}s") from exc
    except DeviceCheckFailed:
        raise
    except Exception as exc:  # a CUDA error, a lost device
        raise DeviceCheckFailed(f"a 2x2 matrix product on {device} failed: {exc!r}") from exc
