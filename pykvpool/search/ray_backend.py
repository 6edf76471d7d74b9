"""The Ray backend (the ``ray`` extra): imported only when a search runs on Ray.

The search's :class:`SearchSpec` is put in the object store once and every task gets it
by reference; tasks are batches of families of chains (:func:`pykvpool.search.backends.make_batches`
for the cluster's CPUs), collected with ``ray.wait`` as they finish. A local Ray started
here is shut down at the end; a joined cluster is left running (only this driver
disconnects). Workers of a joined cluster must have the same pykvpool installed.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable, Optional

from pykvpool.search.evaluate import SearchSpec, evaluate_batch, make_batches
from pykvpool.search.space import Point

__all__ = ["run_ray"]

Rows = list[dict[str, Any]]


def _ray_batch(spec: SearchSpec, batch: list[list[list[Point]]]) -> Rows:
    return evaluate_batch(spec, batch)


def run_ray(spec: SearchSpec, chains: list[list[list[Point]]], workers: Optional[int], address: Optional[str],
            on_rows: Callable[[Rows], None]) -> None:
    """Evaluate ``chains`` (families of chains) on Ray: a local Ray of ``workers`` CPUs (None: every core), or
    the cluster at ``address``; an already initialized Ray is used as it is.

    Raises:
        ImportError: Ray is not installed (``pip install pykvpool[ray]``).
        ConnectionError: no cluster at ``address`` (from Ray).
    """
    ray: Any = importlib.import_module("ray")  # optional (the ray extra), untyped

    started = not ray.is_initialized()
    if started:
        if address is None:
            ray.init(num_cpus=workers, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        else:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        remote = ray.remote(num_cpus=1)(_ray_batch)
        ref = ray.put(spec)
        pending = [remote.remote(ref, b) for b in make_batches(chains, max(cpus, 1))]
        try:
            while pending:
                # Every finished task at most 0.2 s late: one O(pending) scan per wait, not per task.
                done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
                for d in done:
                    on_rows(ray.get(d))
        finally:
            for p in pending:
                ray.cancel(p)
    finally:
        if started:
            ray.shutdown()
