"""Serving simulator: replay a workload through continuous batching over the real pool.

The engine (:mod:`pykvpool.simulate.engine`) is re-exported here, so ``from pykvpool import
simulate as sim`` gives ``sim.run``, ``sim.SimConfig``, ``sim.Workload``...; trace loading
lives in :mod:`pykvpool.simulate.traces`, sweeps in :mod:`pykvpool.simulate.sweep`, figures
in :mod:`pykvpool.simulate.plots`. The step-time model :class:`Roofline` lives with the
planner's rooflines (:mod:`pykvpool.planning.roofline`).
"""

from pykvpool.planning.roofline import Roofline, roofline
from pykvpool.simulate.engine import (
    MAX_REQUEST_TOKENS,
    MAX_REQUESTS,
    MAX_STEP_TOKENS,
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

__all__ = [
    "MAX_REQUESTS",
    "MAX_REQUEST_TOKENS",
    "MAX_STEP_TOKENS",
    "GroupSpec",
    "Roofline",
    "SchedulerConfig",
    "SimConfig",
    "SimulationResult",
    "StepTimeFn",
    "StopWhen",
    "TimeModel",
    "Workload",
    "kv_blocks_for_memory",
    "roofline",
    "run",
    "synthetic_workload",
]
