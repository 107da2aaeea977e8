"""Machine facts every benchmark records beside its numbers: CPU, memory, kernel, the
disk behind a directory, and the versions of the packages that matter."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _ram_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def _read(path: Path, default: str = "unknown") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def disk_of(directory: Path) -> dict[str, str]:
    """The block device, filesystem and rotational flag behind `directory`."""
    dev = os.stat(directory).st_dev
    sys_dev = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    uevent = dict(line.split("=", 1) for line in _read(sys_dev / "uevent", "").splitlines() if "=" in line)
    name = uevent.get("DEVNAME", f"{os.major(dev)}:{os.minor(dev)}")
    queue = sys_dev / "queue" if (sys_dev / "queue").exists() else sys_dev / ".." / "queue"
    resolved, mount, fstype = str(directory.resolve()), "unknown", "unknown"
    for line in _read(Path("/proc/mounts"), "").splitlines():
        _, point, kind, *_ = line.split()
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and (mount == "unknown" or len(point) > len(mount)):  # the innermost mount wins
            mount, fstype = point, kind
    return {
        "dir": str(directory),
        "device": f"/dev/{name}",
        "filesystem": fstype,
        "mount": mount,
        "rotational": _read(queue / "rotational"),
        "model": _read(sys_dev / "device" / "model", "n/a"),
    }


def machine_info(
    ssd_dir: Path, redis_version: str | None = None, packages: Sequence[str] = ()
) -> dict[str, Any]:
    """Hardware and versions; the Redis client and server only when `redis_version` is
    given, and the versions of `packages` on top."""
    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)),
        "l3_cache": _read(Path("/sys/devices/system/cpu/cpu0/cache/index3/size")),
        "ram_bytes": _ram_bytes(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "grpcio": _version("grpcio"),
    }
    if redis_version is not None:
        info.update(redis_py=_version("redis"), hiredis=_version("hiredis"), redis_server=redis_version)
    info.update({"numpy": _version("numpy"), "ssd_disk": disk_of(ssd_dir)})
    info.update({package: _version(package) for package in packages})
    return info
