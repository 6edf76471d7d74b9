"""Run a Rust timing bench and keep its figures as JSON, as the Python benchmarks do.

``python benches/rust_benches.py core_step [-- divan args]`` runs
``cargo bench --locked --bench core_step -- <divan args>``, echoes its table, parses it and
writes ``benches/out/core_step.json`` (or ``--out``) with the machine block of
``benches/common.py``; ``--all`` runs every divan bench in turn. divan 0.1 prints only its
tree table, so that table is what is parsed: per bench its path (``decode_step/211``),
fastest, slowest, median and mean in seconds, samples and iters, and, for a bench with a
counter, one ``throughput`` entry per counter row (the same four statistics, per second,
with divan's unit without its scale prefix, e.g. ``item/s``, ``B/s``).

``hybrid_step`` is timed by hand, not by divan (see its module doc); its printed table
(ns per token per pool) and ratio lines are parsed too. ``dot_rates`` prints its own
JSON line, read by ``benches/quant_roofs.py``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from benches.common import machine, out_path, write_json

DIVAN = ("core_step", "prefix_admit", "layout", "decode_rate")
HAND_ROLLED = ("hybrid_step",)
ROOT = Path(__file__).resolve().parents[1]
STATS = ("fastest", "slowest", "median", "mean")
#: Seconds per unit of a divan duration.
TIME = {"ps": 1e-12, "ns": 1e-9, "µs": 1e-6, "μs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0,
        "m": 60.0, "h": 3600.0, "d": 86400.0}
#: divan's throughput scale prefixes (``K``... decimal, ``Ki``... binary, bytes only).
SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
         "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
RATE = re.compile(r"^([0-9.]+) (K|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?(item/s|B/s|char/s|Hz)$")
BRANCH = re.compile(r"[├╰]─ ")


def clean(x: float) -> float:
    """``x`` to 12 significant digits: divan prints at most 4, the rest is scaling noise."""
    return float(f"{x:.12g}")


def seconds(cell: str, line: str) -> float:
    """A divan duration cell (``12.4 µs``) in seconds."""
    value, _, unit = cell.partition(" ")
    if unit not in TIME:
        raise ValueError(f"not a divan duration {cell!r} in line {line!r}")
    return clean(float(value) * TIME[unit])


def rate(cell: str, line: str) -> tuple[float, str]:
    """A divan throughput cell (``21.12 Gitem/s``): the rate per second and its unit."""
    m = RATE.match(cell)
    if not m:
        raise ValueError(f"not a divan throughput {cell!r} in line {line!r}")
    return clean(float(m[1]) * SCALE[m[2] or ""]), m[3]


def parse_divan(text: str) -> list[dict[str, Any]]:
    """The benches of divan's printed tree table in ``text`` (lines before its header, such
    as ``Timer precision``, are skipped). Raises ValueError on a line it cannot read."""
    lines = text.splitlines()
    head = next((i for i, ln in enumerate(lines) if re.search(r"\bfastest\s+│ slowest", ln)), None)
    if head is None:
        raise ValueError("no divan table (no 'fastest │ slowest' header) in the output")
    col = lines[head].index("fastest")
    rows: list[dict[str, Any]] = []
    path: list[str] = []
    for line in lines[head + 1:]:
        if not line.strip():
            continue
        tree, cells = line[:col], [c.strip() for c in line[col:].split("│")]
        if len(cells) != 6:
            raise ValueError(f"expected 6 columns after the bench name in line {line!r}")
        branch = BRANCH.search(tree)
        if branch is None:  # a counter row under the bench above it
            if tree.strip("│ ") or not rows or cells[4] or cells[5]:
                raise ValueError(f"unexpected row in the divan table: {line!r}")
            got = [rate(c, line) for c in cells[:4]]
            rows[-1].setdefault("throughput", []).append(
                {"unit": got[0][1], **{k: v for k, (v, _) in zip(STATS, got)}})
            continue
        depth, name = branch.start() // 3, tree[branch.end():].strip()
        if not name or depth > len(path):
            raise ValueError(f"bad tree row in the divan table: {line!r}")
        path[depth:] = [name]
        if any(cells):  # a leaf; a group row has empty cells
            try:
                samples, iters = int(cells[4]), int(cells[5])
            except ValueError:
                raise ValueError(f"samples and iters are not counts in line {line!r}") from None
            rows.append({"path": "/".join(path), **{k: seconds(c, line) for k, c in zip(STATS, cells)},
                         "samples": samples, "iters": iters})
    if not rows:
        raise ValueError("the divan table has no bench rows")
    return rows


def parse_hybrid_step(text: str) -> dict[str, Any]:
    """The figures ``hybrid_step`` prints: its run shape, min and median ns per token of
    each pool, and each ratio to ``BlockPool`` (of minima, median of per-round ratios)."""
    shape = re.search(r"decode step, (\d+) sequences, block size (\d+), (\d+) steps x (\d+) rounds", text)
    if shape is None:
        raise ValueError("no 'decode step, N sequences, ...' line in the hybrid_step output")
    pools = [{"pool": m[1], "min_ns_per_token": float(m[2]), "median_ns_per_token": float(m[3])}
             for m in re.finditer(r"^(BlockPool\S*(?: \[.*\])?)\s+([0-9.]+)\s+([0-9.]+)$", text, re.M)]
    ratios = [{"pools": f"{m[1]} / BlockPool", "of_minima": float(m[2]), "median_of_ratios": float(m[3])}
              for m in re.finditer(r"^(\[.*\]) / BlockPool: ([0-9.]+) \(of minima\), ([0-9.]+) \(median", text, re.M)]
    if len(pools) != 3 or len(ratios) != 2:
        raise ValueError(f"expected 3 pool rows and 2 ratio lines in the hybrid_step output, got {len(pools)}, {len(ratios)}")
    keys = ("sequences", "block_size", "steps", "rounds")
    return {**dict(zip(keys, map(int, shape.groups()))), "pools": pools, "ratios": ratios}


def run(name: str, args: list[str], out: str | None = None) -> Path:
    """Run bench ``name`` with ``args`` after ``--``, echo its output, write its JSON."""
    cmd = ["cargo", "bench", "--locked", "--bench", name, "--", *args]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, encoding="utf-8")
    print(proc.stdout, end="", flush=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited with status {proc.returncode}")
    parsed = parse_hybrid_step(proc.stdout) if name in HAND_ROLLED else {"benches": parse_divan(proc.stdout)}
    data = {"bench": name, "command": " ".join(cmd), "machine": machine(), **parsed}
    return write_json(data, out_path(out, f"{name}.json"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="rust_benches", description=__doc__.split("\n\n")[0])
    p.add_argument("bench", nargs="?", choices=DIVAN + HAND_ROLLED, help="the bench to run")
    p.add_argument("--all", action="store_true", help="run every divan bench: " + ", ".join(DIVAN))
    p.add_argument("--out", help="the JSON path (default benches/out/NAME.json); one bench only")
    a = p.parse_args(own)
    if a.all == bool(a.bench):
        p.error("give one bench or --all")
    if a.all and a.out:
        p.error("--out names one file: give one bench, not --all")
    for name in DIVAN if a.all else (a.bench,):
        try:
            print(f"wrote {run(name, extra, a.out)}")
        except (RuntimeError, ValueError) as e:
            print(f"rust_benches: error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
