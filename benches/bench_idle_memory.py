"""How fast a KV cache's pages read after they lay unread for a while (``benches/RESULTS.md``,
"How the figures are taken"): on some hosts memory left unread for seconds reads slower the next time
(a virtual machine whose guest runs DAMON, for one), so a benchmark that leaves one cache
unread while it times another compares a cold cache with a warm one.

One bf16 cache of ``--layers`` layers (8 sequences x 4,096 tokens, 8 KV heads of 128 by
default: 128 MiB a layer) on a scattered block table, written, then read twice (warm).
Then per gap: sleep ``gap`` seconds, and sweep every layer once in table order
(``read_bandwidth(cache=..., block_tables=..., seq_lens=..., layer=...)``, one pass, CPU
clock, one thread). Reported per gap: the median and the range of the layers' read rates
(GB/s), and the median over the warm rate (the last sweep with no gap before it).

    python benches/bench_idle_memory.py [--gaps 0,0.1,0.3,1,2,4,8,15] [--layers 4] [--tokens 4096]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import pykvpool as kv
from benches.common import out_path, write_json


def sweep(cache: kv.KvCache, table: np.ndarray, seq_lens: np.ndarray) -> list[float]:
    """Each layer's table-order read rate, bytes/s, one pass each, in layer order."""
    return [kv.read_bandwidth(cache=cache, passes=1, clock="cpu", block_tables=table, seq_lens=seq_lens, layer=layer)
            for layer in range(cache.num_layers)]


def run(gaps: list[float], layers: int, tokens: int, seqs: int = 8, hkv: int = 8, d: int = 128,
        block_size: int = 16) -> list[dict[str, Any]]:
    """Per gap (seconds), the layers' read rates after that long unread, warm rate beside."""
    kv.set_num_threads(1)
    blocks = seqs * -(-tokens // block_size)
    rng = np.random.default_rng(0)
    table = rng.permutation(blocks).reshape(seqs, -1).astype(np.int64)
    seq_lens = np.full(seqs, tokens, np.int32)
    cache = kv.KvCache(layers, blocks, block_size, hkv, d, "bf16")
    rows = rng.standard_normal((block_size * blocks, hkv, d)).astype(np.float32)
    for layer in range(layers):
        cache.write(layer, rows, rows, np.arange(block_size * blocks))
    sweep(cache, table, seq_lens)
    warm = float(np.median(sweep(cache, table, seq_lens)))
    out = []
    for gap in gaps:
        time.sleep(gap)
        rates = sweep(cache, table, seq_lens)
        out.append(dict(gap=gap, median=float(np.median(rates)), low=min(rates), high=max(rates), warm=warm))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gaps", default="0,0.1,0.3,1,2,4,8,15", help="seconds unread before each sweep, comma-separated")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per sequence (8 sequences)")
    ap.add_argument("--out", help="JSON output path (default benches/out/bench_idle_memory.json)")
    args = ap.parse_args()
    try:
        gaps = [float(g) for g in args.gaps.split(",")]
    except ValueError:
        ap.error(f"--gaps: comma-separated seconds, not {args.gaps!r}")
    if any(not g >= 0 for g in gaps):
        ap.error(f"--gaps: seconds must be at least 0, not {args.gaps!r}")
    if args.layers < 1 or args.tokens < 1:
        ap.error("--layers and --tokens must be at least 1")
    print("| unread for (s) | GB/s, median (range over layers) | x warm |\n|---|---|---|")
    rows = run(gaps, args.layers, args.tokens)
    for r in rows:
        print(f"| {r['gap']:g} | {r['median'] / 1e9:.1f} ({r['low'] / 1e9:.1f}-{r['high'] / 1e9:.1f}) | "
              f"{r['median'] / r['warm']:.2f} |")
    write_json(dict(layers=args.layers, tokens=args.tokens, bytes_per_s=rows), out_path(args.out, "bench_idle_memory.json"))


if __name__ == "__main__":
    main()
