"""Sweeps over arrival rates x scheduler policies x block sizes (the ``pykvpool simulate``
subcommand is :mod:`pykvpool.cli.simulate`).

Runs execute on a thread pool: the engine releases the GIL for the whole run, so every
core works (a Python step-time callable re-takes the GIL per step and serializes). A
progress bar goes to stderr. Results come back in a deterministic order whatever the
completion order.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
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
    scaled), or called with the rate. ``workers`` defaults to every core; ``progress`` is
    the stream of the progress bar (None: no bar).

    Raises:
        InvalidArgumentError: a rate that is not a finite number > 0, a block size larger
            than ``capacity_tokens``, ``workers`` < 1, or a configuration the engine
            rejects (the first one met).
    """
    _check_grid(rates, block_sizes, capacity_tokens, workers)
    jobs = [(r, name, bs) for r in rates for name in policies for bs in block_sizes]
    loads = {r: at_rate(workload, r) for r in rates}

    def one(job: tuple[float, str, int]) -> dict[str, Any]:
        rate, name, bs = job
        pol = policies[name]
        base = pol if isinstance(pol, SimConfig) else SimConfig(num_blocks=1, scheduler=pol)
        cfg = dataclasses.replace(base, num_blocks=capacity_tokens // bs, block_size=bs)
        # A roofline's swap cost is per block: it follows the block size.
        tm = dataclasses.replace(time_model, block_size=bs) if isinstance(time_model, Roofline) else time_model
        res = run(loads[rate], cfg, tm)
        return {"rate": rate, "label": name, "block_size": bs, "num_blocks": cfg.num_blocks, **res.summary}

    rows: list[dict[str, Any]] = []
    with ProgressBar("simulation sweep", len(jobs), stream=progress, enabled=progress is not None) as bar, \
            ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as ex:
        futures = [ex.submit(one, j) for j in jobs]
        for f in futures:
            rows.append(f.result())
            bar(len(rows))
    return rows
