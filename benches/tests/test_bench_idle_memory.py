"""Behaviour of the idle-memory benchmark (no timing): a row per gap with its rates, and its
usage errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benches.bench_idle_memory import run

ROOT = Path(__file__).resolve().parents[2]


def test_a_row_per_gap_with_positive_rates_and_the_warm_rate_beside() -> None:
    rows = run([0.0, 0.01], layers=2, tokens=64)
    assert [r["gap"] for r in rows] == [0.0, 0.01]
    for r in rows:
        assert 0 < r["low"] <= r["median"] <= r["high"] and r["warm"] > 0
    assert rows[0]["warm"] == rows[1]["warm"]


@pytest.mark.parametrize("args, message", [(["--gaps", "x"], "--gaps: comma-separated seconds"),
                                           (["--gaps", "1,-1"], "--gaps: seconds must be at least 0"),
                                           (["--gaps", "nan"], "--gaps: seconds must be at least 0"),
                                           (["--layers", "0"], "--layers and --tokens must be at least 1")])
def test_bad_arguments_are_usage_errors(args: list[str], message: str) -> None:
    res = subprocess.run([sys.executable, str(ROOT / "benches" / "bench_idle_memory.py"), *args],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr
