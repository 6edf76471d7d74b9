"""Trace loading for the simulator: the Azure LLM inference CSVs, Mooncake JSONL, files of
one length per line, and any CSV or JSONL file given its column names. Each returns a
:class:`pykvpool.simulate.Workload` with arrival times in seconds relative to the first
request, sorted by arrival.

Every format is read by :mod:`pykvpool.tracefile` (the same reader as the static sweeps):
errors are :class:`pykvpool.TraceFormatError` naming the file and line (a missing column,
a value that is not a count, a non-JSON line, a file that is not UTF-8 text, an empty
file); ``OSError`` when the file cannot be read.

The shipped traces (``pykvpool/data``, see the README and LICENSE beside each):

- ``azure_llm_2023/AzureLLMInferenceTrace_{conv,code}.csv``: TIMESTAMP (datetime),
  ContextTokens, GeneratedTokens;
- ``mooncake_fast25/synthetic_trace.jsonl``: timestamp (ms), input_length,
  output_length, hash_ids (one chained key per 512-token block).

:func:`pykvpool.tracefile.named_trace_path` finds them by name (``azure-conv``,
``azure-code``, ``mooncake``).
"""

from __future__ import annotations

import math
import os
from typing import Optional, Union

import numpy as np

from pykvpool._native import InvalidArgumentError
from pykvpool.errors import TraceFormatError
from pykvpool.simulate.workload import LengthDist, Workload
from pykvpool.tracefile import AZURE_COLUMNS, MOONCAKE_COLUMNS, TraceColumns, TraceTable, read_table

__all__ = ["empirical", "from_table", "load_azure", "load_file", "load_mooncake", "load_trace"]

PathLike = Union[str, "os.PathLike[str]"]


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
    """Load any CSV or JSONL trace by naming its columns (every named column must exist).

    Args:
        arrival: column of arrival times: numbers (``time_unit`` seconds each, e.g. 1e-3
            for milliseconds) or ISO date-times.
        prompt_len, output_len: token-count columns; prompts must be >= 1 token, outputs
            below ``min_output`` are raised to it (the simulator needs one output token).
        priority: optional integer column.
        block_keys: optional column holding a list of integer block keys per request
            (JSONL), ``ceil(prompt / tokens_per_key)`` of them.
        fmt: ``csv`` or ``jsonl``; guessed from the extension and content when None.
        limit: keep the first ``limit`` rows.

    Raises:
        TraceFormatError: see the module docstring; InvalidArgumentError: a bad argument.
        OSError: the file cannot be read.
    """
    cols = TraceColumns(prompt_len, output_len, arrival, priority, block_keys, time_unit)
    table = read_table(path, cols, kind=fmt, limit=limit)
    return from_table(table, tokens_per_key=tokens_per_key, min_output=min_output)


def from_table(
    table: TraceTable,
    *,
    tokens_per_key: int = 512,
    min_output: int = 1,
    rate: float = 10.0,
    seed: int = 0,
    output: tuple[int, int] = (128, 384),
) -> Workload:
    """A simulator workload from a trace table, sorted by arrival (stable).

    A table without times arrives as a Poisson process at ``rate`` requests/s (seeded by
    ``seed``). A lengths file (one length L per line, as ``pykvpool sweep`` reads it)
    has no prompt/output split: each request's output is drawn uniformly from
    ``output`` (inclusive, seeded) and capped at ``L - 1``, its prompt is the rest (a
    length of 1 becomes prompt 1 + output 1).

    Raises:
        TraceFormatError: a prompt of 0 tokens, or a key list whose length is not
            ``ceil(prompt / tokens_per_key)``, naming the line.
        InvalidArgumentError: a bad ``rate``, ``output`` or ``min_output``.
    """
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise InvalidArgumentError(f"rate must be a finite number > 0 requests/s, got {rate!r}")
    if not 1 <= output[0] <= output[1] or min_output < 1:
        raise InvalidArgumentError(f"output must be 1 <= lo <= hi and min_output >= 1, got {output}, {min_output}")
    rng = np.random.default_rng(seed)
    if table.prompt is None or table.output is None:
        out = np.minimum(rng.integers(output[0], output[1] + 1, len(table)), np.maximum(table.lengths - 1, 1))
        prompt, outs = np.maximum(table.lengths - out, 1), out.astype(np.int64)
    else:
        prompt, outs = table.prompt, np.maximum(table.output, min_output)
    zero = np.flatnonzero(prompt < 1)
    if zero.size:
        raise TraceFormatError(table.path, int(table.lines[zero[0]]), "a prompt of 0 tokens (the simulator needs >= 1)")
    if table.time is None:
        gaps = rng.exponential(1.0 / rate, len(table))
        times = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    else:
        times = table.time
    order = np.argsort(times, kind="stable")
    w = Workload(
        arrival=np.ascontiguousarray(times[order], dtype=np.float64),
        prompt_len=np.ascontiguousarray(prompt[order], dtype=np.int64),
        output_len=np.ascontiguousarray(outs[order], dtype=np.int64),
        priority=None if table.priority is None else table.priority[order],
    )
    if table.keys is None or table.key_offsets is None:
        return w
    return _with_keys(w, table, order, tokens_per_key)


def _with_keys(w: Workload, table: TraceTable, order: np.ndarray, tokens_per_key: int) -> Workload:
    assert table.keys is not None and table.key_offsets is not None and table.prompt is not None
    if tokens_per_key < 1:
        raise InvalidArgumentError(f"tokens_per_key must be >= 1, got {tokens_per_key}")
    off = table.key_offsets
    counts = np.diff(off)
    want = -(-table.prompt // tokens_per_key)
    bad = np.flatnonzero(counts != want)
    if bad.size:
        i = int(bad[0])
        raise TraceFormatError(table.path, int(table.lines[i]),
                               f"{counts[i]} block keys for {table.prompt[i]} prompt tokens, "
                               f"expected ceil({table.prompt[i]}/{tokens_per_key}) = {want[i]}")
    parts = [table.keys[off[i] : off[i + 1]] for i in order]
    new_off = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(counts[order], out=new_off[1:])
    return Workload(
        arrival=w.arrival,
        prompt_len=w.prompt_len,
        output_len=w.output_len,
        priority=w.priority,
        block_keys=np.concatenate(parts) if parts else table.keys,
        key_offsets=new_off,
        tokens_per_key=tokens_per_key,
    )


def load_file(
    path: PathLike,
    columns: Optional[TraceColumns] = None,
    *,
    limit: Optional[int] = None,
    rate: float = 10.0,
    seed: int = 0,
    output: tuple[int, int] = (128, 384),
) -> Workload:
    """Whatever trace file ``path`` is (what ``pykvpool simulate --trace FILE`` reads):
    a CSV or JSONL trace (Azure or Mooncake column names by default, else ``columns``),
    or a file of one length per line. Traces without times, and lengths files, arrive at
    ``rate``; lengths are split as :func:`from_table` says.

    Raises:
        TraceFormatError, InvalidArgumentError, OSError.
    """
    table = read_table(path, columns, limit=limit)
    return from_table(table, rate=rate, seed=seed, output=output)


def load_azure(path: PathLike, limit: Optional[int] = None) -> Workload:
    """An Azure LLM inference trace (2023 CSV: TIMESTAMP, ContextTokens, GeneratedTokens),
    the first ``limit`` requests (all when None).

    Raises:
        TraceFormatError: (an InvalidArgumentError, naming file and line) a file that is
            not UTF-8 text or holds no request, a malformed row or a missing column, a
            token count that is not an integer in ``0 ..``
            :data:`pykvpool.tracefile.MAX_TOKENS`, a prompt of 0 tokens, or a time that is
            neither a number nor a date-time.
        InvalidArgumentError: ``limit`` below 1.
        OSError: the file cannot be read.
    """
    c = AZURE_COLUMNS
    return load_trace(path, arrival=str(c.time), prompt_len=c.prompt, output_len=c.output, limit=limit)


def load_mooncake(path: PathLike, limit: Optional[int] = None, with_keys: bool = True) -> Workload:
    """A Mooncake trace (JSONL: timestamp in ms, input_length, output_length, hash_ids of
    512-token blocks). ``with_keys=False`` drops the hash ids (lengths only). The first
    ``limit`` requests (all when None).

    Raises:
        TraceFormatError: (an InvalidArgumentError, naming file and line) a file that is
            not UTF-8 text or holds no request, a line that is not a JSON object, a missing
            field, a token count that is not an integer in ``0 ..``
            :data:`pykvpool.tracefile.MAX_TOKENS`, a prompt of 0 tokens, a bad time, or
            (with keys) a ``hash_ids`` that is not a list of ``ceil(input_length / 512)``
            integers in ``0 .. 2**63 - 1``.
        InvalidArgumentError: ``limit`` below 1.
        OSError: the file cannot be read.
    """
    c = MOONCAKE_COLUMNS
    return load_trace(path, arrival=str(c.time), prompt_len=c.prompt, output_len=c.output,
                      block_keys=c.keys if with_keys else None, tokens_per_key=512,
                      time_unit=c.time_unit, fmt="jsonl", limit=limit)


def empirical(values: np.ndarray) -> LengthDist:
    """An empirical length distribution (for :func:`pykvpool.simulate.synthetic_workload`)
    from a trace column, e.g. ``empirical(load_azure(p).prompt_len)``."""
    return ("empirical", [float(v) for v in np.asarray(values).ravel()])
