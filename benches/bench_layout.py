"""Read pattern of a work item, measured on the real kernel: one KV head per item (reads
a scattered K tile and V tile, ``block_size x head_dim`` values each, two 8 KiB runs in f32
at d = 128) versus every KV head of a block per item (the block's K of every head, then
its V: one contiguous 128 KiB run in f32). The physical
layout (block-major, then head) makes the second possible; this is what chose it, and
the kernel's default ``kv_heads_per_item`` (all heads; set per call by
``tuning=KernelTuning(kv_heads_per_item=...)``).

Shape (a) of bench_attention.py: 8 x 4096 tokens, 32 q / 8 kv heads, d 128, block 16,
blocks scattered. Run: ``python benches/bench_layout.py`` (JSON in benches/out/).
"""

from __future__ import annotations

import pykvpool as kv
from benches.bench_attention import best_time, build, shapes
from benches.common import OUT_DIR, write_json


def main() -> None:
    shape = shapes(1)["a"]
    dtypes = ["f32", "bf16"]
    caches, table, q = build(shape, dtypes, seed=1)
    lens = shape["lens"]
    rows = []
    for t in (1, 2):
        kv.set_num_threads(t)
        probe = kv.read_bandwidth(threads=t)
        for dt in dtypes:
            nbytes = sum(lens) * shape["hkv"] * shape["d"] * 2 * (4 if dt == "f32" else 2)
            for kpi in (1, shape["hkv"]):
                tuning = kv.KernelTuning(kv_heads_per_item=kpi)
                best, _ = best_time(lambda: kv.decode_attention(caches[dt], 0, q, table, lens, tuning=tuning), 15)
                rows.append(dict(threads=t, dtype=dt, kv_heads_per_item=kpi, gbps=nbytes / best / 1e9,
                                 pct_probe=100 * nbytes / best / probe))
    write_json(rows, OUT_DIR / "bench_layout.json")
    print("| threads | dtype | KV heads per item (run length) | GB/s | % probe |")
    print("|---|---|---|---|---|")
    for r in rows:
        kib = r["kv_heads_per_item"] * 16 * 128 * (4 if r["dtype"] == "f32" else 2) // 1024
        run = f"{r['kv_heads_per_item']} ({'one' if r['kv_heads_per_item'] == shape['hkv'] else 'two'} "
        run += f"{2 * kib if r['kv_heads_per_item'] == shape['hkv'] else kib} KiB run{'' if r['kv_heads_per_item'] == shape['hkv'] else 's'})"
        print(f"| {r['threads']} | {r['dtype']} | {run} | {r['gbps']:.1f} | {r['pct_probe']:.0f}% |")


if __name__ == "__main__":
    main()
