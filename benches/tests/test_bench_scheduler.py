"""Behaviour of the scheduler-loop benchmark (``benches/bench_scheduler.py``, no timing): on
small workloads of the reference loop (:mod:`pykvpool.simulate.reference`) pykvpool and the
pure-Python baseline take the same steps, preempt the same requests and hand out the
same slots; every request finishes with exactly its output length; the pool ends empty."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest


import pykvpool
from benches import bench_scheduler
from benches.py_allocator import PyBlockPool
from pykvpool.simulate.reference import LoopResult, LoopWorkload, make_workload, run_loop

Event = tuple[str, int, list[int], list[int] | None, list[int] | None]


def record(pool: Any, wl: LoopWorkload) -> tuple[LoopResult, list[Event]]:
    events: list[Event] = []

    def observe(kind: str, step: int, ids: Any, slots: Any, lens: Any) -> None:
        events.append(
            (
                kind,
                step,
                [int(x) for x in ids],
                None if slots is None else [int(x) for x in slots],
                None if lens is None else [int(x) for x in lens],
            )
        )
        if kind == "decode":
            # The running set never holds a request twice, and pykvpool agrees on lengths.
            assert len(set(events[-1][2])) == len(events[-1][2])

    return run_loop(pool, wl, observe), events


def small(num_requests: int, num_blocks: int, max_running: int, seed: int) -> LoopWorkload:
    return make_workload(
        num_requests,
        seed,
        prompt_range=(5, 200),
        output_range=(1, 60),
        block_size=8,
        num_blocks=num_blocks,
        max_running=max_running,
    )


def check_run(wl: LoopWorkload) -> LoopResult:
    engines: dict[str, Any] = {"pykvpool": pykvpool.BlockPool, "python": PyBlockPool}
    out = {}
    for name, make in engines.items():
        pool: Any = make(wl.num_blocks, wl.block_size)
        res, events = record(pool, wl)
        # Conservation: the pool is empty and consistent, every request got its output.
        assert pool.num_free_blocks == wl.num_blocks
        assert pool.num_seqs == 0
        pool.check_invariants()
        assert res.generated == [int(x) for x in wl.output_lens]
        assert res.decode_tokens == int(wl.output_lens.sum())
        assert res.prefill_tokens - res.recomputed_tokens == int(wl.prompt_lens.sum())
        assert res.admissions == wl.num_requests + res.preemptions
        out[name] = (res, events)
    (a, ea), (b, eb) = out["pykvpool"], out["python"]
    assert a.counts() == b.counts()
    assert ea == eb  # same steps, same preemptions, same slot mappings and lengths
    check_lifecycle(wl, ea)
    return a


def check_lifecycle(wl: LoopWorkload, events: list[Event]) -> None:
    """Replay the events: admissions are FCFS, a finished sequence holds prompt + output
    tokens, each admission prefills prompt + generated-so-far, preemption hits the newest."""
    prompts = [int(x) for x in wl.prompt_lens]
    outputs = [int(x) for x in wl.output_lens]
    generated = [0] * len(prompts)
    length: dict[int, int] = {}
    running: list[int] = []
    next_new = 0
    for kind, _, ids, slots, lens in events:
        if kind == "admit":
            (rid,) = ids
            assert slots is not None
            assert len(slots) == prompts[rid] + generated[rid]
            if rid >= next_new:
                assert rid == next_new, "first admissions must follow arrival order"
                next_new += 1
            length[rid] = len(slots)
            running.append(rid)
        elif kind == "decode":
            assert ids == running
            assert lens is not None and slots is not None and len(slots) == len(ids)
            for rid, n in zip(ids, lens):
                generated[rid] += 1
                length[rid] += 1
                assert n == length[rid]
        elif kind == "preempt":
            (rid,) = ids
            assert rid == running[-1], "preemption must hit the newest running request"
            running.pop()
            del length[rid]
        elif kind == "finish":
            (rid,) = ids
            assert generated[rid] == outputs[rid]
            assert length[rid] == prompts[rid] + outputs[rid]
            running.remove(rid)
            del length[rid]
    assert not running and not length
    assert generated == outputs


@pytest.mark.parametrize("seed", range(6))
def test_engines_agree_under_memory_pressure(seed: int) -> None:
    # 60 blocks of 8 tokens hold ~2.5 average requests: admission stalls and preemptions.
    res = check_run(small(40, 60, 6, seed))
    assert res.preemptions > 0


def test_engines_agree_when_running_limit_binds() -> None:
    res = check_run(small(30, 5_000, 4, 7))
    assert res.preemptions == 0
    assert res.peak_running == 4


def test_workload_is_seeded_and_within_its_ranges() -> None:
    a, b, c = make_workload(1000), make_workload(1000), make_workload(1000, seed=1)
    assert np.array_equal(a.prompt_lens, b.prompt_lens) and np.array_equal(a.output_lens, b.output_lens)
    assert not np.array_equal(a.prompt_lens, c.prompt_lens)
    assert a.prompt_lens.min() >= 256 and a.prompt_lens.max() <= 4096
    assert a.output_lens.min() >= 128 and a.output_lens.max() <= 384
    # The pool can hold the longest request whole: the loop never refuses the workload.
    longest = int((a.prompt_lens + a.output_lens).max())
    assert -(-longest // a.block_size) <= a.num_blocks


def test_benchmark_geometry_small_run_agrees() -> None:
    # The real pool geometry with a few requests: checks the default code path.
    check_run(make_workload(300))


def test_request_larger_than_pool_is_refused() -> None:
    wl = small(3, 4, 2, 0)
    with pytest.raises(ValueError):
        run_loop(pykvpool.BlockPool(wl.num_blocks, wl.block_size), wl)


def test_pool_geometry_must_match() -> None:
    wl = small(3, 60, 2, 0)
    with pytest.raises(ValueError):
        run_loop(PyBlockPool(61, wl.block_size), wl)


def test_baseline_step_is_atomic_and_mirrors_pykvpool() -> None:
    """The baseline's own semantics on the operations the loop does not exercise:
    fork, copy-on-write, exhaustion leaving state unchanged."""
    for make in (pykvpool.BlockPool, PyBlockPool):
        pool: Any = make(6, 4)
        pool.add_sequence(1, 6)
        pool.fork(1, 2)
        slots, cow, lens = pool.step([1, 2], [1, 1])
        assert [int(x) for x in lens] == [7, 7]
        # Two holders of the shared partial block: the first copies away, the second
        # is then its only holder and writes in place.
        assert [tuple(int(v) for v in p) for p in cow] == [(1, 2)]
        assert [int(x) for x in slots] == [2 * 4 + 2, 1 * 4 + 2]
        before = (pool.num_free_blocks, list(pool.block_table(1)), list(pool.block_table(2)))
        with pytest.raises(pykvpool.PoolExhaustedError):
            pool.step([1, 2], [20, 20])
        assert before == (pool.num_free_blocks, list(pool.block_table(1)), list(pool.block_table(2)))
        with pytest.raises(pykvpool.InvalidArgumentError):
            pool.step([1, 1], 1)
        with pytest.raises(pykvpool.UnknownSequenceError):
            pool.step([1, 9], 1)
        pool.check_invariants()
        pool.free(1)
        pool.free(2)
        assert pool.num_free_blocks == 6


@pytest.mark.parametrize("seed", range(4))
def test_baseline_matches_pykvpool_on_random_programs(seed: int) -> None:
    """Differential check of the two engines on random add/step/fork/free programs with
    sparse and dense batches, copy-on-write and exhaustion: same outputs, same errors."""
    rng = np.random.default_rng(seed)
    a: Any = pykvpool.BlockPool(48, 4)
    b: Any = PyBlockPool(48, 4)
    live: list[int] = []
    next_id = 0

    def both(op: str, *args: Any) -> Any:
        results = []
        for pool in (a, b):
            try:
                out = getattr(pool, op)(*args)
            except pykvpool.KvPoolError as e:
                results.append(type(e))
                continue
            if isinstance(out, tuple):
                out = tuple([tuple(int(v) for v in np.asarray(x).ravel()) for x in out])
            elif out is not None:
                out = tuple(int(v) for v in out)
            results.append(out)
        assert results[0] == results[1], (op, args, results)
        return results[0]

    for _ in range(400):
        r = rng.random()
        if r < 0.2 or not live:
            res = both("add_sequence", next_id, int(rng.integers(0, 30)))
            if not isinstance(res, type):
                live.append(next_id)
            next_id += 1
        elif r < 0.3:
            res = both("fork", int(rng.choice(live)), next_id)
            if not isinstance(res, type):
                live.append(next_id)
            next_id += 1
        elif r < 0.5:
            victim = int(rng.choice(live))
            both("free", victim)
            live.remove(victim)
        else:
            # Sparse or dense batches; occasionally an unknown or duplicated id.
            k = int(rng.integers(1, len(live) + 1))
            ids = [int(x) for x in rng.choice(live, size=k, replace=False)]
            if rng.random() < 0.05:
                ids.append(ids[0] if rng.random() < 0.5 else 10_000)
            counts = [int(x) for x in rng.integers(0, 6, size=len(ids))]
            both("step", ids, counts)
        assert a.num_free_blocks == b.num_free_blocks
        a.check_invariants()
        b.check_invariants()
    for s in live:
        assert list(a.block_table(s)) == b.block_table(s)


def test_bench_script_runs_and_reports_finite_figures(tmp_path: Path) -> None:
    """The benchmark script end to end on a tiny run: it checks both engines agree (slot
    mappings included) and reports finite per-run figures of the right shape (their values
    are not checked here: timing belongs to the benchmark, not the tests)."""
    out = tmp_path / "scheduler.json"
    argv = ["--requests", "120", "--repeats", "3", "--micro-reps", "20", "--check-slots", "--no-vllm",
            "--out", str(out)]
    assert bench_scheduler.main(argv) == 0
    rep = json.loads(out.read_text())
    assert rep["slots_checked"] is True
    engines = {"pykvpool", "python", "python+np"}
    assert set(rep["loop"]) == engines
    assert rep["counts"]["decode_tokens"] == int(make_workload(120).output_lens.sum())
    head = rep["headline"]
    assert set(head["allocator_ms"]) == set(head["cpu_ms"]) == engines
    assert set(head["allocator_ratio"]) == engines - {"pykvpool"}
    for group in head.values():
        for s in group.values():
            assert s["runs"] == 3
            assert all(math.isfinite(s[k]) and s[k] > 0 for k in ("min", "q1", "median", "q3", "max"))
            assert s["min"] <= s["q1"] <= s["median"] <= s["q3"] <= s["max"]
    # The second figure (sum of per-call minima) never exceeds the smallest run's total.
    for name in engines:
        assert rep["loop"][name]["allocator_ms"] <= head["allocator_ms"][name]["min"] + 1e-9
    assert all(math.isfinite(t["value"]) and t["value"] > 0 for t in rep["targets"].values())
