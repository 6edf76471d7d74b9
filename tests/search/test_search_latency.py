"""pykvpool.search.latency: the cost vs latency frontier on hand-made rows (against the
Pareto definition), which points are run at the reference rate and which are reused or
skipped (checked against direct simulator runs), the files, the backends and resuming."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from isolation import isolated
from pykvpool import InvalidArgumentError
from pykvpool import search as ds
from pykvpool import simulate as sim
from pykvpool.planning.models import model_preset
from pykvpool.search.backends import session
from pykvpool.search.folder import read_search
from pykvpool.search.latency import (
    COLUMNS,
    candidates,
    entry_key,
    frontier_rows,
    latency_frontier,
    plan_runs,
    reference_latency,
    reference_rates,
)
from pykvpool.simulate import traces
from pykvpool.simulate.sweep import at_rate
from pykvpool.tracefile import named_trace_path

ROOT = Path(__file__).resolve().parents[2]
LLAMA = model_preset("llama-3-8b")
INLINE = ds.Backend("inline")
SPACE = ds.SearchSpace(hardware=("a100-80gb-sxm", "h100-sxm"), devices=(1, 2), max_running=(8, 256))
SLOS = [ds.SLO("chat", ttft_p99=1.0, tpot_p99=0.05), ds.SLO("batch", ttft_p99=20.0)]
LADDER = ds.RateLadder(0.5, 64.0, 8)


def azure(n: int) -> sim.Workload:
    return traces.load_file(named_trace_path("azure-conv"), limit=n)


def small_search(out: str | None = None, backend: ds.Backend = INLINE) -> ds.SearchResult:
    return ds.search(azure(300), LLAMA, SPACE, SLOS, ladder=LADDER, backend=backend, out=out, progress=None)


# ---- the frontier on hand-made rows ---------------------------------------------------------


def pareto_by_definition(cands: list[dict[str, Any]], metric: str) -> list[str]:
    """Keys no other candidate beats (at most as costly and as slow, one strictly); of
    candidates equal in both, the first; by (cost, latency)."""
    have = [(i, c) for i, c in enumerate(cands) if isinstance(c.get(metric), (int, float))
            and math.isfinite(c[metric])]
    keep = []
    for i, c in have:
        beaten = any(o["cost"] <= c["cost"] and o[metric] <= c[metric]
                     and (o["cost"] < c["cost"] or o[metric] < c[metric] or j < i) for j, o in have if j != i)
        if not beaten:
            keep.append((c["cost"], c[metric], c["key"]))
    return [k for _, _, k in sorted(keep)]


def test_latency_frontier_by_hand_dominance_ties_and_missing_metrics() -> None:
    def c(key: str, cost: float, lat: Any) -> dict[str, Any]:
        return {"key": key, "cost": cost, "ttft_p99": lat}

    cands = [c("a", 2, 0.5), c("b", 1, 0.9), c("c", 1, 0.9), c("d", 1, 1.5), c("e", 2, 0.5), c("f", 4, 0.5),
             c("g", 4, 0.1), c("h", 3, None), c("i", 0.5, float("nan")), {"key": "j", "cost": 0.5},
             c("k", 8, 0.1)]
    front = latency_frontier(cands, "ttft_p99")
    # b before its tie c; d (same cost, slower) out; a before its tie e; f no faster than a;
    # g; k (as fast as g, dearer) out; h, i, j have no finite latency.
    assert [r["key"] for r in front] == ["b", "a", "g"]
    assert [r["key"] for r in front] == pareto_by_definition(cands, "ttft_p99")
    assert latency_frontier([], "ttft_p99") == [] and latency_frontier([c("x", 1, None)], "ttft_p99") == []


def test_latency_frontier_equals_the_pareto_definition_on_random_rows() -> None:
    rng = np.random.default_rng(7)
    for trial in range(300):
        n = int(rng.integers(0, 12))
        cands = [{"key": f"p{i}", "cost": float(rng.integers(1, 5)),
                  "tpot_p99": (None if rng.random() < 0.15 else float(rng.integers(1, 6)) / 100)} for i in range(n)]
        got = [r["key"] for r in latency_frontier(cands, "tpot_p99")]
        assert got == pareto_by_definition(cands, "tpot_p99"), (trial, cands)
        lats = [r["tpot_p99"] for r in latency_frontier(cands, "tpot_p99")]
        assert lats == sorted(lats, reverse=True) and len(set(lats)) == len(lats)


def test_reference_rates_default_to_each_best_points_rate() -> None:
    best = {"a": {"a_rate": 4.0}, "b": None}
    assert reference_rates(best) == {"a": 4.0, "b": None}
    assert reference_rates(best, 2.5) == {"a": 2.5, "b": 2.5}
    for bad in (0.0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(InvalidArgumentError, match="rate must be"):
            reference_rates(best, bad)  # type: ignore[arg-type]


def test_which_points_run_are_reused_or_skipped() -> None:
    rungs = (1.0, 2.0, 4.0, 8.0)
    fields = ds.Point("a100-80gb-sxm", 1, 1, "bf16", 16, 8, 2048, True, "recompute", False, "lru", False).as_dict()

    def row(key: str, state: str, rate: float | None, status: str = "ok") -> dict[str, Any]:
        return {**fields, "key": key, "status": status, "cost": 1.0, "s_state": state, "s_rate": rate,
                **{f"s_{m}": (0.1 if state == "ok" else None) for m in ds.METRICS}}

    rows = [row("same", "ok", 4.0), row("below", "ok", 2.0), row("above", "ok", 8.0), row("none", "none", 0.0),
            row("dom", "dominated", None), row("oom", "infeasible", None, "infeasible: weights")]
    reused, todo = plan_runs(rows, {"s": 4.0}, rungs, 10)
    assert list(reused) == [entry_key("same", 4.0)]
    assert reused[entry_key("same", 4.0)] == {"key": entry_key("same", 4.0), "point": "same", "rate": 4.0,
                                               "finished": 10, **{m: 0.1 for m in ds.METRICS}, "sims": 0}
    assert len(todo) == 2 and {r for _, r in todo} == {4.0}  # above and dom; below fails at 4 (rung 4 failed)
    # A rate between rungs: a point whose first failing rung is above it must run.
    _, todo = plan_runs(rows, {"s": 3.0}, rungs, 10)
    assert len(todo) == 4  # below (fails at 4, 3 unknown), same, above, dom
    _, todo = plan_runs(rows, {"s": 0.5}, rungs, 10)
    assert len(todo) == 5  # every feasible point, none included (0.5 is below its failing rung 1)
    # Two SLOs at one rate: the row's run is reused once for both.
    two = [{**rows[0], "t_state": "dominated", "t_rate": None}]
    reused, todo = plan_runs(two, {"s": 4.0, "t": 4.0}, rungs, 10)
    assert list(reused) == [entry_key("same", 4.0)] and todo == []


def test_reference_runs_equal_direct_runs_and_skipped_points_fail() -> None:
    """Every entry (run or reused) is the simulator's own summary at the reference rate;
    the points skipped as failing do fail there; with the default rate the frontier
    starts at the best point."""
    res = small_search()
    lat = reference_latency(res, backend=INLINE, progress=None)
    w = res.spec.workload
    assert set(lat.rates) == {"chat", "batch"} and lat.source == "best point"
    for slo in SLOS:
        rate = lat.rates[slo.name]
        assert res.best[slo.name] is not None and rate == res.best[slo.name][f"{slo.name}_rate"]  # type: ignore[index]
        for row in res.rows:
            point = ds.Point(**{k: row[k] for k in ds.Point.__dataclass_fields__})
            summary = sim.run(at_rate(w, rate), *ds.deploy(point, LLAMA)).summary
            e = lat.entries.get(entry_key(row["key"], rate))
            if e is None:
                assert not slo.meets(summary, len(w)), row["key"]
                continue
            assert e["finished"] == summary["finished"] and all(e[m] == summary[m] for m in ds.METRICS), row["key"]
        ref = [f for f in lat.frontier if f["slo"] == slo.name and f["basis"] == "reference"]
        assert {f["metric"] for f in ref} == {"ttft_p99", "tpot_p99"}
        best = res.best[slo.name]
        assert best is not None
        for metric in ("ttft_p99", "tpot_p99"):
            first = [f for f in ref if f["metric"] == metric][0]
            assert first["cost"] == best["cost"]  # nothing cheaper meets the SLO at the best point's rate
    assert lat.evaluated == sum(e["sims"] for e in lat.entries.values()) > 0
    assert lat.evaluated < len(res.rows) * len(SLOS)


def test_sustained_basis_uses_the_rows_without_runs() -> None:
    res = small_search()
    rows = frontier_rows(res.rows, {}, res.spec.slos, {"chat": None, "batch": None}, len(res.spec.workload))
    assert rows and {r["basis"] for r in rows} == {"sustained"}
    for r in rows:
        src = next(x for x in res.rows if x["key"] == r["key"])
        assert r["latency"] == src[f"{r['slo']}_{r['metric']}"] and r["rate"] == src[f"{r['slo']}_rate"]
    assert candidates(res.rows, {}, SLOS[0], "reference", None, 300) == []


def test_files_and_resuming_after_a_cut(tmp_path: Path) -> None:
    out = tmp_path / "s"
    res = small_search(str(out))
    whole = reference_latency(res, rate=3.0, backend=INLINE, out=out, progress=None)
    assert whole.evaluated > 2 and whole.source == "given" and set(whole.rates.values()) == {3.0}
    with open(out / "frontier_latency.csv") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["slo", "basis", "metric", "latency", *COLUMNS]
    assert [(t["slo"], t["basis"], t["metric"], t["key"]) for t in table] == [
        (r["slo"], r["basis"], r["metric"], r["key"]) for r in whole.frontier]
    doc = json.loads((out / "latency.json").read_text())
    assert doc["reference_rates"] == whole.rates and doc["frontier"] == whole.frontier
    assert read_search(out).entries == whole.entries
    again = reference_latency(res, rate=3.0, backend=INLINE, out=out, progress=None)
    assert again.evaluated == 0 and again.entries == whole.entries
    # An interruption: two runs logged, the third cut short.
    log = out / "latency.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:2]) + lines[2][:10])
    resumed = reference_latency(res, rate=3.0, backend=INLINE, out=out, progress=None)
    assert resumed.evaluated == whole.evaluated - 2
    assert resumed.entries == whole.entries and resumed.frontier == whole.frontier
    assert json.loads((out / "latency.json").read_text()) == doc
    assert log.read_text().count("\n") == whole.evaluated


def test_a_folder_of_another_search_or_none_is_refused(tmp_path: Path) -> None:
    res = small_search(str(tmp_path / "a"))
    with pytest.raises(InvalidArgumentError, match="holds no search"):
        reference_latency(res, backend=INLINE, out=tmp_path / "empty", progress=None)
    other = ds.search(azure(100), LLAMA, ds.SearchSpace(), [SLOS[1]], ladder=LADDER, backend=INLINE,
                      out=str(tmp_path / "b"), progress=None)
    with pytest.raises(InvalidArgumentError, match="another search"):
        reference_latency(other, backend=INLINE, out=tmp_path / "a", progress=None)
    assert not (tmp_path / "a" / "latency.jsonl").exists()


def test_process_pool_entries_equal_in_process_entries() -> None:
    res = small_search()
    inline = reference_latency(res, rate=6.0, backend=INLINE, progress=None)
    pool = reference_latency(res, rate=6.0, backend=ds.Backend("process", 2), progress=None)
    assert pool.entries == inline.entries and pool.frontier == inline.frontier


@isolated(timeout=400)
def test_ray_session_runs_search_and_latency_on_one_ray() -> None:
    ray = pytest.importorskip("ray")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    res = small_search()
    inline = reference_latency(res, rate=6.0, backend=INLINE, progress=None)
    backend = ds.Backend("ray", 2)
    inits = []
    init = ray.init

    def counting_init(*a: object, **kw: object) -> object:
        inits.append(1)
        return init(*a, **kw)

    ray.init = counting_init
    try:
        with session(backend):
            on_ray = small_search(backend=backend)
            lat = reference_latency(on_ray, rate=6.0, backend=backend, progress=None)
            assert ray.is_initialized()
    finally:
        ray.init = init
    assert not ray.is_initialized() and inits == [1]
    assert on_ray.rows == res.rows and lat.entries == inline.entries and lat.frontier == inline.frontier
