"""What the Python benchmarks share: where and how they write their figures (JSON under
``benches/out/``), the machine they ran on, the median-and-quartiles summary of repeated
measurements, the timing of one call, the cyclic GC switched off while timing, and the
cells of their printed tables.

This module imports the standard library and numpy only, never pykvpool:
``benches/ab_decode.py`` imports pykvpool from a build directory of its choosing, after
importing this module.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

#: Where the benchmarks write their JSON by default.
OUT_DIR = Path(__file__).resolve().parent / "out"


def out_path(given: str | Path | None, name: str) -> Path:
    """The JSON path of a run: ``given`` (a ``--out`` argument) or ``OUT_DIR / name``."""
    return Path(given) if given else OUT_DIR / name


def write_json(data: Any, path: str | Path, indent: int = 2) -> Path:
    """Write ``data`` as JSON (creating the folder), ending with a newline; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent) + "\n", encoding="utf-8")
    return path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """The machine and versions a run's figures come from."""
    try:
        version = importlib.metadata.version("pykvpool")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"cpu": cpu_model(), "arch": platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__, "pykvpool": version}


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile of ``values`` (numpy's linear rule)."""
    q1, med, q3 = (float(x) for x in np.percentile(values, [25, 50, 75]))
    return q1, med, q3


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median of ``values`` with its spread: quartiles (``q1``, ``q3``), ``min``, ``max``
    and the number of ``runs``."""
    q1, med, q3 = quartiles(values)
    return {"median": med, "q1": q1, "q3": q3, "min": float(min(values)), "max": float(max(values)),
            "runs": len(values)}


def fmt_spread(s: dict[str, float], digits: int = 1) -> str:
    """A :func:`spread` as ``median (IQR q1-q3, min-max lo-hi)``."""
    return (f"{s['median']:.{digits}f} (IQR {s['q1']:.{digits}f}-{s['q3']:.{digits}f}, "
            f"min-max {s['min']:.{digits}f}-{s['max']:.{digits}f})")


def fmt(v: float | None, digits: int = 3) -> str:
    """A table cell: ``v`` to ``digits`` decimals, ``-`` for None."""
    return "-" if v is None else f"{v:.{digits}f}"


def verdict(value: float | None, limit: float, higher_is_better: bool = False) -> str:
    """``PASS`` or ``FAIL`` of ``value`` against a target ``limit`` (``n/a`` for None)."""
    if value is None:
        return "n/a"
    ok = value >= limit if higher_is_better else value <= limit
    return "PASS" if ok else "FAIL"


def timed(fn: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds (by ``clock``) of one call of ``fn``."""
    t0 = clock()
    fn()
    return clock() - t0


@contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off (after one collection) for the block, as ``timeit``
    does: a collection triggered by one engine's garbage would otherwise land inside
    whichever call is being timed."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
