"""Where a streaming decode call's time goes (``benches/RESULTS.md``, "Decode attention"): the
call from memory against its two parts measured apart, per row of ``bench_quant.py``.

- *compute*: the same call (same shape, query and cache) with every block-table entry
  moved into the cache's first 4 blocks of one layer (``table % 4``: 128 KiB of an 8-bit
  cache of 8 KV heads, 256 KiB of bf16, 1 MiB of bf16 with 32), so its codes come from L2: the kernel's whole
  work (scores, softmax, ``P V``, the walk and its prefetch instructions) without waiting
  on memory. This is the kernel's own compute time, not the minimal instruction
  sequence of ``cargo bench --bench dot_rates`` (the instruction-mix roof).
- *read*: ``read_bandwidth(cache=c, block_tables=t, seq_lens=l)``, the runs the call
  reads in its order with nothing computed, as a time for the call's bytes.
- *memory*: the call on the scattered table, each call on the next of the caches'
  layers (enough layers that they do not fit the last-level cache: ``auto_layers``).

Per row: the median over rounds of each; ``exposed`` = (memory - max(compute, read)) /
min(compute, read), the share of the shorter part that the call does not hide behind the
longer (0: all of it hidden, the call as long as its longer part; 1: none); ``x bf16``:
bf16's memory time over the row's; and ``1.8x needs exposed <=``: the exposure at which
this row's compute and read times would give 1.8x bf16's tokens/s (negative: not even
with all of it hidden, as max(compute, read) exceeds bf16's time / 1.8). A round times
every row's three figures back to back, so a slow phase of a shared machine moves them
together, after one untimed sweep of the row's cache (memory unread for seconds reads
slower on some hosts: ``bench_quant.paired_ratios``).

    python benches/bench_overlap.py [--rounds 5] [--shape a|d] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any, Callable

import numpy as np

import pykvpool as kv
from benches.bench_quant import DTYPES, ROWS, SHAPE_KV_HEADS, build, streaming_layers
from benches.common import out_path, write_json

DEFAULT_ROWS = ["bf16", "int8", "fp8_e4m3", "fp8_e5m2", "int8_scores",
                "fp8_e4m3+fp16_reduction", "fp8_e5m2+fp16_reduction"]


def exposed(compute: float, read: float, memory: float) -> float:
    """The share of the shorter of ``compute`` and ``read`` (seconds) that a call taking
    ``memory`` seconds does not hide behind the longer: 0 when the call is as long as its
    longer part, 1 when it is their sum."""
    return (memory - max(compute, read)) / min(compute, read)


def exposure_for(target: float, compute: float, read: float, base_memory: float) -> float:
    """The exposure (as [`exposed`]) at which a call of these ``compute`` and ``read``
    seconds would run ``target`` times faster than a ``base_memory``-second one; negative
    when max(compute, read) alone is longer than ``base_memory / target``."""
    return exposed(compute, read, base_memory / target)


def hot_table(table: np.ndarray, blocks: int = 4) -> np.ndarray:
    """The block table with every entry moved into the first ``blocks`` blocks (padding,
    negative entries, kept)."""
    return np.where(table >= 0, table % blocks, table)


def measure(shape: str, rows: list[str], rounds: int, threads: int, clock: Callable[[], float],
            lens: list[int] | None = None, layers: int | None = None) -> dict[str, dict[str, list[float]]]:
    """Per row, the per-round seconds of ``compute``, ``read`` and ``memory`` (each the best
    of 3 calls or sweeps) on sequences of ``lens`` tokens (default 8 x 4,096) in caches of
    ``layers`` layers (default ``auto_layers``')."""
    lens, hkv, d = lens or [4096] * 8, SHAPE_KV_HEADS[shape], 128
    if layers is None:
        layers = streaming_layers(lens, hkv, d)
    dtypes = sorted({ROWS[r][0] for r in rows}, key=DTYPES.index)
    caches, table, q, _ = build(lens, 32, hkv, d, dtypes, seed=1, layers=layers)
    sl, hot, out = np.array(lens), hot_table(table), np.empty_like(q)
    turn = {dt: itertools.cycle(range(layers)) for dt in caches}
    kv.set_num_threads(threads)
    res: dict[str, dict[str, list[float]]] = {r: {"compute": [], "read": [], "memory": []} for r in rows}
    for _ in range(rounds):
        for name in rows:
            dt, kw, _ = ROWS[name]
            c = caches[dt]
            nbytes = sum(lens) * kv.KvCache.bytes_per_token(hkv, d, dt)
            # One untimed sweep of the whole cache first: memory left unread for seconds
            # reads slower on some hosts (`bench_quant.paired_ratios`), and a cache lies
            # unread while the other rows run.
            kv.read_bandwidth(cache=c, threads=threads, passes=1, clock="cpu")
            for part, tab in (("compute", hot), ("memory", table)):
                best = np.inf
                for _ in range(3):
                    lay = 0 if part == "compute" else next(turn[dt])
                    t0 = clock()
                    kv.decode_attention(c, lay, q, tab, sl, out=out, **kw)
                    best = min(best, clock() - t0)
                res[name][part].append(best)
            bw = max(kv.read_bandwidth(cache=c, threads=threads, passes=1, clock="cpu", block_tables=table,
                                       seq_lens=sl, layer=next(turn[dt])) for _ in range(3))
            res[name]["read"].append(nbytes / bw)
    return res


def summary(res: dict[str, dict[str, list[float]]], target: float = 1.8) -> list[dict[str, Any]]:
    """The table's rows from ``measure``'s seconds: medians, exposure, x bf16 and the
    exposure ``target`` x bf16 needs (None without a bf16 row)."""
    med = {name: {k: float(np.median(v)) for k, v in parts.items()} for name, parts in res.items()}
    base = med["bf16"]["memory"] if "bf16" in med else None
    return [dict(row=n, **m, exposed=exposed(m["compute"], m["read"], m["memory"]),
                 x_bf16=None if base is None else base / m["memory"],
                 needs=None if base is None else exposure_for(target, m["compute"], m["read"], base))
            for n, m in med.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shape", choices=sorted(SHAPE_KV_HEADS), default="a")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help="bench_quant.py rows, comma-separated")
    ap.add_argument("--out", help="JSON output path (default benches/out/bench_overlap.json)")
    args = ap.parse_args()
    rows = args.rows.split(",")
    if bad := [r for r in rows if r not in ROWS]:
        ap.error(f"--rows: unknown rows {bad}; known: {', '.join(ROWS)}")
    if not all(x.isdigit() and int(x) > 0 for x in args.threads.split(",")):
        ap.error(f"--threads: comma-separated positive thread counts, not {args.threads!r}")
    if args.rounds < 1:
        ap.error(f"--rounds: at least 1, not {args.rounds}")
    print(f"shape {args.shape}, {args.rounds} rounds, CPU clock; seconds are medians over rounds\n")
    print("| thr | row | compute ms (L2) | read ms (own pages, table order) | memory ms | exposed | x bf16 | "
          "1.8x needs exposed <= |\n|---|---|---|---|---|---|---|---|")
    fmt = "{:.2f}".format
    out = []
    for t in (int(x) for x in args.threads.split(",")):
        clock = time.thread_time if t == 1 else (lambda t=t: time.process_time() / t)
        for r in summary(measure(args.shape, rows, args.rounds, t, clock)):
            out.append(dict(threads=t, **r))
            print(f"| {t} | {r['row']} | {1e3 * r['compute']:.2f} | {1e3 * r['read']:.2f} | {1e3 * r['memory']:.2f} | "
                  f"{fmt(r['exposed'])} | {'-' if r['x_bf16'] is None else fmt(r['x_bf16'])} | "
                  f"{'-' if r['needs'] is None else fmt(r['needs'])} |")
    print("exposed: (memory - max(compute, read)) / min(compute, read), 0 when the shorter part is all hidden "
          "behind the longer, 1 when none of it is")
    write_json(dict(shape=args.shape, rounds=args.rounds, seconds_median=out), out_path(args.out, "bench_overlap.json"))


if __name__ == "__main__":
    main()
