"""Prefill/decode disaggregation in the simulator from Python: ``SimConfig(disaggregation=)``.

The engine's rules are proven in Rust (``tests/rust/sim_disagg.rs``: the prefill side is a
colocated run of one-token outputs bit for bit, the link is first come first served, the
decode side admits at its first step once the KV has arrived); here the facade: the checks,
the columns and summary figures, a hand-computed run, and what a trace shows through the
public API.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pykvpool
from pykvpool import _native
from pykvpool import simulate as sim
from pykvpool.planning.models import model_preset


def _link(**kw: Any) -> sim.Disaggregation:
    args: dict[str, Any] = dict(decode_replicas=1, bandwidth=100.0, bytes_per_token=10.0, latency=0.25)
    args.update(kw)
    return sim.Disaggregation(**args)


@pytest.mark.parametrize("kw,name", [
    (dict(decode_replicas=0), "decode_replicas"),
    (dict(decode_replicas=True), "decode_replicas"),
    (dict(decode_replicas=sim.MAX_REPLICAS + 1), "decode_replicas"),
    (dict(bandwidth=0.0), "bandwidth"),
    (dict(bandwidth=float("inf")), "bandwidth"),
    (dict(bytes_per_token=-1.0), "bytes_per_token"),
    (dict(latency=-0.1), "latency"),
    (dict(latency=float("nan")), "latency"),
    (dict(layers=0), "layers"),
    (dict(layers=(1 << 16) + 1), "layers"),
    (dict(decode_num_blocks=0), "decode_num_blocks"),
    (dict(mixed_tokens=-1), "mixed_tokens"),
    (dict(mixed_tokens=True), "mixed_tokens"),
    (dict(mixed_tokens=2**63), "mixed_tokens"),
])
def test_a_bad_disaggregation_is_refused_by_name(kw: dict[str, Any], name: str) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match=f"disaggregation.{name}"):
        _link(**kw)


def test_the_configuration_checks_the_policy_and_the_type() -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match="allocation='paged'"):
        sim.SimConfig(num_blocks=64, scheduler=sim.SchedulerConfig(allocation="oracle"), disaggregation=_link())
    with pytest.raises(pykvpool.InvalidArgumentError, match="convention='vllm'"):
        sim.SimConfig(num_blocks=64, scheduler=sim.SchedulerConfig(convention="decode_first"), disaggregation=_link())
    with pytest.raises(TypeError, match="disaggregation"):
        sim.SimConfig(num_blocks=64, disaggregation={"decode_replicas": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize("value,name,exc", [
    ({"decode_replicas": 1, "bandwidth": 1.0}, "disaggregation.bytes_per_token", pykvpool.InvalidArgumentError),
    ({"decode_replicas": 1, "bandwidth": "fast", "bytes_per_token": 1.0}, "disaggregation.bandwidth",
     pykvpool.InvalidArgumentError),
    ({"decode_replicas": 1, "bandwidth": 1.0, "bytes_per_token": 1.0, "hops": 2}, "unknown key hops",
     pykvpool.InvalidArgumentError),
    ({"decode_replicas": 2.0, "bandwidth": 1.0, "bytes_per_token": 1.0}, "disaggregation.decode_replicas",
     pykvpool.InvalidArgumentError),
    ([1, 2], "disaggregation must be a dict", TypeError),
])
def test_the_native_run_names_a_bad_disaggregation(value: Any, name: str, exc: type[Exception]) -> None:
    w = {"arrival": np.zeros(2), "prompt_len": np.array([5, 5]), "output_len": np.array([2, 2])}
    with pytest.raises(exc, match=name):
        _native.run_simulation(w, {"num_blocks": 100, "block_size": 16, "disaggregation": value})


def test_a_decode_time_model_needs_disaggregation() -> None:
    w = sim.Workload(arrival=np.zeros(1), prompt_len=np.array([4]), output_len=np.array([2]))
    with pytest.raises(pykvpool.InvalidArgumentError, match="decode_time_model needs disaggregation"):
        sim.run(w, sim.SimConfig(num_blocks=8), 1.0, decode_time_model=0.5)
    with pytest.raises(pykvpool.InvalidArgumentError, match="decode_time_model"):
        sim.run(w, sim.SimConfig(num_blocks=8, disaggregation=_link()), 1.0, decode_time_model=-1.0)


@pytest.mark.parametrize("layers,ready", [(1, 2.25), (4, 1.5)])
def test_a_hand_computed_run(layers: int, ready: float) -> None:
    # One prefill step (1 s) computes both prompts; the 100 bytes of the 10-token prompt
    # take 1 s at 100 bytes/s after it (or stream over 4 layers of the step: the last
    # quarter leaves 0.25 s after it), then 0.25 s of latency; two 0.5 s decode steps.
    w = sim.Workload(arrival=np.zeros(2), prompt_len=np.array([10, 20]), output_len=np.array([3, 1]))
    cfg = sim.SimConfig(num_blocks=64, block_size=4, check_invariants=True, disaggregation=_link(layers=layers))
    r = sim.run(w, cfg, 1.0, decode_time_model=0.5)
    q = r.requests
    assert q["first_token"].tolist() == [1.0, 1.0]
    assert q["replica"].tolist() == [0, 0] and q["decode_replica"].tolist() == [1, -1]
    assert q["kv_ready"][0] == ready and np.isnan(q["kv_ready"][1])
    assert q["decode_start"][0] == ready and q["finish"].tolist() == [ready + 1.0, 1.0]
    s = r.summary
    assert (s["kv_transfers"], s["kv_transfer_bytes"], s["leaked_blocks"]) == (1, 100.0, 0)
    assert s["kv_transfer_mean"] == ready - 1.0 and s["decode_wait_max"] == 0.0
    assert r.steps["replica"].tolist() == [0, 1, 1]


def test_a_colocated_run_has_no_transfer() -> None:
    w = sim.synthetic_workload(20, rate=10.0, seed=2)
    r = sim.run(w, sim.SimConfig(num_blocks=800), 0.01)
    assert (r.requests["decode_replica"] == -1).all() and np.isnan(r.requests["kv_ready"]).all()
    assert np.isnan(r.requests["decode_start"]).all()
    assert r.summary["kv_transfers"] == 0 and r.summary["kv_transfer_mean"] is None


def test_on_a_trace_prefill_steps_never_decode_and_the_kv_arrives_before_its_decode() -> None:
    w = sim.synthetic_workload(300, rate=40.0, seed=5)
    model = model_preset("llama-3-8b")
    prefill = sim.roofline("llama-3-8b", "a100-80gb-sxm")
    decode = sim.roofline("llama-3-8b", "h100-sxm")
    link = sim.Disaggregation(decode_replicas=3, bandwidth=25e9, bytes_per_token=model.kv_bytes_per_token(),
                              latency=5e-4, layers=model.num_layers, decode_num_blocks=4000)
    cfg = sim.SimConfig(num_blocks=3000, replicas=2, router="shortest_queue", disaggregation=link)
    r = sim.run(w, cfg, prefill, decode_time_model=decode)
    q, st = r.requests, r.steps
    assert r.summary["finished"] == 300 and r.summary["leaked_blocks"] == 0
    moved = w.output_len > 1
    assert set(q["decode_replica"][moved].tolist()) <= {2, 3, 4} and (q["decode_replica"][~moved] == -1).all()
    assert (q["kv_ready"][moved] > q["first_token"][moved]).all()
    assert (q["decode_start"][moved] >= q["kv_ready"][moved]).all()
    assert (st["decode_tokens"][st["replica"] < 2] == 0).all()
    assert (st["prefill_tokens"][st["replica"] >= 2] == 0).all()
    # Bytes: every moved prompt's tokens at the model's KV bytes per token.
    want = float(w.prompt_len[moved].sum()) * model.kv_bytes_per_token()
    assert r.summary["kv_transfers"] == int(moved.sum())
    assert r.summary["kv_transfer_bytes"] == pytest.approx(want, rel=1e-12)


def test_a_mixed_pool_under_constant_pressure_is_a_colocated_deployment_of_its_decode_instances() -> None:
    w = sim.synthetic_workload(120, rate=30.0, seed=4)
    roof = sim.roofline("llama-3-8b", "a100-80gb-sxm")
    mixed = sim.SimConfig(num_blocks=3000, replicas=2, router="shortest_queue",
                          disaggregation=_link(decode_replicas=3, bandwidth=25e9, mixed_tokens=0))
    colocated = sim.SimConfig(num_blocks=3000, replicas=3, router="shortest_queue")
    a, b = sim.run(w, mixed, roof), sim.run(w, colocated, roof)
    assert a.summary["kv_transfers"] == 0
    np.testing.assert_array_equal(a.requests["finish"], b.requests["finish"])
    np.testing.assert_array_equal(a.requests["replica"], b.requests["replica"] + 2)
    # Under a pressure it never reaches, the plain disaggregated run.
    never = sim.SimConfig(num_blocks=3000, replicas=2, router="shortest_queue",
                          disaggregation=_link(decode_replicas=3, bandwidth=25e9, mixed_tokens=2**63 - 1))
    plain = sim.SimConfig(num_blocks=3000, replicas=2, router="shortest_queue",
                          disaggregation=_link(decode_replicas=3, bandwidth=25e9))
    assert sim.run(w, never, roof).summary == sim.run(w, plain, roof).summary
