"""The scheduler loop as the allocator benchmarks time it.

The loop itself, and the definition of a step, a preemption and every count, is the
package's reference loop, :mod:`pykvpool.simulate.reference` (its module doc), which the
simulator's ``convention="decode_first"`` reproduces exactly. This module holds what the
benchmarks built on it share (``bench_scheduler.py``, ``bench_prefix_cache.py``,
``vllm_bench.py``): a run's figures (:func:`loop_figures`) and the per-call minimum over
runs (:func:`per_call_min`).
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

import numpy as np

from pykvpool.simulate.reference import CallTimes, LoopResult

#: The kinds of allocator call a run times.
KINDS = ("decode", "decode_refused", "admit", "admit_refused", "free")


def loop_figures(r: LoopResult) -> dict[str, Any]:
    """A run's allocator figures: totals (ms), per call and per token (us), call counts."""
    full = r.full_batch_decode_ns
    return {
        "allocator_ms": r.allocator_ns / 1e6,
        "wall_ms": r.wall_ns / 1e6,
        "cpu_ms": r.cpu_ns / 1e6,
        "decode_us_per_token": r.decode.ns / r.decode_tokens / 1e3 if r.decode_tokens else None,
        "decode_us_per_step": r.decode.us_per_call,
        "decode_full_batch_steps": len(full),
        "decode_full_batch_us_median": statistics.median(full) / 1e3 if full else None,
        "decode_refused_us_per_call": r.decode_refused.us_per_call if r.decode_refused.calls else None,
        "admit_us_per_call": r.admit.us_per_call,
        "admit_tokens_mean": r.prefill_tokens / r.admissions if r.admissions else None,
        "admit_check_refused_us_per_call": r.admit_refused.us_per_call if r.admit_refused.calls else None,
        "free_us_per_call": r.free.us_per_call,
        "allocator_ms_by_kind": {k: getattr(r, k).ns / 1e6 for k in KINDS},
        "calls": {k: getattr(r, k).calls for k in KINDS},
    }


def per_call_min(rs: list[LoopResult]) -> LoopResult:
    """A run whose every allocator call takes its minimum over ``rs``.

    The loop is deterministic, so call ``k`` of a kind is the same call (same batch, same
    pool state) in every run; its minimum over runs drops the time the process spent
    descheduled on a shared machine. Counts are those of the (identical) runs.
    """
    out = copy.copy(rs[0])
    for kind in KINDS:
        stacked = np.array([getattr(r, kind).samples for r in rs], dtype=np.int64)
        best = stacked.min(axis=0) if stacked.size else np.zeros(0, dtype=np.int64)
        setattr(out, kind, CallTimes(calls=len(best), ns=int(best.sum()), samples=best.tolist()))
    if rs[0].full_batch_decode_ns:
        out.full_batch_decode_ns = np.array([r.full_batch_decode_ns for r in rs]).min(axis=0).tolist()
    out.wall_ns = min(r.wall_ns for r in rs)
    out.cpu_ns = min(r.cpu_ns for r in rs)
    return out
