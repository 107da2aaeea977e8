"""The worker's health check: a tiny matrix product on the device, bounded in time."""

from __future__ import annotations

import time

import pytest
import torch

from inference_worker import device_check
from inference_worker.device_check import DeviceCheckFailed, check_device

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
async def test_passes_on_a_working_device(device: str, dtype: torch.dtype) -> None:
    await check_device(torch.device(device), dtype, timeout_seconds=30)


async def test_a_hung_device_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_check, "_tiny_matmul", lambda device, dtype: time.sleep(0.5))
    with pytest.raises(DeviceCheckFailed, match="took over 0.05s"):
        await check_device(torch.device("cpu"), torch.float32, timeout_seconds=0.05)


async def test_a_device_error_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(device: torch.device, dtype: torch.dtype) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(device_check, "_tiny_matmul", broken)
    with pytest.raises(DeviceCheckFailed, match="illegal memory access"):
        await check_device(torch.device("cpu"), torch.float32, timeout_seconds=5)
