"""The search on random small spaces with a stub simulator (a point's capacity drawn from
its deployment, so any scaling with devices, superlinear included, shows up): the pruned
search gives the grid's frontier and best points, and the scaling checks (the rate at the
ladder's top read as a lower bound, superlinear points flagged and never ranked) hold by
hand."""

from __future__ import annotations

import csv
import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pykvpool import search as ds
from pykvpool import simulate as sim
from pykvpool.planning.models import model_preset
from pykvpool.plotting import overlapping_labels
from pykvpool.report.search_section import search_section
from pykvpool.search.figures import frontier_figure, rates_figure
from pykvpool.search.folder import read_search
from pykvpool.search.output import best_points
from pykvpool.search.scaling import (
    SCALING_ID,
    SCALING_MODEL,
    SCALING_TOLERANCE,
    is_superlinear,
    rate_text,
    scaling_note,
)
from pykvpool.simulate import traces
from pykvpool.tracefile import named_trace_path

LLAMA = model_preset("llama-3-8b")
INLINE = ds.Backend("inline")
N = 5
COLS = ("state", "rate", "objective", "rate_is_lower_bound", "superlinear")


class _Run:
    def __init__(self, summary: dict[str, Any]) -> None:
        self.summary = summary


def stub(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Replace the simulator: a point's capacity (req/s) is log-uniform in 0.1..200 from a
    hash of its deployment and ``seed``; a run at rate r finishes every request and has
    p99 TTFT r / capacity."""
    def capacity(cfg: Any, tm: Any) -> float:
        what = repr((seed, cfg.num_blocks, cfg.block_size, cfg.scheduler.max_running,
                     cfg.scheduler.max_batched_tokens, tm.hardware.bandwidth)).encode()
        u = int.from_bytes(hashlib.sha256(what).digest()[:8], "big") / 2**64
        return float(0.1 * 2000.0 ** u)

    def run(rate: float, cfg: Any, tm: Any) -> _Run:
        cap = capacity(cfg, tm)
        return _Run({"finished": N, "stopped": None, "ttft_p99": rate / cap, "tpot_p50": 0.01, "tpot_p99": 0.01,
                     "output_throughput": 10.0 * rate, "request_throughput": rate, "preemptions": 0})

    monkeypatch.setattr("pykvpool.search.evaluate.at_rate", lambda w, r: r)
    monkeypatch.setattr("pykvpool.search.evaluate.run", run)


def random_case(rng: random.Random) -> dict[str, Any]:
    space = ds.SearchSpace(
        hardware=tuple(rng.sample(["a100-80gb-sxm", "h100-sxm", "h200"], rng.randint(1, 2))),
        devices=tuple(sorted(rng.sample([1, 2, 3, 4, 8], rng.randint(1, 4)))),
        kv_dtypes=tuple(rng.sample(["bf16", "fp8"], rng.randint(1, 2))),
        max_running=tuple(rng.sample([8, 64, 256], rng.randint(1, 2))))
    lo = rng.choice([0.25, 0.5, 1.0])
    ladder = ds.RateLadder(lo, lo * rng.choice([4, 16, 64, 256]), rng.randint(2, 12))
    slos = [ds.SLO("a", ttft_p99=1.0), ds.SLO("b", ttft_p99=rng.choice([0.1, 0.3, 3.0]))]
    objective = ds.Objective(rng.choice(["per_device", "per_dollar"]))
    return {"space": space, "ladder": ladder, "slos": slos, "objective": objective}


def run_search(case: dict[str, Any], strategy: str) -> ds.SearchResult:
    w = sim.synthetic_workload(N, rate=1.0, seed=0)
    return ds.search(w, LLAMA, case["space"], case["slos"], ladder=case["ladder"], objective=case["objective"],
                     strategy=strategy, backend=INLINE, progress=None)


def test_pruned_and_grid_searches_give_one_frontier_on_random_spaces(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {"dominated": 0, "superlinear": 0, "lower bound": 0}
    for seed in range(200):
        stub(monkeypatch, seed)
        case = random_case(random.Random(seed))
        grid, pruned = run_search(case, "grid"), run_search(case, "pruned")
        for s in ("a", "b"):
            assert [(r["key"], r[f"{s}_rate"]) for r in pruned.frontier[s]] == \
                [(r["key"], r[f"{s}_rate"]) for r in grid.frontier[s]], (seed, s)
            g, p = grid.best[s], pruned.best[s]
            assert (p and p["key"]) == (g and g["key"]), (seed, s)
            for a, b in zip(grid.rows, pruned.rows):
                if b[f"{s}_state"] != "dominated":
                    assert [b[f"{s}_{c}"] for c in COLS] == [a[f"{s}_{c}"] for c in COLS], (seed, a["key"])
            seen["dominated"] += sum(r[f"{s}_state"] == "dominated" for r in pruned.rows)
            seen["superlinear"] += sum(bool(r[f"{s}_superlinear"]) for r in grid.rows)
            seen["lower bound"] += sum(bool(r[f"{s}_rate_is_lower_bound"]) for r in grid.rows)
    assert min(seen.values()) > 20, seen  # every case the rules handle occurs


def _row(devices: int, rate: float, blocks: int, state: str = "ok", top: bool = False,
         tp: int = 0) -> dict[str, Any]:
    """A row of ``devices`` devices in groups of ``tp`` (default: one group of all)."""
    return {"devices": devices, "tensor_parallel": tp or devices, "num_blocks": blocks, "block_size": 16,
            "s_state": state, "s_rate": rate, "s_rate_is_lower_bound": top}


def test_superlinear_rule_allows_the_kv_gain_and_the_tolerance_by_hand() -> None:
    one = _row(1, 4.0, 1000)
    tol = 1.0 + SCALING_TOLERANCE
    # Equal KV per device: up to 5% more per device passes, more is flagged.
    assert not is_superlinear(_row(2, 8.0 * tol * 0.999, 2000), [one], "s")
    assert is_superlinear(_row(2, 8.0 * tol * 1.001, 2000), [one], "s")
    # 20% more KV per device (the weights stored once): 20% more rate per device passes.
    assert not is_superlinear(_row(2, 8.0 * 1.2 * tol * 0.999, 2400), [one], "s")
    assert is_superlinear(_row(2, 8.0 * 1.2 * tol * 1.001, 2400), [one], "s")
    # Less KV per device never lowers the allowance below linear.
    assert not is_superlinear(_row(2, 8.0, 1000), [one], "s")
    # Any fewer-devices point may flag it, not only the previous one.
    assert is_superlinear(_row(4, 20.0, 4000), [one, _row(2, 16.0, 2000)], "s")
    # No comparison with a lower bound, a point that sustains nothing, or no rate.
    for q in (_row(1, 4.0, 1000, top=True), _row(1, 0.0, 1000, "none"), _row(1, 4.0, 1000, "dominated")):
        assert not is_superlinear(_row(2, 64.0, 2000), [q], "s")
    assert not is_superlinear(_row(2, 0.0, 2000, "none"), [one], "s")
    # Replicas are simulated as they are: more replicas of the same group size are never
    # flagged against fewer (pooling the arrivals is the model's own result), while a
    # larger group is flagged against replicas of smaller ones.
    dp = _row(4, 40.0, 1000, tp=1)
    assert not is_superlinear(dp, [one, _row(2, 8.0, 1000, tp=1)], "s")
    assert is_superlinear(_row(4, 40.0, 4000), [one, dp], "s")
    assert not is_superlinear(_row(4, 40.0, 2000, tp=2), [_row(2, 8.0, 2000)], "s")


def test_rates_print_as_lower_bounds_at_the_top() -> None:
    assert rate_text(64.0, True) == ">= 64" and rate_text(8.0, False) == "8" and rate_text(None, None) == "-"
    assert scaling_note(0) == SCALING_MODEL and "2 superlinear configurations" in scaling_note(2)


def test_a_point_with_a_lower_objective_but_a_higher_rate_stays_on_the_frontier() -> None:
    """One H100 sustains more than half the top rung, so two cannot beat it per device;
    but two sustain more than one (at least the top rung): the pruned search simulates
    them and puts them on the frontier, their rate read as a lower bound (two replicas
    first, then one group of two, which costs the same: both are simulated)."""
    w = traces.load_file(named_trace_path("azure-conv"), limit=1000)
    space = ds.SearchSpace(hardware=("h100-sxm",), devices=(1, 2), kv_dtypes=("fp8",), max_running=(256,),
                           max_batched_tokens=(2048,))
    res = ds.search(w, LLAMA, space, [ds.SLO("batch", ttft_p99=20.0)], backend=INLINE, progress=None)
    one, two, group = res.rows
    assert (two["tensor_parallel"], group["tensor_parallel"]) == (1, 2)
    top = ds.RateLadder().rates()[-1]
    assert top / 2 < one["batch_rate"] < top and not one["batch_rate_is_lower_bound"]
    for r in (two, group):
        assert r["batch_state"] == "ok" and r["batch_rate"] == top and r["batch_rate_is_lower_bound"]
    assert [r["key"] for r in res.frontier["batch"]] == [one["key"], two["key"]]
    assert res.best["batch"] is not None and res.best["batch"]["key"] == one["key"]


def test_equal_objectives_up_to_rounding_go_to_the_cheaper_point() -> None:
    rates = ds.RateLadder().rates()
    one: dict[str, Any] = {"key": "one", "cost": 1.0, "s_state": "ok", "s_rate": rates[15], "s_objective": rates[15]}
    four: dict[str, Any] = {"key": "four", "cost": 4.0, "s_state": "ok", "s_rate": rates[21],
                            "s_objective": rates[21] / 4}
    assert four["s_objective"] > one["s_objective"]  # 16 and 64 / 4, a rounding error apart
    assert best_points([four, one], ["s"])["s"]["key"] == "one"  # type: ignore[index]


CLI = ["search", "--trace", "azure-conv", "--limit", "300", "--ttft-p99", "1", "--tpot-p99", "0.05", "--slo",
       "loose:ttft_p99=30", "--devices", "1,2,4", "--inline", "--quiet", "--no-latency"]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """One A100 sustains 3.17 req/s under ``slo``; two and four as replicas of one device
    sustain more per device (their arrivals' bursts split: not flagged), as groups of two
    or four too (flagged: more than the replicas of smaller groups beyond the KV gain);
    under ``loose`` one sustains the ladder's top (and more devices are pruned)."""
    out = tmp_path_factory.mktemp("scaling") / "s"
    r = subprocess.run([sys.executable, "-m", "pykvpool.cli", *CLI, "--out", str(out)], capture_output=True,
                       text=True, check=False, timeout=300)
    assert r.returncode == 0, r.stderr
    return out, r.stdout, r.stderr


def test_the_cli_states_the_scaling_model_flags_and_lower_bounds(cli_run: tuple[Path, str, str]) -> None:
    out, stdout, stderr = cli_run
    lines = stdout.splitlines()
    assert lines[1].startswith(SCALING_MODEL) and "3 superlinear configurations" in lines[1]
    assert "SLO slo: best a100-80gb-sxm|x4:tp1|" in stdout and "3 superlinear configurations not ranked" in stdout
    assert "SLO loose: best a100-80gb-sxm|x1:tp1|" in stdout and ">= 64 req/s sustained" in stdout
    assert "at least 64 req/s" in stderr
    best = json.loads((out / "best.json").read_text())
    assert best["scaling_model"] == SCALING_MODEL and best["scaling_tolerance"] == SCALING_TOLERANCE
    assert json.loads((out / "search.json").read_text())["scaling"] == SCALING_ID
    with open(out / "points.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["devices"], r["tensor_parallel"]) for r in table] == [
        ("1", "1"), ("2", "1"), ("2", "2"), ("4", "1"), ("4", "2"), ("4", "4")]
    assert [(r["slo_superlinear"], r["loose_rate_is_lower_bound"], r["loose_state"]) for r in table] == [
        ("False", "True", "ok"), ("False", "", "dominated"), ("True", "", "dominated"),
        ("False", "", "dominated"), ("True", "", "dominated"), ("True", "", "dominated")]
    assert {r["scaling"] for r in table} == {SCALING_ID}


def test_the_report_section_states_the_scaling_model(cli_run: tuple[Path, str, str], tmp_path: Path) -> None:
    md, data, _ = search_section(tmp_path, read_search(cli_run[0]), progress=False)
    assert SCALING_MODEL in md and "| >= 64 |" in md
    assert "3 configurations flagged superlinear" in md and "a100-80gb-sxm\\|x4:tp4" in md
    assert data["scaling_model"] == SCALING_MODEL and len(data["superlinear"]["slo"]) == 3


def test_each_bar_is_named_and_nothing_overlaps(cli_run: tuple[Path, str, str]) -> None:
    rows = read_search(cli_run[0]).rows
    fig = rates_figure(rows, ["slo", "loose"])
    slo, loose = fig.axes[:2]
    # By rate; only the devices and their split differ.
    assert [t.get_text() for t in slo.get_yticklabels()] == ["x4:tp1", "x4:tp2", "x4:tp4", "x2:tp2", "x2:tp1", "x1:tp1"]
    assert [t.get_text() for t in loose.get_yticklabels()] == ["x1:tp1"]  # the others were not simulated
    assert ">= 64" in [t.get_text() for t in loose.texts]
    assert overlapping_labels(fig) == []
    for fig in (fig, frontier_figure(rows, ["slo", "loose"], "devices")):
        assert [t.get_text().replace("\n", " ") for t in fig.texts] == [SCALING_MODEL]  # wrapped to the width
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "superlinear: not ranked (3)" in legend and "frontier (3)" in legend


def test_a_folder_without_a_scaling_model_is_refused_in_one_line(cli_run: tuple[Path, str, str],
                                                                tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(cli_run[0], old)
    meta = json.loads((old / "search.json").read_text())
    del meta["scaling"]
    (old / "search.json").write_text(json.dumps(meta))
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    for args in ([*CLI, "--out", str(old)], ["report", "--no-measure", "--quiet", "--search", str(old), "--out",
                                             str(tmp_path / "rep")]):
        r = subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True,
                           check=False, timeout=300)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("pykvpool: error: ") and "search.json" in r.stderr
        assert "recorded no scaling model" in r.stderr and "new folder" in r.stderr
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before
    assert not (tmp_path / "rep").exists()


def test_the_report_figures_label_nothing_over_anything(cli_run: tuple[Path, str, str]) -> None:
    """Titles (a second line saying what was not simulated included) stay in the figure."""
    rows = read_search(cli_run[0]).rows
    fig = rates_figure(rows, ["slo", "loose"])
    fig.canvas.draw()
    box = fig.bbox
    for ax in fig.axes:
        title = ax.title.get_window_extent()
        assert box.x0 <= title.x0 and title.x1 <= box.x1, ax.title.get_text()
    assert "5 not simulated: fewer devices already sustain the top rate" in fig.axes[1].title.get_text()
