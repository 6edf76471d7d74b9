"""Paired A/B of two builds of pykvpool on prefill attention, as ``ab_decode.py --interleave``
does for decode: both builds' native modules are loaded side by side in one process (see
``ab_decode.load_extension``), each writes the same seeded cache, and the calls alternate
A, B, B, A, ... ``--pairs`` pairs per row, timed by the thread's CPU time at 1 thread.
Reported per row: the median and quartiles of the per-pair ratios B / A and the ratio of
the best calls (below 1: B is faster), and the largest difference between the two builds'
outputs (0 where they agree bit for bit).

Shapes (block size 16, blocks scattered by a random permutation): ``a`` 2 sequences of
128 new tokens over 1,024 cached, 32 query / 8 KV heads, head_dim 128, causal (text
prefill, a quarter of ``bench_prefill.py``'s (a)); ``b`` one 390-token video chunk over
1,560 cached, 12 / 12 heads, block-causal (a quarter of its (b)); ``d80`` 2 x 96 over 512,
8 / 2 heads, head_dim 80 (a head_dim that is no multiple of the widest vector's pass).
Rows: every cache dtype and precision in ``ROWS``, on each path of ``--isa``.

Run: ``python benches/ab_prefill.py A B [--pairs 15] [--isa avx512,avx2] [--shapes a,b,d80]``
where A and B are directories that each hold a ``pykvpool`` package with its built module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benches.ab_decode import load_native, summarize_pairs  # noqa: E402

BS = 16
SHAPES = {
    "a": dict(n=2, cached=1024, new=128, hq=32, hkv=8, d=128, chunk=None),
    "b": dict(n=1, cached=1560, new=390, hq=12, hkv=12, d=128, chunk=390),
    "d80": dict(n=2, cached=512, new=96, hq=8, hkv=2, d=80, chunk=None),
}
ROWS: list[tuple[str, dict[str, str]]] = [
    ("f32", {}), ("bf16", {}), ("bf16", {"q_dtype": "bf16"}), ("bf16", {"q_dtype": "bf16", "pv_dtype": "bf16"}),
    ("int8", {}), ("fp8_e4m3", {}),
]


def row_name(dtype: str, kw: dict[str, str]) -> str:
    return "+".join([dtype, *(f"{k}={v}" for k, v in kw.items())])


def run_shape(natives: list[Any], sh: dict[str, Any], isa: str, pairs: int) -> list[dict[str, Any]]:
    """Every row of ``ROWS`` on one shape and path: its pair summary and the outputs' difference."""
    rng = np.random.default_rng(0)
    n, hkv, d, length = sh["n"], sh["hkv"], sh["d"], sh["cached"] + sh["new"]
    nb = n * -(-length // BS) + 1
    k, v = (rng.standard_normal((nb * BS, hkv, d), dtype=np.float32) for _ in range(2))
    table = rng.permutation(nb)[: nb - 1].reshape(n, -1).astype(np.int32)
    q = rng.standard_normal((n * sh["new"], sh["hq"], d), dtype=np.float32)
    indptr = np.arange(n + 1) * sh["new"]
    out = []
    for dtype, kw in ROWS:
        calls = []
        for m in natives:
            m.set_num_threads(1)
            c = m.KvCache(1, nb, BS, hkv, d, dtype)
            c.write(0, k, v, np.arange(nb * BS))
            t = m.KernelTuning(isa=isa)
            calls.append(lambda m=m, c=c, t=t: m.prefill_attention(c, 0, q, indptr, table, [length] * n, causal=True,
                                                                     chunk_size=sh["chunk"], tuning=t, **kw))
        diff = float(np.max(np.abs(np.asarray(calls[0]()) - np.asarray(calls[1]()))))
        times = []
        for i in range(pairs):
            ts = [0.0, 0.0]
            for j in ((0, 1) if i % 2 == 0 else (1, 0)):
                t0 = time.thread_time()
                calls[j]()
                ts[j] = time.thread_time() - t0
            times.append((ts[0], ts[1]))
        out.append({"row": row_name(dtype, kw), "isa": isa, **summarize_pairs(times), "max_diff": diff})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="directory holding build A's pykvpool package")
    ap.add_argument("b", help="directory holding build B's pykvpool package")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--isa", default="avx512,avx2", help="kernel paths, each forced by tuning=KernelTuning(isa=...)")
    ap.add_argument("--shapes", default="a,b,d80")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "ab_prefill.json"))
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"shape {s!r}: one of {', '.join(SHAPES)}")
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    for side in (args.a, args.b):
        if not os.path.isdir(os.path.join(side, "pykvpool")):
            ap.error(f"{side} holds no pykvpool package")
    natives = [load_native(args.a), load_native(args.b)]
    paths = natives[0].kernel_paths()
    isas = [i for i in args.isa.split(",") if i in paths]
    result: dict[str, Any] = {"pairs": args.pairs, "shapes": {}}
    print(f"B / A time, prefill, 1 thread, {args.pairs} interleaved pairs of calls (paths: {', '.join(isas)})")
    print("| shape | path | row | median | quartiles | best calls | max difference |\n|---|---|---|---|---|---|---|")
    for s in shapes:
        rows = [r for isa in isas for r in run_shape(natives, SHAPES[s], isa, args.pairs)]
        result["shapes"][s] = rows
        for r in rows:
            print(f"| {s} | {r['isa']} | {r['row']} | {r['median']:.3f} | {r['q1']:.3f}-{r['q3']:.3f} | "
                  f"{r['best']:.3f} | {r['max_diff']:.2e} |", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
