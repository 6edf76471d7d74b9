"""Sweeps over arrival rates x scheduler policies x block sizes (the ``pykvpool simulate``
subcommand is :mod:`pykvpool.cli.simulate`).

Runs go through the package's task runner (:mod:`pykvpool.simulate.tasks`): one run per
task on a pool of worker processes, the re-timed workloads crossing to each worker once;
in this process for one worker or one run, or for a Python step-time callable (it holds the
GIL for every step, so it never ran in parallel anyway, and need not pickle). A progress
bar goes to stderr. Rows come back in the grid's order whatever the completion order.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Callable, Mapping, Optional, Sequence, TextIO, Union

from pykvpool._native import InvalidArgumentError
from pykvpool.progress import ProgressBar
from pykvpool.planning.roofline import Roofline
from pykvpool.simulate.engine import (
    SchedulerConfig,
    SimConfig,
    TimeModel,
    Workload,
    run,
)
from pykvpool.simulate.workload import check_prefix_caching
from pykvpool.simulate.tasks import run_local

__all__ = ["WorkloadSource", "at_rate", "sweep"]

#: A fixed workload (re-timed to each rate) or a function building one for a rate.
WorkloadSource = Union[Workload, Callable[[float], Workload]]


def at_rate(source: WorkloadSource, rate: float) -> Workload:
    """``source`` at ``rate`` requests/s: a function is called with the rate; a fixed
    workload is re-timed (its arrival span scaled) unless all its requests arrive at once.

    Raises:
        InvalidArgumentError: ``rate`` is not a finite number > 0 (from
            :meth:`Workload.scaled`), or what a workload function raises.
    """
    if callable(source):
        return source(rate)
    span = float(source.arrival.max() - source.arrival.min()) if len(source) > 1 else 0.0
    if span <= 0:
        return source
    base = (len(source) - 1) / span
    return source.scaled(time=base / rate)


def _check_grid(rates: Sequence[float], block_sizes: Sequence[int], capacity_tokens: int,
                workers: Optional[int]) -> None:
    for r in rates:
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (math.isfinite(r) and r > 0):
            raise InvalidArgumentError(f"rates must be finite numbers > 0 requests/s, got {r!r}")
    for bs in block_sizes:
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise InvalidArgumentError(f"block sizes must be integers >= 1, got {bs!r}")
        if capacity_tokens // bs < 1:
            raise InvalidArgumentError(f"block size {bs} exceeds the capacity of {capacity_tokens} tokens")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise InvalidArgumentError(f"workers must be an integer >= 1, got {workers!r}")


def sweep(
    workload: WorkloadSource,
    rates: Sequence[float],
    policies: Mapping[str, Union[SchedulerConfig, SimConfig]],
    block_sizes: Sequence[int],
    capacity_tokens: int,
    time_model: TimeModel,
    workers: Optional[int] = None,
    progress: Optional[TextIO] = sys.stderr,
) -> list[dict[str, Any]]:
    """Run every (rate, policy, block size) and return one row per run: ``rate`` (req/s),
    ``label`` (policy name), ``block_size``, ``num_blocks`` (= ``capacity_tokens //
    block_size``, the same memory for every block size) and the run's summary. A policy
    is a :class:`SchedulerConfig`, or a whole :class:`SimConfig` (prefix caching and its
    eviction policy, ...) whose pool shape the sweep overrides.

    ``workload`` is re-timed to each rate when it is a :class:`Workload` (its mean rate is
    scaled), or called with the rate. ``workers`` is the number of worker processes (None:
    every core; 1: this process, as for a Python step-time callable); ``progress`` is the
    stream of the progress bar (None: no bar).

    Raises:
        InvalidArgumentError: a rate that is not a finite number > 0, a block size larger
            than ``capacity_tokens``, ``workers`` < 1, a policy with ``prefix_caching`` on a
            fixed workload of lengths only (before any run), or a configuration the engine
            rejects (the first failing run to finish; runs not started are cancelled).
    """
    _check_grid(rates, block_sizes, capacity_tokens, workers)
    if isinstance(workload, Workload) and any(isinstance(p, SimConfig) and p.prefix_caching is True
                                              for p in policies.values()):
        check_prefix_caching(workload)
    jobs = list(enumerate((r, name, bs) for r in rates for name in policies for bs in block_sizes))
    shared = ({r: at_rate(workload, r) for r in rates}, policies, capacity_tokens, time_model)
    local = workers == 1 or len(jobs) <= 1 or callable(time_model)
    rows: list[Optional[dict[str, Any]]] = [None] * len(jobs)
    with ProgressBar("simulation sweep", len(jobs), stream=progress, enabled=progress is not None) as bar:
        done = 0

        def collect(results: list[tuple[int, dict[str, Any]]]) -> None:
            nonlocal done
            for i, row in results:
                rows[i] = row
            done += len(results)
            bar(done)

        run_local("inline" if local else "process", workers, shared, [[j] for j in jobs], _run_jobs, collect)
    return [r for r in rows if r is not None]


#: What every sweep task reads: the workload at each rate, the policies, the capacity in
#: tokens and the time model.
_Shared = tuple[dict[float, Workload], Mapping[str, Union[SchedulerConfig, SimConfig]], int, TimeModel]


def _run_jobs(shared: _Shared, jobs: list[tuple[int, tuple[float, str, int]]]) -> list[tuple[int, dict[str, Any]]]:
    """A sweep task (module level: it crosses to the worker processes by name): each job's
    index and row."""
    loads, policies, capacity_tokens, time_model = shared
    out = []
    for i, (rate, name, bs) in jobs:
        pol = policies[name]
        base = pol if isinstance(pol, SimConfig) else SimConfig(num_blocks=1, scheduler=pol)
        cfg = dataclasses.replace(base, num_blocks=capacity_tokens // bs, block_size=bs)
        # A roofline's swap cost is per block: it follows the block size.
        tm = dataclasses.replace(time_model, block_size=bs) if isinstance(time_model, Roofline) else time_model
        res = run(loads[rate], cfg, tm)
        out.append((i, {"rate": rate, "label": name, "block_size": bs, "num_blocks": cfg.num_blocks, **res.summary}))
    return out
