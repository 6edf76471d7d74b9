"""Behaviour of the prefix-cache benchmark (no timing): pykvpool with prefix caching and
the pure-Python baseline (benches/py_prefix_pool.py) make the same scheduling decisions,
reuse the same cached tokens, evict the same blocks and hand out the same slots, under
memory pressure (evictions and preemptions); the script runs end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


from benches.bench_prefix_cache import ENGINES, PrefixLoop, cache_counts, main, request_tokens
from pykvpool.simulate.reference import make_workload


def trace(name: str, num_blocks: int) -> tuple[Any, list[Any], dict[str, int]]:
    wl = make_workload(150, seed=3, num_blocks=num_blocks, max_running=32)
    tokens, offsets = request_tokens(wl, 3)
    events: list[Any] = []

    def observe(kind: str, step: int, ids: Any, slots: Any, lens: Any) -> None:
        if kind == "admit":
            cached, s, cow = slots
            events.append((kind, step, list(ids), int(cached), [int(x) for x in s], len(cow)))
        else:
            events.append((kind, step, list(ids), None if slots is None else [int(x) for x in slots]))

    pool = ENGINES[name](wl.num_blocks, wl.block_size)
    res = PrefixLoop(pool, wl, tokens, offsets, observe).run()
    pool.check_invariants()
    assert pool.num_free_blocks == wl.num_blocks
    return res.counts(), events, cache_counts(pool)


def test_engines_agree_under_pressure() -> None:
    fast = trace("pykvpool", 700)
    slow = trace("python", 700)
    assert fast[0] == slow[0]
    assert fast[2] == slow[2]
    assert fast[1] == slow[1]
    counts, _, cache = fast
    assert counts["preemptions"] > 0, "the workload must preempt"
    assert cache["evictions"] > 0 and cache["hit_tokens"] > 0


def test_bench_script_runs_and_reports_finite_figures(tmp_path: Path) -> None:
    out = tmp_path / "prefix.json"
    argv = ["--requests", "100", "--repeats", "2", "--micro-reps", "5", "--check-slots", "--out", str(out)]
    assert main(argv) == 0
    rep = json.loads(out.read_text())
    assert rep["slots_checked"] is True
    assert set(rep["loop"]) == {"pykvpool", "python"}
    assert set(rep["targets"]) == {"admit_2176_cold_us", "admit_2176_cold_evicting_us", "admit_2176_warm_us",
                                   "loop_allocator_ratio"}
    assert all(math.isfinite(t["value"]) and t["value"] > 0 for t in rep["targets"].values())
    for name in ("pykvpool", "python"):
        assert math.isfinite(rep["loop"][name]["allocator_ms"]) and rep["loop"][name]["allocator_ms"] > 0
    assert 0 < rep["token_hit_rate"] < 1
