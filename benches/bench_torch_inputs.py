"""What reading float32 inputs in place saves: the same calls with C-contiguous inputs
(numpy and CPU torch tensors, read in place) and with the inputs copied
first, in one run.

Before they were read in place the bindings copied every float32 input into a Rust ``Vec`` (one
allocation and one ``memcpy``, the GIL held) before the call. A build cannot time its own
past, so the copy is put back explicitly: ``copied`` passes ``x.copy()`` (numpy's
allocation and ``memcpy`` of the same bytes, then the in-place read of the fresh array),
the work the old binding did for every call. Also timed: Fortran-order inputs, which
still go through the logical-order copy (element by element).

Cases:
  write:   ``KvCache.write`` of 4,096 tokens x 8 KV heads x 128 (f32 cache; K and V
           16 MiB each, 32 MiB per call), slots scattered over the cache's blocks;
  decode:  ``decode_attention`` at bench_attention's shape (a) (8 x 4,096 tokens,
           32 / 8 heads, d 128, f32): q is 128 KiB, so no gain is expected;
  prefill: ``prefill_attention`` at bench_prefill's shape (a) (8 x 512 new tokens over
           4,096 cached, 32 / 8 heads, d 128, causal, f32): q is 16 MiB against seconds
           of compute (``--quick``: bench_prefill's quick shape).

Per round each variant runs once (best of 3 calls for write and decode, one call for
prefill), in alternating order; reported: best time per variant, and per variant the
median over rounds of time(variant) / time(in place) with its IQR; ``copy share`` =
1 - 1 / that ratio for ``copied`` (the part of the old call that was the copy).

Run: ``python benches/bench_torch_inputs.py [--reps 15] [--prefill-reps 5] [--quick]
[--threads 1]`` (writes ``benches/out/bench_torch_inputs.json``; prints a markdown table).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

import numpy as np

import pykvpool as kv
from benches import bench_attention, bench_prefill
from benches.common import OUT_DIR, write_json


def torch_or_none() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def variants(call: Callable[..., Any], *xs: np.ndarray) -> dict[str, Callable[[], Any]]:
    """``call`` on the float inputs ``xs`` in place, copied first, Fortran-order, and as
    torch tensors (when torch is importable)."""
    fortran = [np.asfortranarray(x) for x in xs]
    out: dict[str, Callable[[], Any]] = {
        "in place": lambda: call(*xs),
        "copied": lambda: call(*(x.copy() for x in xs)),
        "fortran (logical-order copy)": lambda: call(*fortran),
    }
    torch = torch_or_none()
    if torch is not None:
        ts = [torch.from_numpy(x) for x in xs]
        out["torch in place"] = lambda: call(*ts)
    return out


def write_case() -> dict[str, Callable[[], Any]]:
    n, h, d = 4096, 8, 128
    rng = np.random.default_rng(0)
    cache = kv.KvCache(1, 2 * n // 16, 16, h, d)
    k, v = (rng.standard_normal((n, h, d), dtype=np.float32) for _ in range(2))
    slots = rng.permutation(2 * n)[:n].astype(np.int64)
    return variants(lambda k, v: cache.write(0, k, v, slots), k, v)


def decode_case() -> dict[str, Callable[[], Any]]:
    shape = bench_attention.shapes(1)["a"]
    caches, table, q = bench_attention.build(shape, ["f32"], seed=1)
    c, lens = caches["f32"], shape["lens"]
    return variants(lambda q: kv.decode_attention(c, 0, q, table, lens), q)


def prefill_case(quick: bool) -> dict[str, Callable[[], Any]]:
    data = bench_prefill.build(bench_prefill.shapes(quick)["a"])
    c = data["caches"]["f32"]
    return variants(lambda q: kv.prefill_attention(c, 0, q, data["indptr"], data["table"], data["lens"]), data["q"])


def measure(calls: dict[str, Callable[[], Any]], reps: int, per_round: int) -> dict[str, Any]:
    ref = np.asarray(calls["in place"]())
    for name, fn in calls.items():
        got = fn()
        if got is not None:
            assert np.array_equal(np.asarray(got), ref), f"{name} computes the same output"
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(reps):
        for name in (list(calls) if r % 2 else list(calls)[::-1]):
            best = float("inf")
            for _ in range(per_round):
                t = time.perf_counter()
                calls[name]()
                best = min(best, time.perf_counter() - t)
            times[name].append(best)
    base = np.array(times["in place"])
    rows = {}
    for name, ts in times.items():
        ratio = np.array(ts) / base
        rows[name] = dict(best_ms=min(ts) * 1e3, ratio=float(np.median(ratio)), q1=float(np.quantile(ratio, 0.25)),
                          q3=float(np.quantile(ratio, 0.75)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="bench_prefill's quick shape for prefill")
    ap.add_argument("--threads", type=int, default=None, help="kernel threads (default: pykvpool's)")
    ap.add_argument("--out", default=str(OUT_DIR / "bench_torch_inputs.json"))
    args = ap.parse_args()
    if args.threads:
        kv.set_num_threads(args.threads)
    results = {
        "write": measure(write_case(), args.reps, 3),
        "decode": measure(decode_case(), args.reps, 3),
        "prefill": measure(prefill_case(args.quick), args.prefill_reps, 1),
    }
    print(f"{kv.get_num_threads()} threads; load {os.getloadavg()}")
    print("| case | inputs | best ms | time / in place, per-round median [IQR] | copy share |")
    print("|---|---|---|---|---|")
    for case, rows in results.items():
        for name, r in rows.items():
            share = f"{100 * (1 - 1 / r['ratio']):.1f}%" if name == "copied" else ""
            print(f"| {case} | {name} | {r['best_ms']:.2f} | {r['ratio']:.3f} [{r['q1']:.3f}-{r['q3']:.3f}] | {share} |")
    write_json(dict(threads=kv.get_num_threads(), load=os.getloadavg(), results=results), args.out)


if __name__ == "__main__":
    main()
