"""Builds the project's plain-C code with the machine's C compiler on first use, cached by
source, compiler, flags and CPU: the engine's kernels (paged_decode.c, row_ops.c;
inference_worker/engine/decode_kernel.py says why plain C through ctypes and not a torch
extension) and the daemon's data-plane read server. Here, in the package every service
imports, so the daemon (no torch) builds with the same code."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import structlog

log = structlog.get_logger("attnstore.c_build")

CACHE_VARIABLE = "ATTNSTORE_KERNEL_CACHE_DIR"
# -march=native: the machine's vector width (the cache key names the CPU). -std=c11 (not
# gnu11) also keeps floating-point contraction off: row_ops.c rounds each product as torch does.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
BUILD_TIMEOUT_SECONDS = 120
_LOCAL_INCLUDE = re.compile(rb'^#include "([^"]+)"', re.MULTILINE)  # a header beside the source
Kernel = TypeVar("Kernel")


def load_probed(
    source: Path,
    unavailable_variable: str,
    wrap: Callable[[ctypes.CDLL], Kernel],
    probe: Callable[[Kernel], str | None],
) -> tuple[Kernel | None, str | None]:
    """`source` built, loaded, wrapped and probed: the kernel and None, or None and why not
    (`unavailable_variable`=1, no compiler, a failed build or load, the probe's objection)."""
    if os.environ.get(unavailable_variable) == "1":
        return None, f"{unavailable_variable}=1"
    try:
        kernel = wrap(ctypes.CDLL(str(build_library(source))))
        error = probe(kernel)
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        text = str(exc).strip()
        error = text.splitlines()[0] if text else type(exc).__name__
    if error is not None:
        log.warning("kernel_unavailable", source=source.name, reason=error)
        return None, error
    return kernel, None


def _with_local_headers(source: Path) -> bytes:
    """The source's text, then each header beside it that it includes, directly or through
    another such header, once each."""
    texts: dict[Path, bytes] = {}
    pending = [source]
    while pending:
        path = pending.pop()
        if path not in texts:
            texts[path] = path.read_bytes()
            pending.extend(source.parent / name.decode() for name in _LOCAL_INCLUDE.findall(texts[path]))
    return b"".join(texts.values())


def build_library(source: Path, extra_flags: Sequence[str] = ()) -> Path:
    """The shared library, compiled unless this source (with the headers beside it that it
    includes, at any depth), compiler, flags and CPU already built one. `extra_flags` after
    FLAGS (tests build e.g. `-mno-avx512f`: the code a CPU without AVX-512 runs, on any
    machine)."""
    flags = (*FLAGS, *extra_flags)
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc, gcc, $CC)")
    text = _with_local_headers(source)
    version = subprocess.run([compiler, "--version"], capture_output=True, check=True, timeout=30).stdout
    digest = hashlib.sha256(text + version + " ".join(flags).encode() + _cpu_flags()).hexdigest()[:16]
    cache = Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "attnstore" / "kernels")
    target = cache / f"{source.stem}-{digest}.so"
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:  # renamed into place: builders may race
        built = Path(scratch) / target.name
        result = subprocess.run(
            [compiler, *flags, "-o", str(built), str(source), "-lm"],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
            check=False,  # its stderr says why
        )
        if result.returncode:
            errors = [line for line in result.stderr.splitlines() if "error" in line] or [result.stderr]
            raise OSError(f"{compiler} failed: {errors[0].strip()}")
        os.replace(built, target)
    log.info("kernel_built", path=str(target))
    return target


def _cpu_flags() -> bytes:
    """The CPU's feature flags (what -march=native compiled for), so a cache shared by
    machines never hands one a library built for another."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode()
    return next((line for line in lines if line.startswith("flags")), "").encode()
