"""Decode with a logit soft cap (Gemma-2: each logit ``x`` becomes ``cap * tanh(x / cap)``):
what the cap costs ``decode_attention``, and what it saves against the route Gemma-2's
decode steps took before decode had a cap (``prefill_attention`` with one query per
sequence, ``qo_indptr = arange(n + 1)``, the same cap), in one run.

Every kernel path applies the cap as a const-generic instantiation of its tile loop (calls
without a cap keep the loop they had), so (a) capped / uncapped decode should be a little
over 1 (a ``tanh`` per logit), and (b) capped decode / capped one-query prefill under 1
(the ratio ``pykvpool.hf`` gained on Gemma-2's decode steps by switching routes).

Shapes (head_dim 128, block size 16, blocks scattered by a random permutation, K, V and q
standard normal, fp8 scales set from the data's range): ``l2``, 1 sequence x 2,048
tokens, 4 query / 1 KV heads (a 1 MiB bf16 cache: L2-resident, the kernel's compute);
``batch``, 64 x 512 tokens, 32 / 8 heads (a 64 MiB bf16 cache, from memory or L3). Per
dtype, shape and comparison: ``--pairs`` pairs of calls alternating their order
(``bench_quant.paired_ratios``; CPU time of the calling thread, 1 thread), the median and
quartiles of the per-pair time ratio.

    python benches/bench_soft_cap.py [--dtypes bf16,int8,fp8_e4m3] [--shapes l2,batch]
        [--pairs N (default 1000 for l2, 200 for batch)] [--tokens T] [--out FILE]
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np

import pykvpool as kv
from benches.bench_quant import build, paired_ratios
from benches.common import out_path, quartiles, write_json

D, BS, CAP = 128, 16, 50.0
#: name: (sequences, tokens per sequence, query heads, KV heads, default pairs)
SHAPES = {"l2": (1, 2048, 4, 1, 1000), "batch": (64, 512, 32, 8, 200)}
DTYPES = ("bf16", "int8", "fp8_e4m3", "fp8_e5m2", "f16", "f32")
#: case: the time ratio it reports
CASES = {"cap_cost": "capped / uncapped decode", "vs_prefill": "capped decode / capped one-query prefill"}


def routes(dtype: str, shape: str, tokens: int | None = None) -> tuple[dict[str, Callable[[], None]],
                                                                       dict[str, np.ndarray]]:
    """The three calls of one cell on the bench's inputs (``tokens`` per sequence overrides
    the shape's), ``decode``, ``decode_cap`` and ``prefill_cap``, and the arrays each
    writes its output to, by the same names."""
    n, t, hq, hkv, _ = SHAPES[shape]
    lens = [tokens or t] * n
    caches, table, q, _ = build(lens, hq, hkv, D, [dtype], seed=1)
    c, sl, indptr = caches[dtype], np.array(lens), np.arange(n + 1, dtype=np.int64)
    outs = {k: np.empty_like(q) for k in ("decode", "decode_cap", "prefill_cap")}

    def decode() -> None:
        kv.decode_attention(c, 0, q, table, sl, out=outs["decode"])

    def decode_cap() -> None:
        kv.decode_attention(c, 0, q, table, sl, out=outs["decode_cap"], logits_soft_cap=CAP)

    def prefill_cap() -> None:
        kv.prefill_attention(c, 0, q, indptr, table, sl, logits_soft_cap=CAP, out=outs["prefill_cap"])

    return {"decode": decode, "decode_cap": decode_cap, "prefill_cap": prefill_cap}, outs


def measure(dtypes: list[str], shapes: list[str], pairs: int | None,
            tokens: int | None) -> dict[str, dict[str, dict[str, list[float]]]]:
    """Per dtype, shape and case, the per-pair time ratios (``CASES``)."""
    kv.set_num_threads(1)
    res: dict[str, dict[str, dict[str, list[float]]]] = {}
    for dt in dtypes:
        for shape in shapes:
            r, _ = routes(dt, shape, tokens)
            p = pairs or SHAPES[shape][4]

            def warm(r: dict[str, Callable[[], None]] = r) -> None:
                for f in r.values():
                    f()

            res.setdefault(dt, {})[shape] = {
                "cap_cost": paired_ratios(r["decode_cap"], r["decode"], p, time.thread_time, warm),
                "vs_prefill": paired_ratios(r["decode_cap"], r["prefill_cap"], p, time.thread_time, warm)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="bf16,int8,fp8_e4m3", help="cache dtypes, comma-separated")
    ap.add_argument("--shapes", default="l2,batch", help=f"shapes, comma-separated ({', '.join(SHAPES)})")
    ap.add_argument("--pairs", type=int, help="pairs per cell (default: 1000 for l2, 200 for batch)")
    ap.add_argument("--tokens", type=int, help="tokens per sequence for every shape (a multiple of 16)")
    ap.add_argument("--out", help="JSON output path (default benches/out/bench_soft_cap.json)")
    args = ap.parse_args()
    dtypes, shapes = args.dtypes.split(","), args.shapes.split(",")
    if bad := [d for d in dtypes if d not in DTYPES]:
        ap.error(f"--dtypes: unknown dtypes {bad}; known: {', '.join(DTYPES)}")
    if bad := [s for s in shapes if s not in SHAPES]:
        ap.error(f"--shapes: unknown shapes {bad}; known: {', '.join(SHAPES)}")
    if args.pairs is not None and args.pairs < 1:
        ap.error(f"--pairs: at least 1, not {args.pairs}")
    if args.tokens is not None and (args.tokens < BS or args.tokens % BS):
        ap.error(f"--tokens: a positive multiple of {BS}, not {args.tokens}")
    res = measure(dtypes, shapes, args.pairs, args.tokens)
    print(f"soft cap {CAP:g}, d {D}, block size {BS}, 1 thread, thread CPU time: time ratio, median (quartiles)\n")
    print("| dtype | shape | pairs | " + " | ".join(CASES.values()) + " |\n|---|---|---|" + "---|" * len(CASES))
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for dt, by_shape in res.items():
        for shape, by_case in by_shape.items():
            cells: list[str] = []
            cell: dict[str, Any] = {"pairs": len(by_case["cap_cost"])}
            for case in CASES:
                q1, med, q3 = quartiles(by_case[case])
                cells.append(f"{med:.3f} ({q1:.3f}-{q3:.3f})")
                cell[case] = dict(q1=q1, median=med, q3=q3)
            print(f"| {dt} | {shape} | {cell['pairs']} | " + " | ".join(cells) + " |")
            summary.setdefault(dt, {})[shape] = cell
    n_tok = {s: args.tokens or SHAPES[s][1] for s in shapes}
    write_json(dict(cap=CAP, cases=CASES, shapes={s: dict(zip(("sequences", "tokens", "hq", "hkv"), SHAPES[s][:4]),
                                                          tokens=n_tok[s]) for s in shapes}, ratios=summary),
               out_path(args.out, "bench_soft_cap.json"))


if __name__ == "__main__":
    main()
