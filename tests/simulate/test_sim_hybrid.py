"""The serving simulator with layer groups (``SimConfig.groups``): the device is a real
``BlockPool``; a sliding window holds only its window per request, so a Mistral-7B-like
model sustains more concurrency on long requests than full attention at the same blocks;
per-group block columns add up to the pool's; one full group reproduces the plain run."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pykvpool
from pykvpool import _native
from pykvpool import simulate as sim
from pykvpool.planning.layers import LayerGroup
from pykvpool.planning.models import model_preset


def long_requests(n: int = 40, seed: int = 5) -> sim.Workload:
    return sim.synthetic_workload(n, arrivals="burst", prompt=("uniform", [12_000, 16_000]),
                                  output=("uniform", [200, 400]), seed=seed)


def test_mistral_window_sustains_more_concurrency_than_full_attention() -> None:
    mistral = model_preset("mistral-7b")
    assert [g.kind for g in mistral.groups] == ["sliding"]
    w = long_requests()
    full = sim.SimConfig(num_blocks=8_000, block_size=16)
    win = dataclasses.replace(full, groups=mistral.groups)
    a, b = sim.run(w, full, 0.01), sim.run(w, win, 0.01)
    assert a.summary["finished"] == b.summary["finished"] == 40
    # 16k tokens need ~1,000 blocks in full; the 4,096-token window ~270 during a decode.
    assert a.summary["peak_running"] <= 8_000 // (12_000 // 16)
    assert b.summary["peak_running"] >= 2 * a.summary["peak_running"]
    assert b.summary["makespan"] < a.summary["makespan"]
    assert "blocks_used_g0" not in a.steps and "peak_blocks_used_g0" not in a.summary
    np.testing.assert_array_equal(b.steps["blocks_used_g0"], b.steps["blocks_used"])
    assert b.summary["peak_blocks_used_g0"] == b.summary["peak_blocks_used"] <= 8_000
    # Per running request the window group holds at most the spec's bound: the window's
    # blocks (one more when unaligned) plus a growth's own (the 8,192-token budget).
    bound = 4095 // 16 + 1 + 1 + 8192 // 16
    assert np.all(b.steps["blocks_used_g0"] <= bound * b.steps["running"])
    # Decode-only steps: at most the window's blocks plus one new block per request.
    decode = (b.steps["prefill_tokens"] == 0) & (b.steps["running"] > 0)
    assert decode.any()
    per_req = b.steps["blocks_used_g0"][decode] / b.steps["running"][decode]
    assert per_req.max() <= 4095 // 16 + 1 + 1 + 1


def test_gemma_groups_split_the_blocks_and_the_window_stays_small(tmp_path: Path) -> None:
    gemma = model_preset("gemma-2-9b")
    kinds = [g.kind for g in gemma.groups]
    assert sorted(kinds) == ["full", "sliding"]
    w = sim.synthetic_workload(30, rate=5.0, prompt=("uniform", [6_000, 12_000]), output=("uniform", [50, 300]), seed=2)
    r = sim.run(w, sim.SimConfig(num_blocks=12_000, block_size=16, groups=gemma.groups), 0.01)
    assert r.summary["finished"] == 30 and r.summary["leaked_blocks"] == 0
    g_full, g_win = kinds.index("full"), kinds.index("sliding")
    cols = [r.steps[f"blocks_used_g{j}"] for j in range(2)]
    np.testing.assert_array_equal(cols[0] + cols[1], r.steps["blocks_used"])
    for j in range(2):
        assert r.summary[f"peak_blocks_used_g{j}"] == int(cols[j].max())
    # The full group holds whole sequences, the 4,096-token window far less.
    assert r.summary[f"peak_blocks_used_g{g_win}"] * 1.5 < r.summary[f"peak_blocks_used_g{g_full}"]
    # Stored tokens over all groups fit in the slots held, and the window's blocks hold
    # tokens too: more than the full group's blocks alone could.
    lens = r.steps["kv_tokens"]
    assert np.all(lens <= 16 * r.steps["blocks_used"])
    assert np.any(lens > 16 * cols[g_full])
    paths = r.to_csv(tmp_path)
    with open(paths[1]) as f:
        header = next(csv.reader(f))
    assert "blocks_used_g0" in header and "blocks_used_g1" in header


def test_one_full_group_is_the_plain_run_exactly() -> None:
    w = sim.synthetic_workload(150, rate=40.0, prompt=("uniform", [20, 900]), output=("uniform", [1, 300]), seed=9)
    plain = sim.SimConfig(num_blocks=900, block_size=16, scheduler=sim.SchedulerConfig(max_running=50))
    a = sim.run(w, plain, 0.01)
    for groups in [(("full",),), (LayerGroup("full", 32),)]:
        b = sim.run(w, dataclasses.replace(plain, groups=groups), 0.01)
        assert a.summary["preemptions"] > 0
        for k, v in a.requests.items():
            np.testing.assert_array_equal(v, b.requests[k], err_msg=k)
        for k, v in a.steps.items():
            np.testing.assert_array_equal(v, b.steps[k], err_msg=k)
        extra = {k: v for k, v in b.summary.items() if k not in a.summary}
        assert extra == {"peak_blocks_used_g0": a.summary["peak_blocks_used"]}
        assert {k: b.summary[k] for k in a.summary} == a.summary


def test_groups_accept_layer_groups_and_tuples_alike() -> None:
    w = sim.synthetic_workload(20, rate=10.0, prompt=("uniform", [100, 600]), output=("uniform", [1, 50]), seed=1)
    base = sim.SimConfig(num_blocks=400, block_size=8, check_invariants=True)
    as_groups = (LayerGroup("sliding", 2, 64, 4), LayerGroup("chunked", 1, 100), LayerGroup("full", 3))
    as_tuples = (("sliding", 64, 4), ["chunked", 100], ("full",))
    a = sim.run(w, dataclasses.replace(base, groups=as_groups))
    b = sim.run(w, dataclasses.replace(base, groups=as_tuples))
    assert a.summary == b.summary and a.summary["finished"] == 20
    assert [f"peak_blocks_used_g{j}" in a.summary for j in range(4)] == [True, True, True, False]


BAD_GROUPS: list[tuple[str, Any, str]] = [
    ("empty", (), "groups"),
    ("not a sequence", 5, "groups"),
    ("a string", "full", "groups"),
    ("unknown kind", (("global",),), "groups[0]"),
    ("full with a window", (("full", 8),), "groups[0]"),
    ("sliding without a window", (("sliding",),), "groups[0]"),
    ("sliding window 0", (("full",), ("sliding", 0)), "groups[1]"),
    ("sliding negative sinks", (("sliding", 8, -1),), "groups[0]"),
    ("sliding window bool", (("sliding", True),), "groups[0]"),
    ("sliding window float", (("sliding", 8.0),), "groups[0]"),
    ("chunked with sinks", (("chunked", 8, 2),), "groups[0]"),
    ("chunk 0", (("chunked", 0),), "groups[0]"),
    ("too many", (("full",),) * 65, "groups"),
    ("item not a tuple", ("full",), "groups[0]"),
]


@pytest.mark.parametrize("groups,name", [b[1:] for b in BAD_GROUPS], ids=[b[0] for b in BAD_GROUPS])
def test_bad_groups_name_the_argument(groups: Any, name: str) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match=name.replace("[", r"\[")):
        sim.SimConfig(num_blocks=100, groups=groups)
    w = {"arrival": np.zeros(3), "prompt_len": np.array([5, 6, 7]), "output_len": np.array([5, 6, 7])}
    with pytest.raises(pykvpool.InvalidArgumentError, match=name.replace("[", r"\[")):
        _native.run_simulation(w, {"num_blocks": 100, "block_size": 16, "groups": groups})


def test_window_over_the_span_limit_is_refused_by_the_engine() -> None:
    w = {"arrival": np.zeros(1), "prompt_len": np.array([5]), "output_len": np.array([5])}
    with pytest.raises(pykvpool.InvalidArgumentError, match=r"groups\[0\] window"):
        _native.run_simulation(w, {"num_blocks": 100, "block_size": 16, "groups": [("sliding", 2**31)]})


@pytest.mark.parametrize("eviction", ["lru", "fifo", "lfu", "priority"])
def test_prefix_caching_with_layer_groups_reuses_shared_prefixes(eviction: str) -> None:
    # Gemma-2's layout (a full and a 4,096-token window group) on prompts that open with
    # one of four 2,048-token prefixes: the cache serves both groups, and a pool too small
    # for everything evicts and preempts while the run stays exact (checked every step).
    gemma = model_preset("gemma-2-9b")
    w = sim.synthetic_workload(60, rate=20.0, prompt=("uniform", [2_500, 6_000]), output=("uniform", [20, 200]),
                               shared_prefixes=(4, 2_048, 32_000), seed=4)
    cfg = sim.SimConfig(num_blocks=2_000, block_size=16, groups=gemma.groups, prefix_caching=True,
                        eviction=eviction, check_invariants=True)
    r = sim.run(w, cfg, 0.01)
    assert r.summary["finished"] == 60 and r.summary["leaked_blocks"] == 0
    assert r.summary["preemptions"] > 0
    cached = r.requests["cached_tokens"]
    # Later requests reuse whole prefixes (2,048 tokens = 128 blocks); hits are whole
    # blocks, summed over a request's admissions (a preempted one is admitted again).
    assert cached.sum() >= 20 * 2_048 and np.all(cached % 16 == 0)
    no_cache = sim.run(w, dataclasses.replace(cfg, prefix_caching=False), 0.01)
    assert r.steps["prefill_tokens"].sum() < no_cache.steps["prefill_tokens"].sum()
    assert 0 < r.summary["prefix_hit_rate"] < 1


def test_swap_with_layer_groups_moves_only_what_each_group_holds() -> None:
    # Mistral-like: every layer slides over 256 tokens; a swapped request moves its window
    # (at most 256 / 16 + 1 blocks, one more for the growth after), not its history.
    w = sim.synthetic_workload(40, rate=50.0, prompt=("uniform", [300, 800]), output=("uniform", [400, 800]), seed=6)
    cfg = sim.SimConfig(num_blocks=150, block_size=16, groups=(("sliding", 256),), check_invariants=True,
                        scheduler=sim.SchedulerConfig(preemption="swap", host_blocks=300, max_batched_tokens=2048))
    r = sim.run(w, cfg, 0.01)
    assert r.summary["finished"] == 40 and r.summary["leaked_blocks"] == 0
    assert r.summary["swaps"] > 0
    moved = int(r.steps["swapped_blocks"].sum())
    assert moved <= 2 * r.summary["swaps"] * (256 // 16 + 2)  # out and back in
    full = sim.run(w, dataclasses.replace(cfg, groups=(("full",),)), 0.01)
    assert full.summary["swaps"] > 0
    assert moved / r.summary["swaps"] < full.steps["swapped_blocks"].sum() / full.summary["swaps"]
