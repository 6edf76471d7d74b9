"""The Ray backend (the ``ray`` extra): imported only when a search runs on Ray.

The search's :class:`SearchSpec` is put in the object store once per call and every task
gets it by reference; tasks are batches sized for the cluster's CPUs (of families of
chains, or of points at a reference rate), collected with ``ray.wait`` as they finish. A local Ray
started here is shut down at the end; a joined cluster is left running (only this driver
disconnects); :func:`ray_session` keeps one Ray up across calls. Workers of a joined
cluster must have the same pykvpool installed.
"""

from __future__ import annotations

import importlib
import logging
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from pykvpool.search.evaluate import SearchSpec

__all__ = ["ray_session", "run_ray"]

Rows = list[dict[str, Any]]


def _ray_task(task: Callable[[SearchSpec, Any], Rows], spec: SearchSpec, batch: Any) -> Rows:
    return task(spec, batch)


def _ray() -> Any:
    return importlib.import_module("ray")  # optional (the ray extra), untyped


@contextmanager
def ray_session(workers: Optional[int], address: Optional[str]) -> Iterator[None]:
    """Ray initialized for the block: a local Ray of ``workers`` CPUs (None: every core),
    or the cluster at ``address``; shut down (or left, for a cluster) at the end. An
    already initialized Ray is used as it is and left running.

    Raises:
        ImportError: Ray is not installed (``pip install pykvpool[ray]``).
        ConnectionError: no cluster at ``address`` (from Ray).
    """
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        if address is None:
            ray.init(num_cpus=workers, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        else:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def run_ray(spec: SearchSpec, batches_for: Callable[[int], list[Any]], task: Callable[[SearchSpec, Any], Rows],
            workers: Optional[int], address: Optional[str], on_rows: Callable[[Rows], None]) -> None:
    """Run ``task(spec, batch)`` for every batch of ``batches_for(cluster CPUs)`` on Ray
    (:func:`ray_session`: a local Ray of ``workers`` CPUs, or the cluster at ``address``).

    Raises:
        ImportError: Ray is not installed (``pip install pykvpool[ray]``).
        ConnectionError: no cluster at ``address`` (from Ray).
    """
    with ray_session(workers, address):
        ray = _ray()
        cpus = int(ray.cluster_resources().get("CPU", 1))
        batches = batches_for(max(cpus, 1))
        if not batches:
            return
        remote = ray.remote(num_cpus=1)(_ray_task)
        ref = ray.put(spec)
        pending = [remote.remote(task, ref, b) for b in batches]
        try:
            while pending:
                # Every finished task at most 0.2 s late: one O(pending) scan per wait, not per task.
                done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
                for d in done:
                    on_rows(ray.get(d))
        finally:
            for p in pending:
                ray.cancel(p)
