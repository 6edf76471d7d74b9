"""The Rust bench runner (``benches/rust_benches.py``): divan's printed tree table and
``hybrid_step``'s printed figures become JSON rows (paths of nested rows, every duration
in seconds, counters' throughput per second), a line it cannot read is refused with an
error naming it, and one real bench runs end to end. No timing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.needs import missing
from benches.rust_benches import main, parse_divan, parse_hybrid_step, rate, seconds

# Captured from `cargo bench --locked --bench prefix_admit -- --sample-count 3`.
PREFIX_ADMIT = """\
Timer precision: 20 ns
prefix_admit      fastest       │ slowest       │ median        │ mean          │ samples │ iters
├─ cold           10.24 µs      │ 48.69 µs      │ 17.03 µs      │ 25.32 µs      │ 3       │ 3
├─ cold_evicting  11.2 µs       │ 13.61 µs      │ 13.53 µs      │ 12.78 µs      │ 3       │ 3
├─ free           630.7 ns      │ 58.58 µs      │ 760.7 ns      │ 19.99 µs      │ 3       │ 3
╰─ warm           3.945 µs      │ 5.056 µs      │ 3.984 µs      │ 4.329 µs      │ 3       │ 3

"""

# Captured from core_step (an `args` bench: a group row over its leaves).
CORE_STEP = """\
core_step        fastest       │ slowest       │ median        │ mean          │ samples │ iters
├─ add_sequence  1.07 µs       │ 17.44 µs      │ 1.261 µs      │ 6.592 µs      │ 3       │ 3
├─ decode_step                 │               │               │               │         │
│  ├─ 211        3.845 µs      │ 9.814 µs      │ 3.925 µs      │ 5.861 µs      │ 3       │ 3
│  ╰─ 256        5.047 µs      │ 10.14 µs      │ 5.257 µs      │ 6.816 µs      │ 3       │ 3
╰─ free          179.5 ns      │ 560.5 ns      │ 229.5 ns      │ 323.2 ns      │ 3       │ 3
"""

# Trimmed from decode_rate (args x consts, an items counter under each leaf).
DECODE_RATE = """\
decode_rate                    fastest       │ slowest       │ median        │ mean          │ samples │ iters
╰─ tokens_1024                               │               │               │               │         │
   ├─ 1                                      │               │               │               │         │
   │  ├─ bf16                  12.4 µs       │ 115.4 µs      │ 13.08 µs      │ 46.99 µs      │ 3       │ 3
   │  │                        21.12 Gitem/s │ 2.27 Gitem/s  │ 20.02 Gitem/s │ 5.578 Gitem/s │         │
   │  ╰─ int8_scores           12.67 µs      │ 26.21 µs      │ 12.99 µs      │ 17.29 µs      │ 3       │ 3
   │                           20.67 Gitem/s │ 9.998 Gitem/s │ 20.16 Gitem/s │ 15.15 Gitem/s │         │
   ╰─ 4                                      │               │               │               │         │
      ╰─ bf16                  30.91 ms      │ 1.103 s       │ 31.73 ms      │ 57.65 ms      │ 3       │ 3
                               8.479 Mitem/s │ 2.376 Kitem/s │ 8.259 item/s  │ 4.546 Titem/s │         │
"""

# Captured from `cargo bench --bench hybrid_step -- --sample-count 2`.
HYBRID_STEP = """\
decode step, 256 sequences, block size 16, 400 steps x 2 rounds
pool                                        min ns/token  median ns/token
BlockPool::step_decode                              6.88             7.38
BlockPool [Full]                                   8.39            10.08
BlockPool [Full, SlidingWindow(4096)]             10.35            10.57
[Full] / BlockPool: 1.22 (of minima), 1.37 (median of per-round ratios)
[Full, SlidingWindow(4096)] / BlockPool: 1.50 (of minima), 1.54 (median of per-round ratios); target <= 2
"""


def test_flat_rows_in_seconds() -> None:
    rows = parse_divan(PREFIX_ADMIT)
    assert [r["path"] for r in rows] == ["cold", "cold_evicting", "free", "warm"]
    free = rows[2]
    assert free["fastest"] == pytest.approx(630.7e-9) and free["slowest"] == pytest.approx(58.58e-6)
    assert free["median"] == pytest.approx(760.7e-9) and free["mean"] == pytest.approx(19.99e-6)
    assert (free["samples"], free["iters"]) == (3, 3) and "throughput" not in free


def test_nested_rows_get_their_path_and_groups_no_row() -> None:
    rows = parse_divan(CORE_STEP)
    assert [r["path"] for r in rows] == ["add_sequence", "decode_step/211", "decode_step/256", "free"]
    assert rows[2]["median"] == pytest.approx(5.257e-6)


def test_counter_rows_become_throughput_of_the_leaf_above() -> None:
    rows = parse_divan(DECODE_RATE)
    assert [r["path"] for r in rows] == ["tokens_1024/1/bf16", "tokens_1024/1/int8_scores", "tokens_1024/4/bf16"]
    assert rows[0]["throughput"] == [{"unit": "item/s", "fastest": pytest.approx(21.12e9), "slowest": pytest.approx(2.27e9),
                                      "median": pytest.approx(20.02e9), "mean": pytest.approx(5.578e9)}]
    last = rows[2]
    assert (last["fastest"], last["slowest"]) == (pytest.approx(30.91e-3), pytest.approx(1.103))
    t = last["throughput"][0]
    assert (t["fastest"], t["slowest"], t["median"], t["mean"]) == (
        pytest.approx(8.479e6), pytest.approx(2.376e3), pytest.approx(8.259), pytest.approx(4.546e12))


def test_units() -> None:
    line = "the line"
    for cell, s in [("2 ps", 2e-12), ("2 ns", 2e-9), ("2 µs", 2e-6), ("2 ms", 2e-3), ("2 s", 2.0), ("2 m", 120.0)]:
        assert seconds(cell, line) == pytest.approx(s)
    assert seconds("4.515 µs", line) == 4.515e-6  # exact: no scaling noise in the JSON
    assert rate("1.5 KiB/s", line) == (1.5 * 1024, "B/s")
    assert rate("3 MB/s", line) == (3e6, "B/s")
    assert rate("2 Gchar/s", line) == (2e9, "char/s")


@pytest.mark.parametrize("bad, error", [  # each in place of the first row (a counter row: the second)
    ("├─ cold           10.24 µs      │ 48.69 µs      │ 17.03 µs      │ 3       │ 3", "expected 6 columns"),
    ("├─ cold           10.24 qs      │ 48.69 µs      │ 17.03 µs      │ 25.32 µs      │ 3       │ 3", "not a divan duration '10.24 qs'"),
    ("├─ cold           10.24 µs      │ 48.69 µs      │ 17.03 µs      │ 25.32 µs      │ x       │ 3", "not counts"),
    ("│                 21.12 Gitem   │ 2.27 Gitem/s  │ 20.02 Gitem/s │ 5.578 Gitem/s │         │", "not a divan throughput"),
    ("garbage here      10.24 µs      │ 48.69 µs      │ 17.03 µs      │ 25.32 µs      │ 3       │ 3", "unexpected row"),
    ("│  ├─ cold        10.24 µs      │ 48.69 µs      │ 17.03 µs      │ 25.32 µs      │ 3       │ 3", "bad tree row"),
])
def test_a_malformed_line_is_refused_by_name(bad: str, error: str) -> None:
    lines = PREFIX_ADMIT.splitlines()
    lines[3 if "Gitem" in bad else 2] = bad
    text = "\n".join(lines)
    with pytest.raises(ValueError, match=error) as e:
        parse_divan(text)
    assert bad in str(e.value)


def test_no_table_is_refused() -> None:
    with pytest.raises(ValueError, match="no divan table"):
        parse_divan("Timer precision: 20 ns\n")
    with pytest.raises(ValueError, match="no bench rows"):
        parse_divan(PREFIX_ADMIT.split("├")[0])


def test_hybrid_step_figures() -> None:
    got = parse_hybrid_step(HYBRID_STEP)
    assert (got["sequences"], got["block_size"], got["steps"], got["rounds"]) == (256, 16, 400, 2)
    assert got["pools"][2] == {"pool": "BlockPool [Full, SlidingWindow(4096)]", "min_ns_per_token": 10.35,
                               "median_ns_per_token": 10.57}
    assert [p["pool"] for p in got["pools"]] == ["BlockPool::step_decode", "BlockPool [Full]",
                                                 "BlockPool [Full, SlidingWindow(4096)]"]
    assert got["ratios"][1] == {"pools": "[Full, SlidingWindow(4096)] / BlockPool", "of_minima": 1.50,
                                "median_of_ratios": 1.54}
    with pytest.raises(ValueError, match="3 pool rows and 2 ratio lines"):
        parse_hybrid_step("\n".join(HYBRID_STEP.splitlines()[:-1]))


@pytest.mark.parametrize("argv", [[], ["core_step", "--all"], ["--all", "--out", "x.json"], ["nope"]])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2


def test_prefix_admit_end_to_end(tmp_path: Path) -> None:
    """The smallest divan bench (a second or so once built) in a child process; the bound
    leaves room for cargo to rebuild the bench first."""
    if shutil.which("cargo") is None:
        missing("cargo is not installed")
    out = tmp_path / "prefix_admit.json"
    script = Path(__file__).resolve().parents[1] / "rust_benches.py"
    cmd = [sys.executable, str(script), "prefix_admit", "--out", str(out), "--", "--sample-count", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"wrote {out}" in proc.stdout
    data = json.loads(out.read_text())
    assert data["bench"] == "prefix_admit" and "cpu" in data["machine"]
    assert [r["path"] for r in data["benches"]] == ["cold", "cold_evicting", "cold_groups/false", "cold_groups/true", "free",
                                                 "warm"]
    assert all(r["samples"] == 3 and 0 < r["fastest"] <= r["median"] <= r["slowest"] for r in data["benches"])
