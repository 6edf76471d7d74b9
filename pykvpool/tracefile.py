"""Reading trace files: one text decoder, one CSV/JSONL reader, one JSON-document reader
(:func:`read_json`: config and price files, a search's files) and one integer parser,
shared by the static sweeps (:func:`pykvpool.planning.workloads.read_trace`), the simulator
(:mod:`pykvpool.simulate.traces`), the prefix-cache replay (:mod:`pykvpool.prefix.replay`) and
the command line. Every problem is a :class:`~pykvpool.TraceFormatError` (an
``InvalidArgumentError``) whose message starts with ``file:line:``.

Three kinds of file, told apart by content (a ``.jsonl`` / ``.json`` name means JSONL):

- CSV with a header row (its first line that is neither blank nor a ``#`` comment holds
  a comma), e.g. the Azure LLM inference traces;
- JSONL, one JSON object per line, e.g. the Mooncake traces;
- lengths: one non-negative integer per line (blank lines and ``#`` comments skipped).

Files must be UTF-8 text (a UTF-8 byte-order mark is allowed): binary, UTF-16 and other
encodings are refused with the line of the first bad byte. Token counts are integers in
``0 ..`` :data:`MAX_TOKENS`; block keys in ``0 .. 2**63 - 1``; times finite numbers or
ISO date-times.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import numpy.typing as npt

from pykvpool._native import InvalidArgumentError
from pykvpool.errors import TraceFormatError, UnknownPresetError

__all__ = [
    "AZURE_COLUMNS",
    "MAX_FILE_BYTES",
    "MAX_KEY",
    "MAX_TOKENS",
    "MOONCAKE_COLUMNS",
    "NAMED_TRACES",
    "TraceColumns",
    "TraceTable",
    "csv_records",
    "file_kind",
    "jsonl_record",
    "jsonl_records",
    "named_trace_path",
    "parse_columns",
    "read_json",
    "read_table",
    "read_text",
    "to_count",
]

PathLike = Union[str, "os.PathLike[str]"]
I64 = npt.NDArray[np.int64]

MAX_TOKENS = 2**31 - 1
"""Largest token count a trace may give for one request (prompt, output or length)."""
MAX_KEY = 2**63 - 1
"""Largest block key (keys are stored as int64)."""
MAX_FILE_BYTES = 1 << 30
"""Largest file :func:`read_text` reads, bytes."""

#: Traces shipped in ``pykvpool/data``, by the name the command line accepts.
NAMED_TRACES: dict[str, str] = {
    "azure-conv": "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
    "azure-code": "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
    "mooncake": "mooncake_fast25/synthetic_trace.jsonl",
}

_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def named_trace_path(name: str) -> Path:
    """Path of a trace shipped in the package (``azure-conv``, ``azure-code``,
    ``mooncake``), wherever the current folder is.

    Raises:
        UnknownPresetError: another name.
        FileNotFoundError: the package was installed without its data files.
    """
    if name not in NAMED_TRACES:
        raise UnknownPresetError("trace", name, sorted(NAMED_TRACES))
    path = Path(str(resources.files("pykvpool") / "data" / NAMED_TRACES[name]))
    if not path.is_file():
        raise FileNotFoundError(2, "the package data is missing (reinstall pykvpool)", str(path))
    return path


def read_text(path: PathLike, max_bytes: int | None = None) -> str:
    """The whole file as text (at most ``max_bytes`` bytes, :data:`MAX_FILE_BYTES` unless
    given; a UTF-8 byte-order mark is dropped).

    Raises:
        TraceFormatError: (an InvalidArgumentError) a file that is not UTF-8 text
            (binary, UTF-16, Latin-1, ...), naming the line of the first bad byte, or one
            larger than ``max_bytes``.
        OSError: the file cannot be read.
    """
    p = os.fspath(path)
    data = _read_bytes(p, max_bytes)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise TraceFormatError(p, line, f"not UTF-8 text (byte 0x{data[e.start]:02x})") from None


def read_json(path: PathLike, max_bytes: int | None = None) -> Any:
    """The JSON document in the file at ``path`` (read by :func:`read_text`, at most
    ``max_bytes`` bytes).

    Raises:
        TraceFormatError: (an InvalidArgumentError) what :func:`read_text` refuses, or text
            that is not JSON, naming the line; a document nested deeper than Python's
            parser goes is refused the same way.
        OSError: the file cannot be read.
    """
    p = os.fspath(path)
    text = read_text(p, max_bytes)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(p, e.lineno, f"not valid JSON ({e.msg})") from None
    except RecursionError:
        raise TraceFormatError(p, 0, "not valid JSON (nested deeper than Python's parser goes)") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise TraceFormatError(p, 0, f"not valid JSON ({_short(e)})") from None


def _read_bytes(p: str, max_bytes: int | None = None) -> bytes:
    """The file's bytes, in chunks (a device or pipe works too), refusing a NUL byte or a
    UTF-16 byte-order mark as soon as it is read and anything above ``max_bytes``."""
    limit = MAX_FILE_BYTES if max_bytes is None else max_bytes
    chunks: list[bytes] = []
    size = lines = 0
    with open(p, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            if not chunks and chunk.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
                raise TraceFormatError(p, 1, "UTF-16 (or UTF-32) text; save the file as UTF-8")
            nul = chunk.find(b"\0")
            if nul >= 0:
                line = lines + chunk.count(b"\n", 0, nul) + 1
                raise TraceFormatError(p, line, "not text: a NUL byte (a binary or UTF-16 file?)")
            size += len(chunk)
            if size > limit:
                raise TraceFormatError(p, 0, f"larger than {limit:,} bytes")
            lines += chunk.count(b"\n")
            chunks.append(chunk)
    return b"".join(chunks)


def _lines(text: str) -> list[str]:
    """Lines split at ``\\n`` only (``str.splitlines`` also splits at U+2028 and other
    characters a JSON string may hold), without a trailing ``\\r``."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def _meaningful(text: str) -> Optional[tuple[int, str]]:
    for n, line in enumerate(_lines(text), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            return n, line
    return None


def file_kind(path: PathLike, text: str) -> str:
    """``"jsonl"``, ``"csv"`` or ``"lengths"`` (see the module docstring)."""
    if os.fspath(path).endswith((".jsonl", ".json")):
        return "jsonl"
    first = _meaningful(text)
    if first is None or "," not in first[1]:
        return "jsonl" if first is not None and first[1].lstrip().startswith("{") else "lengths"
    return "csv"


def jsonl_records(path: PathLike, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` for each non-blank line of a JSONL file.

    Raises:
        TraceFormatError: a line that is not JSON or not a JSON object.
    """
    for n, line in enumerate(_lines(text), 1):
        if line.strip():
            yield n, jsonl_record(path, n, line)


def jsonl_record(path: PathLike, line: int, text: Union[str, bytes]) -> dict[str, Any]:
    """``text``, line ``line`` of the JSONL file ``path``, as the JSON object it holds.

    Raises:
        TraceFormatError: ``text`` is not JSON (a line nested deeper than Python's parser
            goes included; bytes that are not UTF-8 too) or not a JSON object.
    """
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TraceFormatError(os.fspath(path), line, f"not JSON ({_short(e)})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(os.fspath(path), line, f"expected a JSON object, found {type(obj).__name__}")
    return obj


def csv_records(path: PathLike, text: str) -> tuple[int, list[str], Iterator[tuple[int, dict[str, str]]]]:
    """The header of a CSV file (its line and column names: the first row that is not
    blank or a ``#`` comment) and an iterator of ``(line, {column: field})`` over the
    rows after it.

    Raises:
        TraceFormatError: no header, a row with another number of fields than the
            header, a malformed CSV.
    """
    p = os.fspath(path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            if row and any(c.strip() for c in row) and not row[0].lstrip().startswith("#"):
                header = [c.strip() for c in row]
                return reader.line_num, header, _csv_rows(p, reader, header)
    except csv.Error as e:
        raise TraceFormatError(p, reader.line_num, f"malformed CSV ({e})") from None
    raise TraceFormatError(p, 0, "the file holds no request")


def _csv_rows(p: str, reader: Any, header: list[str]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        for row in reader:
            if not row or not any(c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise TraceFormatError(p, reader.line_num,
                                       f"expected {len(header)} fields, found {len(row)}")
            yield reader.line_num, dict(zip(header, row))
    except csv.Error as e:
        raise TraceFormatError(p, reader.line_num, f"malformed CSV ({e})") from None


def _short(e: BaseException, limit: int = 80) -> str:
    s = str(e) or type(e).__name__
    return s if len(s) <= limit else s[:limit] + "..."


def _show(value: Any) -> str:
    s = repr(value.strip() if isinstance(value, str) else value)
    return s if len(s) <= 40 else s[:37] + "..."


def to_count(value: Any, path: str, line: int, what: str, limit: int = MAX_TOKENS) -> int:
    """``value`` (a CSV string or a JSON number) as an integer in ``0 .. limit``.

    Raises:
        TraceFormatError: not an integer, negative, or above ``limit``.
    """
    v: Optional[int] = None
    if isinstance(value, str):
        try:
            v = int(value.strip())
        except ValueError:
            v = None
    elif isinstance(value, int) and not isinstance(value, bool):
        v = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        v = int(value)
    if v is None:
        raise TraceFormatError(path, line, f"{what} {_show(value)} is not an integer")
    if v < 0:
        raise TraceFormatError(path, line, f"{what} {v} is negative")
    if v > limit:
        raise TraceFormatError(path, line, f"{what} {_show(v)} exceeds the limit of {limit:,}")
    return v


@dataclass(frozen=True)
class TraceColumns:
    """Which field of a CSV or JSONL trace holds what.

    Attributes:
        prompt, output: token-count fields (prompt tokens, generated tokens).
        time: arrival-time field (numbers in ``time_unit`` seconds each, or ISO
            date-times); None: the trace has no times.
        priority: optional integer field (>= 0, lower first).
        keys: optional field holding a list of block keys per request (JSONL).
        time_unit: seconds per unit of a numeric time field.
    """

    prompt: str
    output: str
    time: Optional[str] = None
    priority: Optional[str] = None
    keys: Optional[str] = None
    time_unit: float = 1.0


#: The Azure LLM inference trace 2023 (CSV).
AZURE_COLUMNS = TraceColumns("ContextTokens", "GeneratedTokens", "TIMESTAMP")
#: Mooncake traces (JSONL, times in ms, 512-token block keys).
MOONCAKE_COLUMNS = TraceColumns("input_length", "output_length", "timestamp", keys="hash_ids",
                                time_unit=1e-3)


def parse_columns(spec: str) -> TraceColumns:
    """Parse ``prompt=NAME,output=NAME[,time=NAME][,priority=NAME][,keys=NAME][,unit=s|ms|us]``
    (the ``--columns`` option).

    Raises:
        InvalidArgumentError: an unknown role or unit, a role given twice, a missing name.
    """
    roles: dict[str, Any] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        role, eq, name = (x.strip() for x in part.partition("="))
        if not eq or not name:
            raise InvalidArgumentError(f"columns: expected ROLE=NAME, got {part!r}")
        if role in roles:
            raise InvalidArgumentError(f"columns: {role!r} given twice")
        if role == "unit":
            if name not in _UNITS:
                raise InvalidArgumentError(f"columns: unit must be one of s, ms, us, got {name!r}")
            roles["time_unit"] = _UNITS[name]
        elif role in ("prompt", "output", "time", "priority", "keys"):
            roles[role] = name
        else:
            raise InvalidArgumentError(
                f"columns: unknown role {role!r} (prompt, output, time, priority, keys, unit)")
    missing = [r for r in ("prompt", "output") if r not in roles]
    if missing:
        raise InvalidArgumentError(f"columns: must name {' and '.join(missing)}")
    return TraceColumns(**roles)


@dataclass(frozen=True)
class TraceTable:
    """The requests of one trace file, in file order.

    Attributes:
        path: the file; kind: ``csv``, ``jsonl`` or ``lengths``.
        lines: 1-based line of each request.
        prompt, output: token counts (None for a lengths file).
        lengths: prompt + output per request, or the lengths of a lengths file, tokens.
        time: arrival times in seconds from the earliest (file order; None when the
            trace has none or they were not asked for).
        priority: priorities, or None.
        keys, key_offsets: block keys concatenated, request ``i`` owning
            ``keys[key_offsets[i]:key_offsets[i + 1]]``; None without a key field.
    """

    path: str
    kind: str
    lines: I64
    prompt: Optional[I64]
    output: Optional[I64]
    lengths: I64
    time: Optional[npt.NDArray[np.float64]] = None
    priority: Optional[I64] = None
    keys: Optional[I64] = None
    key_offsets: Optional[I64] = None

    def __len__(self) -> int:
        return int(self.lines.size)


def read_table(
    path: PathLike,
    columns: Optional[TraceColumns] = None,
    *,
    kind: Optional[str] = None,
    want_time: bool = True,
    limit: Optional[int] = None,
) -> TraceTable:
    """Read a trace file (any of the three kinds).

    Args:
        columns: the fields of a CSV/JSONL trace; every one named must exist. None: the
            Azure names for CSV, the Mooncake names for JSONL, and then the time, priority
            and key fields are used only when the file has them.
        kind: ``csv``, ``jsonl`` or ``lengths``; None: guessed (see :func:`file_kind`).
        want_time: parse the time field (False: ignore it).
        limit: keep the first ``limit`` requests (>= 1).

    Raises:
        TraceFormatError: not UTF-8 text, no request, a missing field or column, a value
            that is not a count in ``0 ..`` :data:`MAX_TOKENS`, a bad time or key list.
        InvalidArgumentError: an unknown ``kind`` or a ``limit`` below 1.
        OSError: the file cannot be read.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidArgumentError(f"limit must be an integer >= 1, got {limit!r}")
    p = os.fspath(path)
    text = read_text(p)
    kind = kind or file_kind(p, text)
    if kind == "lengths":
        return _read_lengths(p, text, limit)
    if kind not in ("csv", "jsonl"):
        raise InvalidArgumentError(f"unknown trace format {kind!r} (csv, jsonl, lengths)")
    cols = columns or (AZURE_COLUMNS if kind == "csv" else MOONCAKE_COLUMNS)
    if kind == "csv":
        line, header, rows = csv_records(p, text)
        roles = _roles(cols, columns is None, want_time, header.__contains__)
        missing = [name for name in roles.values() if name not in header]
        if missing:
            shown = ", ".join(header[:12]) + (", ..." if len(header) > 12 else "")
            raise TraceFormatError(p, line, f"no {missing[0]!r} column (the header has: {shown}); "
                                   "name the columns with --columns")
        return _collect(p, kind, cols, roles, rows, limit)
    it = jsonl_records(p, text)
    first = next(it, None)
    if first is None:
        raise TraceFormatError(p, 0, "the file holds no request")
    roles = _roles(cols, columns is None, want_time, first[1].__contains__)
    return _collect(p, kind, cols, roles, _chain(first, it), limit)


def _chain(first: tuple[int, dict[str, Any]],
           rest: Iterator[tuple[int, dict[str, Any]]]) -> Iterator[tuple[int, dict[str, Any]]]:
    yield first
    yield from rest


def _roles(cols: TraceColumns, optional: bool, want_time: bool,
           present: Callable[[str], bool]) -> dict[str, str]:
    """The fields to read, by role: prompt and output always; time, priority and keys
    when named (and, with ``optional``, present in the file)."""
    roles = {"prompt": cols.prompt, "output": cols.output}
    for role in ("time", "priority", "keys"):
        name = getattr(cols, role)
        if name is None or (role == "time" and not want_time) or (optional and not present(name)):
            continue
        roles[role] = name
    return roles


def _read_lengths(p: str, text: str, limit: Optional[int]) -> TraceTable:
    lines: list[int] = []
    lengths: list[int] = []
    for n, raw in enumerate(_lines(text), 1):
        body = raw.split("#", 1)[0]
        if not body.strip():
            continue
        if limit is not None and len(lengths) >= limit:
            break
        value = to_count(body, p, n, "length")
        if value == 0:
            raise TraceFormatError(p, n, "length 0: every request holds at least one token")
        lines.append(n)
        lengths.append(value)
    if not lengths:
        raise TraceFormatError(p, 0, "the file holds no request")
    arr = np.asarray(lengths, dtype=np.int64)
    return TraceTable(p, "lengths", np.asarray(lines, dtype=np.int64), None, None, arr)


def _field(p: str, rec: Mapping[str, Any], line: int, name: str) -> Any:
    if name not in rec:
        raise TraceFormatError(p, line, f"no {name!r} field")
    return rec[name]


def _key_list(p: str, value: Any, line: int, name: str) -> list[int]:
    if not isinstance(value, list):
        raise TraceFormatError(p, line, f"{name} must be a list of integers")
    return [to_count(k, p, line, f"{name} entry", MAX_KEY) for k in value]


def _collect(p: str, kind: str, cols: TraceColumns, roles: dict[str, str],
             rows: Iterator[tuple[int, Mapping[str, Any]]], limit: Optional[int]) -> TraceTable:
    got: dict[str, list[Any]] = {role: [] for role in roles}
    lines: list[int] = []
    offsets = [0]
    for line, rec in rows:
        if limit is not None and len(lines) >= limit:
            break
        for role, name in roles.items():
            value = _field(p, rec, line, name)
            if role == "keys":
                got[role].extend(_key_list(p, value, line, name))
                offsets.append(len(got[role]))
            elif role == "time":
                got[role].append(value)
            else:
                got[role].append(to_count(value, p, line, name))
        lines.append(line)
    if not lines:
        raise TraceFormatError(p, 0, "the file holds a header but no request")
    ln = np.asarray(lines, dtype=np.int64)
    prompt = np.asarray(got["prompt"], dtype=np.int64)
    output = np.asarray(got["output"], dtype=np.int64)
    times = parse_times(got["time"], ln, p, roles["time"], cols.time_unit) if "time" in roles else None
    prios = np.asarray(got["priority"], dtype=np.int64) if "priority" in roles else None
    keys = np.asarray(got["keys"], dtype=np.int64) if "keys" in roles else None
    offs = np.asarray(offsets, dtype=np.int64) if "keys" in roles else None
    return TraceTable(p, kind, ln, prompt, output, prompt + output, times, prios, keys, offs)


def parse_times(values: list[Any], lines: I64, path: str, name: str,
                unit: float) -> npt.NDArray[np.float64]:
    """Seconds from the earliest value: numbers times ``unit`` (seconds each), or ISO
    date-times (all of one kind). Raises TraceFormatError (naming the line) for a value
    that is neither, or not finite."""
    try:
        t = np.asarray([None if isinstance(v, bool) else v for v in values], dtype=np.float64) * unit
    except (ValueError, TypeError, OverflowError):
        t = _datetimes(values, lines, path, name)
    bad = np.flatnonzero(~np.isfinite(t))
    if bad.size:
        i = int(bad[0])
        raise TraceFormatError(path, int(lines[i]), f"{name} {_show(values[i])} is not a finite time")
    out: npt.NDArray[np.float64] = t - t.min()
    if not np.all(np.isfinite(out)):
        raise TraceFormatError(path, 0, f"{name}: the times span more than a float holds")
    return out


def _datetimes(values: list[Any], lines: I64, path: str, name: str) -> npt.NDArray[np.float64]:
    try:
        if not all(isinstance(v, str) for v in values):
            raise ValueError
        ns = np.asarray([v.strip() for v in values], dtype="datetime64[ns]")
        if np.isnat(ns).any():
            raise ValueError
    except (ValueError, TypeError, OverflowError):
        for i, v in enumerate(values):
            try:
                ok = isinstance(v, str) and not np.isnat(np.datetime64(v.strip(), "ns"))
            except (ValueError, TypeError, OverflowError):
                ok = False
            if not ok:
                raise TraceFormatError(path, int(lines[i]),
                                       f"{name} {_show(v)} is neither a number nor a date-time") from None
        raise TraceFormatError(path, 0, f"{name}: mixed numbers and date-times") from None
    n64 = ns.astype(np.int64)
    out: npt.NDArray[np.float64] = (n64 - n64.min()).astype(np.float64) * 1e-9
    return out
