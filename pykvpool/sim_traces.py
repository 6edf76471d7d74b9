"""Trace loading for the simulator: the Azure LLM inference CSVs, Mooncake JSONL, and any
CSV or JSONL file given a column mapping. Each returns a :class:`pykvpool.simulate.Workload`
with arrival times in seconds relative to the first request.

The traces of ``../shared/data`` (see its README for licenses and citations):

- ``azure_llm_2023/AzureLLMInferenceTrace_{conv,code}.csv``: TIMESTAMP (datetime),
  ContextTokens, GeneratedTokens;
- ``mooncake_fast25/synthetic_trace.jsonl``: timestamp (ms), input_length,
  output_length, hash_ids (one chained key per 512-token block).

Errors: ``FileNotFoundError`` for a missing file; ``ValueError`` (``KeyError`` for a
missing column) for a malformed row, naming the line.
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Iterator, Optional, Union

import numpy as np

from pykvpool.simulate import LengthDist, Workload

__all__ = ["empirical", "load_azure", "load_mooncake", "load_trace"]

PathLike = Union[str, "os.PathLike[str]"]


def _rows(path: PathLike, fmt: Optional[str]) -> Iterator[dict[str, Any]]:
    fmt = fmt or ("jsonl" if str(path).endswith((".jsonl", ".json")) else "csv")
    with open(path, newline="") as f:
        if fmt == "csv":
            yield from csv.DictReader(f)
        elif fmt == "jsonl":
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n}: not JSON: {e}") from None
        else:
            raise ValueError(f"unknown trace format {fmt!r} (csv, jsonl)")


def _times(values: list[Any], unit: float) -> np.ndarray:
    """Seconds from the first value; numbers are scaled by ``unit`` (seconds per unit),
    strings are parsed as ISO datetimes."""
    try:
        t = np.asarray(values, dtype=np.float64) * unit
    except ValueError:
        ns = np.asarray(values, dtype="datetime64[ns]").astype(np.int64)
        t = (ns - ns.min()).astype(np.float64) * 1e-9
    return t - t.min() if t.size else t


def load_trace(
    path: PathLike,
    *,
    arrival: str,
    prompt_len: str,
    output_len: str,
    priority: Optional[str] = None,
    block_keys: Optional[str] = None,
    tokens_per_key: int = 512,
    time_unit: float = 1.0,
    fmt: Optional[str] = None,
    limit: Optional[int] = None,
    min_output: int = 1,
) -> Workload:
    """Load any CSV or JSONL trace by naming its columns.

    Args:
        arrival: column of arrival times: numbers (``time_unit`` seconds each, e.g. 1e-3
            for milliseconds) or datetime strings.
        prompt_len, output_len: token-count columns; outputs below ``min_output`` are raised
            to it (the simulator needs at least one output token).
        priority: optional integer column.
        block_keys: optional column holding a list of integer block keys per request
            (JSONL), one per ``tokens_per_key`` prompt tokens.
        fmt: ``csv`` or ``jsonl``; guessed from the extension when None.
        limit: keep the first ``limit`` rows.

    Raises:
        OSError: the file cannot be read (``FileNotFoundError`` when it is missing).
        KeyError: a row lacks a named column (the message gives the row).
        ValueError: a row that is not JSON or holds a non-integer count or a bad time,
            or an unknown ``fmt``.
    """
    times: list[Any] = []
    prompts: list[int] = []
    outputs: list[int] = []
    prios: list[int] = []
    keys: list[int] = []
    offsets = [0]
    for n, row in enumerate(_rows(path, fmt)):
        if limit is not None and n >= limit:
            break
        try:
            times.append(row[arrival])
            prompts.append(int(row[prompt_len]))
            outputs.append(max(min_output, int(row[output_len])))
            if priority is not None:
                prios.append(int(row[priority]))
            if block_keys is not None:
                keys.extend(int(k) for k in row[block_keys])
                offsets.append(len(keys))
        except KeyError as e:
            raise KeyError(f"{path}: row {n + 1} has no column {e}") from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: row {n + 1}: {e}") from None
    order = np.argsort(_times(times, time_unit), kind="stable")
    t = _times(times, time_unit)[order]
    w = Workload(
        arrival=t,
        prompt_len=np.asarray(prompts, dtype=np.int64)[order],
        output_len=np.asarray(outputs, dtype=np.int64)[order],
        priority=np.asarray(prios, dtype=np.int64)[order] if priority is not None else None,
    )
    if block_keys is None:
        return w
    off = np.asarray(offsets, dtype=np.int64)
    k = np.asarray(keys, dtype=np.int64)
    parts = [k[off[i] : off[i + 1]] for i in order]
    new_off = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=new_off[1:])
    return Workload(
        arrival=w.arrival,
        prompt_len=w.prompt_len,
        output_len=w.output_len,
        priority=w.priority,
        block_keys=np.concatenate(parts) if parts else k,
        key_offsets=new_off,
        tokens_per_key=tokens_per_key,
    )


def load_azure(path: PathLike, limit: Optional[int] = None) -> Workload:
    """An Azure LLM inference trace (2023 CSV: TIMESTAMP, ContextTokens, GeneratedTokens).

    Raises:
        OSError, KeyError, ValueError: as :func:`load_trace`.
    """
    return load_trace(path, arrival="TIMESTAMP", prompt_len="ContextTokens", output_len="GeneratedTokens", limit=limit)


def load_mooncake(path: PathLike, limit: Optional[int] = None, with_keys: bool = True) -> Workload:
    """A Mooncake trace (JSONL: timestamp in ms, input_length, output_length, hash_ids of
    512-token blocks). ``with_keys=False`` drops the hash ids (lengths only).

    Raises:
        OSError, KeyError, ValueError: as :func:`load_trace`.
    """
    return load_trace(
        path,
        arrival="timestamp",
        prompt_len="input_length",
        output_len="output_length",
        block_keys="hash_ids" if with_keys else None,
        tokens_per_key=512,
        time_unit=1e-3,
        fmt="jsonl",
        limit=limit,
    )


def empirical(values: np.ndarray) -> LengthDist:
    """An empirical length distribution (for :func:`pykvpool.simulate.synthetic_workload`)
    from a trace column, e.g. ``empirical(load_azure(p).prompt_len)``."""
    return ("empirical", [float(v) for v in np.asarray(values).ravel()])
