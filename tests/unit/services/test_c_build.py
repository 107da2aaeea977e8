"""The C build cache: a header beside the source that it includes, directly or through
another header, is part of the key, so editing a kernel's shared header (row_ops.h,
panels.h) rebuilds every source that includes it."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from attnstore.c_build import CACHE_VARIABLE, build_library


def test_an_included_header_is_part_of_the_cache_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    source, header = tmp_path / "answer.c", tmp_path / "answer.h"
    source.write_text('#include "answer.h"\nint answer(void) { return ANSWER; }\n')
    header.write_text("#define ANSWER 41\n")
    first = build_library(source)
    assert build_library(source) == first  # cached
    header.write_text("#define ANSWER 42\n")
    second = build_library(source)
    assert second != first and ctypes.CDLL(str(second)).answer() == 42


def test_a_header_included_by_a_header_is_part_of_the_cache_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    source, outer, inner = tmp_path / "answer.c", tmp_path / "outer.h", tmp_path / "inner.h"
    source.write_text('#include "outer.h"\nint answer(void) { return ANSWER; }\n')
    outer.write_text('#include "inner.h"\n')
    inner.write_text("#define ANSWER 41\n")
    first = build_library(source)
    inner.write_text("#define ANSWER 42\n")
    second = build_library(source)
    assert second != first and ctypes.CDLL(str(second)).answer() == 42
