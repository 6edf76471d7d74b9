"""Pages vs frames for the video stream cache: frame-aligned block sizes against
pages shared by two frames, in memory per stream at steady state and in chunk-attention
time, on Wan2.1-1.3B's frame geometry (1,560 tokens per latent frame on a 30 x 52 grid,
3-frame chunks).

Memory (exact, no timing): one LongLive stream (3 sink frames, a 12-frame window,
3-frame chunks) run for ``--chunks`` chunks through :class:`pykvpool.video.VideoCache`;
after every commit the pages it holds, and while a chunk is open the peak. Waste = slots
of held pages minus the tokens a query can still see (visible history + open chunk), in
tokens and in bytes at Wan2.1-1.3B's 184,320 bytes per bf16 token (30 layers x 12 KV
heads x 128 x K and V x 2 bytes).

Time: the attention of one steady-state chunk (queries of 3 frames over 1 sink frame, a
3-frame window and the chunk: 10,920 keys), one layer of ``--heads`` heads x 128, bf16
cache (the default), one ``VideoCache.attention`` call. Each round times every block size
once, in a rotating order; the median over ``--reps`` rounds and its ratio to 16-token
pages (per round, then the median) are reported, with min-max of the ratios. The machine
is shared: read the ratios.

Run: ``python benches/bench_video.py`` (writes ``benches/out/bench_video.json`` and prints
markdown tables); ``--quick`` for a small smoke run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from pykvpool.video import VideoCache

TPF, GRID, FPC = 1560, (30, 52), 3
WAN_BYTES_PER_TOKEN = 30 * 12 * 128 * 2 * 2
BLOCK_SIZES = [8, 16, 24, 32, 40, 64, 120]


def memory(bs: int, chunks: int, sinks: int = 3, window: int = 12) -> dict[str, Any]:
    """Pages and waste of one LongLive-like stream over ``chunks`` chunks (steady state:
    the chunks after the window filled)."""
    vc = VideoCache(num_layers=1, num_kv_heads=1, head_dim=1, tokens_per_frame=TPF, grid=GRID,
                    frames_per_chunk=FPC, sink_frames=sinks, window_frames=window,
                    num_blocks=-(-(sinks + window + 2 * FPC) * TPF // bs) + 4, block_size=bs, dtype="f32")
    vc.add_stream(0)
    steady = (sinks + window) // FPC + 1
    held, peak, waste, waste_open = [], [], [], []
    for c in range(chunks):
        vc.begin_chunk([0])
        st = vc.stats()["streams"][0]
        if c >= steady:
            peak.append(st["blocks"])
            waste_open.append(st["waste_tokens"])
        vc.commit_chunk([0])
        st = vc.stats()["streams"][0]
        if c >= steady:
            held.append(st["blocks"])
            waste.append(st["waste_tokens"])
    visible = (sinks + window) * TPF
    return {
        "block_size": bs, "frame_aligned": TPF % bs == 0,
        "pages_held": [min(held), max(held)], "pages_peak": max(peak),
        "tokens_held_max": max(held) * bs, "visible_tokens": visible,
        "waste_tokens": [min(waste), max(waste)], "waste_tokens_open": [min(waste_open), max(waste_open)],
        "waste_bytes_max": max(max(waste), max(waste_open)) * WAN_BYTES_PER_TOKEN,
        "waste_pct_max": 100 * max(waste) / visible,
    }


def steady_chunk(bs: int, heads: int, seed: int = 0) -> tuple[VideoCache, Any, np.ndarray]:
    """A cache whose one stream has its steady-state chunk open (sinks 1, window 3), K/V
    written; returns (cache, batch, q)."""
    rng = np.random.default_rng(seed)
    vc = VideoCache(num_layers=1, num_kv_heads=heads, head_dim=128, tokens_per_frame=TPF, grid=GRID,
                    frames_per_chunk=FPC, sink_frames=1, window_frames=3,
                    num_blocks=-(-(1 + 3 + 2 * FPC) * TPF // bs) + 4, block_size=bs, dtype="bf16")
    vc.add_stream(0)
    for _ in range(3):
        b = vc.begin_chunk([0])
        k = rng.standard_normal((b.num_tokens, heads, 128), dtype=np.float32)
        vc.write(0, k, k * 0.5, b)
        vc.commit_chunk([0])
    b = vc.begin_chunk([0])
    k = rng.standard_normal((b.num_tokens, heads, 128), dtype=np.float32)
    vc.write(0, k, -k, b)
    q = rng.standard_normal((b.num_tokens, heads, 128), dtype=np.float32)
    return vc, b, q


def timing(sizes: list[int], heads: int, reps: int) -> dict[int, dict[str, Any]]:
    setups = {bs: steady_chunk(bs, heads) for bs in sizes}
    keys = (1 + 3 + FPC) * TPF
    flops = 4 * 128 * heads * FPC * TPF * keys
    times: dict[int, list[float]] = {bs: [] for bs in sizes}
    outs = {}
    for r in range(reps):
        order = sizes[r % len(sizes):] + sizes[: r % len(sizes)]
        for bs in order:
            vc, b, q = setups[bs]
            t0 = time.perf_counter()
            outs[bs] = vc.attention(0, q, b)
            times[bs].append(time.perf_counter() - t0)
    ref = outs[16] if 16 in outs else outs[sizes[0]]
    res = {}
    for bs in sizes:
        base = times[16] if 16 in times else times[sizes[0]]
        ratios = [t16 / t for t16, t in zip(base, times[bs])]
        res[bs] = {"median_s": statistics.median(times[bs]), "best_s": min(times[bs]),
                   "gflops": flops / statistics.median(times[bs]) / 1e9,
                   "speed_vs_16": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
                   "max_diff_vs_16": float(np.abs(outs[bs] - ref).max())}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.chunks, a.heads, a.reps = 10, 1, 1
    mem = [memory(bs, a.chunks) for bs in BLOCK_SIZES]
    tim = timing(BLOCK_SIZES, a.heads, a.reps)
    print("| block size | frame-aligned | pages held (steady) | peak pages (chunk open) | waste tokens after commit"
          " | waste tokens, chunk open | max waste, Wan2.1 bf16 | max waste % |")
    print("|---|---|---|---|---|---|---|---|")
    for m in mem:
        aligned = "yes" if m["frame_aligned"] else "no"
        print(f"| {m['block_size']} | {aligned} | {m['pages_held'][0]}-{m['pages_held'][1]} "
              f"| {m['pages_peak']} | {m['waste_tokens'][0]}-{m['waste_tokens'][1]} "
              f"| {m['waste_tokens_open'][0]}-{m['waste_tokens_open'][1]} "
              f"| {m['waste_bytes_max'] / 2**20:.2f} MiB | {m['waste_pct_max']:.3f}% |")
    print(f"\nchunk attention, 1 layer x {a.heads} heads x 128, bf16 cache, {a.reps} rounds")
    print("| block size | median s | best s | GFLOP/s | speed vs 16 (median, range) | max |diff| vs 16 |")
    print("|---|---|---|---|---|---|")
    for bs, t in tim.items():
        print(f"| {bs} | {t['median_s']:.3f} | {t['best_s']:.3f} | {t['gflops']:.1f} | {t['speed_vs_16']:.2f} "
              f"({t['ratio_range'][0]:.2f}-{t['ratio_range'][1]:.2f}) | {t['max_diff_vs_16']:.1e} |")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_video.json").write_text(json.dumps({"memory": mem, "timing": tim, "args": vars(a)}, indent=1))


if __name__ == "__main__":
    main()
