"""The package's one task runner for local parallel work: a module-level task function run
over a list of batches, in this process or on a pool of processes.

A task is ``task(shared, batch) -> results``: ``shared`` is what every task reads (a
workload, a search's spec) and crosses to each worker process once, as the pool's
initializer argument; ``batch`` is one task's share of the work. ``task`` crosses by name,
so it must be a module-level function, and ``shared``, every batch and every result must
pickle. Results are handed to ``on_results`` in the calling thread as tasks finish: in
batch order in this process, in completion order on a pool (a caller that needs an order
tags its results).

Users: :func:`pykvpool.simulate.sweep.sweep` (one simulator run per task) and the
deployment search (:mod:`pykvpool.search.backends`, which adds Ray as a third kind on top
of these two).
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Callable, Optional, Sequence

from pykvpool.checks import invalid

__all__ = ["LOCAL_KINDS", "Task", "parallelism", "run_local"]

#: Where a task runs: ``inline`` (this process, one task after another) or ``process``
#: (a pool of worker processes).
LOCAL_KINDS = ("inline", "process")

#: A task: a module-level function of the shared value and one batch (picklable by name).
Task = Callable[[Any, Any], list[Any]]

_SHARED: Any = None
_READY = False


def parallelism(workers: Optional[int]) -> int:
    """Workers run at once: ``workers``, or every core of this machine when None.

    Raises:
        Nothing: ``workers`` is the caller's checked count (an int >= 1) or None.
    """
    return workers or os.cpu_count() or 1


def run_local(kind: str, workers: Optional[int], shared: Any, batches: Sequence[Any], task: Task,
              on_results: Callable[[list[Any]], None]) -> None:
    """Run ``task(shared, batch)`` for every batch of ``batches`` and call ``on_results``
    with each task's results as it finishes (in the calling thread). ``kind`` ``inline``
    runs them here, in order; ``process`` on ``min(parallelism(workers), len(batches))``
    worker processes, each given ``shared`` once.

    Raises:
        InvalidArgumentError: ``kind`` is not one of :data:`LOCAL_KINDS`, or what a task
            raises (on a pool, pending tasks are cancelled first).
    """
    if kind not in LOCAL_KINDS:
        raise invalid(f"kind must be one of {', '.join(LOCAL_KINDS)}, got {kind!r}")
    if kind == "inline":
        for b in batches:
            on_results(task(shared, b))
    elif batches:
        _run_pool(min(parallelism(workers), len(batches)), shared, batches, task, on_results)


def _init_worker(shared: Any) -> None:
    global _SHARED, _READY
    _SHARED, _READY = shared, True


def _worker_task(task: Task, batch: Any) -> list[Any]:
    assert _READY, "worker not initialized"
    return task(_SHARED, batch)


def _run_pool(workers: int, shared: Any, batches: Sequence[Any], task: Task,
              on_results: Callable[[list[Any]], None]) -> None:
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(shared,)) as ex:
        pending: set[Future[list[Any]]] = {ex.submit(_worker_task, task, b) for b in batches}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    on_results(f.result())
        finally:
            for f in pending:
                f.cancel()
