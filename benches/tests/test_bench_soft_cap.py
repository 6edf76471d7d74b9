"""``benches/bench_soft_cap.py``: the two capped routes it times agree on its own inputs, a
small run's table and JSON, and the usage errors. No timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benches.bench_soft_cap import SHAPES, routes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype", ["bf16", "int8", "fp8_e4m3"])
def test_capped_decode_and_one_query_prefill_agree(dtype: str, shape: str) -> None:
    # The bench's inputs at their full size. On them the cap moves the output by 4e-3 to
    # 1e-2 of its scale: the capped routes agree with each other, not with the uncapped one.
    calls, outs = routes(dtype, shape)
    for call in calls.values():
        call()
    dec, pre, plain = outs["decode_cap"], outs["prefill_cap"], outs["decode"]
    out_scale = max(float(np.abs(pre).max()), 1e-3)
    assert np.abs(dec - pre).max() <= 1e-5 * out_scale, (dtype, shape)
    assert np.abs(dec - plain).max() > 1e-3 * out_scale, (dtype, shape)


def test_a_small_run_prints_one_row_per_dtype_and_shape_and_writes_them(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "benches/bench_soft_cap.py", "--tokens", "32", "--pairs", "3",
                        "--dtypes", "int8,bf16", "--out", str(tmp_path / "cap.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads((tmp_path / "cap.json").read_text())["ratios"]
    assert {dt: sorted(v) for dt, v in got.items()} == {"int8": ["batch", "l2"], "bf16": ["batch", "l2"]}
    assert all(set(c) == {"pairs", "cap_cost", "vs_prefill"} and c["pairs"] == 3
               and all(c[k]["q1"] <= c[k]["median"] <= c[k]["q3"] for k in ("cap_cost", "vs_prefill"))
               for v in got.values() for c in v.values())
    lines = [x for x in r.stdout.splitlines() if x.startswith(("| int8 ", "| bf16 "))]
    assert len(lines) == 4 and all(x.count("(") == 2 for x in lines), r.stdout


@pytest.mark.parametrize("args", [["--dtypes", "int9"], ["--shapes", "l3"], ["--pairs", "0"], ["--pairs", "x"],
                                  ["--tokens", "40"]])
def test_bad_arguments_are_usage_errors(args: list[str]) -> None:
    r = subprocess.run([sys.executable, "benches/bench_soft_cap.py", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr, r.stderr
