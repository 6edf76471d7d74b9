"""Cost against latency: the p99 TTFT and p99 TPOT each configuration gives, and their
Pareto frontiers per SLO (the search's "cost vs latency" frontier).

Two bases, both in ``frontier_latency.csv``:

- ``reference`` (the one to plan with): every point at one arrival rate per SLO, the
  *reference rate*, so that all configurations are compared under the same load. By
  default it is the sustained rate of the SLO's best point: the load the recommended
  configuration is sized for. No cheaper point meets the SLO at that rate (it would have
  a better objective), so the frontier starts at the best point and shows what paying
  more buys in latency at the same traffic. ``rate`` sets one rate (requests/s) for every
  SLO instead: the planner's expected traffic. Candidates are the points that meet the
  SLO at the reference rate (every request finished, every bound held).
- ``sustained``: each point at its own sustained rate (the row's ``<slo>_ttft_p99`` and
  ``<slo>_tpot_p99``; no extra run). Each point is loaded differently, so a point that
  sustains little looks fast: it reads as the latency at the edge of each configuration's
  capacity, not as a choice at a given traffic.

The reference basis needs runs at the reference rate; they go through the search's
backends (:func:`pykvpool.search.backends.run_tasks`) and, with ``out``, are appended to
``out/latency.jsonl`` as they finish, so a rerun skips them. A run is a pure function of
the point and the rate. Points known to fail the SLO at the reference rate are not run:
their first failing rung (the one above their sustained rate; the lowest for ``none``) is
at most the reference rate (meeting an SLO is monotone in the rate: the pruned search's
assumption). A point whose sustained rate is the reference rate is not run again either:
its row holds that very run's metrics.

Frontier (:func:`latency_frontier`): the candidates with the metric (a missing, None or
NaN latency leaves a point out), by increasing cost; a point is kept when its latency is
strictly below that of every point kept before it. So no kept point has another point
at most as costly and at most as slow, one of them strictly; of points equal in both,
the first in space order is kept.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

from pykvpool.checks import check_positive
from pykvpool.progress import ProgressBar
from pykvpool.search.backends import Backend, run_tasks
from pykvpool.search.evaluate import METRICS, SearchSpec, deploy, summary_of
from pykvpool.search.folder import check_entry, entry_key
from pykvpool.search.output import JsonLog, check_same_search, ranked
from pykvpool.search.slo import SLO
from pykvpool.search.space import Point
from pykvpool.search.strategies import SearchResult
from pykvpool.simulate.engine import run
from pykvpool.simulate.sweep import at_rate

__all__ = ["BASES", "COLUMNS", "LATENCY_METRICS", "LatencyResult", "candidates", "entry_key", "evaluate_at_rates",
           "frontier_rows", "latency_frontier", "plan_runs", "reference_latency", "reference_rates", "write_latency"]

Row = dict[str, Any]
#: Latencies the frontiers are drawn on (seconds).
LATENCY_METRICS = ("ttft_p99", "tpot_p99")
#: ``reference``: every point at the SLO's reference rate; ``sustained``: at its own rate.
BASES = ("reference", "sustained")
_POINT_FIELDS = tuple(f.name for f in fields(Point))
#: Columns of a candidate (and of ``frontier_latency.csv`` after slo, basis, metric, latency).
COLUMNS = ("key", "cost", "rate", *METRICS, *_POINT_FIELDS)


@dataclass
class LatencyResult:
    """What :func:`reference_latency` found.

    Attributes:
        rates: per SLO name, its reference rate (requests/s; None: no point sustains any
            rate and no ``rate`` was given).
        source: ``best point`` (each SLO's best point's sustained rate) or ``given``.
        entries: the runs at a reference rate, by ``<point key>@<rate>``: ``point``,
            ``rate``, ``finished`` and the :data:`pykvpool.search.evaluate.METRICS`.
        frontier: :func:`frontier_rows` (every SLO, basis and metric).
        evaluated: runs made in this call (the rest came from the rows or the log).
        seconds: wall time of those runs, seconds.
        files: the files written into ``out``.
    """

    rates: dict[str, Optional[float]]
    source: str
    entries: dict[str, Row]
    frontier: list[Row]
    evaluated: int
    seconds: float
    files: list[str] = field(default_factory=list)


def reference_rates(best: dict[str, Optional[Row]], rate: Optional[float] = None) -> dict[str, Optional[float]]:
    """Per SLO of ``best`` (:attr:`SearchResult.best`), ``rate`` if given, else the best
    point's sustained rate (None when no point sustains any rate).

    Raises:
        InvalidArgumentError: ``rate`` not a finite number > 0.
    """
    if rate is not None:
        r = check_positive(rate, "rate")
        return {s: r for s in best}
    return {s: (None if b is None else float(b[f"{s}_rate"])) for s, b in best.items()}


def _plan(row: Row, slo: str, rate: float, rungs: Sequence[float]) -> str:
    """``reuse`` (the row holds the run at ``rate``), ``skip`` (known to fail) or ``run``."""
    state = row.get(f"{slo}_state")
    if row.get("status") != "ok" or state == "infeasible":
        return "skip"
    if state == "dominated":
        return "run"
    if state == "none":
        return "skip" if rungs[0] <= rate else "run"
    sustained = float(row[f"{slo}_rate"])
    if sustained == rate:
        return "reuse"
    above = [r for r in rungs if r > sustained]
    return "skip" if above and above[0] <= rate else "run"


def _reused(row: Row, slo: str, rate: float, n: int) -> Row:
    return {"key": entry_key(row["key"], rate), "point": row["key"], "rate": rate, "finished": n,
            **{m: row.get(f"{slo}_{m}") for m in METRICS}, "sims": 0}


def plan_runs(rows: Sequence[Row], rates: dict[str, Optional[float]], rungs: Sequence[float],
              n: int, per_request: Sequence[str] = ()) -> tuple[dict[str, Row], list[tuple[Point, float]]]:
    """What the reference basis needs: the entries a row already holds (by key), and the
    (point, rate) pairs to run, in row order then by rate (see the module docstring). A
    rate one of ``per_request``'s SLOs (those of per-request bounds, whose counts a row
    does not keep) is taken at is run, never reused.

    Raises:
        KeyError: a row without the point's fields or an SLO's columns.
    """
    reused: dict[str, Row] = {}
    todo: list[tuple[Point, float]] = []
    distinct = sorted({r for r in rates.values() if r is not None})
    for row in rows:
        for rate in distinct:
            plans = {s: _plan(row, s, rate, rungs) for s, r in rates.items() if r == rate}
            if any(s in per_request for s in plans) and any(p != "skip" for p in plans.values()):
                todo.append((Point(**{f: row[f] for f in _POINT_FIELDS if f in row}), rate))
            elif "reuse" in plans.values():
                s = next(s for s, p in plans.items() if p == "reuse")
                reused[entry_key(row["key"], rate)] = _reused(row, s, rate, n)
            elif "run" in plans.values():
                todo.append((Point(**{f: row[f] for f in _POINT_FIELDS if f in row}), rate))
    return reused, todo


def evaluate_at_rates(spec: SearchSpec, batch: list[tuple[Point, float]]) -> list[Row]:
    """Run each (point, rate) of ``batch``: the workload re-timed to ``rate`` requests/s on
    the point's deployment (:func:`pykvpool.search.evaluate.deploy`); one entry each
    (``finished`` and the summary's :data:`~pykvpool.search.evaluate.METRICS`; ``stopped``
    too when the run reports it). A backend task.

    Raises:
        BudgetError: a point whose weights do not fit (:func:`plan_runs` never asks for one).
        InvalidArgumentError: a configuration the simulator refuses.
    """
    out: list[Row] = []
    for point, rate in batch:
        cfg, tm = deploy(point, spec.model)
        summary = summary_of(run(at_rate(spec.workload, rate), cfg, tm), spec.slos)
        extra = {"stopped": summary["stopped"]} if "stopped" in summary else {}
        attained = {s.attained_key: summary[s.attained_key] for s in spec.slos if s.attained_key in summary}
        out.append({"key": entry_key(point.key(), rate), "point": point.key(), "rate": rate,
                    "finished": summary.get("finished"), **{m: summary.get(m) for m in METRICS}, **extra,
                    **attained, "sims": 1})
    return out


def _batches(todo: list[tuple[Point, float]], parallelism: int, max_items: int = 32) -> list[list[tuple[Point, float]]]:
    per = max(1, min(max_items, -(-len(todo) // max(4 * parallelism, 1))))
    return [todo[i:i + per] for i in range(0, len(todo), per)]


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def candidates(rows: Sequence[Row], entries: dict[str, Row], slo: SLO, basis: str,
               rate: Optional[float], n: int) -> list[Row]:
    """The points a frontier of ``slo`` chooses from, in row order: for ``reference``, the
    entries at ``rate`` that meet ``slo`` (of a workload of ``n`` requests); for
    ``sustained``, the rows whose ``<slo>_state`` is ``ok``, at their own rate, but for
    those flagged superlinear (:func:`pykvpool.search.output.ranked`). Each
    with :data:`COLUMNS` (``rate``: where the latencies were taken, requests/s).

    Raises:
        KeyError: a row without ``key`` or ``cost``.
    """
    out: list[Row] = []
    for row in rows:
        base = {"key": row["key"], "cost": row["cost"], **{f: row.get(f) for f in _POINT_FIELDS}}
        if basis == "sustained":
            if ranked(row, slo.name):
                out.append({**base, "rate": row[f"{slo.name}_rate"],
                            **{m: row.get(f"{slo.name}_{m}") for m in METRICS}})
            continue
        e = None if rate is None else entries.get(entry_key(row["key"], rate))
        if e is not None and not e.get("stopped") and slo.meets(e, n):
            out.append({**base, "rate": rate, **{m: e.get(m) for m in METRICS}})
    return out


def latency_frontier(cands: Sequence[Row], metric: str) -> list[Row]:
    """The Pareto frontier of ``cost`` against ``metric`` (lower is better on both) over
    ``cands``, by increasing cost (see the module docstring for ties); a candidate
    without a finite ``metric`` is left out.

    Raises:
        KeyError: a candidate without ``cost``.
    """
    have = [(c["cost"], c[metric], i, c) for i, c in enumerate(cands) if _finite(c.get(metric))]
    out: list[Row] = []
    best = math.inf
    for _, lat, _, c in sorted(have, key=lambda t: t[:3]):
        if lat < best:
            out.append(c)
            best = lat
    return out


def frontier_rows(rows: Sequence[Row], entries: dict[str, Row], slos: Sequence[SLO],
                  rates: dict[str, Optional[float]], n: int) -> list[Row]:
    """Every latency frontier, SLO by SLO, basis by basis (:data:`BASES`), metric by metric
    (:data:`LATENCY_METRICS`), each by increasing cost: rows of ``slo``, ``basis``,
    ``metric``, ``latency`` (seconds) and :data:`COLUMNS`.

    Raises:
        KeyError: a row without ``key`` or ``cost``.
    """
    out: list[Row] = []
    for slo in slos:
        for basis in BASES:
            cands = candidates(rows, entries, slo, basis, rates.get(slo.name), n)
            for metric in LATENCY_METRICS:
                out += [{"slo": slo.name, "basis": basis, "metric": metric, "latency": c[metric], **c}
                        for c in latency_frontier(cands, metric)]
    return out


def write_latency(directory: str | os.PathLike[str], res: LatencyResult) -> list[Path]:
    """Write ``frontier_latency.csv`` and ``latency.json`` (the reference rates, their
    source, every entry in row order and the frontiers) into ``directory``.

    Raises:
        OSError: a file cannot be written.
    """
    d = Path(directory)
    paths = [d / "frontier_latency.csv", d / "latency.json"]
    cols = ["slo", "basis", "metric", "latency", *COLUMNS]
    with open(paths[0], "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows({k: "" if r.get(k) is None else r[k] for k in cols} for r in res.frontier)
    doc = {"reference_rates": res.rates, "source": res.source, "entries": list(res.entries.values()),
           "frontier": res.frontier}
    paths[1].write_text(json.dumps(doc, indent=0), encoding="utf-8")
    return paths


def reference_latency(
    result: SearchResult,
    *,
    rate: Optional[float] = None,
    backend: Backend = Backend(),
    out: Optional[str | os.PathLike[str]] = None,
    progress: Optional[TextIO] = sys.stderr,
) -> LatencyResult:
    """Run ``result``'s points at each SLO's reference rate (``rate`` requests/s, or the
    best point's sustained rate) on ``backend`` and build the latency frontiers (see the
    module docstring). With ``out`` (the search's folder) the runs are appended to
    ``out/latency.jsonl`` as they finish (a rerun skips them) and ``frontier_latency.csv``
    and ``latency.json`` are written at the end. ``progress`` gets a bar (None: none).

    Raises:
        InvalidArgumentError: ``rate`` not a finite number > 0; ``out`` holding no search
            or another one, or a ``latency.jsonl`` line that is not a run this module
            writes (naming the file and line); what the simulator refuses.
        ImportError: the ray backend without Ray installed.
        OSError: ``out`` cannot be read or written.
    """
    spec = result.spec
    rates = reference_rates(result.best, rate)
    n = len(spec.workload)
    log = None
    if out is not None:
        check_same_search(out, spec)
        log = JsonLog(Path(out) / "latency.jsonl", check_entry)
    per_request = [s.name for s in spec.slos if s.attainment is not None]
    entries, todo = plan_runs(result.rows, rates, spec.ladder.rates(), n, per_request)
    logged = log.rows if log is not None else {}
    done = {k: logged[k] for k in (entry_key(p.key(), r) for p, r in todo) if k in logged}
    todo = [(p, r) for p, r in todo if entry_key(p.key(), r) not in done]
    entries.update(done)
    t0 = time.perf_counter()
    with ProgressBar("reference-rate latency", len(todo) + len(done), stream=progress,
                     enabled=progress is not None and bool(todo or done)) as bar:
        bar(len(done))

        def on_rows(rows: list[Row]) -> None:
            if log is not None:
                log.append(rows)
            entries.update((r["key"], r) for r in rows)
            bar(bar.done + len(rows))

        if todo:
            run_tasks(spec, lambda par: _batches(todo, par), evaluate_at_rates, backend, on_rows)
    order = {row["key"]: i for i, row in enumerate(result.rows)}
    entries = dict(sorted(entries.items(), key=lambda kv: (order[kv[1]["point"]], kv[1]["rate"])))
    res = LatencyResult(rates, "best point" if rate is None else "given", entries,
                        frontier_rows(result.rows, entries, spec.slos, rates, n), len(todo),
                        time.perf_counter() - t0)
    if out is not None:
        res.files = [str(p) for p in write_latency(out, res)]
    return res

