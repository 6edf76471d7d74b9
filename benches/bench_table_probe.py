"""The read roof of a decode call's access pattern against the front-to-back stream
(``benches/RESULTS.md``, "How the figures are taken").

``pykvpool.read_bandwidth(cache=c)`` streams a cache's pages front to back;
``read_bandwidth(cache=c, block_tables=t, seq_lens=l)`` reads exactly the runs
``decode_attention`` reads for those tables (one run per block: its K and V tiles of
every KV head, plus an int8 block's scales), in table order, split into the call's work
items, with no compute. On ``bench_quant.py``'s caches (8 sequences x 4,096 tokens,
head_dim 128, block size 16, blocks scattered by a random permutation; ``a``: 8 KV heads,
``d``: 32; as many layers as ``auto_layers`` gives, each table sweep on the next layer, so
that the sweeps read memory rather than the last-level cache), ``--rounds`` rounds
alternate the two probes (best of 3 passes or sweeps, by the CPU clock) on each dtype and thread
count; printed: the median GB/s of each and the median and quartiles of the per-round
ratio table / stream.

    python benches/bench_table_probe.py [--rounds 15] [--shape a|d] [--dtypes int8,bf16]
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np

import pykvpool as kv
from benches.bench_quant import DTYPES, SHAPE_KV_HEADS, build, streaming_layers
from benches.common import out_path, quartiles, write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--shape", choices=sorted(SHAPE_KV_HEADS), default="a")
    ap.add_argument("--dtypes", default="int8,bf16")
    ap.add_argument("--out", help="JSON output path (default benches/out/bench_table_probe.json)")
    args = ap.parse_args()
    lens = [4096] * 8
    dtypes = args.dtypes.split(",")
    if args.rounds < 1:
        ap.error(f"--rounds: at least 1, not {args.rounds}")
    if bad := [dt for dt in dtypes if dt not in DTYPES]:
        ap.error(f"--dtypes: unknown dtypes {bad}; known: {', '.join(DTYPES)}")
    layers = streaming_layers(lens, SHAPE_KV_HEADS[args.shape])
    caches, table, _, _ = build(lens, 32, SHAPE_KV_HEADS[args.shape], 128, dtypes, seed=1, layers=layers)
    sl = np.array(lens)
    print(f"shape {args.shape}, {layers} layer(s), {args.rounds} rounds, best of 3 each, CPU clock\n")
    print("| dtype | threads | stream GB/s | table order GB/s | table / stream (IQR) |\n|---|---|---|---|---|")
    out = []
    for dt in dtypes:
        c = caches[dt]
        turn = itertools.cycle(range(layers))
        for t in (1, 2):
            seq, tab = [], []
            for _ in range(args.rounds):
                seq.append(kv.read_bandwidth(cache=c, threads=t, passes=3, clock="cpu"))
                # Best of 3 sweeps, each on the next layer (passes over one layer would
                # re-read it from the last-level cache).
                tab.append(max(kv.read_bandwidth(cache=c, threads=t, passes=1, clock="cpu", block_tables=table,
                                                 seq_lens=sl, layer=next(turn)) for _ in range(3)))
            q1, med, q3 = quartiles(np.array(tab) / np.array(seq))
            out.append(dict(dtype=dt, threads=t, stream_gbs=np.median(seq) / 1e9, table_gbs=np.median(tab) / 1e9,
                            ratio=med, ratio_q1=q1, ratio_q3=q3))
            print(f"| {dt} | {t} | {np.median(seq) / 1e9:.1f} | {np.median(tab) / 1e9:.1f} | "
                  f"{med:.2f} ({q1:.2f}-{q3:.2f}) |")
    write_json(dict(shape=args.shape, layers=layers, rounds=args.rounds, rows=out), out_path(args.out, "bench_table_probe.json"))


if __name__ == "__main__":
    main()
