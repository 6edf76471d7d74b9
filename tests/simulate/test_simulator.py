"""The serving simulator from Python: fidelity with the allocator benchmark's Python-driven
loop, pool invariants at every step over random workloads and policies (hypothesis),
conservation, determinism, expected directions, prefix caching, trace loading, exports,
figures, sweeps, the CLI subcommand, and rejected input."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


import pykvpool
from pykvpool.simulate.reference import make_workload, run_loop
from pykvpool.simulate import plots as sim_plots, sweep as sim_sweep, traces as sim_traces
from pykvpool import simulate as sim
from pykvpool.cli import simulate as cli_simulate
from isolation import isolated

# The traces ship inside the package (with their licenses), so these tests never skip.
DATA = Path(pykvpool.__file__).resolve().parent / "data"
AZURE_CONV = DATA / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = DATA / "mooncake_fast25" / "synthetic_trace.jsonl"

ROOF = sim.roofline("llama-3-8b", "a100-80gb-sxm")


def bench_config(num_blocks: int, block_size: int, max_running: int) -> sim.SimConfig:
    return sim.SimConfig(
        num_blocks=num_blocks,
        block_size=block_size,
        scheduler=sim.SchedulerConfig(
            max_running=max_running, max_batched_tokens=None, chunked_prefill=False, convention="decode_first"
        ),
    )


def loop_per_step(n: int, **kw: Any) -> tuple[Any, dict[str, np.ndarray], np.ndarray]:
    """Run the benchmark loop on pykvpool with an observer; per-step decode batch sizes,
    preemptions, admitted tokens, and per-request preemption counts."""
    wl = make_workload(n, **kw)
    dec: dict[int, int] = defaultdict(int)
    pre: dict[int, int] = defaultdict(int)
    adm: dict[int, int] = defaultdict(int)
    per_req = np.zeros(n, dtype=np.int64)

    def observe(kind: str, step: int, ids: Any, slots: Any, lens: Any) -> None:
        if kind == "decode":
            dec[step] += len(ids)
        elif kind == "preempt":
            pre[step] += 1
            per_req[ids[0]] += 1
        elif kind == "admit":
            adm[step] += len(slots)

    res = run_loop(pykvpool.BlockPool(wl.num_blocks, wl.block_size), wl, observe)
    steps = {
        "decode_tokens": np.array([dec[k] for k in range(res.steps)]),
        "preemptions": np.array([pre[k] for k in range(res.steps)]),
        "prefill_tokens": np.array([adm[k] for k in range(res.steps)]),
    }
    return res, steps, per_req


def simulate_bench(n: int, **kw: Any) -> tuple[sim.SimulationResult, Any]:
    wl = make_workload(n, **kw)
    w = sim.Workload(arrival=np.zeros(n), prompt_len=wl.prompt_lens, output_len=wl.output_lens)
    return sim.run(w, bench_config(wl.num_blocks, wl.block_size, wl.max_running)), wl


def assert_same_as_loop(n: int, **kw: Any) -> sim.SimulationResult:
    res, steps, per_req = loop_per_step(n, **kw)
    r, _ = simulate_bench(n, **kw)
    assert r.summary["steps"] == res.steps
    assert r.summary["preemptions"] == res.preemptions
    assert r.summary["recomputed_tokens"] == res.recomputed_tokens
    assert r.summary["peak_running"] == res.peak_running
    for col, want in steps.items():
        np.testing.assert_array_equal(r.steps[col], want, err_msg=col)
    np.testing.assert_array_equal(r.requests["preemptions"], per_req)
    return r


# ---- fidelity -------------------------------------------------------------------------


def test_engine_reproduces_the_allocator_benchmark_loop_exactly() -> None:
    """The issue's workload: 10,000 requests, same steps and preemptions, step by step."""
    r = assert_same_as_loop(10_000)
    assert r.summary["steps"] == 12_124 and r.summary["preemptions"] == 1_062
    assert r.summary["finished"] == 10_000 and r.summary["leaked_blocks"] == 0


@pytest.mark.parametrize(
    "kw",
    [
        dict(seed=3, num_blocks=400, max_running=64, prompt_range=(10, 600), output_range=(1, 300)),
        dict(seed=4, num_blocks=700, block_size=7, max_running=300, prompt_range=(1, 900), output_range=(1, 900)),
        dict(seed=5, num_blocks=50, block_size=32, max_running=8, prompt_range=(1, 100), output_range=(1, 500)),
    ],
)
def test_engine_matches_the_loop_under_heavy_preemption(kw: dict[str, Any]) -> None:
    r = assert_same_as_loop(1_500, **kw)
    assert r.summary["preemptions"] > 0


@pytest.mark.parametrize("kw", [dict(num_requests=-1), dict(num_requests=True), dict(output_range=(0, 5)),
                                dict(prompt_range=(9, 3)), dict(block_size=0), dict(max_running=0)])
def test_the_reference_workload_refuses_bad_values(kw: dict[str, Any]) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError):
        make_workload(**kw)


def test_the_reference_loop_refuses_a_pool_of_another_shape_and_requests_that_never_fit() -> None:
    wl = make_workload(4, num_blocks=8, block_size=4, prompt_range=(1, 8), output_range=(1, 8))
    with pytest.raises(pykvpool.InvalidArgumentError, match="pool is"):
        run_loop(pykvpool.BlockPool(9, 4), wl)
    wl = make_workload(4, num_blocks=2, block_size=4, prompt_range=(8, 8), output_range=(1, 1))
    with pytest.raises(pykvpool.InvalidArgumentError, match="cannot fit"):
        run_loop(pykvpool.BlockPool(2, 4), wl)


# ---- invariants, conservation (hypothesis) --------------------------------------------

policies = st.builds(
    sim.SchedulerConfig,
    max_running=st.integers(1, 8),
    max_batched_tokens=st.one_of(st.none(), st.integers(8, 300)),
    chunked_prefill=st.booleans(),
    watermark=st.sampled_from([0.0, 0.05]),
    queue=st.sampled_from(["fcfs", "priority"]),
    allocation=st.sampled_from(["paged", "reserve", "oracle"]),
    # Used by "reserve" only; below some workloads' longest request, so some are rejected.
    reserve_tokens=st.integers(1, 150),
    preemption=st.sampled_from(["recompute", "swap"]),
    host_blocks=st.integers(0, 40),
    victim=st.sampled_from(["newest", "lowest_priority"]),
    convention=st.sampled_from(["vllm", "decode_first"]),
)


@st.composite
def workloads(draw: st.DrawFn) -> sim.Workload:
    n = draw(st.integers(1, 20))
    gaps = draw(st.lists(st.floats(0, 0.5), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 90), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    prio = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    w = sim.Workload(
        arrival=np.cumsum(gaps),
        prompt_len=np.array(prompts, dtype=np.int64),
        output_len=np.array(outputs, dtype=np.int64),
        priority=np.array(prio, dtype=np.int64),
    )
    if draw(st.booleans()):
        # Prompts from a 4-token alphabet share prefixes often enough to hit the cache.
        prefix = draw(st.lists(st.integers(0, 3), min_size=90, max_size=90))
        ids = [prefix[: p // 2] + draw(st.lists(st.integers(0, 3), min_size=p - p // 2, max_size=p - p // 2)) for p in prompts]
        w = sim.Workload(
            arrival=w.arrival,
            prompt_len=w.prompt_len,
            output_len=w.output_len,
            priority=w.priority,
            token_ids=np.concatenate([np.array(t, dtype=np.int64) for t in ids]),
            token_offsets=np.concatenate([[0], np.cumsum(prompts)]).astype(np.int64),
        )
    return w


def assert_conserved(w: sim.Workload, r: sim.SimulationResult, convention: str) -> None:
    q, s = r.requests, r.summary
    assert s["leaked_blocks"] == 0
    assert s["finished"] + s["rejected"] == len(w)
    done = q["outcome"] == 0
    assert np.all(q["finish"][done] >= q["first_token"][done])
    assert np.all(q["first_token"][done] >= q["arrival"][done])
    assert np.all(np.isnan(q["finish"][~done]))
    last = 1 if convention == "vllm" else 0
    # Each finished request computed its prompt and outputs once, plus recomputes, minus cache hits.
    expect = (w.prompt_len + w.output_len - last + q["recomputed_tokens"] - q["cached_tokens"])[done].sum()
    assert int(r.steps["prefill_tokens"].sum() + r.steps["decode_tokens"].sum()) == int(expect)
    assert s["output_tokens"] == int(w.output_len[done].sum())


@settings(max_examples=150)
@given(
    w=workloads(),
    pol=policies,
    block_size=st.sampled_from([1, 3, 16]),
    num_blocks=st.integers(10, 80),
    caching=st.booleans(),
    eviction=st.sampled_from(["lru", "fifo", "lfu", "priority"]),
)
def test_pool_invariants_hold_at_every_step(
    w: sim.Workload, pol: sim.SchedulerConfig, block_size: int, num_blocks: int, caching: bool, eviction: Any
) -> None:
    cfg = sim.SimConfig(
        num_blocks=num_blocks,
        block_size=block_size,
        scheduler=pol,
        prefix_caching=caching and w.has_prompt_ids,  # run() refuses it on lengths only
        eviction=eviction,
        check_invariants=True,
    )
    r = sim.run(w, cfg, 0.01)
    assert_conserved(w, r, pol.convention)
    assert np.all(r.steps["running"] <= pol.max_running)
    assert np.all((r.steps["utilization"] >= 0) & (r.steps["utilization"] <= 1))
    if pol.max_batched_tokens is not None:
        assert np.all(r.steps["prefill_tokens"] + r.steps["decode_tokens"] <= pol.max_batched_tokens)


# ---- determinism and workloads --------------------------------------------------------


def test_same_seed_gives_identical_results_bit_for_bit() -> None:
    def one() -> sim.SimulationResult:
        w = sim.synthetic_workload(
            400, arrivals="gamma", rate=30.0, cv=2.5, prompt=("lognormal", [600, 0.8]), output=("pareto", [30, 1.5]),
            prompt_clamp=(1, 4000), output_clamp=(1, 800), priority_levels=3, seed=11,
        )
        cfg = sim.SimConfig(num_blocks=1500, scheduler=sim.SchedulerConfig(queue="priority", victim="lowest_priority"))
        return sim.run(w, cfg, ROOF)

    a, b = one(), one()
    for part in ("requests", "steps"):
        for k, v in getattr(a, part).items():
            assert v.tobytes() == getattr(b, part)[k].tobytes(), k
    assert a.summary == b.summary
    c = sim.synthetic_workload(400, arrivals="gamma", rate=30.0, cv=2.5, seed=12)
    assert not np.array_equal(c.arrival, sim.synthetic_workload(400, arrivals="gamma", rate=30.0, cv=2.5, seed=11).arrival)


def test_synthetic_distributions_have_their_shape() -> None:
    w = sim.synthetic_workload(20_000, rate=50.0, prompt=("uniform", [10, 20]), output=("fixed", [7]), seed=1)
    assert w.prompt_len.min() == 10 and w.prompt_len.max() == 20
    assert np.all(w.output_len == 7)
    gaps = np.diff(w.arrival)
    assert abs(gaps.mean() - 0.02) < 0.001 and abs(gaps.std() / gaps.mean() - 1.0) < 0.05
    g = sim.synthetic_workload(20_000, arrivals="gamma", rate=50.0, cv=3.0, seed=1)
    gg = np.diff(g.arrival)
    assert abs(gg.std() / gg.mean() - 3.0) < 0.3
    ln = sim.synthetic_workload(20_000, prompt=("lognormal", [500, 1.0]), prompt_clamp=(1, 10**6), seed=2)
    assert abs(np.median(ln.prompt_len) - 500) < 25
    emp = sim.synthetic_workload(1000, prompt=sim_traces.empirical(np.array([5, 9])), seed=3)
    assert set(emp.prompt_len.tolist()) == {5, 9}
    heavy = sim.synthetic_workload(20_000, prompt=("pareto", [100, 1.2]), prompt_clamp=(1, 10**7), seed=4)
    assert heavy.prompt_len.max() > 50 * np.median(heavy.prompt_len)


def test_scaling_time_and_lengths() -> None:
    w = sim.synthetic_workload(50, rate=10.0, seed=1)
    s = w.scaled(time=2.0, prompt=0.5, output=3.0)
    np.testing.assert_allclose(s.arrival, w.arrival * 2)
    assert np.all(s.prompt_len == np.maximum(1, np.rint(w.prompt_len * 0.5)))
    assert np.all(s.output_len == w.output_len * 3)
    shared = sim.synthetic_workload(5, shared_prefixes=(2, 16, 100), seed=1)
    with pytest.raises(pykvpool.InvalidArgumentError):
        shared.scaled(prompt=2.0)


# ---- expected directions --------------------------------------------------------------


def test_low_load_no_preemption_and_ttft_close_to_prefill_time() -> None:
    w = sim.synthetic_workload(200, rate=0.5, prompt=("uniform", [500, 1500]), output=("uniform", [20, 100]), seed=2)
    r = sim.run(w, sim.SimConfig(num_blocks=20_000), ROOF)
    assert r.summary["preemptions"] == 0
    # A prefill alone takes the roofline time of its prompt (compute bound). TTFT adds the
    # decodes batched with it, the step in flight at arrival and, rarely, a prompt that
    # arrived at the same time: close to the prefill time for most requests.
    own = np.maximum(2 * 8.03e9 * w.prompt_len / (312e12 * 0.6), 8.03e9 * 2 / (2.039e12 * 0.8)) + 2e-3
    ratio = r.requests["ttft"] / own
    assert np.all(ratio >= 1.0 - 1e-9)
    assert np.median(ratio) < 1.05 and np.percentile(ratio, 90) < 1.3


def test_past_saturation_the_queue_grows() -> None:
    def waiting_at(rate: float) -> tuple[float, float]:
        w = sim.synthetic_workload(3000, rate=rate, prompt=("uniform", [500, 1500]), output=("uniform", [100, 300]), seed=3)
        r = sim.run(w, sim.SimConfig(num_blocks=30_000, scheduler=sim.SchedulerConfig(max_running=64)), ROOF)
        t, q = r.steps["time"], r.steps["waiting"]
        span = w.arrival[-1]
        return float(q[np.searchsorted(t, 0.25 * span)]), float(q[np.searchsorted(t, 0.9 * span)])

    early, late = waiting_at(1.0)
    assert late <= 5
    early, late = waiting_at(40.0)
    assert late > 2 * max(early, 1) and late > 100


def test_paged_admits_more_than_reservation() -> None:
    w = sim.synthetic_workload(600, arrivals="burst", prompt=("uniform", [100, 800]), output=("uniform", [20, 1500]), seed=4)
    res = {}
    for alloc in ("paged", "reserve"):
        cfg = sim.SimConfig(num_blocks=4000, scheduler=sim.SchedulerConfig(allocation=alloc, reserve_tokens=2400))
        res[alloc] = sim.run(w, cfg, ROOF)
    assert res["paged"].summary["peak_running"] > 1.5 * res["reserve"].summary["peak_running"]
    assert res["reserve"].summary["preemptions"] == 0
    assert res["paged"].summary["output_throughput"] > res["reserve"].summary["output_throughput"]
    data = sim_plots.policy_comparison(res)
    assert data["paged"]["mean_utilization"] > data["reserve"]["mean_utilization"]


def test_reserve_at_max_context_admits_fewer_than_paged() -> None:
    """Orca reserves the model's context for every request: on requests much shorter than
    the context, it holds at most num_blocks // ceil(context / block_size) of them."""
    ctx = ROOF.model.max_context
    w = sim.synthetic_workload(400, arrivals="burst", prompt=("uniform", [100, 800]), output=("uniform", [20, 300]), seed=14)
    assert int((w.prompt_len + w.output_len).max()) < ctx // 4
    res = {
        alloc: sim.run(w, sim.SimConfig(num_blocks=3000, scheduler=sim.SchedulerConfig(allocation=alloc, reserve_tokens=ctx)), ROOF)
        for alloc in ("paged", "reserve", "oracle")
    }
    per_request = -(-ctx // 16)
    orca = res["reserve"]
    assert orca.summary["finished"] == 400 and orca.summary["rejected"] == 0 and orca.summary["preemptions"] == 0
    # Every running request holds exactly its reservation, allocated or still promised.
    held = orca.steps["blocks_used"] + orca.steps["blocks_reserved"]
    np.testing.assert_array_equal(held, orca.steps["running"].astype(np.int64) * per_request)
    assert orca.summary["peak_running"] == 3000 // per_request
    assert res["paged"].summary["peak_running"] > 5 * orca.summary["peak_running"]
    assert res["oracle"].summary["peak_running"] > 5 * orca.summary["peak_running"]
    assert res["paged"].summary["output_throughput"] > res["reserve"].summary["output_throughput"]


def test_reserve_rejects_requests_longer_than_reserve_tokens() -> None:
    w = sim.Workload(arrival=np.zeros(4), prompt_len=np.array([60, 61, 10, 100]), output_len=np.array([40, 40, 5, 1]))
    r = sim.run(w, sim.SimConfig(num_blocks=100, scheduler=sim.SchedulerConfig(allocation="reserve", reserve_tokens=100)))
    # prompt + output: 100 fits the reservation exactly, 101 never can.
    assert r.requests["outcome"].tolist() == [0, 1, 0, 1]
    assert r.summary["rejected"] == 2 and r.summary["finished"] == 2 and r.summary["leaked_blocks"] == 0
    paged = sim.run(w, sim.SimConfig(num_blocks=100))
    assert paged.summary["rejected"] == 0
    with pytest.raises(pykvpool.InvalidArgumentError, match="reserve_tokens"):
        sim.run(w, sim.SimConfig(num_blocks=100, scheduler=sim.SchedulerConfig(allocation="reserve")))


@pytest.mark.parametrize("convention", ["vllm", "decode_first"])
def test_oracle_reserves_each_request_final_length(convention: Any) -> None:
    """``oracle`` is the former ``reserve`` without ``reserve_tokens``: each request holds
    the blocks of its own longest KV (prompt + output - 1 under vllm, prompt + output
    under decode_first) from admission to finish, and nothing is preempted."""
    w = sim.synthetic_workload(300, arrivals="burst", prompt=("fixed", [70]), output=("fixed", [41]), seed=2)
    cfg = sim.SimConfig(num_blocks=120, block_size=16, scheduler=sim.SchedulerConfig(allocation="oracle", convention=convention))
    r = sim.run(w, cfg)
    longest = 70 + 41 - (1 if convention == "vllm" else 0)
    held = r.steps["blocks_used"] + r.steps["blocks_reserved"]
    np.testing.assert_array_equal(held, r.steps["running"].astype(np.int64) * -(-longest // 16))
    assert r.summary["preemptions"] == 0 and r.summary["finished"] == 300
    assert r.summary["peak_running"] == 120 // -(-longest // 16)
    # With equal lengths, the oracle is Orca at exactly that length (decode_first, or
    # vllm whose longest KV needs as many blocks as prompt + output).
    orca = sim.run(w, dataclasses.replace(cfg, scheduler=dataclasses.replace(cfg.scheduler, allocation="reserve", reserve_tokens=111)))
    for k, v in r.steps.items():
        assert v.tobytes() == orca.steps[k].tobytes(), k


def test_swap_keeps_kv_and_recompute_recomputes() -> None:
    w = sim.synthetic_workload(300, arrivals="burst", prompt=("uniform", [50, 300]), output=("uniform", [200, 600]), seed=5)
    base = dict(num_blocks=900, check_invariants=True)
    rec = sim.run(w, sim.SimConfig(**base), ROOF)  # type: ignore[arg-type]
    swp = sim.run(w, sim.SimConfig(**base, scheduler=sim.SchedulerConfig(preemption="swap", host_blocks=5000)), ROOF)  # type: ignore[arg-type]
    assert rec.summary["recomputed_tokens"] > 0 and rec.summary["swaps"] == 0
    assert swp.summary["swaps"] > 0 and swp.summary["recomputed_tokens"] == 0
    assert swp.steps["swapped_blocks"].sum() > 0
    assert_conserved(w, swp, "vllm")


def test_priority_queue_serves_urgent_requests_first() -> None:
    w = sim.synthetic_workload(500, arrivals="burst", prompt=("uniform", [200, 400]), output=("uniform", [50, 100]), priority_levels=2, seed=6)
    assert w.priority is not None
    r = sim.run(w, sim.SimConfig(num_blocks=2000, scheduler=sim.SchedulerConfig(queue="priority", victim="lowest_priority")), ROOF)
    q = r.requests["queueing"]
    assert np.mean(q[w.priority == 0]) < 0.5 * np.mean(q[w.priority == 1])


def test_prefix_caching_lowers_ttft_on_shared_prefixes() -> None:
    w = sim.synthetic_workload(500, rate=15.0, prompt=("uniform", [1200, 2000]), output=("uniform", [20, 80]), shared_prefixes=(4, 1024, 32000), seed=7)
    off = sim.run(w, sim.SimConfig(num_blocks=8000), ROOF)
    on = sim.run(w, sim.SimConfig(num_blocks=8000, prefix_caching=True), ROOF)
    assert off.summary["prefix_hit_rate"] == 0
    assert on.summary["prefix_hit_rate"] > 0.4
    assert on.summary["ttft_mean"] < 0.7 * off.summary["ttft_mean"]
    assert on.summary["ttft_p99"] < off.summary["ttft_p99"]
    q, h = on.steps["cache_query_tokens"], on.steps["cache_hit_tokens"]
    assert h.sum() / q.sum() == pytest.approx(on.summary["prefix_hit_rate"])
    np.testing.assert_allclose(on.steps["prefix_hit_rate"][q > 0], h[q > 0] / q[q > 0])
    assert np.all(np.isnan(on.steps["prefix_hit_rate"][q == 0]))
    cdf = sim_plots.latency_cdf({"off": off, "on": on}, "ttft")
    assert cdf["on"][0].size == cdf["off"][0].size == 500


# ---- traces ---------------------------------------------------------------------------


def test_azure_conv_trace_replays_in_full() -> None:
    w = sim_traces.load_azure(AZURE_CONV)
    assert len(w) == 19_366
    assert w.arrival[0] == 0 and np.all(np.diff(w.arrival) >= 0) and 3400 < w.arrival[-1] < 3600
    assert abs(w.prompt_len.mean() - 1155) < 1 and int(np.median(w.output_len)) == 129
    r = sim.run(w, sim.SimConfig(num_blocks=sim.kv_blocks_for_memory(ROOF.model, ROOF.hardware)), ROOF)
    assert r.summary["finished"] == 19_366 and r.summary["leaked_blocks"] == 0


def test_mooncake_hash_ids_hit_like_an_unbounded_cache() -> None:
    w = sim_traces.load_mooncake(MOONCAKE)
    assert len(w) == 3_993 and w.tokens_per_key == 512
    assert w.key_offsets is not None and w.block_keys is not None
    assert np.all(np.diff(w.key_offsets) == -(-w.prompt_len // 512))
    # Independent rule: a request reuses the longest prefix of its ids seen before, in
    # whole 512-token blocks, leaving its last prompt token to compute.
    seen: set[tuple[int, ...]] = set()
    expect = 0
    for i in range(len(w)):
        ids = tuple(w.block_keys[w.key_offsets[i] : w.key_offsets[i + 1]].tolist())
        hit = 0
        while hit < len(ids) and ids[: hit + 1] in seen:
            hit += 1
        expect += min(hit, (int(w.prompt_len[i]) - 1) // 512) * 512
        seen.update(ids[: k + 1] for k in range(len(ids)))
    # Arrivals far apart and a huge pool: every request sees all earlier ones, nothing evicted.
    spread = sim.Workload(
        arrival=np.arange(len(w)) * 1e6, prompt_len=w.prompt_len, output_len=w.output_len,
        block_keys=w.block_keys, key_offsets=w.key_offsets, tokens_per_key=512,
    )
    r = sim.run(spread, sim.SimConfig(num_blocks=400_000, block_size=512, prefix_caching=True), 1.0)
    assert r.summary["cached_tokens"] == expect
    assert 0.6 < r.summary["prefix_hit_rate"] < 0.7


def test_generic_csv_and_jsonl_with_a_column_mapping(tmp_path: Path) -> None:
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("ts_ms,in,out,prio\n2000,10,3,1\n0,20,1,0\n1000,30,2,2\n")
    w = sim_traces.load_trace(csv_path, arrival="ts_ms", prompt_len="in", output_len="out", priority="prio", time_unit=1e-3)
    np.testing.assert_allclose(w.arrival, [0.0, 1.0, 2.0])
    assert w.prompt_len.tolist() == [20, 30, 10] and w.priority is not None and w.priority.tolist() == [0, 2, 1]
    jl = tmp_path / "t.jsonl"
    jl.write_text("\n".join(json.dumps(d) for d in [
        {"t": 5, "p": 600, "o": 0, "ids": [7, 8]},
        {"t": 1, "p": 100, "o": 4, "ids": [9]},
    ]))
    k = sim_traces.load_trace(jl, arrival="t", prompt_len="p", output_len="o", block_keys="ids")
    assert k.output_len.tolist() == [4, 1]
    assert k.block_keys is not None and k.block_keys.tolist() == [9, 7, 8]
    assert k.key_offsets is not None and k.key_offsets.tolist() == [0, 1, 3]
    with pytest.raises(pykvpool.TraceFormatError, match="no 'nope' column"):
        sim_traces.load_trace(csv_path, arrival="nope", prompt_len="in", output_len="out")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n0,x,1\n")
    with pytest.raises(ValueError):
        sim_traces.load_trace(bad, arrival="a", prompt_len="b", output_len="c")


# ---- results, figures, sweep, CLI -----------------------------------------------------


def test_csv_export_and_figures_return_their_data(tmp_path: Path) -> None:
    w = sim.synthetic_workload(100, rate=20.0, prompt=("uniform", [100, 400]), output=("uniform", [10, 50]), seed=8)
    r = sim.run(w, sim.SimConfig(num_blocks=3000), ROOF)
    paths = r.to_csv(tmp_path)
    lines = Path(paths[0]).read_text().splitlines()
    assert len(lines) == 101 and lines[0].startswith("prompt_len,")
    assert len(Path(paths[1]).read_text().splitlines()) == r.summary["steps"] + 1
    u = sim_plots.utilization_over_time(r, tmp_path / "u.png")
    assert (tmp_path / "u.png").stat().st_size > 0
    np.testing.assert_array_equal(u["running"], r.steps["running"])
    cdf = sim_plots.latency_cdf({"a": r}, "e2e", tmp_path / "c.png")
    assert np.all(np.diff(cdf["a"][0]) >= 0) and cdf["a"][1][-1] == 1.0


def test_sweep_covers_the_grid_in_order_and_throughput_rises_with_rate(tmp_path: Path) -> None:
    base = sim.synthetic_workload(300, rate=5.0, prompt=("uniform", [100, 600]), output=("uniform", [20, 100]), seed=9)
    policies = {"paged": sim.SchedulerConfig(), "reserve": sim.SchedulerConfig(allocation="reserve", reserve_tokens=8192)}
    bar = io.StringIO()
    rows = sim_sweep.sweep(base, [2.0, 8.0], policies, [16, 32], 60_000, ROOF, workers=2, progress=bar)
    assert [(r["rate"], r["label"], r["block_size"]) for r in rows] == [
        (rate, p, bs) for rate in (2.0, 8.0) for p in policies for bs in (16, 32)
    ]
    assert "8/8" in bar.getvalue()
    assert rows[0]["num_blocks"] == 60_000 // 16 and rows[1]["num_blocks"] == 60_000 // 32
    data = sim_plots.throughput_vs_rate(rows, tmp_path / "t.png")
    assert data["paged"]["output_throughput"][-1] > data["paged"]["output_throughput"][0]
    shared = sim.synthetic_workload(200, rate=5.0, prompt=("uniform", [600, 900]), output=("fixed", [20]),
                                    shared_prefixes=(2, 512, 1000), seed=9)
    caching = {e: sim.SimConfig(num_blocks=1, prefix_caching=True, eviction=e) for e in ("lru", "fifo")}
    rows = sim_sweep.sweep(shared, [5.0], {**caching, "off": sim.SchedulerConfig()}, [16], 20_000, ROOF, progress=None)
    hits = {r["label"]: r["prefix_hit_rate"] for r in rows}
    assert hits["lru"] > 0.4 and hits["fifo"] > 0.4 and hits["off"] == 0


def test_cli_subcommand_runs_and_writes_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="pykvpool")
    cli_simulate.add_subcommand(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate", "--requests", "200", "--rate", "5", "--num-blocks", "5000", "--out", str(tmp_path)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "200 requests" in out and "  ttft (s)  " in out
    assert (tmp_path / "requests.csv").exists() and (tmp_path / "utilization.png").exists()
    args = parser.parse_args(["simulate", "--requests", "100", "--num-blocks", "3000", "--sweep-rates", "1,4", "--workers", "1"])
    assert args.func(args) == 0
    assert capsys.readouterr().out.count("paged") == 2


def test_pykvpool_simulate_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    from pykvpool.cli import main

    assert main(["simulate", "--trace", "azure-code", "--limit", "300", "--num-blocks", "4000"]) == 0
    assert "300 requests" in capsys.readouterr().out
    assert main(["simulate", "--requests", "10", "--model", "llama-3-70b", "--hardware", "l40s"]) == 2
    assert "unknown hardware" in capsys.readouterr().err
    assert main(["simulate", "--requests", "10", "--model", "llama-3-70b", "--hardware", "a100-80gb-sxm",
                 "--block-size", "16"]) == 2
    assert "exceed the usable" in capsys.readouterr().err


# ---- time models and bad input --------------------------------------------------------


@isolated(timeout=180)
def test_a_run_releases_the_gil() -> None:
    """Another Python thread keeps running while a simulation runs (sweeps rely on it)."""
    import threading

    wl = make_workload(3_000)
    w = sim.Workload(arrival=np.zeros(3_000), prompt_len=wl.prompt_lens, output_len=wl.output_lens)
    cfg = bench_config(wl.num_blocks, wl.block_size, wl.max_running)
    started, done = threading.Event(), threading.Event()
    results: list[sim.SimulationResult] = []

    def work() -> None:
        started.set()
        results.append(sim.run(w, cfg))
        done.set()

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    ticks = 0
    while not done.is_set():
        ticks += 1
    t.join()
    # Had the run held the GIL, this thread would only wake up once it was over.
    assert ticks > 1_000
    assert results[0].summary["finished"] == 3_000


def test_python_step_time_callable_is_called_and_its_errors_propagate() -> None:
    w = sim.synthetic_workload(20, arrivals="burst", prompt=("fixed", [64]), output=("fixed", [5]), seed=1)
    calls: list[tuple[int, ...]] = []

    def timer(*shape: int) -> float:
        calls.append(shape)
        return 0.5

    r = sim.run(w, sim.SimConfig(num_blocks=200), timer)
    assert len(calls) == r.summary["steps"] and r.steps["duration"].tolist() == [0.5] * len(calls)
    assert sum(c[0] for c in calls) == 20 * 64 and sum(c[1] for c in calls) == 20 * 4

    def broken(*shape: int) -> float:
        raise ZeroDivisionError("model failed")

    with pytest.raises(ZeroDivisionError, match="model failed"):
        sim.run(w, sim.SimConfig(num_blocks=200), broken)
    with pytest.raises(pykvpool.InvalidArgumentError):
        sim.run(w, sim.SimConfig(num_blocks=200), lambda *s: -1.0)


@pytest.mark.parametrize(
    "change",
    [
        dict(queue="lifo"),
        dict(allocation="contiguous"),
        dict(preemption="drop"),
        dict(victim="oldest"),
        dict(convention="sglang"),
        dict(max_running=0),
        dict(max_batched_tokens=0),
        dict(watermark=1.5),
    ],
)
def test_bad_scheduler_settings_are_rejected(change: dict[str, Any]) -> None:
    w = sim.synthetic_workload(5, seed=1)
    cfg = sim.SimConfig(num_blocks=1000, scheduler=sim.SchedulerConfig(**change))
    with pytest.raises(pykvpool.InvalidArgumentError):
        sim.run(w, cfg)


def test_bad_workloads_are_rejected() -> None:
    ok = sim.synthetic_workload(3, seed=1)
    cfg = sim.SimConfig(num_blocks=1000)
    bad = [
        sim.Workload(arrival=np.zeros(3), prompt_len=ok.prompt_len[:2], output_len=ok.output_len),
        sim.Workload(arrival=np.array([0.0, np.nan, 1.0]), prompt_len=ok.prompt_len, output_len=ok.output_len),
        sim.Workload(arrival=np.zeros(3), prompt_len=np.array([1, 0, 1]), output_len=ok.output_len),
        sim.Workload(arrival=np.zeros(3), prompt_len=ok.prompt_len, output_len=np.array([1, -1, 1])),
        sim.Workload(arrival=np.zeros(1), prompt_len=np.array([3]), output_len=np.array([1]), token_ids=np.array([1, 2]), token_offsets=np.array([0, 2])),
        sim.Workload(arrival=np.zeros(1), prompt_len=np.array([3]), output_len=np.array([1]), block_keys=np.array([1]), key_offsets=np.array([0, 1]), tokens_per_key=0),
    ]
    for w in bad:
        with pytest.raises(pykvpool.InvalidArgumentError):
            sim.run(w, cfg)
    with pytest.raises(pykvpool.InvalidArgumentError):
        sim.run(ok, sim.SimConfig(num_blocks=0))
    with pytest.raises(pykvpool.InvalidArgumentError):
        sim.synthetic_workload(3, prompt=("zipf", [1.0]))
    with pytest.raises(pykvpool.InvalidArgumentError):
        sim.synthetic_workload(3, arrivals="poisson", rate=0.0)


def test_requests_that_can_never_fit_are_rejected_not_stalled() -> None:
    w = sim.Workload(arrival=np.zeros(3), prompt_len=np.array([100, 5000, 50]), output_len=np.array([10, 10, 10]))
    r = sim.run(w, sim.SimConfig(num_blocks=64))
    assert r.requests["outcome"].tolist() == [0, 1, 0]
    assert np.isnan(r.requests["ttft"][1]) and r.summary["rejected"] == 1


def test_the_longest_requests_run_or_are_rejected_without_overflow() -> None:
    """Lengths at the limit go through the engine's token arithmetic (no u32 overflow,
    no InvariantError): admitted when the pool holds them, rejected when it cannot."""
    big = sim.MAX_REQUEST_TOKENS
    w = sim.Workload(arrival=np.zeros(3), prompt_len=np.array([big, big, 5]), output_len=np.array([1, big, 3]))
    # 2**24 + 2**16 tokens of pool: the first request fits, the second (2**25 - 1) never does.
    cfg = sim.SimConfig(num_blocks=257, block_size=2**16, max_steps=3, check_invariants=True)
    r = sim.run(w, cfg)
    assert r.requests["outcome"].tolist() == [2, 1, 2]
    assert r.summary["rejected"] == 1 and r.summary["steps"] == 3
    assert r.steps["prefill_tokens"].tolist() == [8192, 8192, 8192]
    for o in ([big, 5], [5, big]):
        w = sim.Workload(arrival=np.zeros(2), prompt_len=np.array(o), output_len=np.array(o[::-1]))
        assert sim.run(w, sim.SimConfig(num_blocks=1000)).requests["outcome"].tolist() == [1, 1]


def test_an_empty_workload_simulates_to_an_empty_result(tmp_path: Path) -> None:
    for w in (sim.synthetic_workload(0), sim.Workload(arrival=np.zeros(0), prompt_len=np.array([]), output_len=np.array([]))):
        assert len(w) == 0
        r = sim.run(w, sim.SimConfig(num_blocks=10), ROOF)
        assert all(v.size == 0 for v in (*r.requests.values(), *r.steps.values()))
        counts = {k: v for k, v in r.summary.items() if isinstance(v, int)}
        assert counts and all(v == 0 for v in counts.values())
        assert r.summary["ttft_p99"] is None and r.summary["output_throughput"] is None
        assert r.summary["mean_utilization"] is None and r.summary["makespan"] is None
        assert not any(isinstance(v, float) and np.isnan(v) for v in r.summary.values())
        r.to_csv(tmp_path)
        rows = dict(line.split(",") for line in (tmp_path / "summary.csv").read_text().splitlines()[1:])
        assert rows["ttft_p99"] == "" and rows["num_requests"] == "0"


def test_statistics_over_no_finished_request_are_none() -> None:
    w = sim.synthetic_workload(10, arrivals="burst", prompt=("fixed", [10]), output=("fixed", [1]), seed=1)
    r = sim.run(w, sim.SimConfig(num_blocks=500), 1.0)
    # Single-token outputs: TPOT is undefined, the rest is measured.
    assert r.summary["tpot_p50"] is None and r.summary["ttft_p50"] == 1.0
    stopped = sim.run(w, sim.SimConfig(num_blocks=500, max_steps=0), 1.0)
    assert stopped.summary["steps"] == 0 and stopped.summary["finished"] == 0
    assert stopped.summary["e2e_max"] is None and stopped.summary["makespan"] is None


def test_max_steps_stops_early_with_unfinished_requests() -> None:
    w = sim.synthetic_workload(10, arrivals="burst", prompt=("fixed", [10]), output=("fixed", [100]), seed=1)
    r = sim.run(w, sim.SimConfig(num_blocks=500, max_steps=5), 1.0)
    assert r.summary["steps"] == 5 and np.all(r.requests["outcome"] == 2)
