"""The simulator's exact early stop through Python (``SimConfig(stop_when=StopWhen(...))``):
an SLO decides the same on the stopped run as on the complete one (a property over
random workloads, pools and rates with bounds around the complete run's own figures),
an unstopped run is the complete run, overloaded runs stop early, and bad bounds are
typed errors (the engine-level proptest is ``tests/rust/sim_stop.rs``)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykvpool import InvalidArgumentError
from pykvpool import simulate as sim
from pykvpool.search import SLO
from pykvpool.search.slo import stop_rule

TM = sim.roofline("llama-3-8b", "a100-80gb-sxm")


def _around(v: object, f: float | None) -> float | None:
    return None if f is None or not isinstance(v, float) or v <= 0 else v * f


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 120), rate=st.floats(0.5, 200.0), seed=st.integers(0, 2**32),
       blocks=st.integers(40, 3000), running=st.integers(1, 128),
       f=st.lists(st.one_of(st.none(), st.just(1.0), st.floats(0.3, 1.7)), min_size=4, max_size=4))
def test_an_slo_decides_the_same_with_and_without_the_stop(n: int, rate: float, seed: int, blocks: int,
                                                          running: int, f: list[float | None]) -> None:
    w = sim.synthetic_workload(n, arrivals="gamma", rate=rate, cv=2.0, prompt=("uniform", [16, 2048]),
                               output=("uniform", [1, 200]), seed=seed)
    cfg = sim.SimConfig(num_blocks=blocks, scheduler=sim.SchedulerConfig(max_running=running))
    full = sim.run(w, cfg, TM).summary
    slo = SLO("s", ttft_p99=_around(full["ttft_p99"], f[0]), tpot_p50=_around(full["tpot_p50"], f[1]),
              tpot_p99=_around(full["tpot_p99"], f[2]), min_throughput=_around(full["output_throughput"], f[3]))
    cut = sim.run(w, dataclasses.replace(cfg, stop_when=stop_rule([slo])), TM).summary
    assert slo.meets(cut, n) == slo.meets(full, n)
    if cut["stopped"] is None:
        assert cut.keys() == full.keys()
        assert all(cut[k] == full[k] or (cut[k] != cut[k] and full[k] != full[k]) for k in full)
    else:
        assert cut["steps"] <= full["steps"] and not slo.meets(full, n)


def test_an_overloaded_run_stops_early_and_the_slo_fails_it() -> None:
    w = sim.synthetic_workload(3000, rate=200.0, seed=4)
    cfg = sim.SimConfig(num_blocks=30_000)
    slo = SLO("chat", ttft_p99=2.0, tpot_p99=0.1)
    full = sim.run(w, cfg, TM).summary
    cut = sim.run(w, dataclasses.replace(cfg, stop_when=stop_rule([slo])), TM)
    assert full["stopped"] is None and not slo.meets(full, len(w))
    assert cut.summary["stopped"] == "ttft_p99" and not slo.meets(cut.summary, len(w))
    assert cut.summary["steps"] * 10 < full["steps"]
    assert (cut.requests["outcome"] == 2).any()


def test_stop_rule_is_the_loosest_of_the_slos() -> None:
    rule = stop_rule([SLO("a", ttft_p99=1.0, tpot_p99=0.05, min_throughput=10.0), SLO("b", ttft_p99=3.0)])
    assert rule == sim.StopWhen(ttft_p99=3.0)
    rule = stop_rule([SLO("a", ttft_p99=1.0, tpot_p50=0.02, min_throughput=10.0),
                      SLO("b", ttft_p99=3.0, tpot_p50=0.01, min_throughput=5.0)])
    assert rule == sim.StopWhen(ttft_p99=3.0, tpot_p50=0.02, min_output_throughput=5.0)
    assert SLO("x").meets({"finished": 3, "stopped": None}, 3)
    assert not SLO("x").meets({"finished": 3, "stopped": "rejected"}, 3)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True])
def test_bad_bounds_are_invalid_argument_errors_naming_them(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="stop_when.tpot_p99"):
        sim.StopWhen(tpot_p99=bad)  # type: ignore[arg-type]


def test_wrong_types_are_type_errors_and_the_native_dict_is_checked() -> None:
    with pytest.raises(TypeError, match="stop_when.ttft_p99"):
        sim.StopWhen(ttft_p99="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stop_when must be a StopWhen"):
        sim.SimConfig(num_blocks=10, stop_when={"ttft_p99": 1.0})  # type: ignore[arg-type]
    from pykvpool import _native

    w = {"arrival": [0.0], "prompt_len": [4], "output_len": [2]}
    with pytest.raises(TypeError, match="stop_when"):
        _native.run_simulation(w, {"num_blocks": 4, "block_size": 4, "stop_when": 1.0})
    for bad, match in (({"ttft": 1.0}, "unknown key"), ({"ttft_p99": -1.0}, "stop_when.ttft_p99"),
                       ({"tpot_p50": True}, "stop_when.tpot_p50")):
        with pytest.raises(InvalidArgumentError, match=match):
            _native.run_simulation(w, {"num_blocks": 4, "block_size": 4, "stop_when": bad})
    ok = _native.run_simulation(w, {"num_blocks": 4, "block_size": 4, "stop_when": {"ttft_p99": None}})
    assert ok["summary"]["stopped"] is None and ok["summary"]["finished"] == 1


def _attained(res: sim.SimulationResult, ttft: float | None, tpot: float | None) -> int:
    """Requests finished within both per-request bounds, counted from the columns (a
    one-token output has no TPOT: NaN, which meets the bound)."""
    r = res.requests
    ok = r["outcome"] == 0
    if ttft is not None:
        ok &= r["ttft"] <= ttft
    if tpot is not None:
        ok &= ~(r["tpot"] > tpot)
    return int(ok.sum())


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 120), rate=st.floats(0.5, 200.0), seed=st.integers(0, 2**32),
       blocks=st.integers(20, 3000), share=st.one_of(st.none(), st.floats(0.05, 1.0)),
       ft=st.one_of(st.none(), st.floats(0.3, 1.7)), fp=st.one_of(st.none(), st.floats(0.3, 1.7)),
       tolerate=st.booleans())
def test_an_attainment_target_stops_only_a_run_that_misses_it(n: int, rate: float, seed: int, blocks: int,
                                                              share: float | None, ft: float | None,
                                                              fp: float | None, tolerate: bool) -> None:
    w = sim.synthetic_workload(n, arrivals="gamma", rate=rate, cv=2.0, prompt=("uniform", [16, 2048]),
                               output=("uniform", [1, 200]), seed=seed)
    cfg = sim.SimConfig(num_blocks=blocks)
    full = sim.run(w, cfg, TM)
    # Bounds around the complete run's medians (either may be left out).
    ttft, tpot = _around(full.summary["ttft_p50"], ft), _around(full.summary["tpot_p50"], fp)
    if ttft is None and tpot is None:
        return
    got = _attained(full, ttft, tpot)
    share = share if share is not None else max(got, 1) / n  # None: exactly what the run attains
    rule = sim.StopWhen(attain_ttft=ttft, attain_tpot=tpot, attain_share=share, tolerate_rejections=tolerate)
    cut = sim.run(w, dataclasses.replace(cfg, stop_when=rule), TM)
    meets_full = got >= share * n and (tolerate or full.summary["rejected"] == 0)
    if cut.summary["stopped"] is None:
        assert meets_full == (_attained(cut, ttft, tpot) >= share * n and (tolerate or cut.summary["rejected"] == 0))
        assert cut.summary == full.summary
    else:
        assert not meets_full and cut.summary["stopped"] in ("attainment", "rejected")


@pytest.mark.parametrize("kw,match", [
    (dict(attain_ttft=1.0), "attain_share"),
    (dict(attain_share=0.9), "attain_share"),
    (dict(attain_ttft=1.0, attain_share=1.5), "attain_share"),
    (dict(attain_tpot=-1.0, attain_share=0.5), "attain_tpot"),
])
def test_an_attainment_target_needs_a_bound_and_a_share(kw: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        sim.StopWhen(**kw)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tolerate_rejections"):
        sim.StopWhen(tolerate_rejections=1)  # type: ignore[arg-type]
