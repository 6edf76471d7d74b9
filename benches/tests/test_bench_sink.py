"""``benches/bench_sink.py``: the sink's score gap, a small run's table, the outputs with a
sink (the tokens far below it contribute nothing) and the usage errors. No timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pykvpool as kv
from benches.bench_quant import ROWS
from benches.bench_sink import BS, D, cache_of, sink_inputs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("gap", [0.0, 60.0, 200.0])
def test_the_sinks_score_exceeds_the_others_by_the_gap(gap: float) -> None:
    k, v, q = sink_inputs(256, gap)
    s = (k[:, 0] @ q[0, 0]) / np.sqrt(D)
    assert s[0] == pytest.approx(gap, abs=1e-3)
    assert np.abs(s[1:]).max() < 6  # about N(0, 1)
    assert (q == q[:, :1]).all() and k.dtype == v.dtype == np.float32


@pytest.mark.parametrize("row", list(ROWS))
def test_a_dominant_sinks_output_is_its_value(row: str) -> None:
    # 200 nats: every other token's probability is e^-200 of the sink's, exactly 0 in the
    # kernels (2^-64 and below are), so the output is the sink's stored V row. Every row of
    # bench_quant.py (the rows bench_sink.py times), each with its decode keywords.
    dtype, switches, _ = ROWS[row]
    k, v, q = sink_inputs(512, 200.0)
    c = cache_of(dtype, k, v)
    table = np.arange(512 // BS, dtype=np.int64)[None]
    out = kv.decode_attention(c, 0, q, table, np.array([512]), **switches)
    v0 = c.dequantized(0)[1][0, 0] if dtype != "bf16" else v[0, 0]
    tol = 1e-2 * np.abs(v0).max() if dtype == "bf16" else 1e-5 * np.abs(v0).max()
    np.testing.assert_allclose(out[0], np.tile(v0, (q.shape[1], 1)), atol=tol)


def test_a_small_run_prints_one_cell_per_row_and_gap_and_writes_them(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "benches/bench_sink.py", "--tokens", "64", "--pairs", "3",
                        "--gaps", "100,200", "--rows", "int8,bf16", "--out", str(tmp_path / "sink.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    got = json.loads((tmp_path / "sink.json").read_text())["with_sink_over_without"]
    assert {k: [c["gap"] for c in v] for k, v in got.items()} == {"int8": [100, 200], "bf16": [100, 200]}
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("| int8 ") or x.startswith("| bf16 ")]
    assert len(lines) == 2 and all(x.count("(") == 2 for x in lines), r.stdout


@pytest.mark.parametrize("args", [["--gaps", "x"], ["--gaps", "0"], ["--gaps", "nan"], ["--pairs", "0"],
                                  ["--tokens", "40"], ["--rows", "int9"]])
def test_bad_arguments_are_usage_errors(args: list[str]) -> None:
    r = subprocess.run([sys.executable, "benches/bench_sink.py", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr, r.stderr
