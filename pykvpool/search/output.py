"""A search's files: the resumable log of rows, the tables, the frontier and the best points.

``points.jsonl`` gets each task's rows appended as the task finishes (flushed, one JSON
object per line); ``search.json`` holds the search's fingerprint (workload, model, SLOs,
rates, objective, strategy, pykvpool's version). A rerun into the same folder reads both,
skips the chains whose rows are all there, and refuses a folder of another search. A last
line cut short by an interruption is dropped (and its chain run again); any other line
that is not a row the search writes (:mod:`pykvpool.search.folder` checks each) is refused
before any work, naming the file and the line.

At the end: ``points.csv``, ``points.json`` (and ``points.parquet`` when pyarrow is
installed) with every point in space order, ``frontier.csv`` (per SLO, the points no
cheaper point beats on sustained rate) and ``best.json`` (per SLO, the best point with
its simulated metrics; ``scaling_model`` and ``scaling_tolerance``: the scaling model
and the superlinear rule's tolerance, :mod:`pykvpool.search.scaling`). Every row says
``scaling`` (the model's name) and, per SLO, ``<slo>_rate_is_lower_bound`` and
``<slo>_superlinear``; the frontier and the best points skip flagged rows.

:class:`JsonLog` is the append-and-resume file under both ``points.jsonl`` and the
reference-rate runs' ``latency.jsonl`` (:mod:`pykvpool.search.latency`).
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from pykvpool._native import InvalidArgumentError, __version__
from pykvpool.checks import invalid
from pykvpool.errors import TraceFormatError
from pykvpool.search.evaluate import SearchSpec
from pykvpool.search.folder import check_entry, read_meta, row_checker
from pykvpool.search.scaling import SCALING_ID, SCALING_MODEL, SCALING_TOLERANCE
from pykvpool.tracefile import jsonl_record

__all__ = ["JsonLog", "ResultStore", "best_points", "check_same_search", "fingerprint", "frontier", "ranked",
           "write_tables"]

Row = dict[str, Any]


def fingerprint(spec: SearchSpec) -> str:
    """A SHA-256 over everything a row depends on except the point (hex), pykvpool's
    version included (another version's simulator may give other rows).

    Raises:
        Nothing: hashing of validated inputs.
    """
    h = hashlib.sha256()
    w = spec.workload
    for name in ("arrival", "prompt_len", "output_len", "priority", "token_ids", "token_offsets", "block_keys",
                 "key_offsets"):
        col = getattr(w, name)
        h.update(name.encode())
        if col is not None:
            h.update(np.ascontiguousarray(col).tobytes())
    h.update(repr((w.tokens_per_key, spec.model, spec.slos, spec.ladder, spec.objective.kind,
                   sorted(spec.objective.prices.items()), spec.strategy, __version__)).encode())
    return h.hexdigest()


def check_same_search(directory: str | os.PathLike[str], spec: SearchSpec) -> None:
    """Refuse a ``directory`` whose ``search.json`` is missing or records another search.

    Raises:
        InvalidArgumentError: no ``search.json``, one that is not what a search writes
            (naming the file), or its fingerprint is not ``spec``'s.
        OSError: ``search.json`` cannot be read.
    """
    meta_path = Path(directory) / "search.json"
    if not meta_path.exists():
        raise invalid(f"out: {directory} holds no search (no search.json); run the search into it first")
    if read_meta(meta_path)["fingerprint"] != fingerprint(spec):
        raise invalid(f"out: {directory} holds the results of another search (workload, model, SLOs, "
                      "rates, objective, strategy or pykvpool's version differ); use another folder")


class ResultStore:
    """The rows of a search in ``directory``, appended as they come.

    Both logs (``points.jsonl`` and the reference-rate runs' ``latency.jsonl``) are read
    and checked before anything is written.

    Raises:
        InvalidArgumentError: ``directory`` holds another search (its fingerprint differs),
            or files that are not what a search writes (naming the file and line).
        OSError: the folder or its files cannot be created, read or written.
    """

    def __init__(self, directory: str | os.PathLike[str], spec: SearchSpec) -> None:
        self.dir = Path(directory)
        self.log = self.dir / "points.jsonl"
        meta_path = self.dir / "search.json"
        if meta_path.exists():
            check_same_search(self.dir, spec)
        self._log = JsonLog(self.log, row_checker([s.name for s in spec.slos]))
        JsonLog(self.dir / "latency.jsonl", check_entry)
        self.rows = self._log.rows
        meta = {"fingerprint": fingerprint(spec), "strategy": spec.strategy, "objective": spec.objective.kind,
                "slos": [s.name for s in spec.slos], "rates": list(spec.ladder.rates()),
                "requests": len(spec.workload), "model": spec.model.name, "scaling": SCALING_ID}
        self.dir.mkdir(parents=True, exist_ok=True)
        meta_path.write_text(json.dumps(meta, indent=1), encoding="utf-8")

    def append(self, rows: Sequence[Row]) -> None:
        """Record ``rows`` (a finished task's) at the end of the log, flushed to the OS.

        Raises:
            OSError: the log cannot be written.
        """
        self._log.append(rows)


class JsonLog:
    """Rows appended to a JSON-lines file as they come, each with a unique ``key``; what an
    earlier run left is read back (``rows``, by key: each as ``check`` returns it, which
    raises InvalidArgumentError saying what is wrong with it), and a last line cut short
    by an interruption (no newline) is dropped from the file.

    Raises:
        InvalidArgumentError: (a TraceFormatError naming the file and line) a complete
            line that is not JSON, not an object or not a row ``check`` accepts; the file
            is left as it is.
        OSError: the file cannot be read or truncated.
    """

    def __init__(self, path: str | os.PathLike[str], check: Callable[..., Row]) -> None:
        self.path = Path(path)
        self.rows: dict[str, Row] = {}
        if not self.path.exists():
            return
        whole = 0
        with open(self.path, "rb") as f:
            for n, line in enumerate(f, 1):
                if not line.endswith(b"\n"):
                    break  # the last line, cut short
                whole += len(line)
                if line.strip():
                    row = jsonl_record(self.path, n, line)
                    try:
                        row = check(row)
                    except InvalidArgumentError as e:
                        raise TraceFormatError(str(self.path), n, str(e)) from None
                    self.rows[row["key"]] = row
        if whole != self.path.stat().st_size:
            with open(self.path, "r+b") as f:
                f.truncate(whole)

    def append(self, rows: Sequence[Row]) -> None:
        """Write ``rows`` at the end of the file (one JSON object a line, NaN as null),
        flushed to the OS, and remember them.

        Raises:
            OSError: the file cannot be written.
        """
        plain = [_plain(r) for r in rows]
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in plain))
        self.rows.update((r["key"], r) for r in plain)


def _plain(row: Row) -> Row:
    """JSON-ready values: numpy scalars as Python numbers, NaN as None."""
    out: Row = {}
    for k, v in row.items():
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


def ranked(row: Row, slo: str) -> bool:
    """Whether ``row`` may be ranked for ``slo`` (a best point, a frontier point): it
    sustains a rate (state ``ok``) that is not flagged superlinear.

    Raises:
        Nothing: lookups with defaults.
    """
    return row.get(f"{slo}_state") == "ok" and not row.get(f"{slo}_superlinear")


def frontier(rows: Sequence[Row], slo: str) -> list[Row]:
    """The Pareto frontier of cost against sustained rate for ``slo``: rows that sustain a
    rate > 0, are not flagged ``<slo>_superlinear`` (:mod:`pykvpool.search.scaling`) and
    that no such row of lower or equal cost beats, by increasing cost (ties: the first
    row in order).

    Raises:
        KeyError: a row without ``cost`` or the SLO's columns.
    """
    ok = [(r["cost"], -r[f"{slo}_rate"], i, r) for i, r in enumerate(rows) if ranked(r, slo)]
    out: list[Row] = []
    best = 0.0
    for _, neg_rate, _, r in sorted(ok, key=lambda t: t[:3]):
        if -neg_rate > best:
            out.append(r)
            best = -neg_rate
    return out


def best_points(rows: Sequence[Row], slos: Sequence[str]) -> dict[str, Optional[Row]]:
    """Per SLO, the row of highest objective (ties: lower cost, then the first in order)
    among the rows :func:`ranked` admits, or None when none sustains any rate. Objectives
    are compared to 12 significant digits: rungs are ``lo x exp(r i)`` in floating point,
    so 4 devices at 64 req/s and 1 at 16 are a tie (won by the cheaper), not a win by a
    rounding error.

    Raises:
        KeyError: a row without ``cost`` or an SLO's columns.
    """
    out: dict[str, Optional[Row]] = {}
    for s in slos:
        cands = [(float(f"{r[f'{s}_objective']:.12g}"), -r["cost"], -i, r) for i, r in enumerate(rows)
                 if ranked(r, s)]
        out[s] = max(cands, key=lambda c: c[:3])[3] if cands else None
    return out


def write_tables(directory: str | os.PathLike[str], rows: Sequence[Row], slos: Sequence[str],
                 extra: Optional[dict[str, Any]] = None) -> list[Path]:
    """Write the points (CSV, JSON, Parquet if pyarrow is importable), the frontier and
    the best points; returns the paths written.

    Raises:
        OSError: a file cannot be written.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    rows = [_plain(r) for r in rows]
    cols = list(rows[0]) if rows else ["key"]
    paths = [d / "points.csv", d / "points.json", d / "frontier.csv", d / "best.json"]
    _csv(paths[0], cols, rows)
    paths[1].write_text(json.dumps(rows, indent=0), encoding="utf-8")
    front = [{"slo": s, **r} for s in slos for r in frontier(rows, s)]
    _csv(paths[2], ["slo", *cols], front)
    best = {"best": best_points(rows, slos), **(extra or {}), "scaling_model": SCALING_MODEL,
            "scaling_tolerance": SCALING_TOLERANCE}
    paths[3].write_text(json.dumps(best, indent=1), encoding="utf-8")
    try:  # optional (the ray extra), untyped: through importlib
        pa: Any = importlib.import_module("pyarrow")
        pq: Any = importlib.import_module("pyarrow.parquet")
    except ImportError:
        return paths
    table = pa.Table.from_pylist(rows) if rows else pa.table({"key": pa.array([], pa.string())})
    with open(d / "points.parquet", "wb") as f:  # a file, never a path pyarrow could read as a URI
        pq.write_table(table, f)
    return [*paths, d / "points.parquet"]


def _csv(path: Path, cols: list[str], rows: Sequence[Row]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows({k: "" if r.get(k) is None else r[k] for k in cols} for r in rows)
