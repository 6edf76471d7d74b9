"""Serving simulator: replay a workload through continuous batching over the real pool.

The engine (:mod:`pykvpool.simulate.engine`) is re-exported here, so ``from pykvpool import
simulate as sim`` gives ``sim.run``, ``sim.SimConfig``, ``sim.Workload``...; trace loading
lives in :mod:`pykvpool.simulate.traces`, sweeps in :mod:`pykvpool.simulate.sweep`, figures
in :mod:`pykvpool.simulate.plots`, the units of a run's summary (and its printed text) in
:mod:`pykvpool.simulate.metrics`, prefill/decode disaggregation (:class:`Disaggregation`) in
:mod:`pykvpool.simulate.disagg`; video streams in :mod:`pykvpool.simulate.video`, one
stream's KV over time and its figure in :mod:`pykvpool.simulate.video_plots`. The step-time
model :class:`Roofline` lives with the planner's rooflines (:mod:`pykvpool.planning.roofline`).

A trace replays at its own arrival times; ``Workload.rate_scaled(x)`` replays it ``x`` times
as fast (each arrival time divided by ``x``). Prefix caching needs prompts given as token ids
or block keys: :func:`run` refuses it on a workload of lengths only
(:func:`check_prefix_caching`, the one check the CLI shares).
"""

from pykvpool.planning.roofline import Roofline, roofline
from pykvpool.simulate.engine import (
    MAX_REPLICAS,
    Disaggregation,
    MAX_REQUEST_TOKENS,
    MAX_REQUESTS,
    MAX_STEP_TOKENS,
    ROUTERS,
    GroupSpec,
    SchedulerConfig,
    SimConfig,
    SimulationResult,
    StepTimeFn,
    StopWhen,
    TimeModel,
    Workload,
    kv_blocks_for_memory,
    run,
    synthetic_workload,
)
from pykvpool.simulate.workload import check_prefix_caching

__all__ = [
    "Disaggregation",
    "MAX_REPLICAS",
    "MAX_REQUESTS",
    "MAX_REQUEST_TOKENS",
    "MAX_STEP_TOKENS",
    "GroupSpec",
    "ROUTERS",
    "Roofline",
    "SchedulerConfig",
    "SimConfig",
    "SimulationResult",
    "StepTimeFn",
    "StopWhen",
    "TimeModel",
    "Workload",
    "check_prefix_caching",
    "kv_blocks_for_memory",
    "roofline",
    "run",
    "synthetic_workload",
]
