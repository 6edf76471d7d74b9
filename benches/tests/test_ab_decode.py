"""Behaviour of the paired A/B script (no timing): the ratios it reports, and one round (or a few
interleaved pairs of calls) of the installed build against itself end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pykvpool as kv
from benches.ab_decode import make_cache, setup, summarize, summarize_pairs

ROOT = Path(__file__).resolve().parents[2]


def test_summarize_gives_the_median_and_range_of_the_per_round_ratios() -> None:
    a = [[1.0, 2.0], [1.0, 2.0], [2.0, 4.0]]
    b = [[0.9, 2.0], [1.2, 1.0], [1.0, 4.4]]
    rows = summarize(a, b, ["x", "y"])
    assert [r["row"] for r in rows] == ["x", "y"]
    assert rows[0]["median"] == 0.9 and rows[0]["low"] == 0.5 and rows[0]["high"] == 1.2
    assert rows[1]["median"] == 1.0 and rows[1]["low"] == 0.5 and abs(rows[1]["high"] - 1.1) < 1e-12
    assert rows[0]["rounds"] == 3


def test_one_round_of_a_build_against_itself_reports_every_row(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benches" / "ab_decode.py"), str(ROOT), str(ROOT), "--shape", "l2",
           "--rows", "int8,bf16", "--rounds", "1", "--calls", "1", "--out", str(tmp_path / "ab.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    assert [r["row"] for r in json.loads((tmp_path / "ab.json").read_text())["b_over_a"]] == ["int8", "bf16"]
    lines = [line for line in out.splitlines() if line.startswith("| int8 ") or line.startswith("| bf16 ")]
    assert len(lines) == 2
    for line in lines:
        median = float(line.split("|")[2])
        assert median > 0


def test_a_directory_without_the_package_is_a_usage_error(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benches" / "ab_decode.py"), str(tmp_path), str(ROOT), "--rounds", "1"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "holds no pykvpool package" in res.stderr


def test_an_unknown_row_is_a_usage_error() -> None:
    # Two switches: each sets q_dtype, so a row takes at most one.
    for row in ("int9", "int8+fast", "fp8_e5m2+bf16_scores+fp16_reduction"):
        cmd = [sys.executable, str(ROOT / "benches" / "ab_decode.py"), str(ROOT), str(ROOT), "--rows", row]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and f"row {row!r}" in res.stderr


def test_summarize_pairs_gives_the_quartiles_of_the_per_pair_ratios_and_the_best_calls() -> None:
    pairs = [(1.0, 0.5), (1.0, 1.0), (2.0, 3.0), (1.0, 2.0), (4.0, 4.0)]
    s = summarize_pairs(pairs)
    # Ratios 0.5, 1.0, 1.5, 2.0, 1.0 -> sorted 0.5, 1.0, 1.0, 1.5, 2.0.
    assert s["median"] == 1.0
    assert s["q1"] == 0.75 and s["q3"] == 1.75
    assert s["best"] == 0.5 / 1.0
    one = summarize_pairs([(2.0, 1.0)])
    assert one == {"median": 0.5, "q1": 0.5, "q3": 0.5, "best": 0.5}


def test_interleaved_pairs_of_a_build_against_itself_report_every_row(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benches" / "ab_decode.py"), str(ROOT), str(ROOT), "--shape", "l2",
           "--rows", "int8,bf16+bf16_scores", "--interleave", "3", "--out", str(tmp_path / "ab.json"),
           "--force-isa", "scalar"]  # each native module's own KernelTuning
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    assert [r["pairs"] for r in json.loads((tmp_path / "ab.json").read_text())["b_over_a"]] == [3, 3]
    lines = [line for line in out.splitlines() if line.startswith("| int8 ") or line.startswith("| bf16+")]
    assert len(lines) == 2
    for line in lines:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        median, (q1, q3), best = float(cells[1]), map(float, cells[2].split("-")), float(cells[3])
        assert 0 < q1 <= median <= q3 and best > 0


def test_interleave_without_a_built_module_or_pairs_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "pykvpool").mkdir()
    cmd = [sys.executable, str(ROOT / "benches" / "ab_decode.py"), str(tmp_path), str(ROOT), "--interleave", "2"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "holds no built _native module" in res.stderr
    cmd = [sys.executable, str(ROOT / "benches" / "ab_decode.py"), str(ROOT), str(ROOT), "--interleave", "0"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--interleave must be at least 1" in res.stderr


@pytest.mark.parametrize("dtype", ["bf16", "int8", "fp8_e4m3", "fp8_e5m2"])
def test_a_cache_written_anew_holds_the_same_codes_and_scales_in_other_memory(dtype: str) -> None:
    """What ``--reallocate`` gives each side: the same codes and scales on fresh pages,
    written (not copied through writable views, which would turn on e4m3's NaN-code check)."""
    k, q, table, seq_lens, out, total, hkv, d = setup("l2", 16)
    src = make_cache(kv, dtype, k, total, 16, hkv, d)
    copy = make_cache(kv, dtype, k, total, 16, hkv, d)
    assert copy.dtype == dtype and copy.nbytes == src.nbytes
    view = {"key": lambda c: c.key(0, writable=False), "value": lambda c: c.value(0, writable=False)}
    if dtype != "bf16":
        view |= {"ks": lambda c: c.key_scales(0, writable=False), "vs": lambda c: c.value_scales(0, writable=False)}
    for name, v in view.items():
        assert not np.shares_memory(v(copy), v(src)), name
        assert np.array_equal(v(copy), v(src)), name
    want = kv.decode_attention(src, 0, q, table, seq_lens)
    assert np.array_equal(kv.decode_attention(copy, 0, q, table, seq_lens), want)


def test_reallocated_pairs_report_every_row_and_zero_is_a_usage_error(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benches" / "ab_decode.py"), str(ROOT), str(ROOT), "--shape", "l2",
           "--rows", "int8,fp8_e5m2", "--interleave", "3", "--out", str(tmp_path / "ab.json"), "--reallocate", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "fresh caches every 2 pairs" in out
    assert sum(line.startswith(("| int8 ", "| fp8_e5m2 ")) for line in out.splitlines()) == 2
    res = subprocess.run(cmd[:-1] + ["0"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--reallocate must be at least 1" in res.stderr


def test_every_switch_of_a_row_reaches_the_call_in_rounds_and_interleaved() -> None:
    # fp16_reduction (q_dtype="f16", pv_dtype="f16") on an int8 cache is refused by
    # decode_attention: both modes must pass it on (the rounds mode once dropped it and
    # timed the plain path under its name).
    from benches.ab_decode import interleaved, measure

    with pytest.raises(kv.InvalidArgumentError, match="q_dtype=f16 with pv_dtype=f16"):
        measure(str(ROOT), "l2", ["int8+fp16_reduction"], 1, 1, 16)
    with pytest.raises(kv.InvalidArgumentError, match="q_dtype=f16 with pv_dtype=f16"):
        interleaved(str(ROOT), str(ROOT), "l2", ["int8+fp16_reduction"], 1, 1, 16)


def test_switches_and_force_isa_become_precision_and_tuning_keywords(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each switch is its q_dtype / pv_dtype, --force-isa a KernelTuning of the called module's
    own class; a build from before KernelTuning gets the boolean keywords and force_isa=."""
    import benches.ab_decode as ab

    assert ab.call_kwargs(kv, []) == {}
    assert ab.call_kwargs(kv, ["bf16_scores"]) == {"q_dtype": "bf16"}
    assert ab.call_kwargs(kv, ["int8_scores"]) == {"q_dtype": "int8"}
    assert ab.call_kwargs(kv, ["fp16_reduction"]) == {"q_dtype": "f16", "pv_dtype": "f16"}
    monkeypatch.setattr(ab, "FORCE_ISA", "scalar")
    got = ab.call_kwargs(kv, ["int8_scores"])
    assert got == {"q_dtype": "int8", "tuning": kv.KernelTuning(isa="scalar")}
    assert type(got["tuning"]) is kv.KernelTuning

    class Old:
        """A build from before KernelTuning: no such attribute."""

    assert ab.call_kwargs(Old(), ["int8_scores"]) == {"int8_scores": True, "force_isa": "scalar"}
    monkeypatch.setattr(ab, "FORCE_ISA", None)
    assert ab.call_kwargs(Old(), ["fp16_reduction"]) == {"fp16_reduction": True}
    # Every switch is a valid precision on a cache of its row's dtype.
    k, q, table, seq_lens, out, total, hkv, d = setup("l2", 16)
    for row in ("bf16+bf16_scores", "fp8_e4m3+bf16_scores", "int8+int8_scores", "fp8_e5m2+fp16_reduction"):
        parsed = ab.parse_row(row)
        assert parsed is not None
        dtype, switches = parsed
        cache = make_cache(kv, dtype, k, total, 16, hkv, d)
        kv.decode_attention(cache, 0, q, table, seq_lens, out=out, **ab.call_kwargs(kv, switches))


def test_layers_cycle_in_rounds_and_interleaved_and_zero_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # --layers L: call i (pair i) reads layer i % L of a cache whose every layer holds the rows.
    import benches.ab_decode as ab

    k, q, table, seq_lens, out, total, hkv, d = setup("l2", 16)
    cache = make_cache(kv, "int8", k, total, 16, hkv, d, layers=3)
    assert cache.num_layers == 3
    for layer in (1, 2):
        assert np.array_equal(cache.key(layer, writable=False), cache.key(0, writable=False))
        assert np.array_equal(cache.value_scales(layer, writable=False), cache.value_scales(0, writable=False))

    seen: list[int] = []
    real: Any = kv.decode_attention

    class Recording:
        """The module with decode_attention recording its layer."""

        def __getattr__(self, name: str) -> object:
            return getattr(kv, name)

        def decode_attention(self, cache: object, layer: int, *args: object, **kw: object) -> object:
            seen.append(layer)
            return real(cache, layer, *args, **kw)

    monkeypatch.setattr(kv, "decode_attention", Recording().decode_attention)
    ab.measure(str(ROOT), "l2", ["int8"], 5, 1, 16, layers=3)
    assert seen == [0, 1, 2, 0, 1]
    seen.clear()
    monkeypatch.setattr(ab, "load_native", lambda _dir: Recording())
    ab.interleaved(str(ROOT), str(ROOT), "l2", ["int8"], 3, 1, 16, layers=2)
    # The untimed pass over both sides' layers, then the pairs.
    assert seen == [0, 0, 1, 1] + [0, 0, 1, 1, 0, 0]
    cmd = [sys.executable, str(ROOT / "benches" / "ab_decode.py"), str(ROOT), str(ROOT), "--layers", "0"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--layers must be at least 1" in res.stderr


def test_the_batch_shapes_hold_64_sequences_on_scattered_blocks() -> None:
    from benches.ab_decode import SHAPES

    assert SHAPES["batch"] == ([512] * 64, 32, 8) and SHAPES["tiny"] == ([1] * 8, 32, 8)
    k, q, table, seq_lens, out, total, hkv, d = setup("short", 16)
    assert seq_lens.tolist() == [16] * 64 and q.shape == out.shape == (64, 32, 128) and hkv == 8
    assert total == 64 and k.shape == (64 * 16, 8, 128)
    assert sorted(table[:, 0].tolist()) == list(range(64)) and table[:, 0].tolist() != list(range(64))


def test_the_side_written_last_alternates_and_the_warm_pass_reads_every_layer_of_both() -> None:
    """A large last-level cache still holds the pages written last: the side written last
    alternates between allocations, and the untimed pass reads both sides layer by layer."""
    from benches.ab_decode import fresh_caches, warm

    written: list[str] = []

    def make(native: str) -> str:
        written.append(native)
        return native + "-cache"

    for n, last in [(0, "B"), (1, "A"), (2, "B"), (3, "A")]:
        written.clear()
        assert fresh_caches(["A", "B"], n, make) == ["A-cache", "B-cache"]
        assert written[-1] == last and sorted(written) == ["A", "B"]
    calls: list[tuple[str, str, int]] = []
    warm(["A", "B"], ["a", "b"], 3, lambda m, c, layer: calls.append((m, c, layer)))
    assert calls == [("A", "a", 0), ("B", "b", 0), ("A", "a", 1), ("B", "b", 1), ("A", "a", 2), ("B", "b", 2)]
