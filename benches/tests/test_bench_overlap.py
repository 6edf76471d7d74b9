"""``benches/bench_overlap.py``: the exposure arithmetic, the L2-resident table, which
table and layer each timed call reads, and the usage errors. No timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benches.bench_overlap import exposed, exposure_for, hot_table, summary

ROOT = Path(__file__).resolve().parents[2]


def test_exposure_is_zero_when_the_shorter_part_is_hidden_and_one_when_added() -> None:
    assert exposed(4.0, 5.0, 5.0) == 0.0
    assert exposed(4.0, 5.0, 9.0) == 1.0
    assert exposed(5.0, 4.0, 6.0) == pytest.approx(0.25)  # compute the longer part


def test_exposure_for_a_target_is_negative_when_the_longer_part_alone_is_too_long() -> None:
    # bf16 10 s; 1.8x asks 5.56 s: with 4 + 5 s parts, 0.56 s of the 4 may show.
    assert exposure_for(1.8, 4.0, 5.0, 10.0) == pytest.approx((10.0 / 1.8 - 5.0) / 4.0)
    assert exposure_for(1.8, 4.0, 6.0, 10.0) < 0


def test_hot_table_keeps_padding_and_moves_entries_into_the_first_blocks() -> None:
    t = np.array([[7, 12, 5, -1], [3, 4, -1, -1]])
    h = hot_table(t)
    assert h.tolist() == [[3, 0, 1, -1], [3, 0, -1, -1]]
    assert hot_table(t, 2).max() == 1


def test_summary_takes_medians_and_compares_with_bf16() -> None:
    res = {"bf16": {"compute": [6.0, 5.0, 7.0], "read": [10.0] * 3, "memory": [11.0, 10.0, 12.0]},
           "int8": {"compute": [4.0] * 3, "read": [5.0] * 3, "memory": [6.0] * 3}}
    rows = {r["row"]: r for r in summary(res)}
    assert rows["bf16"]["memory"] == 11.0 and rows["bf16"]["exposed"] == pytest.approx(1.0 / 6.0)
    assert rows["int8"]["x_bf16"] == pytest.approx(11.0 / 6.0)
    assert rows["int8"]["needs"] == pytest.approx((11.0 / 1.8 - 5.0) / 4.0)
    assert summary({"int8": res["int8"]})[0]["x_bf16"] is None


def test_compute_calls_read_the_hot_table_and_memory_calls_the_next_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    import benches.bench_overlap as bo
    import pykvpool as kv

    seen: list[tuple[str, str, int]] = []
    real = kv.decode_attention

    def decode(cache: Any, layer: int, q: Any, table: np.ndarray, *args: Any, **kw: Any) -> Any:
        seen.append((cache.dtype, "hot" if table.max() < 4 else "scattered", layer))
        return real(cache, layer, q, table, *args, **kw)

    def probe(**kw: Any) -> float:
        seen.append((kw["cache"].dtype, "sweep", kw["layer"]) if "block_tables" in kw else (kw["cache"].dtype, "warm", -1))
        return 1e9

    monkeypatch.setattr(kv, "decode_attention", decode)
    monkeypatch.setattr(kv, "read_bandwidth", probe)
    res = bo.measure("a", ["bf16", "int8_scores"], rounds=1, threads=1, clock=lambda: 0.0,
                     lens=[64, 48], layers=3)
    assert set(res) == {"bf16", "int8_scores"} and all(len(v) == 1 for p in res.values() for v in p.values())
    # Per row: an untimed sweep of the whole cache, 3 hot calls on layer 0, 3 scattered
    # calls on the next layers, 3 table sweeps on the layers after those (one cycle per cache).
    assert seen[:10] == [("bf16", "warm", -1)] + [("bf16", "hot", 0)] * 3 + \
        [("bf16", "scattered", i) for i in (0, 1, 2)] + [("bf16", "sweep", i) for i in (0, 1, 2)]
    assert seen[10:] == [("int8", "warm", -1)] + [("int8", "hot", 0)] * 3 + \
        [("int8", "scattered", i) for i in (0, 1, 2)] + [("int8", "sweep", i) for i in (0, 1, 2)]


@pytest.mark.parametrize("args, message", [(["--rows", "int9"], "--rows: unknown rows"),
                                           (["--threads", "0"], "--threads: comma-separated positive"),
                                           (["--threads", "x"], "--threads: comma-separated positive"),
                                           (["--threads", "1,,2"], "--threads: comma-separated positive"),
                                           (["--threads", "00"], "--threads: comma-separated positive"),
                                           (["--rounds", "0"], "--rounds: at least 1")])
def test_bad_rows_threads_or_rounds_are_usage_errors(args: list[str], message: str) -> None:
    res = subprocess.run([sys.executable, str(ROOT / "benches" / "bench_overlap.py"), *args],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2 and message in res.stderr
