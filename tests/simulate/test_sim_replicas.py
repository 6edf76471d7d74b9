"""Data parallelism in the simulator from Python: ``SimConfig(replicas=, router=)``.

The engine's exactness is proven in Rust (``tests/rust/sim_replicas.rs``: round robin
serves each share as a run of its own, bit for bit); here the facade: the checks, the
``replica`` columns, and the same share property on a trace through the public API.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pykvpool
from pykvpool import _native
from pykvpool import simulate as sim


def _workload(n: int = 400, rate: float = 60.0, seed: int = 3) -> sim.Workload:
    return sim.synthetic_workload(n, rate=rate, seed=seed)


@pytest.mark.parametrize("kw,name", [
    (dict(replicas=0), "replicas"),
    (dict(replicas=-2), "replicas"),
    (dict(replicas=True), "replicas"),
    (dict(replicas=sim.MAX_REPLICAS + 1), "replicas"),
    (dict(replicas=2, router="random"), "router"),
])
def test_a_bad_deployment_is_refused_by_name(kw: dict[str, Any], name: str) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match=name):
        sim.SimConfig(num_blocks=100, **kw)


@pytest.mark.parametrize("value,name", [(0, "replicas"), (sim.MAX_REPLICAS + 1, "replicas"), (True, "replicas"),
                                        ("fastest", "router")])
def test_the_native_run_names_a_bad_deployment(value: Any, name: str) -> None:
    cfg = {"num_blocks": 100, "block_size": 16, name: value}
    w = {"arrival": np.zeros(2), "prompt_len": np.array([5, 5]), "output_len": np.array([2, 2])}
    with pytest.raises((pykvpool.InvalidArgumentError, TypeError), match=name):
        _native.run_simulation(w, cfg)


def test_the_limit_is_exported_and_runs() -> None:
    assert sim.MAX_REPLICAS == _native.SIM_MAX_REPLICAS == 1024
    w = sim.Workload(arrival=np.zeros(3), prompt_len=np.array([4, 4, 4]), output_len=np.array([2, 2, 2]))
    r = sim.run(w, sim.SimConfig(num_blocks=4, replicas=sim.MAX_REPLICAS), 0.01)
    assert r.requests["replica"].tolist() == [0, 1, 2]
    assert r.summary["finished"] == 3 and r.summary["leaked_blocks"] == 0


def test_round_robin_serves_every_share_as_its_own_run() -> None:
    w = _workload()
    tm = sim.roofline("llama-3-8b", "a100-80gb-sxm")
    cfg = sim.SimConfig(num_blocks=2500, replicas=3)
    both = sim.run(w, cfg, tm)
    order = np.lexsort((np.arange(len(w)), w.arrival))
    for r in range(3):
        mine = np.sort(order[r::3])
        share = sim.Workload(arrival=w.arrival[mine], prompt_len=w.prompt_len[mine], output_len=w.output_len[mine])
        alone = sim.run(share, sim.SimConfig(num_blocks=2500), tm)
        assert (both.requests["replica"][mine] == r).all()
        for col in ("first_token", "finish", "first_scheduled", "preemptions"):
            np.testing.assert_array_equal(both.requests[col][mine], alone.requests[col])
        assert int((both.steps["replica"] == r).sum()) == alone.summary["steps"]


def test_one_replica_is_the_classic_run_and_more_replicas_serve_more() -> None:
    w = _workload(600, rate=80.0)
    tm = sim.roofline("llama-3-8b", "a100-80gb-sxm")
    one = sim.run(w, sim.SimConfig(num_blocks=2000), tm)
    same = sim.run(w, sim.SimConfig(num_blocks=2000, replicas=1, router="shortest_queue"), tm)
    assert one.summary == same.summary
    assert (one.requests["replica"] == 0).all() and (one.steps["replica"] == 0).all()
    four = sim.run(w, sim.SimConfig(num_blocks=2000, replicas=4, router="shortest_queue"), tm)
    assert set(four.requests["replica"].tolist()) == {0, 1, 2, 3}
    assert four.summary["ttft_p99"] < one.summary["ttft_p99"]
    assert (np.diff(four.steps["time"]) >= 0).all()


def test_a_run_stopped_early_leaves_late_arrivals_unrouted() -> None:
    w = _workload(2000, rate=400.0)
    cfg = sim.SimConfig(num_blocks=2000, replicas=2, stop_when=sim.StopWhen(ttft_p99=0.05))
    r = sim.run(w, cfg, sim.roofline("llama-3-8b", "a100-80gb-sxm"))
    assert r.summary["stopped"] == "ttft_p99"
    unrouted = r.requests["replica"] == -1
    assert unrouted.any() and (r.requests["outcome"][unrouted] == 2).all()
