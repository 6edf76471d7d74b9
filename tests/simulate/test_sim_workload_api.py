"""The request stream's Python API: prefix caching refused on a workload it cannot key
(lengths only, as the Azure traces), and ``Workload.rate_scaled``, the exact re-timing of a
trace to a multiple of its own rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

import pykvpool
from pykvpool import simulate as sim
from pykvpool.simulate import sweep as sim_sweep
from pykvpool.simulate import traces as sim_traces
from pykvpool.simulate.workload import check_prefix_caching
from pykvpool.tracefile import named_trace_path

ROOF = sim.roofline("llama-3-8b", "a100-80gb-sxm")


def lengths_only(n: int = 40) -> sim.Workload:
    return sim_traces.load_azure(named_trace_path("azure-conv"), limit=n)


# ---- prefix caching needs token ids or block keys -------------------------------------


def test_run_refuses_prefix_caching_on_a_workload_of_lengths_only() -> None:
    w = lengths_only()
    with pytest.raises(pykvpool.InvalidArgumentError, match="prefix_caching") as e:
        sim.run(w, sim.SimConfig(num_blocks=20_000, prefix_caching=True), ROOF)
    assert "token ids or block keys" in str(e.value) and "\n" not in str(e.value)
    # the same workload without caching, and caching on prompts given as ids, both run
    assert sim.run(w, sim.SimConfig(num_blocks=20_000), ROOF).summary["finished"] == len(w)
    ids = sim.synthetic_workload(30, rate=5.0, shared_prefixes=(2, 64, 100), seed=1)
    assert ids.has_prompt_ids and not w.has_prompt_ids
    assert sim.run(ids, sim.SimConfig(num_blocks=20_000, prefix_caching=True), ROOF).summary["finished"] == 30


def test_sweep_refuses_a_caching_policy_on_a_workload_of_lengths_only() -> None:
    caching = {"lru": sim.SimConfig(num_blocks=1, prefix_caching=True)}
    with pytest.raises(pykvpool.InvalidArgumentError, match="prefix_caching"):
        sim_sweep.sweep(lengths_only(), [2.0], caching, [16], 50_000, ROOF, workers=2, progress=None)


def test_the_check_names_the_argument_as_its_caller_spells_it() -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match="^--prefix-caching needs"):
        check_prefix_caching(lengths_only(), "--prefix-caching")
    check_prefix_caching(sim_traces.load_mooncake(named_trace_path("mooncake"), limit=5))  # keys: fine


# ---- rate_scaled: arrivals divided by the factor ---------------------------------------


def test_rate_scale_two_halves_every_gap_and_one_is_identity() -> None:
    w = lengths_only(200)
    fast = w.rate_scaled(2.0)
    np.testing.assert_array_equal(np.diff(fast.arrival), np.diff(w.arrival) / 2)
    np.testing.assert_array_equal(fast.arrival, w.arrival / 2)
    np.testing.assert_array_equal(fast.prompt_len, w.prompt_len)
    np.testing.assert_array_equal(fast.output_len, w.output_len)
    np.testing.assert_array_equal(w.rate_scaled(1).arrival, w.arrival)
    slow = w.rate_scaled(0.5)
    np.testing.assert_array_equal(slow.arrival, w.arrival * 2)
    keyed = sim_traces.load_mooncake(named_trace_path("mooncake"), limit=20)
    k3 = keyed.rate_scaled(3.0)
    np.testing.assert_array_equal(k3.arrival, keyed.arrival / 3.0)
    assert k3.block_keys is keyed.block_keys and k3.tokens_per_key == keyed.tokens_per_key


def test_rate_scale_doubles_the_request_rate_of_a_run() -> None:
    w = lengths_only(300)
    cfg = sim.SimConfig(num_blocks=31_253)
    one, two = (sim.run(w.rate_scaled(x), cfg, ROOF).summary for x in (1.0, 2.0))
    span = float(w.arrival[-1] - w.arrival[0])
    assert one["finished"] == two["finished"] == 300
    # the makespan ends with the last request's service: the arrival span halves
    assert two["makespan"] < one["makespan"] and two["makespan"] >= span / 2


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.nan, math.inf, -math.inf, True, False, np.bool_(True)])
def test_rate_scale_refuses_values_that_are_no_finite_positive_number(bad: object) -> None:
    w = lengths_only(5)
    with pytest.raises(pykvpool.InvalidArgumentError, match="rate_scale"):
        w.rate_scaled(bad)  # type: ignore[arg-type]


def test_rate_scale_refuses_a_string() -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match="rate_scale"):
        lengths_only(5).rate_scaled("2")  # type: ignore[arg-type]
