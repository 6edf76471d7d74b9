"""The fixed cost of a small decode call: one layer's `decode_attention` over a batch
too small for the kernel to dominate (4 sequences x 64 tokens, 32 query / 8 KV heads,
head_dim 128, bf16), at 1 and 2 threads of the kernels' pool.

Per thread count: `--rounds` rounds of `--calls` back-to-back calls after a warm-up;
prints the fastest and the median round's microseconds per call. With one thread a call
runs on the calling thread (`runtime::threads::run_workers`); before that, every call
was handed to the pool's thread and waited for (`git checkout 5f15d03~1` and rebuild to
compare: 206 -> 82 us per call at 1 thread on the machine of `benches/RESULTS.md`).

Run: ``python benches/bench_small_decode.py [--rounds 7] [--calls 200]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pykvpool as kv
from benches.common import out_path, write_json

SEQS, TOKENS, HQ, HKV, D, BS = 4, 64, 32, 8, 128, 16


def per_call_us(rounds: int, calls: int) -> dict[int, tuple[float, float]]:
    """Threads -> (fastest, median) round's microseconds per call."""
    nb = SEQS * TOKENS // BS
    cache = kv.KvCache(1, nb, BS, HKV, D, "bf16")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((nb * BS, HKV, D), dtype=np.float32)
    cache.write(0, x, x, np.arange(nb * BS))
    tables = np.arange(nb).reshape(SEQS, TOKENS // BS)
    lens = np.full(SEQS, TOKENS)
    q = rng.standard_normal((SEQS, HQ, D), dtype=np.float32)
    before = kv.get_num_threads()
    out = {}
    try:
        for threads in (1, 2):
            kv.set_num_threads(threads)
            for _ in range(50):
                kv.decode_attention(cache, 0, q, tables, lens)
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(calls):
                    kv.decode_attention(cache, 0, q, tables, lens)
                times.append((time.perf_counter() - t0) / calls * 1e6)
            out[threads] = (min(times), float(np.median(times)))
    finally:
        kv.set_num_threads(before)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", help="JSON output path (default benches/out/bench_small_decode.json)")
    a = ap.parse_args()
    print(f"decode_attention, {SEQS} x {TOKENS} tokens, {HQ}/{HKV} heads, d {D}, bf16")
    print("| threads | us per call (fastest round) | median round |")
    print("|---|---|---|")
    res = per_call_us(a.rounds, a.calls)
    for t, (best, med) in res.items():
        print(f"| {t} | {best:.1f} | {med:.1f} |")
    rows = [dict(threads=t, us_per_call_best_round=best, us_per_call_median_round=med) for t, (best, med) in res.items()]
    write_json(dict(rounds=a.rounds, calls=a.calls, rows=rows), out_path(a.out, "bench_small_decode.json"))


if __name__ == "__main__":
    main()
