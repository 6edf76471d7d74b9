"""Reading a finished search back from its folder (what ``pykvpool search --out`` wrote),
for ``pykvpool report --search`` and for anyone who wants the rows again.

A search folder holds ``search.json`` (the fingerprint and the inputs' names),
``points.json`` (every row, written when the search finished), ``best.json`` (the
objective, the SLOs and the rate ladder) and, when the latency phase ran,
``latency.json`` (:mod:`pykvpool.search.latency`). Anything else is refused with a message
saying what is missing, before any work is done.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pykvpool.checks import invalid
from pykvpool.search.slo import SLO

__all__ = ["SearchFolder", "read_search"]

Row = dict[str, Any]


@dataclass(frozen=True)
class SearchFolder:
    """A finished search as its folder holds it.

    Attributes:
        path: the folder.
        model: the model's name; requests: requests in the workload; strategy: ``grid`` or
            ``pruned``; objective: ``per_device`` or ``per_dollar``; unit: the objective's unit.
        slos: the SLOs (bounds in seconds, tokens/s); rates: the ladder's rungs (requests/s).
        rows: every point's row, in space order (columns: see
            :func:`pykvpool.search.evaluate.evaluate_chain`).
        best: per SLO name, the best row (None: no point sustains any rate).
        latency: ``latency.json`` (``reference_rates``, ``source``, ``entries``,
            ``frontier``), or None when the latency phase did not run.
    """

    path: Path
    model: str
    requests: int
    strategy: str
    objective: str
    unit: str
    slos: tuple[SLO, ...]
    rates: tuple[float, ...]
    rows: list[Row]
    best: dict[str, Optional[Row]]
    latency: Optional[dict[str, Any]]

    @property
    def cost_unit(self) -> str:
        """What ``cost`` counts: ``devices`` or ``$ per hour``.

        Raises:
            Nothing: one of two strings.
        """
        return "devices" if self.objective == "per_device" else "$ per hour"

    @property
    def entries(self) -> dict[str, Row]:
        """The runs at a reference rate by key (empty without ``latency.json``).

        Raises:
            Nothing: a dict built from loaded JSON.
        """
        return {e["key"]: e for e in (self.latency or {}).get("entries", [])}


def _load(d: Path, name: str, kind: type) -> Any:
    path = d / name
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise invalid(f"search folder {d}: no {name}") from None
    except (ValueError, UnicodeError) as e:
        raise invalid(f"search folder {d}: {name} is not valid JSON ({e})") from None
    if not isinstance(doc, kind):
        raise invalid(f"search folder {d}: {name} holds a JSON {type(doc).__name__}, not a {kind.__name__}")
    return doc


def _need(doc: dict[str, Any], keys: tuple[str, ...], d: Path, name: str) -> None:
    missing = [k for k in keys if k not in doc]
    if missing:
        raise invalid(f"search folder {d}: {name} lacks {', '.join(missing)}")


def read_search(directory: str | os.PathLike[str]) -> SearchFolder:
    """The finished search in ``directory``.

    Raises:
        InvalidArgumentError: ``directory`` is not a folder, holds no search
            (``search.json``), an unfinished one (no ``points.json``: rerun the same
            search into it), or files that are not what the search writes (each
            message names the folder and the file).
        OSError: a file cannot be read.
    """
    d = Path(directory)
    if not d.is_dir():
        raise invalid(f"search folder {d}: {'not a folder' if d.exists() else 'no such folder'}")
    if not (d / "search.json").is_file():
        raise invalid(f"search folder {d}: not the output of `pykvpool search` (no search.json)")
    meta = _load(d, "search.json", dict)
    _need(meta, ("fingerprint", "strategy", "objective", "requests", "model"), d, "search.json")
    if not (d / "points.json").is_file():
        raise invalid(f"search folder {d}: the search did not finish (no points.json); run the same "
                      "`pykvpool search` into it again to complete it")
    rows = _load(d, "points.json", list)
    best = _load(d, "best.json", dict)
    _need(best, ("best", "unit", "slos", "rates"), d, "best.json")
    if not all(isinstance(r, dict) and "key" in r and "cost" in r for r in rows):
        raise invalid(f"search folder {d}: points.json holds a row without key or cost")
    try:
        slos = tuple(SLO(**s) for s in best["slos"])
    except TypeError as e:
        raise invalid(f"search folder {d}: best.json holds a malformed SLO ({e})") from None
    latency = _load(d, "latency.json", dict) if (d / "latency.json").is_file() else None
    if latency is not None:
        _need(latency, ("reference_rates", "source", "entries", "frontier"), d, "latency.json")
    return SearchFolder(d, str(meta["model"]), int(meta["requests"]), str(meta["strategy"]), str(meta["objective"]),
                        str(best["unit"]), slos, tuple(float(r) for r in best["rates"]), rows, best["best"], latency)
