"""The quality split's summary and table (bench/modules/quality_split.py) from given rows."""

from __future__ import annotations

import pytest

from bench.modules.quality_split import summarize, table


def _cell(delta: float, kl: float) -> dict[str, float]:
    return {"ppl": 1 + delta, "delta": delta, "kl": kl}


def test_the_summary_averages_absolute_deltas_and_kl_over_the_rows_that_have_each_variant() -> None:
    rows = [
        {"label": "q0:1+2", "served": _cell(-0.10, 0.04), "oracle@0.15": _cell(0.02, 0.01)},
        {"label": "t0:solo", "served": _cell(0.06, 0.02)},
    ]
    summary = summarize(rows)
    assert summary["served:delta"] == pytest.approx(0.08)
    assert summary["served:kl"] == pytest.approx(0.03)
    assert summary["oracle@0.15:delta"] == pytest.approx(0.02)  # only q0 has it
    assert "positions:delta" not in summary


def test_the_table_has_one_column_per_prompt_and_leaves_missing_cells_empty() -> None:
    rows = [
        {"label": "q0:1+2", "served": _cell(-0.10, 0.04), "deviation@0.15": _cell(0.03, 0.01)},
        {"label": "t0:solo", "served": _cell(0.06, 0.02)},
    ]
    lines = table(rows, summarize(rows)).splitlines()
    assert lines[0].split()[:3] == ["variant", "q0", "t0"]
    served = next(line for line in lines if line.startswith("served"))
    assert served.split()[1:3] == ["-10.0%", "+6.0%"]
    repaired = next(line for line in lines if line.startswith("deviation@0.15"))
    assert repaired.split()[1] == "+3.0%" and len(repaired.split()) == 4  # t0's cell is blank
