"""DistServe's goodput in the search: an SLO of per-request bounds (``ttft``, ``tpot``)
met by a share of the requests (``attainment``), checked by hand against the simulator's
request columns, through the early stop and the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pykvpool import InvalidArgumentError
from pykvpool import search as ds
from pykvpool import simulate as sim
from pykvpool.planning.models import model_preset
from pykvpool.search.evaluate import summary_of
from pykvpool.search.slo import DEFAULT_ATTAINMENT, stop_rule
from pykvpool.simulate import traces
from pykvpool.simulate.sweep import at_rate
from pykvpool.tracefile import named_trace_path

LLAMA = model_preset("llama-3-8b")


def azure(n: int) -> sim.Workload:
    return traces.load_file(named_trace_path("azure-conv"), limit=n)


def by_hand(res: sim.SimulationResult, ttft: float, tpot: float) -> int:
    """Requests finished with TTFT <= ttft and TPOT <= tpot, one at a time."""
    r, n = res.requests, 0
    for i in range(len(r["outcome"])):
        one_token = np.isnan(r["tpot"][i])
        n += int(r["outcome"][i] == 0 and r["ttft"][i] <= ttft and (one_token or r["tpot"][i] <= tpot))
    return n


def test_an_slo_of_per_request_bounds_counts_the_requests_that_meet_both() -> None:
    slo = ds.SLO("g", ttft=1.0, tpot=0.05)
    assert slo.attainment == DEFAULT_ATTAINMENT == 0.9 and not slo.needs_all_finished
    assert ds.SLO("h", ttft=1.0, ttft_p99=2.0).needs_all_finished and ds.SLO("x").needs_all_finished
    w = azure(300)
    cfg, tm = ds.deploy(ds.SearchSpace().points(LLAMA, False)[0], LLAMA)
    for rate in (2.0, 6.0, 12.0):
        res = sim.run(at_rate(w, rate), cfg, tm)
        s = summary_of(res, [slo])
        assert s[slo.attained_key] == by_hand(res, 1.0, 0.05)
        assert slo.meets(s, len(w)) == (by_hand(res, 1.0, 0.05) >= 0.9 * len(w))
        assert not slo.meets({**s, "stopped": "attainment"}, len(w))


@pytest.mark.parametrize("kw, match", [
    (dict(attainment=0.9), "needs a per-request bound"),
    (dict(ttft=1.0, attainment=0.0), "attainment"),
    (dict(ttft=1.0, attainment=1.01), "attainment"),
    (dict(tpot=-1.0), "g.tpot"),
])
def test_bad_per_request_bounds_are_refused_by_name(kw: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        ds.SLO("g", **kw)  # type: ignore[arg-type]


def test_the_stop_rule_takes_the_loosest_attainment_and_tolerates_rejections_only_for_it() -> None:
    a, b = ds.SLO("a", ttft=1.0, tpot=0.05, attainment=0.95), ds.SLO("b", ttft=2.0, attainment=0.9)
    assert stop_rule([a, b]) == sim.StopWhen(attain_ttft=2.0, attain_share=0.9, tolerate_rejections=True)
    # One SLO without per-request bounds: no attainment target; it needs every request
    # finished, the goodput SLO does not: rejections no longer stop the run.
    assert stop_rule([a, ds.SLO("p", ttft_p99=1.0)]) == sim.StopWhen(tolerate_rejections=True)
    assert stop_rule([ds.SLO("p", ttft_p99=1.0)]) == sim.StopWhen(ttft_p99=1.0)


def test_the_search_finds_the_goodput_the_rungs_give_by_hand() -> None:
    """The sustained rate of a goodput SLO is the rung below the first whose runs (complete,
    no early stop) have fewer than 90% of the requests within both bounds; with the early
    stop the search finds the same."""
    w = azure(300)
    space = ds.SearchSpace(devices=(1, 2))
    slo = ds.SLO("goodput", ttft=0.5, tpot=0.04)
    ladder = ds.RateLadder(0.5, 32.0, 10)
    res = ds.search(w, LLAMA, space, [slo], ladder=ladder, strategy="grid", backend=ds.Backend("inline"),
                    progress=None)
    for row in res.rows:
        cfg, tm = ds.deploy(ds.Point(**{k: row[k] for k in ds.Point.__dataclass_fields__}), LLAMA)
        ok = [by_hand(sim.run(at_rate(w, r), cfg, tm), 0.5, 0.04) >= 0.9 * len(w) for r in ladder.rates()]
        k = ok.index(False) - 1 if False in ok else len(ok) - 1
        assert row["goodput_rate"] == (ladder.rates()[k] if k >= 0 else 0.0), row["key"]
    assert {r["goodput_state"] for r in res.rows} == {"ok"}
    for row in res.rows:  # the count at the sustained rate, by hand
        cfg, tm = ds.deploy(ds.Point(**{k: row[k] for k in ds.Point.__dataclass_fields__}), LLAMA)
        got = by_hand(sim.run(at_rate(w, row["goodput_rate"]), cfg, tm), 0.5, 0.04)
        assert row["goodput_attained"] == got >= 0.9 * len(w)
    pruned = ds.search(w, LLAMA, space, [slo], ladder=ladder, backend=ds.Backend("inline"), progress=None)
    assert pruned.best["goodput"] is not None and res.best["goodput"] is not None
    assert pruned.best["goodput"]["key"] == res.best["goodput"]["key"]


def test_the_command_line_takes_a_goodput_slo_and_its_folder_reads_back(tmp_path: Path) -> None:
    out = tmp_path / "g"
    args = ["search", "--trace", "azure-conv", "--limit", "120", "--rates", "0.5,16,6", "--inline", "--quiet",
            "--slo", "goodput:ttft=1,tpot=0.05,attainment=0.95", "--out", str(out)]
    r = subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True, check=False,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "SLO goodput: best" in r.stdout and "% of requests within ttft 1 s, tpot 0.05 s" in r.stdout
    best = json.loads((out / "best.json").read_text())
    assert best["slos"] == [{"name": "goodput", "ttft_p99": None, "tpot_p50": None, "tpot_p99": None,
                             "min_throughput": None, "ttft": 1.0, "tpot": 0.05, "attainment": 0.95}]
    entries = json.loads((out / "latency.json").read_text())["entries"]
    assert entries and all(isinstance(e["attained_goodput"], int) for e in entries)
    again = subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True,
                           check=False, timeout=300)
    assert again.returncode == 0 and " 0 evaluated" in again.stdout, again.stderr
    # A damaged count is refused before any work, in one line.
    log = out / "latency.jsonl"
    lines = log.read_text().splitlines()
    bad = json.loads(lines[0])
    bad["attained_goodput"] = "many"
    log.write_text("\n".join([json.dumps(bad), *lines[1:]]) + "\n")
    r = subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True, check=False,
                       timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("pykvpool: error: ") and "attained_goodput" in r.stderr
