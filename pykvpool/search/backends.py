"""Where a search's tasks run: in this process, on a local process pool (the default), or
on Ray (a local Ray started for the search, or a running cluster joined by address). The
first two are the package's one local task runner (:func:`pykvpool.simulate.tasks.run_local`,
which the simulator's sweeps use too); Ray is this runner's third kind.

A task is a batch of families of chains (:func:`pykvpool.search.evaluate.evaluate_batch`), or of
(point, rate) pairs run at a reference rate (:mod:`pykvpool.search.latency`); batches
keep the scheduling overhead per simulation small. The shared :class:`SearchSpec` (the
workload above all) crosses to each worker once: as the process pool's initializer
argument, or put in Ray's object store once and passed to every task by reference.
Results come back as tasks finish and are handed to ``on_rows`` in completion order;
their content does not depend on the backend.

Ray is imported only when a Ray backend runs (the ``ray`` extra): ``import pykvpool``
never imports it. :func:`session` keeps one Ray up across several calls (the search and
its latency phase).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from pykvpool.checks import invalid
from pykvpool.search.evaluate import SearchSpec, evaluate_batch, make_batches
from pykvpool.search.space import Point
from pykvpool.simulate.tasks import parallelism, run_local

__all__ = ["BACKENDS", "Backend", "run_chains", "run_tasks", "session"]

#: Backend kinds.
BACKENDS = ("inline", "process", "ray")

Rows = list[dict[str, Any]]
Batch = list[list[list[Point]]]


@dataclass(frozen=True)
class Backend:
    """How to run tasks.

    Attributes:
        kind: ``inline`` (this process), ``process`` (a pool of ``workers`` processes) or
            ``ray``.
        workers: processes, or the CPUs of a local Ray (None: every core).
        ray_address: join the Ray cluster at this address (``auto``, ``ray://host:10001``,
            ...) instead of starting a local one.

    Raises:
        InvalidArgumentError: an unknown kind, ``workers`` not an int in 1..=4096, an
            address without ``ray``.
    """

    kind: str = "process"
    workers: Optional[int] = None
    ray_address: Optional[str] = None

    def __post_init__(self) -> None:
        if self.kind not in BACKENDS:
            raise invalid(f"backend must be one of {', '.join(BACKENDS)}, got {self.kind!r}")
        w = self.workers
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 4096):
            raise invalid(f"workers must be an int in 1..=4096, got {w!r}")
        if self.ray_address is not None and self.kind != "ray":
            raise invalid("ray_address needs the ray backend")

    def parallelism(self) -> int:
        """Workers this backend runs at once on this machine (None: every core).

        Raises:
            Nothing: ``workers`` was checked at construction.
        """
        return parallelism(self.workers)


#: A task: a module-level function of the shared spec and one batch (picklable by name).
Task = Callable[[SearchSpec, Any], Rows]


def run_chains(spec: SearchSpec, chains: list[list[list[Point]]], backend: Backend,
               on_rows: Callable[[Rows], None]) -> None:
    """Evaluate every family of chains (:func:`pykvpool.search.evaluate.families_of`) on
    ``backend`` in batches (:func:`make_batches` for the
    backend's parallelism; a joined Ray cluster: its CPUs), calling ``on_rows`` with each
    batch's rows as it finishes (in the calling thread).

    Raises:
        ImportError: the ray backend without Ray installed (``pip install pykvpool[ray]``).
        InvalidArgumentError: what an evaluation raises (a bad price, a configuration the
            simulator refuses); pending tasks are cancelled first.
    """
    if chains:
        run_tasks(spec, lambda workers: make_batches(chains, workers), evaluate_batch, backend, on_rows)


def run_tasks(spec: SearchSpec, batches_for: Callable[[int], list[Any]], task: Task, backend: Backend,
              on_rows: Callable[[Rows], None]) -> None:
    """Run ``task(spec, batch)`` for every batch of ``batches_for(parallelism)`` (the
    backend's workers; a joined Ray cluster: its CPUs) on ``backend``, calling ``on_rows``
    with each task's rows as it finishes (in the calling thread). ``task`` must be a
    module-level function (it crosses to the workers by name).

    Raises:
        ImportError: the ray backend without Ray installed (``pip install pykvpool[ray]``).
        InvalidArgumentError: what a task raises; pending tasks are cancelled first.
    """
    if backend.kind == "ray":
        from pykvpool.search.ray_backend import run_ray

        run_ray(spec, batches_for, task, backend.workers, backend.ray_address, on_rows)
    else:
        batches = batches_for(1 if backend.kind == "inline" else backend.parallelism())
        run_local(backend.kind, backend.workers, spec, batches, task, on_rows)


@contextmanager
def session(backend: Backend) -> Iterator[None]:
    """Keep one Ray running for every search call inside the block (a local Ray started
    here and stopped at the end, or the cluster at ``backend.ray_address`` joined and
    left); nothing for the other backends, or when Ray is already initialized.

    Raises:
        ImportError: the ray backend without Ray installed.
        ConnectionError: no cluster at ``backend.ray_address`` (from Ray).
    """
    if backend.kind != "ray":
        yield
        return
    from pykvpool.search.ray_backend import ray_session

    with ray_session(backend.workers, backend.ray_address):
        yield

