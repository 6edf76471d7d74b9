"""The search itself: points -> chains -> tasks on a backend -> rows, frontier and best.

Two strategies (:data:`pykvpool.search.evaluate.STRATEGIES`):

- ``grid``: every point at every rung of the rate ladder; a point's sustained rate is
  the highest rung below its first failure.
- ``pruned``: per point and SLO a search on the ladder started at a neighbour's answer
  (a configuration of its family with one field changed, or the same one with fewer
  devices) and galloping from there (2 runs when the guess is right; a bisection of the
  ladder, about log2(rungs) runs, without a neighbour), and no run at all for a point
  with a cheaper point in its chain that sustains the ladder's top rung and is not
  flagged superlinear (dominated; its row says ``dominated``): it can be neither on the
  frontier nor a best point. Runs stop early, exactly, once they cannot meet any SLO.
  The same frontier and best points as the grid whenever meeting an SLO is monotone in
  the arrival rate (``tests/search/test_search.py`` checks it on real spaces,
  ``tests/search/test_search_scaling.py`` on random ones).

Both rank only the points :mod:`pykvpool.search.scaling` does not flag superlinear
(devices as replicas of tensor-parallel groups: :data:`pykvpool.search.scaling.SCALING_MODEL`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, TextIO

from pykvpool.checks import invalid
from pykvpool.planning.models import ModelConfig
from pykvpool.progress import ProgressBar
from pykvpool.search.backends import Backend, run_chains
from pykvpool.search.evaluate import STRATEGIES, SearchSpec, families_of, point_cost
from pykvpool.search.output import ResultStore, best_points, frontier, write_tables
from pykvpool.search.slo import SLO, Objective, RateLadder
from pykvpool.search.space import Point, SearchSpace
from pykvpool.simulate.workload import Workload

__all__ = ["SearchResult", "chains_of", "search"]

Row = dict[str, Any]


@dataclass
class SearchResult:
    """What :func:`search` found.

    Attributes:
        rows: one row per point, in space order (columns: see
            :func:`pykvpool.search.evaluate.evaluate_chain`).
        best: per SLO name, the best row (None: no point sustains any rate).
        frontier: per SLO name, the cost vs sustained-rate Pareto frontier, by cost.
        evaluated: points evaluated in this call (the rest came from the resumed log).
        seconds: wall time of the evaluation, seconds.
        spec: the shared inputs.
    """

    rows: list[Row]
    best: dict[str, Optional[Row]]
    frontier: dict[str, list[Row]]
    evaluated: int
    seconds: float
    spec: SearchSpec
    files: list[str] = field(default_factory=list)


def chains_of(points: Sequence[Point]) -> list[list[Point]]:
    """Points grouped by :meth:`Point.chain_key` (first-seen order), each chain by devices,
    then tensor-parallel degree.

    Raises:
        Nothing: bookkeeping on a list.
    """
    groups: dict[str, list[Point]] = {}
    for p in points:
        groups.setdefault(p.chain_key(), []).append(p)
    return [sorted(c, key=lambda p: (p.devices, p.tensor_parallel)) for c in groups.values()]


def _check(points: list[Point], slos: Sequence[SLO], objective: Objective, strategy: str, workload: Workload) -> None:
    if strategy not in STRATEGIES:
        raise invalid(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if not slos or len({s.name for s in slos}) != len(slos):
        raise invalid("slos must be a non-empty list of SLOs with distinct names")
    if len(workload) == 0:
        raise invalid("workload holds no request")
    for p in points:
        point_cost(objective, p)


def search(
    workload: Workload,
    model: ModelConfig,
    space: SearchSpace,
    slos: Sequence[SLO],
    *,
    ladder: RateLadder = RateLadder(),
    objective: Objective = Objective(),
    strategy: str = "pruned",
    backend: Backend = Backend(),
    out: Optional[str] = None,
    progress: Optional[TextIO] = sys.stderr,
) -> SearchResult:
    """Find the best deployment of ``model`` for ``workload`` (re-timed to each rung of
    ``ladder``, requests/s) under each SLO.

    With ``out`` (a folder) rows are appended to ``out/points.jsonl`` as tasks finish and a
    rerun skips the families (:func:`pykvpool.search.evaluate.families_of`) already
    there (a family with a missing row is evaluated again whole, so its rows are what an
    uninterrupted run gives); the tables and ``best.json`` are written at the end
    (:mod:`pykvpool.search.output`). ``progress`` gets a bar counting points (None: no
    bar).

    Raises:
        InvalidArgumentError: an unknown strategy, no SLO or two of one name, an empty
            workload, a hardware without a price under ``per_dollar``, ``out`` holding
            another search or files that are not what a search writes (naming the file;
            refused before any work); what the simulator refuses.
        ImportError: the ray backend without Ray installed.
        OSError: ``out`` cannot be read or written.
    """
    points = space.points(model, workload.has_prompt_ids)
    _check(points, slos, objective, strategy, workload)
    spec = SearchSpec(workload, model, tuple(slos), ladder, objective, strategy)
    store = ResultStore(out, spec) if out is not None else None
    have: dict[str, Row] = dict(store.rows) if store else {}
    todo = [f for f in families_of(chains_of(points)) if not all(p.key() in have for c in f for p in c)]
    done = len(points) - sum(len(c) for f in todo for c in f)
    t0 = time.perf_counter()
    with ProgressBar("deployment search", len(points), stream=progress, enabled=progress is not None) as bar:
        bar(done)

        def on_rows(rows: list[Row]) -> None:
            nonlocal done
            if store is not None:
                store.append(rows)
            have.update((r["key"], r) for r in rows)
            done += len(rows)
            bar(done)

        run_chains(spec, todo, backend, on_rows)
    rows = [have[p.key()] for p in points]
    names = [s.name for s in slos]
    result = SearchResult(rows, best_points(rows, names), {s: frontier(rows, s) for s in names},
                          sum(len(c) for f in todo for c in f), time.perf_counter() - t0, spec)
    if out is not None:
        extra = {"objective": objective.kind, "unit": objective.unit, "strategy": strategy,
                 "rates": list(ladder.rates()), "slos": [vars(s) for s in slos]}
        result.files = [str(p) for p in write_tables(out, rows, names, extra)]
    return result
