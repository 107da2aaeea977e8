"""Where every suite keeps its files: results (JSON and figures, committed) in
bench/results/, scratch space in bench/.work-<suite>/ (on the repository's disk, ignored
by git, removed after a clean run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[1]
RESULTS_DIR = BENCH_DIR / "results"


def work_dir(suite: str) -> Path:
    return BENCH_DIR / f".work-{suite}"


def save_results(name: str, document: dict[str, Any]) -> Path:
    """bench/results/<name>.json; values JSON cannot hold (paths, dates) as their text."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return path


def print_report(table: str, verdicts: list[str], summary: dict[str, Any]) -> None:
    """What every suite ends with: its table, one PASS/FAIL line per target, and the
    summary as one JSON line (the last line of the output, for scripts)."""
    print(table)
    print()
    print("\n".join(verdicts))
    print(json.dumps(summary))
