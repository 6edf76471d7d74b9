"""Where a search's tasks run: in this process, on a local process pool (the default), or
on Ray (a local Ray started for the search, or a running cluster joined by address).

A task is a batch of families of chains (:func:`pykvpool.search.evaluate.evaluate_batch`); batches
keep the scheduling overhead per simulation small. The shared :class:`SearchSpec` (the
workload above all) crosses to each worker once: as the process pool's initializer
argument, or put in Ray's object store once and passed to every task by reference.
Results come back as tasks finish and are handed to ``on_rows`` in completion order;
their content does not depend on the backend.

Ray is imported only when a Ray backend runs (the ``ray`` extra): ``import pykvpool``
never imports it.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Optional

from pykvpool.checks import invalid
from pykvpool.search.evaluate import SearchSpec, evaluate_batch, make_batches
from pykvpool.search.space import Point

__all__ = ["BACKENDS", "Backend", "run_chains"]

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
        return self.workers or os.cpu_count() or 1


_SPEC: Optional[SearchSpec] = None


def _init_worker(spec: SearchSpec) -> None:
    global _SPEC
    _SPEC = spec


def _worker_batch(batch: Batch) -> Rows:
    assert _SPEC is not None, "worker not initialized"
    return evaluate_batch(_SPEC, batch)


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
    if not chains:
        return
    if backend.kind == "inline":
        for b in make_batches(chains, 1):
            on_rows(evaluate_batch(spec, b))
    elif backend.kind == "process":
        _run_process(spec, make_batches(chains, backend.parallelism()), backend, on_rows)
    else:
        from pykvpool.search.ray_backend import run_ray

        run_ray(spec, chains, backend.workers, backend.ray_address, on_rows)


def _run_process(spec: SearchSpec, batches: list[Batch], backend: Backend, on_rows: Callable[[Rows], None]) -> None:
    workers = min(backend.parallelism(), len(batches))
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(spec,)) as ex:
        pending: set[Future[Rows]] = {ex.submit(_worker_batch, b) for b in batches}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    on_rows(f.result())
        finally:
            for f in pending:
                f.cancel()
