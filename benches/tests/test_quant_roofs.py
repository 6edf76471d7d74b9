"""The instruction-mix roofs of ``benches/bench_quant.py`` (``benches/quant_roofs.py``):
the roof is the dot_rates codes/s over the codes per sequence, the sanity check and the
binding roof follow the figures, the targets' verdicts follow the roofs, repeated runs
merge into their best rates, and a saved ``dot_rates`` output is read from among its other
lines. No timing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from benches.quant_roofs import instr_roof, load_dot_rates, merge_rates, sane, verdict


def rates(kv: float, codes_per_fma: float, nominal: float, fma: float = 3.5e9) -> dict[str, Any]:
    """A dot_rates result with one path ("int8", g 4, 1 thread)."""
    return {"dot_rates": 1, "d": 128, "quick": True, "exp2_instr_per_16_scores": 11,
            "fma": [{"threads": 1, "instr_per_s": fma}], "exp2": [{"threads": 1, "scores_per_s": 7e9}],
            "rates": [{"threads": 1, "path": "int8", "g": 4, "k": kv, "v": kv, "kv": kv,
                       "codes_per_fma": codes_per_fma, "nominal_codes_per_fma": nominal}]}


def test_roof_is_codes_per_second_over_codes_per_sequence() -> None:
    r = rates(kv=12e9, codes_per_fma=12e9 / 3.5e9, nominal=4.0)
    m = instr_roof(r, "int8", 4, 1, codes_per_seq=2 * 8 * 128 * 4096)
    assert m is not None
    assert m["roof"] == pytest.approx(12e9 / (2 * 8 * 128 * 4096))
    # The FMA-only roof at the same clock: 4 codes per FMA time at 3.5 G FMA/s.
    assert m["fma_roof_same_clock"] == pytest.approx(4 * 3.5e9 / (2 * 8 * 128 * 4096))
    # exp2: g = 4 scores per 2 d = 256 codes.
    assert m["exp2_frac"] == pytest.approx((4 / 7e9) / (256 / 12e9))


def test_missing_entries_give_no_roof() -> None:
    r = rates(kv=12e9, codes_per_fma=3.4, nominal=4.0)
    assert instr_roof(None, "int8", 4, 1, 1.0) is None
    assert instr_roof(r, "int8", 1, 1, 1.0) is None  # no g = 1 entry
    assert instr_roof(r, "int8", 4, 2, 1.0) is None  # no 2-thread FMA rate
    assert instr_roof(r, "fp8_e4m3", 4, 1, 1.0) is None


def row(dtype: str, g: int, tps: float, bw_roof: float, mix: dict[str, Any] | None) -> dict[str, Any]:
    """A speed row as ``bench_quant.speed`` builds it (the fields the roofs use)."""
    roof = bw_roof if mix is None else min(bw_roof, mix["roof"])
    return dict(dtype=dtype, g=g, tokens_per_s=tps, bw_roof=bw_roof, mix=mix, roof=roof,
                binds="bw" if roof == bw_roof else "instr", pct_roof=tps / roof)


@pytest.mark.parametrize("kv, ok", [(3.9e9, True), (4.3e9, False)])
def test_sanity_check_compares_at_the_same_clock(kv: float, ok: bool) -> None:
    # FMA-only at 1 G FMA/s x 4 codes = 4 G codes/s; 3% tolerance.
    m = instr_roof(rates(kv=kv, codes_per_fma=kv / 1e9, nominal=4.0, fma=1e9), "int8", 4, 1, 1e6)
    assert sane(row("int8", 4, 1.0, 1e9, m)) is ok
    assert sane(row("int8", 4, 1.0, 1e9, None))


def test_verdicts_follow_the_roofs() -> None:
    mix = {"roof": 900.0}
    # MHA, instruction roof 90% of the bandwidth roof and 900 / 400 = 2.25x bf16: reachable,
    # and it is instruction-bound, so the compute-bound share is reported too.
    v = verdict(row("int8", 1, 500.0, 1000.0, mix), bf16_tps=400.0, bf16_roof=450.0)
    assert v.startswith("memory target reachable") and "90% of bw" in v and "compute-bound" in v
    # Instruction roof 50% of the bandwidth roof: the 75% target is out of reach.
    v = verdict(row("int8", 1, 400.0, 1800.0, mix), bf16_tps=400.0, bf16_roof=450.0)
    assert v.startswith("memory target OUT OF REACH") and "75% bw: no" in v
    # Enough instructions but under 1.8x bf16.
    v = verdict(row("int8", 1, 400.0, 1000.0, mix), bf16_tps=600.0, bf16_roof=650.0)
    assert v.startswith("memory target OUT OF REACH") and "1.8x bf16: no" in v
    # GQA, compute-bound: only the compute target, with the row's share of the roof.
    v = verdict(row("fp8_e5m2", 4, 720.0, 5000.0, mix), bf16_tps=400.0, bf16_roof=450.0)
    assert v == "compute-bound: 80% of instr roof needed, 80% now"
    assert verdict(row("bf16", 1, 400.0, 1000.0, mix), 400.0, 450.0).startswith("-")
    assert verdict(row("int8", 1, 400.0, 1000.0, None), 400.0, 450.0).startswith("?")


def test_saved_output_is_read_from_its_json_line(tmp_path: Path) -> None:
    r = rates(kv=1e9, codes_per_fma=1.0, nominal=4.0)
    f = tmp_path / "dot_rates.txt"
    f.write_text("vfmadd231ps zmm: 3.6 instr/ns\n| path | g |\n" + json.dumps(r) + "\n")
    assert load_dot_rates(str(f), quick=True, out_dir=tmp_path) == r
    f.write_text("SKIPPED: this CPU lacks AVX-512 F/BW/VL, FMA or F16C\n")
    assert load_dot_rates(str(f), quick=True, out_dir=tmp_path) is None


def test_runs_merge_into_the_best_rates_and_keep_every_run() -> None:
    slow = rates(kv=6e9, codes_per_fma=6e9 / 3e9, nominal=4.0, fma=3e9)
    fast = rates(kv=10e9, codes_per_fma=10e9 / 4e9, nominal=4.0, fma=4e9)
    fast["rates"][0]["k"] = 5e9  # K alone was slower in the faster run
    m = merge_rates(merge_rates(slow, fast), slow)
    assert m is not None and m["runs"] == 3
    e = m["rates"][0]
    assert (e["kv"], e["k"], e["v"]) == (10e9, 6e9, 10e9)
    assert e["kv_runs"] == [6e9, 10e9, 6e9]
    assert e["codes_per_fma"] == pytest.approx(10e9 / 4e9)
    assert m["fma"][0]["instr_per_s"] == 4e9
    roof = instr_roof(m, "int8", 4, 1, codes_per_seq=1e6)
    assert roof is not None and roof["roof"] == pytest.approx(1e4) and roof["runs"] == [6e3, 1e4, 6e3]
    # The inputs are left as they were; a missing run changes nothing.
    assert slow["rates"][0]["kv"] == 6e9 and "kv_runs" not in slow["rates"][0]
    assert merge_rates(slow, None) is slow
    only = merge_rates(None, slow)
    assert only is not None and only["rates"][0]["kv_runs"] == [6e9]
    assert merge_rates(None, None) is None


def test_a_run_with_a_new_thread_count_adds_its_entries() -> None:
    one = rates(kv=6e9, codes_per_fma=2.0, nominal=4.0, fma=3e9)
    two = rates(kv=11e9, codes_per_fma=2.0, nominal=4.0, fma=5.5e9)
    for key in ("fma", "exp2", "rates"):
        two[key][0]["threads"] = 2
    m = merge_rates(one, two)
    assert m is not None
    assert sorted((x["threads"], x["kv"]) for x in m["rates"]) == [(1, 6e9), (2, 11e9)]
    assert sorted(x["threads"] for x in m["fma"]) == [1, 2]
    assert instr_roof(m, "int8", 4, 2, 1e6) is not None


def test_paired_ratios_alternate_the_calls_and_give_the_base_time_over_the_row_time() -> None:
    from benches.bench_quant import _paired_stats, paired_ratios

    now = [0.0]
    order: list[str] = []

    def side(name: str, cost: float) -> Callable[[], None]:
        def call() -> None:
            order.append(name)
            now[0] += cost

        return call

    ratios = paired_ratios(side("base", 3.0), side("row", 1.5), 4, lambda: now[0])
    assert ratios == [2.0] * 4
    assert order == ["base", "row", "row", "base", "base", "row", "row", "base"]
    # The warm-up runs once, first, and its time is in no ratio.
    order.clear()
    ratios = paired_ratios(side("base", 3.0), side("row", 1.5), 2, lambda: now[0], warm=side("warm", 100.0))
    assert ratios == [2.0] * 2 and order == ["warm", "base", "row", "row", "base"]
    stats = _paired_stats([1.0, 2.0, 3.0, 4.0])
    assert stats["paired"] == 2.5 and stats["pairs"] == 4 and stats["paired_q1"] == 1.75
    assert _paired_stats([]) == dict(paired=1.0, paired_q1=1.0, paired_q3=1.0, pairs=0)


def test_the_last_level_cache_is_the_highest_level_listed(tmp_path: Path) -> None:
    from benches.bench_quant import auto_layers, last_level_cache_bytes

    for i, (level, size) in enumerate([(1, "48K"), (2, "2048K"), (3, "266240K"), (1, "32K")]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "level").write_text(f"{level}\n")
        (tmp_path / f"index{i}" / "size").write_text(f"{size}\n")
    assert last_level_cache_bytes(str(tmp_path)) == 266240 << 10
    assert last_level_cache_bytes(str(tmp_path / "none")) is None
    # Twice 260 MiB over 64 MiB layers: 9 layers; capped; unknown or empty: 1.
    assert auto_layers(64 << 20, 260 << 20) == 9
    assert auto_layers(256 << 20, 260 << 20) == 3
    assert auto_layers(1 << 20, 260 << 20) == 16
    assert auto_layers(64 << 20, None) == 1 and auto_layers(0, 260 << 20) == 1


def test_each_call_and_table_sweep_reads_the_next_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    import benches.bench_quant as bq
    import pykvpool as kv

    seen: dict[str, list[int]] = {}
    real = kv.decode_attention

    def decode(cache: Any, layer: int, *args: Any, **kw: Any) -> Any:
        seen.setdefault(cache.dtype, []).append(layer)
        return real(cache, layer, *args, **kw)

    def probe(**kw: Any) -> float:
        if "block_tables" in kw:
            seen.setdefault(kw["cache"].dtype + " table", []).append(kw["layer"])
        return 1e9

    monkeypatch.setattr(kv, "decode_attention", decode)
    monkeypatch.setattr(kv, "read_bandwidth", probe)
    monkeypatch.setattr(kv, "peak_flops", lambda *a, **k: 1e11)
    monkeypatch.setattr(bq, "ROWS", {n: bq.ROWS[n] for n in ("bf16", "int8")})
    rows = bq.speed("a", [32, 48], 4, 1, 128, reps=1, pairs=2, layers=3)
    assert [(r["threads"], r["dtype"], r["layers"]) for r in rows] == [
        (t, n, 3) for t in (1, 2) for n in ("bf16", "int8")]
    # Per thread count, one cycle per cache shared by its calls and table sweeps: a first
    # call (layer 0), 3 sweeps (1, 2, 0), the best of 3 calls (1, 2, 0), then int8's 2
    # pairs with bf16 (layers 1, 2 of each).
    assert seen["int8"] == [0, 1, 2, 0, 1, 2] * 2
    assert seen["bf16"] == [0, 1, 2, 0, 1, 2] * 2
    assert seen["int8 table"] == seen["bf16 table"] == [1, 2, 0] * 2
    assert all(np.isfinite(r["tokens_per_s"]) for r in rows)


@pytest.mark.parametrize("bad", ["0", "65", "x", "-1"])
def test_layers_outside_auto_or_1_to_64_is_a_usage_error(bad: str) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, str(root / "benches" / "bench_quant.py"), f"--layers={bad}"],
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert res.returncode == 2 and "--layers: auto or a number of layers from 1 to 64" in res.stderr
