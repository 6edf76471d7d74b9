"""pykvpool.search: SLO filtering checked by hand against the simulator, the pruned search
equal to the full grid on the optimum and the frontier, the space's rules and argument errors, the
frontier and the best points (in-process backend; the other backends and resuming are in
tests/search/test_search_backends.py, the command line in tests/search/test_search_cli.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pykvpool import InvalidArgumentError
from pykvpool import search as ds
from pykvpool import simulate as sim
from pykvpool.planning.hardware import HARDWARE
from pykvpool.planning.models import model_preset
from pykvpool.search.evaluate import FAMILY_CHAINS, families_of, make_batches, sustained_rung
from pykvpool.search.output import best_points, frontier
from pykvpool.search.strategies import chains_of
from pykvpool.simulate import traces
from pykvpool.simulate.sweep import at_rate
from pykvpool.tracefile import named_trace_path

LLAMA = model_preset("llama-3-8b")
INLINE = ds.Backend("inline")


def azure(n: int) -> sim.Workload:
    return traces.load_file(named_trace_path("azure-conv"), limit=n)


def go(w: sim.Workload, space: ds.SearchSpace, slos: list[ds.SLO], **kw: object) -> ds.SearchResult:
    model: Any = kw.pop("model", LLAMA)
    return ds.search(w, model, space, slos, backend=INLINE, progress=None, **kw)  # type: ignore[arg-type]


def test_slo_meets_each_bound_and_needs_every_request_finished() -> None:
    s = ds.SLO("x", ttft_p99=1.0, tpot_p50=0.02, tpot_p99=0.05, min_throughput=100.0)
    ok = {"finished": 10, "ttft_p99": 1.0, "tpot_p50": 0.02, "tpot_p99": 0.05, "output_throughput": 100.0}
    assert s.meets(ok, 10)
    assert not s.meets(ok, 11)
    for key, bad in (("ttft_p99", 1.01), ("tpot_p50", 0.03), ("tpot_p99", 0.06), ("output_throughput", 99.0),
                     ("tpot_p99", None)):
        assert not s.meets({**ok, key: bad}, 10), key
    assert ds.SLO("y").meets({"finished": 3, "ttft_p99": 1e9}, 3)


def test_rows_filter_by_hand_on_a_tiny_space() -> None:
    """Each point's sustained rate and metrics are what running the simulator at every
    rung and applying the SLO by hand give."""
    w = azure(150)
    space = ds.SearchSpace(max_running=(2, 256), block_sizes=(16,))
    slo = ds.SLO("t", ttft_p99=1.5, tpot_p99=0.05)
    ladder = ds.RateLadder(0.5, 16.0, 6)
    res = go(w, space, [slo], ladder=ladder, strategy="grid")
    assert [r["max_running"] for r in res.rows] == [2, 256]
    for row in res.rows:
        cfg, tm = ds.deploy(ds.Point(**{k: row[k] for k in ds.Point.__dataclass_fields__}), LLAMA)
        sums = [sim.run(at_rate(w, r), cfg, tm).summary for r in ladder.rates()]
        ok = [s["finished"] == len(w) and s["ttft_p99"] <= 1.5 and s["tpot_p99"] <= 0.05 for s in sums]
        k = ok.index(False) - 1 if False in ok else len(ok) - 1
        assert row["t_rate"] == (ladder.rates()[k] if k >= 0 else 0.0)
        assert row["sims"] == len(ladder.rates())
        if k >= 0:
            assert row["t_ttft_p99"] == sums[k]["ttft_p99"] and row["t_tpot_p99"] == sums[k]["tpot_p99"]
            assert row["t_objective"] == row["t_rate"] / row["devices"]
    # max_running=2 queues requests: it sustains less than 256 does, and the best is 256.
    assert res.rows[0]["t_rate"] < res.rows[1]["t_rate"]
    assert res.best["t"] is not None and res.best["t"]["max_running"] == 256


@pytest.mark.parametrize("objective", ["per_device", "per_dollar"])
def test_pruned_search_equals_the_grid_on_the_optimum(objective: str) -> None:
    w = azure(200)
    space = ds.SearchSpace(hardware=("a100-80gb-sxm", "h100-sxm"), devices=(1, 2, 4), kv_dtypes=("bf16", "fp8"),
                           max_running=(8, 256), max_batched_tokens=(2048, 8192))
    slos = [ds.SLO("chat", ttft_p99=1.0, tpot_p99=0.04), ds.SLO("batch", ttft_p99=20.0)]
    ladder = ds.RateLadder(0.5, 64.0, 16)
    obj = ds.Objective(objective)
    grid = go(w, space, slos, ladder=ladder, objective=obj, strategy="grid")
    pruned = go(w, space, slos, ladder=ladder, objective=obj, strategy="pruned")
    for s in ("chat", "batch"):
        g, p = grid.best[s], pruned.best[s]
        assert g is not None and p is not None
        assert (p["key"], p[f"{s}_rate"], p[f"{s}_objective"]) == (g["key"], g[f"{s}_rate"], g[f"{s}_objective"])
        assert [r["key"] for r in pruned.frontier[s]] == [r["key"] for r in grid.frontier[s]], s
        for a, b in zip(grid.rows, pruned.rows):
            if b[f"{s}_state"] != "dominated" and b[f"{s}_rate"] != a[f"{s}_rate"]:
                _assert_not_monotone(a, next(x for x in slos if x.name == s), ladder, w, b[f"{s}_rate"])
    sims = [sum(r["sims"] for r in res.rows) for res in (grid, pruned)]
    assert sims[1] < sims[0] / 2


def _assert_not_monotone(row: dict[str, Any], slo: ds.SLO, ladder: ds.RateLadder, w: sim.Workload,
                         found: float) -> None:
    """Where the pruned search's rate differs from the grid's, meeting ``slo`` is not
    monotone in the rate (the pruned search is exact only where it is): a rung above the
    grid's first failing one meets it, and the pruned rate is a rung that does."""
    cfg, tm = ds.deploy(ds.Point(**{k: row[k] for k in ds.Point.__dataclass_fields__}), LLAMA)
    rates = ladder.rates()
    ok = [slo.meets(sim.run(at_rate(w, r), cfg, tm).summary, len(w)) for r in rates]
    first_fail = ok.index(False)
    assert any(ok[first_fail:]), (row["key"], ok)
    assert found in rates and ok[rates.index(found)], (row["key"], found, ok)


def test_points_that_cannot_beat_a_cheaper_point_of_their_chain_are_not_simulated() -> None:
    """With a ladder whose top rung one device already sustains, more devices can only
    lower the rate per device: the pruned search skips them, the grid agrees on the best."""
    w = azure(60)
    space = ds.SearchSpace(devices=(1, 2, 4))
    slos = [ds.SLO("loose", ttft_p99=100.0)]
    ladder = ds.RateLadder(0.25, 1.0, 3)
    pruned = go(w, space, slos, ladder=ladder)
    grid = go(w, space, slos, ladder=ladder, strategy="grid")
    # 1 device; 2 as 2 x 1 or 1 x 2; 4 as 4 x 1, 2 x 2 or 1 x 4.
    assert [(r["devices"], r["tensor_parallel"]) for r in pruned.rows] == [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)]
    assert [r["loose_state"] for r in pruned.rows] == ["ok"] + ["dominated"] * 5
    assert [r["sims"] for r in pruned.rows][1:] == [0] * 5
    best = [res.best["loose"] for res in (pruned, grid)]
    assert best[0] is not None and best[1] is not None
    got = [(b["key"], b["loose_rate"], b["loose_objective"]) for b in best if b is not None]
    assert got == [(grid.rows[0]["key"], 1.0, 1.0)] * 2


def test_sustained_rung_search_matches_the_scan_on_monotone_answers() -> None:
    for n in range(1, 9):
        for first_fail in range(n + 1):
            def meets(i: int) -> bool:
                return i < first_fail
            want = first_fail - 1
            assert sustained_rung(meets, n, "grid", None) == want
            for hint in (None, -1, *range(n)):
                calls: list[int] = []

                def counted(i: int) -> bool:
                    calls.append(i)
                    return meets(i)
                assert sustained_rung(counted, n, "pruned", hint) == want
                assert len(calls) == len(set(calls))  # no rung twice
                if hint == want:  # a right guess: it and the rung above (none above the top)
                    assert len(calls) == (1 if want in (-1, n - 1) else 2)
                assert sustained_rung(meets, n, "pruned", hint, gallop=False) == want


def test_space_rules_drop_what_adds_nothing_or_cannot_run() -> None:
    space = ds.SearchSpace(prefix_caching=(False, True), eviction=("lru", "lfu"), layer_groups=(False, True),
                           preemption=("recompute", "swap"))
    flat = space.points(LLAMA, prefix_workload=False)
    assert len(flat) == 2 and not any(p.prefix_caching or p.layer_groups for p in flat)
    keyed = space.points(LLAMA, prefix_workload=True)
    assert sorted((p.preemption, p.prefix_caching, p.eviction) for p in keyed) == [
        ("recompute", False, "lru"), ("recompute", True, "lfu"), ("recompute", True, "lru"),
        ("swap", False, "lru"), ("swap", True, "lfu"), ("swap", True, "lru")]
    gemma = space.points(model_preset("gemma-2-9b"), prefix_workload=True)
    groups = [p for p in gemma if p.layer_groups]
    assert sorted((p.preemption, p.prefix_caching, p.eviction) for p in groups) == [
        ("recompute", False, "lru"), ("recompute", True, "lfu"), ("recompute", True, "lru"),
        ("swap", False, "lru"), ("swap", True, "lfu"), ("swap", True, "lru")]
    assert len({p.key() for p in gemma}) == len(gemma) == 12


def test_layer_groups_and_prefix_caching_points_run() -> None:
    """A windowed model's layer-group point holds more blocks (of fewer layers) than its
    flat point; prefix caching runs on a keyed trace, with layer groups too."""
    w = sim.synthetic_workload(80, rate=2.0, seed=3, shared_prefixes=(4, 512, 1000))
    space = ds.SearchSpace(layer_groups=(False, True), prefix_caching=(False, True))
    res = go(w, space, [ds.SLO("a", ttft_p99=5.0)], model=model_preset("gemma-2-9b"),
             ladder=ds.RateLadder(1.0, 4.0, 3))
    by = {(r["prefix_caching"], r["layer_groups"]): r for r in res.rows}
    assert set(by) == {(False, False), (True, False), (False, True), (True, True)}
    assert by[(False, True)]["num_blocks"] > by[(False, False)]["num_blocks"]
    assert by[(True, True)]["num_blocks"] == by[(False, True)]["num_blocks"]
    assert all(r["status"] == "ok" and r["a_state"] in ("ok", "none") for r in res.rows)


def test_a_model_that_does_not_fit_is_infeasible_without_a_run() -> None:
    res = go(azure(40), ds.SearchSpace(devices=(1, 2)), [ds.SLO("a", ttft_p99=10.0)],
             model=model_preset("llama-3-70b"), ladder=ds.RateLadder(0.5, 1.0, 2))
    # One device, or two as two replicas of one, cannot hold the weights; two as one
    # tensor-parallel group can.
    one, two_dp, two_tp = res.rows
    for r in (one, two_dp):
        assert r["status"].startswith("infeasible") and r["sims"] == 0 and r["a_rate"] is None
    assert two_tp["status"] == "ok" and two_tp["num_blocks"] > 0
    assert res.best["a"] is not None and res.best["a"]["key"] == two_tp["key"]


def test_frontier_and_best_by_hand() -> None:
    def row(key: str, cost: float, rate: float, state: str = "ok") -> dict[str, object]:
        return {"key": key, "cost": cost, "s_state": state, "s_rate": rate, "s_objective": rate / cost}

    rows = [row("a", 1, 2.0), row("b", 1, 3.0), row("c", 2, 3.0), row("d", 2, 8.0), row("e", 4, 9.0),
            row("f", 4, 20.0, "dominated"), row("g", 3, 0.0, "none")]
    assert [r["key"] for r in frontier(rows, "s")] == ["b", "d", "e"]
    assert best_points(rows, ["s"])["s"]["key"] == "d"  # type: ignore[index]
    assert best_points([row("x", 1, 2.0), row("y", 1, 2.0)], ["s"])["s"]["key"] == "x"  # type: ignore[index]
    assert best_points([row("z", 1, 0.0, "none")], ["s"]) == {"s": None}


def test_objective_costs_and_values() -> None:
    o = ds.Objective("per_dollar", {"A100-80GB-SXM": 2.0})
    assert o.cost("a100-80gb-sxm", 3) == 6.0 and o.value(1.5, 6.0) == 900.0
    with pytest.raises(InvalidArgumentError, match="prices: no price for hardware 'h100-sxm'"):
        o.cost("h100-sxm", 1)
    assert ds.Objective().value(6.0, 2.0) == 3.0
    assert set(ds.DEFAULT_PRICES) == set(HARDWARE)
    # Per watt: the datasheets' maximum board power, 400 W per A100, 700 W per H100.
    w = ds.Objective("per_watt")
    assert w.cost("a100-80gb-sxm", 2) == 0.8 and w.cost("h100", 4) == 2.8 and w.value(7.0, 1.4) == 5.0
    assert (w.unit, w.cost_unit) == ("req/s per kW", "kW")
    assert all(h.power_watts > 0 for h in HARDWARE.values())
    with pytest.raises(InvalidArgumentError, match="objective must be one of per_device, per_dollar, per_watt"):
        ds.Objective("per_joule")


@pytest.mark.parametrize("kwargs, match", [
    ({"devices": ()}, "devices must be a non-empty list"),
    ({"devices": (1, 1)}, "devices holds a value twice"),
    ({"devices": (0,)}, "devices must hold integers"),
    ({"devices": (True,)}, "devices must hold integers"),
    ({"block_sizes": (1 << 17,)}, "block_sizes must hold integers"),
    ({"hardware": ("tpu",)}, "tpu"),
    ({"kv_dtypes": ("bf17",)}, "bf17"),
    ({"preemption": ("drop",)}, "preemption must hold values"),
    ({"eviction": "lru"}, "eviction must be a non-empty list"),
    ({"max_batched_tokens": (2**40,)}, "max_batched_tokens must hold integers"),
])
def test_space_errors_name_the_axis(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        ds.SearchSpace(**kwargs)  # type: ignore[arg-type]


def test_argument_errors() -> None:
    with pytest.raises(TypeError, match="chunked_prefill must hold bools"):
        ds.SearchSpace(chunked_prefill=(1,))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="x.ttft_p99 must be finite"):
        ds.SLO("x", ttft_p99=float("nan"))
    with pytest.raises(InvalidArgumentError, match="name must be"):
        ds.SLO("a b")
    with pytest.raises(InvalidArgumentError, match="hi .* must be >= lo"):
        ds.RateLadder(2.0, 1.0, 3)
    with pytest.raises(InvalidArgumentError, match="steps must be"):
        ds.RateLadder(1.0, 2.0, 0)
    with pytest.raises(InvalidArgumentError, match="objective must be"):
        ds.Objective("per_hour")
    with pytest.raises(InvalidArgumentError, match=r"prices\['h100-sxm'\]"):
        ds.Objective("per_dollar", {"h100-sxm": -1.0})
    with pytest.raises(InvalidArgumentError, match="workers must be"):
        ds.Backend("process", 0)
    with pytest.raises(InvalidArgumentError, match="ray_address needs"):
        ds.Backend("process", ray_address="auto")
    w = azure(20)
    for kw, match in (({"strategy": "random"}, "strategy must be"), ({}, "slos must be a non-empty")):
        with pytest.raises(InvalidArgumentError, match=match):
            go(w, ds.SearchSpace(), [] if not kw else [ds.SLO()], **kw)
    with pytest.raises(InvalidArgumentError, match="workload holds no request"):
        go(w.head(0), ds.SearchSpace(), [ds.SLO()])
    with pytest.raises(InvalidArgumentError, match="no price for hardware"):
        go(w, ds.SearchSpace(), [ds.SLO()], objective=ds.Objective("per_dollar", {"h100-sxm": 1.0}))


def test_batches_keep_families_whole_and_in_order() -> None:
    points = ds.SearchSpace(devices=(1, 2, 4), max_running=tuple(range(1, 31)),
                            chunked_prefill=(True, False)).points(LLAMA, False)
    chains = chains_of(points)
    splits = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)]
    assert len(chains) == 60 and all([(p.devices, p.tensor_parallel) for p in c] == splits for c in chains)
    fams = families_of(chains)
    # One family per chunked_prefill value (interleaved in space order), cut at FAMILY_CHAINS.
    sizes = [FAMILY_CHAINS, 30 - FAMILY_CHAINS] if FAMILY_CHAINS < 30 else [30]
    assert [len(f) for f in fams] == sizes * 2
    assert sorted(c[0].key() for f in fams for c in f) == sorted(c[0].key() for c in chains)
    assert all(len({c[0].chunked_prefill for c in f}) == 1 for f in fams)
    for workers, cap in ((1, 64), (2, 64), (64, 64), (1, 5)):
        batches = make_batches(fams, workers, cap)
        assert [f for b in batches for f in b] == fams
        assert all(len(b) == 1 or sum(len(c) for f in b for c in f) <= cap for b in batches)
