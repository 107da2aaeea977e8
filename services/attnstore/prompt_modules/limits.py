"""Limits on PML documents, passed by the caller (the scheduler reads them from its settings)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PmlLimits:
    """Bounds checked while parsing; every default is written here only."""

    schema_bytes_max: int = 1_048_576  # UTF-8 size of a schema document
    prompt_bytes_max: int = 1_048_576  # UTF-8 size of a prompt document
    modules_per_schema_max: int = 1024  # named modules, counted at every depth
    scaffolds_per_schema_max: int = 32
    param_len_max: int = 4096  # positions one <param> may reserve
    nesting_depth_max: int = 32  # elements inside elements, the root element at depth 1
    name_chars_max: int = 64  # a schema, module, param or scaffold name


DEFAULT_LIMITS = PmlLimits()
