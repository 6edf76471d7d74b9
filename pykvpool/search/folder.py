"""Reading a finished search back from its folder (what ``pykvpool search --out`` wrote),
for ``pykvpool report --search`` and for anyone who wants the rows again; and the one check
of each kind of file a search writes, used here and when a search resumes.

A search folder holds ``search.json`` (the fingerprint and the inputs' names),
``points.json`` (every row, written when the search finished), ``best.json`` (the
objective, the SLOs and the rate ladder) and, when the latency phase ran,
``latency.json`` (:mod:`pykvpool.search.latency`); the logs ``points.jsonl`` (rows) and
``latency.jsonl`` (runs at a reference rate) grow while it runs.

:func:`read_search` checks every file completely before it returns -- each key a search
writes is there, each value of its type and range (a row's fields are those its key
names; a run's key is its point's at its rate), the files agree on the SLOs and the
rates -- so nothing read back can fail later; a resumed search checks its logs' rows the
same way (:func:`row_checker`, :func:`check_entry`) and ``search.json`` by
:func:`read_meta`. Anything else is refused with an InvalidArgumentError naming the file
and what is wrong, before any work is done. Keys a search does not write are allowed in
a row when they hold a plain value (a string, a number, a bool or null).

A KV dtype is read in any spelling :func:`pykvpool.planning.models.storage_dtype` reads
and handed back in its one spelling, in ``kv_dtype`` and in the keys that name it (a
search written when planning spelled ``f16`` as ``fp16`` reads, and resumes, as one
written today).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from pykvpool._native import InvalidArgumentError
from pykvpool.checks import invalid
from pykvpool.errors import TraceFormatError
from pykvpool.planning.models import storage_dtype
from pykvpool.search.evaluate import METRICS, STRATEGIES
from pykvpool.search.scaling import SCALING_ID
from pykvpool.search.slo import COST_UNITS, OBJECTIVES, SLO, SLO_ATTAINMENT, SLO_BOUNDS
from pykvpool.search.space import COLOCATED, EVICTIONS, PREEMPTIONS, Point, canonical_split
from pykvpool.tracefile import read_json

__all__ = ["STATES", "SearchFolder", "check_entry", "entry_key", "read_meta", "read_search", "row_checker"]

Row = dict[str, Any]
#: A row's state per SLO (see :func:`pykvpool.search.evaluate.evaluate_chain`).
STATES = ("ok", "none", "dominated", "infeasible")
_OBJECTIVES = OBJECTIVES
_MAX_INT = 2**63 - 1


@dataclass(frozen=True)
class SearchFolder:
    """A finished search as its folder holds it.

    Attributes:
        path: the folder.
        model: the model's name; requests: requests in the workload; strategy: ``grid`` or
            ``pruned``; objective: ``per_device``, ``per_dollar`` or ``per_watt``; unit: the
            objective's unit.
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
        """What ``cost`` counts: ``devices``, ``$ per hour`` or ``kW``.

        Raises:
            Nothing: one of three strings.
        """
        return COST_UNITS[self.objective]

    @property
    def entries(self) -> dict[str, Row]:
        """The runs at a reference rate by key (empty without ``latency.json``).

        Raises:
            Nothing: a dict built from checked JSON.
        """
        return {e["key"]: e for e in (self.latency or {}).get("entries", [])}


def entry_key(point_key: str, rate: float) -> str:
    """The identity of ``point_key`` run at ``rate`` requests/s (exact: ``repr`` of the rate).

    Raises:
        Nothing: string formatting.
    """
    return f"{point_key}@{rate!r}"


# ---- values ---------------------------------------------------------------------------


def _finite(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int past any float
        return False


def _shown(v: Any) -> str:
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, (int, float)):
        text = repr(v)
        return text if len(text) <= 24 else f"an integer of {len(text)} digits"
    if isinstance(v, str):
        return repr(v) if len(v) <= 64 else repr(v[:61] + "...")
    return "a list" if isinstance(v, list) else "an object" if isinstance(v, dict) else type(v).__name__


@dataclass(frozen=True)
class _Kind:
    """What a value must be: ``ok`` says whether it is, ``what`` says so in a message."""

    ok: Callable[[Any], bool]
    what: str


def _number(above: bool = False) -> _Kind:
    return _Kind(lambda v: _finite(v) and (v > 0 if above else v >= 0), f"a finite number {'>' if above else '>='} 0")


def _count(lo: int = 0) -> _Kind:
    return _Kind(lambda v: type(v) is int and lo <= v <= _MAX_INT, f"an integer in {lo}..2**63-1")


def _text(choices: Sequence[str] = ()) -> _Kind:
    what = f"one of {', '.join(map(repr, choices))}" if choices else "a string"
    return _Kind(lambda v: isinstance(v, str) and (not choices or v in choices), what)


def _or_null(k: _Kind) -> _Kind:
    return _Kind(lambda v: v is None or k.ok(v), f"{k.what} or null")


def _rates_ok(v: Any) -> bool:
    return (isinstance(v, list) and 0 < len(v) <= 1000 and all(_finite(r) and r > 0 for r in v)
            and all(a <= b for a, b in zip(v, v[1:])))


def _split_ok(v: Any) -> bool:
    try:
        return isinstance(v, str) and canonical_split(v) == v
    except InvalidArgumentError:
        return False


def _kv_dtype_ok(v: Any) -> bool:
    if not isinstance(v, str) or not 0 < len(v) <= 64:
        return False
    try:
        storage_dtype(v)
    except InvalidArgumentError:
        return False
    return True


_FLAG = _Kind(lambda v: isinstance(v, bool), "true or false")
_NAME = _Kind(lambda v: isinstance(v, str) and 0 < len(v) <= 64 and "|" not in v, "a name without '|'")
_PLAIN = _Kind(lambda v: v is None or isinstance(v, (str, int, float)), "a string, a number, a bool or null")
_OBJECT = _Kind(lambda v: isinstance(v, dict), "an object")
_LIST = _Kind(lambda v: isinstance(v, list), "a list")
_RATES = _Kind(_rates_ok, "a non-empty, increasing list of at most 1000 rates > 0")
_NAMES = _Kind(lambda v: isinstance(v, list) and len(v) > 0 and all(isinstance(n, str) for n in v)
               and len(set(v)) == len(v), "a non-empty list of distinct names")
_STAT = _or_null(_number())  # seconds, tokens/s, requests/s or a count

_POINT: dict[str, _Kind] = {
    "hardware": _NAME, "devices": _count(1), "tensor_parallel": _count(1), "kv_dtype": _Kind(_kv_dtype_ok, "a KV dtype"), "block_size": _count(1), "max_running": _count(1),
    "max_batched_tokens": _count(1), "chunked_prefill": _FLAG, "preemption": _text(PREEMPTIONS),
    "prefix_caching": _FLAG, "eviction": _text(EVICTIONS), "layer_groups": _FLAG}
#: Point fields a row may lack (written before they existed), with the value it then has.
_POINT_DEFAULTS = {"disaggregation": COLOCATED}
_POINT_MORE = {"disaggregation": _Kind(_split_ok, "'colocated' or a prefill:decode ratio 'P:D[@hardware]'")}
_METRICS = {m: _STAT for m in METRICS}
_ENTRY = {"key": _text(), "point": _text(), "rate": _number(above=True), "finished": _or_null(_count()),
          **_METRICS, "sims": _count()}
_FRONTIER = {"slo": _text(), "basis": _text(), "metric": _text(), "latency": _number(), "key": _text(),
             "cost": _number(above=True), "rate": _number(above=True), **_METRICS, **_POINT}
_SCALING = _text((SCALING_ID,))
_META = {"fingerprint": _text(), "strategy": _text(STRATEGIES), "objective": _text(_OBJECTIVES), "slos": _NAMES,
         "rates": _RATES, "requests": _count(1), "model": _text(), "scaling": _SCALING}
_BEST = {"best": _OBJECT, "objective": _text(_OBJECTIVES), "unit": _text(), "strategy": _text(STRATEGIES),
         "rates": _RATES, "slos": _LIST, "scaling_model": _text(), "scaling_tolerance": _number()}
_LATENCY = {"reference_rates": _OBJECT, "source": _text(), "entries": _LIST, "frontier": _LIST}


def _keys(doc: Any, spec: Mapping[str, _Kind], where: str = "", more: Optional[Mapping[str, _Kind]] = None,
          closed: bool = False) -> Row:
    """``doc`` when it is an object holding every key of ``spec``, each value of its kind;
    other keys plain values (``more`` names optional ones; ``closed``: none allowed)."""
    if not isinstance(doc, dict):
        raise invalid(f"{where}must be a JSON object, got {_shown(doc)}")
    missing = [k for k in spec if k not in doc]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise invalid(f"{where}lacks {shown}")
    for k, v in doc.items():
        kind = spec.get(k) or (more or {}).get(k) or (None if closed else _PLAIN)
        if kind is None:
            raise invalid(f"{where}holds an unknown key {_shown(k)}")
        if not kind.ok(v):
            raise invalid(f"{where}{k} must be {kind.what}, got {_shown(v)}")
    return doc


# ---- rows and runs (also the logs' lines) ---------------------------------------------


def _spelled_key(key: str) -> str:
    """A point's key (or a run's, ``<point key>@<rate>``) with its KV dtype field in its one
    spelling; a key whose third field is no KV dtype is returned as it is."""
    parts = key.split("|")
    if len(parts) < 3 or not _kv_dtype_ok(parts[2]):
        return key
    parts[2] = storage_dtype(parts[2]).name
    return "|".join(parts)


def _respelled(doc: Row) -> Row:
    """``doc`` (checked) with its KV dtype in its one spelling wherever it names one:
    ``kv_dtype``, and the dtype field of ``key`` and ``point``."""
    out = dict(doc)
    if "kv_dtype" in out:
        out["kv_dtype"] = storage_dtype(out["kv_dtype"]).name
    for k in ("key", "point"):
        if isinstance(out.get(k), str):
            out[k] = _spelled_key(out[k])
    return out


def row_checker(slos: Sequence[str]) -> Callable[..., Row]:
    """The check of a search's row under the SLOs named ``slos`` (a line of ``points.jsonl``,
    an element of ``points.json``, a best point): every column of
    :func:`pykvpool.search.evaluate.evaluate_chain` of its kind, a rate, an objective and
    the scaling checks (``<slo>_rate_is_lower_bound``, ``<slo>_superlinear``: true or
    false) for each SLO whose state is ``ok`` or ``none`` (all four null for any other
    state: no rate), and a key that is its fields' key. The
    check, ``check(row, where="")``, returns the row with its KV dtype in its one spelling
    (in ``kv_dtype`` and ``key``: see the module docstring); ``where`` starts its messages.

    Raises:
        Nothing itself; the check raises InvalidArgumentError saying what is wrong.
    """
    spec = {"key": _text(), **_POINT, "cost": _number(above=True), "scaling": _SCALING, "num_blocks": _count(),
            "status": _text(), "sims": _count()}
    for s in slos:
        spec.update({f"{s}_state": _text(STATES), f"{s}_rate": _STAT, f"{s}_objective": _STAT,
                     f"{s}_rate_is_lower_bound": _or_null(_FLAG), f"{s}_superlinear": _or_null(_FLAG)})
        spec.update({f"{s}_{m}": _STAT for m in METRICS})
        spec[f"{s}_attained"] = _or_null(_count())

    def check(doc: Any, where: str = "") -> Row:
        row = {**_POINT_DEFAULTS, **_keys(doc, spec, where, more=_POINT_MORE)}
        for s in slos:
            state = row[f"{s}_state"]
            for col in (f"{s}_rate", f"{s}_objective", f"{s}_rate_is_lower_bound", f"{s}_superlinear"):
                if state in ("ok", "none") and row[col] is None:
                    raise invalid(f"{where}{col} is null, but {s}_state is {state!r}")
                if state not in ("ok", "none") and row[col] is not None:
                    raise invalid(f"{where}{col} is {_shown(row[col])}, but {s}_state is {state!r} (no rate)")
        key = Point(**{f: row[f] for f in (*_POINT, *_POINT_DEFAULTS)}).key()
        if row["key"] != key:
            raise invalid(f"{where}key {_shown(row['key'])} is not the key of its fields ({key!r})")
        return _respelled(row)

    return check


def check_entry(entry: Any, where: str = "") -> Row:
    """``entry`` when it is a run at a reference rate as :mod:`pykvpool.search.latency`
    writes it (a line of ``latency.jsonl``, an entry of ``latency.json``): ``key`` (its
    point's at its rate: :func:`entry_key`), ``point``, ``rate`` (requests/s),
    ``finished``, ``sims``, the metrics, an optional ``stopped`` and, for an SLO of
    per-request bounds, ``attained_<slo>`` (a count); ``where`` starts a message. Returned with the KV dtype of ``key`` and ``point`` in its one spelling.

    Raises:
        InvalidArgumentError: what is wrong.
    """
    counts = {k: _or_null(_count()) for k in entry if isinstance(k, str) and k.startswith("attained_")} \
        if isinstance(entry, dict) else {}
    e = _keys(entry, _ENTRY, where, more={"stopped": _or_null(_text()), **counts})
    if e["key"] != entry_key(e["point"], e["rate"]):
        raise invalid(f"{where}key {_shown(e['key'])} is not its point's at its rate")
    return _respelled(e)


# ---- the files --------------------------------------------------------------------------


def _load(d: Path, name: str) -> Any:
    try:
        return read_json(d / name)
    except FileNotFoundError:
        raise invalid(f"search folder {d}: no {name}") from None


def _in_file(path: Path, check: Callable[[], Any]) -> Any:
    """``check()``, its InvalidArgumentError told as one in the file at ``path``."""
    try:
        return check()
    except TraceFormatError:
        raise
    except InvalidArgumentError as e:
        raise TraceFormatError(str(path), 0, str(e)) from None


def read_meta(path: str | os.PathLike[str]) -> Row:
    """The ``search.json`` at ``path``, checked: ``fingerprint``, ``strategy``,
    ``objective``, ``slos`` (names), ``rates`` (requests/s), ``requests``, ``model``,
    ``scaling`` (:data:`pykvpool.search.scaling.SCALING_ID`: a folder written before it
    was recorded, or under another scaling model, is refused in one line).

    Raises:
        InvalidArgumentError: (a TraceFormatError naming the file) not JSON, or not what
            a search writes.
        OSError: the file cannot be read.
    """
    p = Path(path)
    doc = read_json(p)
    if isinstance(doc, dict) and "fingerprint" in doc and "scaling" not in doc:
        raise TraceFormatError(str(p), 0, "written by a pykvpool that recorded no scaling model (its pruned rows "
                                          "may lack frontier points); run the search into a new folder")
    meta: Row = _in_file(p, lambda: _keys(doc, _META))
    return meta


def _slos(doc: list[Any]) -> tuple[SLO, ...]:
    spec = {"name": _text(), **{b: _or_null(_number(above=True)) for b in (*SLO_BOUNDS, *SLO_ATTAINMENT)}}
    slos = []
    for i, s in enumerate(doc):
        _keys(s, spec, f"slos[{i}]: ", closed=True)
        try:
            slos.append(SLO(**s))
        except InvalidArgumentError as e:
            raise invalid(f"slos[{i}]: {e}") from None
    if not slos or len({s.name for s in slos}) != len(slos):
        raise invalid("slos must be a non-empty list of SLOs of distinct names")
    return tuple(slos)


def _best(doc: Any, meta: Row) -> tuple[tuple[SLO, ...], dict[str, Optional[Row]]]:
    _keys(doc, _BEST)
    slos = _slos(doc["slos"])
    names = [s.name for s in slos]
    for key in ("slos", "rates", "objective", "strategy"):
        if (names if key == "slos" else doc[key]) != meta[key]:
            raise invalid(f"{key} do not match search.json's")
    if sorted(doc["best"]) != sorted(names):
        raise invalid(f"best must name each SLO ({', '.join(names)}) once, got {', '.join(map(str, doc['best']))}")
    check = row_checker(names)
    best: dict[str, Optional[Row]] = {}
    for s, row in doc["best"].items():
        best[s] = None if row is None else check(row, f"best[{s!r}]: ")
        if row is not None and row[f"{s}_state"] != "ok":
            raise invalid(f"best[{s!r}]: {s}_state must be 'ok'")
    return slos, best


def _list(doc: Any) -> list[Any]:
    if not isinstance(doc, list):
        raise invalid(f"must be a JSON list of rows, got {_shown(doc)}")
    return doc


def _rows(doc: list[Any], names: Sequence[str]) -> list[Row]:
    check = row_checker(names)
    return [check(row, f"row {i}: ") for i, row in enumerate(doc)]


def _latency(doc: Any, names: Sequence[str]) -> Row:
    lat = _keys(doc, _LATENCY)
    rates = lat["reference_rates"]
    if sorted(rates) != sorted(names):
        raise invalid(f"reference_rates must name each SLO ({', '.join(names)}) once")
    _keys(rates, {s: _or_null(_number(above=True)) for s in names}, "reference_rates: ")
    entries = [check_entry(e, f"entries[{i}]: ") for i, e in enumerate(lat["entries"])]
    front = [_respelled({**_POINT_DEFAULTS, **_keys(f, _FRONTIER, f"frontier[{i}]: ", more=_POINT_MORE)})
             for i, f in enumerate(lat["frontier"])]
    return {**lat, "entries": entries, "frontier": front}


def read_search(directory: str | os.PathLike[str]) -> SearchFolder:
    """The finished search in ``directory``, every file checked (see the module docstring).

    Raises:
        InvalidArgumentError: ``directory`` is not a folder, holds no search
            (``search.json``), an unfinished one (no ``points.json``: rerun the same
            search into it), or files that are not what the search writes (a
            TraceFormatError naming the file and what is wrong).
        OSError: a file cannot be read.
    """
    d = Path(directory)
    if not d.is_dir():
        raise invalid(f"search folder {d}: {'not a folder' if d.exists() else 'no such folder'}")
    if not (d / "search.json").is_file():
        raise invalid(f"search folder {d}: not the output of `pykvpool search` (no search.json)")
    meta = read_meta(d / "search.json")
    if not (d / "points.json").is_file():
        raise invalid(f"search folder {d}: the search did not finish (no points.json); run the same "
                      "`pykvpool search` into it again to complete it")
    points = _load(d, "points.json")
    _in_file(d / "points.json", lambda: _list(points))
    best_doc = _load(d, "best.json")
    slos, best = _in_file(d / "best.json", lambda: _best(best_doc, meta))
    names = [s.name for s in slos]
    rows = _in_file(d / "points.json", lambda: _rows(points, names))
    latency = None
    if (d / "latency.json").is_file():
        doc = _load(d, "latency.json")
        latency = _in_file(d / "latency.json", lambda: _latency(doc, names))
    return SearchFolder(d, meta["model"], meta["requests"], meta["strategy"], meta["objective"], best_doc["unit"],
                        slos, tuple(float(r) for r in best_doc["rates"]), rows, best, latency)
