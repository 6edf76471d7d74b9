"""Sliding-window sequences grown through a real BlockPool to 100x their window: memory per
sequence stays flat and decode attention time does not grow with the logical length.

Two parts, one run:

1. Memory: a Gemma-like pool, ``[FullAttention(), SlidingWindow(4096, sink_tokens=4)]``,
   block 16; 8 sequences grown by 4,096-token chunks (each growth releases what the window
   no longer needs) to 409,600 tokens (100 windows). Per checkpoint: blocks each group
   holds per sequence, from ``stats()``; the full group grows with the length, the window
   group stays at ``ceil(4/16) + ceil(4095/16) + 1`` blocks.
2. Time: a Mistral-like pool, ``[SlidingWindow(4096, sink_tokens=4)]``, with a bf16
   ``KvCache`` (8 KV heads x 128), sequences grown the same way, and
   ``decode_attention_paged`` over the pool's own FlashInfer tables with
   ``kv_page_start`` (32 query heads), timed: four batches of 8 sequences, one per logical
   length, live in the pool at once and are timed round-robin; the baseline is the batch at
   8,192 tokens, so every ratio (median and quartiles of per-round ratios) shares the
   machine's noise.

Usage: ``python benches/bench_windows.py [--reps N] [--out FILE]``; writes a JSON file and
prints Markdown tables (``benches/RESULTS.md``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import pykvpool as kv

WINDOW, SINKS, BS, N, CHUNK = 4096, 4, 16, 8, 4096
CHECKPOINTS = (8_192, 32_768, 131_072, 409_600)


def grow_to(pool: kv.BlockPool, ids: list[int], length: int) -> None:
    """Grow every sequence to ``length`` tokens by chunks (one atomic step per chunk)."""
    while pool.seq_len(ids[0]) < length:
        n = min(CHUNK, length - pool.seq_len(ids[0]))
        pool.step(ids, n)


def memory_part() -> list[dict[str, Any]]:
    groups = [kv.FullAttention(), kv.SlidingWindow(WINDOW, sink_tokens=SINKS)]
    pool = kv.BlockPool(2 * N * (max(CHECKPOINTS) // BS + 300), BS, groups)
    ids = list(range(N))
    for s in ids:
        pool.add_sequence(s, 0)
    rows = []
    for length in CHECKPOINTS:
        grow_to(pool, ids, length)
        pool.step(ids)  # one decode token: the growth that releases the last chunk's early blocks
        st = pool.stats()
        rows.append(dict(length=pool.seq_len(0), full_blocks_per_seq=st.group_blocks[0] / N,
                         window_blocks_per_seq=st.group_blocks[1] / N,
                         window_holes_per_seq=st.group_holes[1] / N))
        pool.check_invariants()
    return rows


def time_part(reps: int) -> list[dict[str, Any]]:
    """Four batches of 8 sequences, one per checkpoint length, live in one pool at once;
    each round times one decode call per batch (round-robin)."""
    hkv, hq, d = 8, 32, 128
    per_seq = -(-SINKS // BS) + -(-(WINDOW - 1) // BS) + 1 + CHUNK // BS + 1
    batches = {c: list(range(i * N, (i + 1) * N)) for i, c in enumerate(CHECKPOINTS)}
    pool = kv.BlockPool(len(CHECKPOINTS) * N * per_seq + 16, BS, [kv.SlidingWindow(WINDOW, sink_tokens=SINKS)])
    cache = kv.KvCache(1, pool.num_blocks, BS, hkv, d, dtype="bf16")
    rng = np.random.default_rng(0)
    for arr in (cache.key(0), cache.value(0)):
        arr[...] = rng.standard_normal(arr.shape, dtype=np.float32).astype(arr.dtype)
    q = rng.standard_normal((N, hq, d), dtype=np.float32)
    for c, ids in batches.items():
        for s in ids:
            pool.add_sequence(s, 0)
        grow_to(pool, ids, c - 1)
        pool.step(ids)  # the decode token: logical length c
    pool.check_invariants()
    kw: dict[str, Any] = dict(window_left=WINDOW - 1, sink_tokens=SINKS)
    tables = {c: pool.flashinfer_tables(ids, group=0) for c, ids in batches.items()}
    held = {c: sum(int(np.diff(t[0])[i]) for i in range(N)) / N for c, t in tables.items()}
    out: dict[int, list[float]] = {c: [] for c in CHECKPOINTS}
    for _ in range(reps):
        for c in CHECKPOINTS:
            indptr, indices, last, start = tables[c]
            t0 = time.perf_counter()
            kv.decode_attention_paged(cache, 0, q, indptr, indices, last, kv_page_start=start, **kw)
            out[c].append(time.perf_counter() - t0)
    base = out[CHECKPOINTS[0]]
    rows = []
    for c in CHECKPOINTS:
        r = sorted(x / b for x, b in zip(out[c], base))
        q1, med, q3 = statistics.quantiles(r, n=4)
        rows.append(dict(length=c, stored_blocks_per_seq=held[c], us=1e6 * statistics.median(out[c]),
                         ratio=med, q1=q1, q3=q3))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=str(Path(__file__).with_name("out") / "bench_windows.json"))
    args = ap.parse_args()
    mem = memory_part()
    print(f"memory: [FullAttention(), SlidingWindow({WINDOW}, sink_tokens={SINKS})], block {BS}, {N} sequences")
    print("| logical length | full group blocks / seq | window group blocks / seq | window holes / seq |")
    print("|---:|---:|---:|---:|")
    for r in mem:
        print(f"| {r['length']:,} | {r['full_blocks_per_seq']:,.0f} | {r['window_blocks_per_seq']:,.0f} "
              f"| {r['window_holes_per_seq']:,.0f} |")
    tim = time_part(args.reps)
    print(f"\ndecode_attention_paged, window {WINDOW} + {SINKS} sinks, {N} x 32/8 heads, d 128, bf16, "
          f"{kv.get_num_threads()} threads, {args.reps} rounds; ratio = time / time at {CHECKPOINTS[0]:,}")
    print("| logical length | stored blocks / seq | median us | ratio (median [IQR]) |")
    print("|---:|---:|---:|---|")
    for r in tim:
        print(f"| {r['length']:,} | {r['stored_blocks_per_seq']:.0f} | {r['us']:.0f} | "
              f"{r['ratio']:.2f} [{r['q1']:.2f}-{r['q3']:.2f}] |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(memory=mem, time=tim), indent=1))


if __name__ == "__main__":
    main()
