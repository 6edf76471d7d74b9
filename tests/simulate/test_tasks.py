"""The package's one local task runner (:mod:`pykvpool.simulate.tasks`): in this process and
on a process pool it hands every task's results over, a task's error arrives typed, and both
the simulator's sweeps and the deployment search run through it."""

from __future__ import annotations

import os
from typing import Any

import pytest

import pykvpool
from pykvpool import simulate as sim
from pykvpool.simulate import sweep as sim_sweep, tasks

ROOF = sim.roofline("llama-3-8b", "a100-80gb-sxm")


def where(shared: Any, batch: list[int]) -> list[tuple[int, Any, int]]:
    """A task: the worker's process id, the shared value and each item of the batch."""
    return [(os.getpid(), shared, x) for x in batch]


def refuse_two(shared: Any, batch: list[int]) -> list[int]:
    """A task that refuses the batch holding 2."""
    if 2 in batch:
        raise pykvpool.InvalidArgumentError(f"bad item in {batch}")
    return batch


def test_inline_runs_here_in_batch_order() -> None:
    got: list[list[Any]] = []
    tasks.run_local("inline", 4, "s", [[1, 2], [3]], where, got.append)
    assert got == [[(os.getpid(), "s", 1), (os.getpid(), "s", 2)], [(os.getpid(), "s", 3)]]


def test_a_process_pool_runs_every_batch_in_other_processes() -> None:
    got: list[Any] = []
    tasks.run_local("process", 2, {"shared": 1}, [[i] for i in range(6)], where, got.extend)
    assert sorted(x for _, _, x in got) == list(range(6))
    assert {s["shared"] for _, s, _ in got} == {1}
    assert os.getpid() not in {pid for pid, _, _ in got}
    tasks.run_local("process", 2, None, [], where, got.extend)  # no batch: no pool, nothing
    assert len(got) == 6


@pytest.mark.parametrize("kind", tasks.LOCAL_KINDS)
def test_a_task_error_arrives_typed(kind: str) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match="bad item"):
        tasks.run_local(kind, 2, None, [[1], [2], [3]], refuse_two, lambda r: None)


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match="kind"):
        tasks.run_local("thread", 2, None, [[1]], where, lambda r: None)


def test_the_sweep_runs_through_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several workers: a process pool; one worker or a Python step-time callable: this
    process. The rows are the same, in the grid's order, whatever the kind."""
    kinds: list[str] = []
    run_local = tasks.run_local

    def recording(kind: str, *args: Any) -> None:
        kinds.append(kind)
        run_local(kind, *args)

    monkeypatch.setattr(sim_sweep, "run_local", recording)
    w = sim.synthetic_workload(120, rate=5.0, prompt=("uniform", [100, 600]), output=("uniform", [20, 100]), seed=4)
    policies = {"paged": sim.SchedulerConfig(), "reserve": sim.SchedulerConfig(allocation="reserve", reserve_tokens=4096)}
    grid = ([1.0, 6.0], policies, [16, 32], 40_000)
    pool = sim_sweep.sweep(w, *grid, ROOF, workers=2, progress=None)
    here = sim_sweep.sweep(w, *grid, ROOF, workers=1, progress=None)
    assert pool == here
    assert [(r["rate"], r["label"], r["block_size"]) for r in pool] == [
        (rate, p, bs) for rate in (1.0, 6.0) for p in policies for bs in (16, 32)]
    sim_sweep.sweep(w, [1.0], policies, [16], 40_000, lambda *a: 0.01, workers=2, progress=None)
    assert kinds == ["process", "inline", "inline"]
