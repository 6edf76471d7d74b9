"""``benches/bench_table_probe.py``'s usage errors (exit 2, a message naming the option),
before any cache is built. No timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, message", [(["--rounds", "0"], "--rounds: at least 1"),
                                           (["--dtypes", "int8,int9"], "--dtypes: unknown dtypes ['int9']")])
def test_bad_rounds_or_dtypes_are_usage_errors(args: list[str], message: str) -> None:
    res = subprocess.run([sys.executable, str(ROOT / "benches" / "bench_table_probe.py"), *args],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2 and message in res.stderr
