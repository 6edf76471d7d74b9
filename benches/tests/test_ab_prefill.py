"""Behaviour of the paired prefill A/B script (no timing): a build against itself reports
every row of every path it was given, with outputs that agree bit for bit; bad arguments
are usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pykvpool as kv
from benches.ab_prefill import ROWS, row_name

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "benches" / "ab_prefill.py")


def test_a_build_against_itself_reports_every_row_with_equal_outputs(tmp_path: Path) -> None:
    isa = kv.kernel_paths()[-1]
    cmd = [sys.executable, SCRIPT, str(ROOT), str(ROOT), "--pairs", "1", "--shapes", "d80", "--isa", isa,
           "--out", str(tmp_path / "ab.json")]
    subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    rows = json.loads((tmp_path / "ab.json").read_text())["shapes"]["d80"]
    assert [r["row"] for r in rows] == [row_name(dt, kw) for dt, kw in ROWS]
    assert all(r["isa"] == isa and r["max_diff"] == 0.0 and r["median"] > 0 for r in rows)


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    for args, said in ([str(tmp_path), str(ROOT)], "holds no pykvpool package"), \
                      ([str(ROOT), str(ROOT), "--shapes", "z"], "shape 'z'"), \
                      ([str(ROOT), str(ROOT), "--pairs", "0"], "--pairs"):
        res = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and said in res.stderr
