"""Decode with a dominant sink (``docs/experiments.md``, "Subnormals"): each row of
``bench_quant.py`` on keys where one token's score exceeds every other's by ``gap`` nats,
against the same row on the same keys without the sink (gap 0), in one run.

Far below the sink, the others' probabilities are tiny: times an 8-bit cache's V scale or
a value they were subnormal numbers, and every multiply with a subnormal operand takes a
microcode assist (a hundred cycles or so). The kernels' ``exp2`` now returns exactly 0
more than 64 log2 units (44 nats) under the softmax's reference point
(``EXP2_ZERO_BELOW`` in ``rust/attention/work.rs``), so the gap should cost nothing.

Shape: one sequence of ``--tokens`` tokens (default 2,048), 4 query heads on 1 KV head,
head_dim 128, block size 16, blocks scattered (an 8-bit cache of 512 KiB: L2-resident, so
the figure is the kernel's compute, where the assists are). The 4 query heads are one
random vector, and the sink (token 0) is its direction scaled so that its score
(``q.k / sqrt(d)``) is exactly ``gap``; the others' scores are about N(0, 1). Per row and
gap: ``--pairs`` pairs of calls alternating the gap-0 cache and the sink's (CPU time of
the calling thread, 1 thread), the median and quartiles of the ratio sink / no sink (1:
the sink costs nothing).

    python benches/bench_sink.py [--gaps 60,100,200] [--pairs 1000] [--rows int8,...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pykvpool as kv
from benches.bench_quant import ROWS, paired_ratios
from benches.common import out_path, quartiles, write_json

D, HQ, BS = 128, 4, 16
DEFAULT_ROWS = ["bf16", "int8", "fp8_e5m2", "int8_scores", "fp8_e5m2+fp16_reduction"]


def sink_inputs(tokens: int, gap: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K and V ``[tokens, 1, D]`` and q ``[1, HQ, D]`` (one vector for every head) such that
    token 0's score ``q.k / sqrt(D)`` is ``gap`` and the others' are those of random keys."""
    rng = np.random.default_rng(seed)
    k, v = (rng.standard_normal((tokens, 1, D), dtype=np.float32) for _ in range(2))
    qv = rng.standard_normal(D).astype(np.float32)
    k[0, 0] = qv / float(qv @ qv) * gap * np.sqrt(D)
    return k, v, np.tile(qv, (1, HQ, 1))


def cache_of(dtype: str, k: np.ndarray, v: np.ndarray) -> kv.KvCache:
    """A cache of ``dtype`` holding ``k``, ``v`` at slots ``0..tokens`` (fp8 scales set
    from the data's range)."""
    c = kv.KvCache(1, k.shape[0] // BS, BS, 1, D, dtype)
    if dtype.startswith("fp8"):
        top = 448.0 if dtype == "fp8_e4m3" else 57344.0
        c.set_fp8_scales(0, np.array([np.abs(k).max()], np.float32) / top, np.array([np.abs(v).max()], np.float32) / top)
    c.write(0, k, v, np.arange(k.shape[0]))
    return c


def measure(rows: list[str], gaps: list[float], tokens: int, pairs: int) -> dict[str, dict[float, list[float]]]:
    """Per row and gap, the per-pair ratios of the sink call's time over the gap-0 call's
    (``paired_ratios``' pairs: base, sink, sink, base, ...)."""
    kv.set_num_threads(1)
    nb = tokens // BS
    table = np.random.default_rng(1).permutation(nb).reshape(1, nb).astype(np.int64)
    lens = np.array([tokens])
    inputs = {g: sink_inputs(tokens, g) for g in [0.0, *gaps]}
    res: dict[str, dict[float, list[float]]] = {}
    for name in rows:
        dt, kw, _ = ROWS[name]
        caches = {g: cache_of(dt, k, v) for g, (k, v, _) in inputs.items()}
        for g in gaps:
            q = inputs[g][2]
            out = np.empty_like(q)

            def call(c: kv.KvCache, q: np.ndarray = q, out: np.ndarray = out) -> None:
                kv.decode_attention(c, 0, q, table, lens, out=out, **kw)

            # The base cache is read with the sink's query too: its keys are random, so
            # its scores are the same N(0, 1) as the sink cache's other tokens.
            speedups = paired_ratios(lambda: call(caches[0.0]), lambda: call(caches[g]), pairs, time.thread_time)
            res.setdefault(name, {})[g] = [1.0 / max(x, 1e-9) for x in speedups]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gaps", default="60,100,200", help="sink score gaps in nats, comma-separated")
    ap.add_argument("--pairs", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=2048, help="a multiple of 16")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help="bench_quant.py rows, comma-separated")
    ap.add_argument("--out", help="JSON output path (default benches/out/bench_sink.json)")
    args = ap.parse_args()
    rows = args.rows.split(",")
    if bad := [r for r in rows if r not in ROWS]:
        ap.error(f"--rows: unknown rows {bad}; known: {', '.join(ROWS)}")
    try:
        gaps = [float(x) for x in args.gaps.split(",")]
    except ValueError:
        ap.error(f"--gaps: comma-separated numbers, not {args.gaps!r}")
    if not all(np.isfinite(g) and g > 0 for g in gaps):
        ap.error(f"--gaps: positive finite gaps, not {args.gaps!r}")
    if args.pairs < 1:
        ap.error(f"--pairs: at least 1, not {args.pairs}")
    if args.tokens < BS or args.tokens % BS:
        ap.error(f"--tokens: a positive multiple of {BS}, not {args.tokens}")
    res = measure(rows, gaps, args.tokens, args.pairs)
    print(f"{args.tokens} tokens, 4 / 1 heads, d {D}, 1 thread, {args.pairs} pairs: time with the sink / without, "
          "median (quartiles)\n")
    print("| row | " + " | ".join(f"gap {g:g} nats" for g in gaps) + " |\n|---|" + "---|" * len(gaps))
    for name, by_gap in res.items():
        cells = []
        for g in gaps:
            q1, med, q3 = quartiles(by_gap[g])
            cells.append(f"{med:.3f} ({q1:.3f}-{q3:.3f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    summary = {name: [dict(zip(("gap", "q1", "median", "q3"), (g, *quartiles(by_gap[g])))) for g in gaps]
               for name, by_gap in res.items()}
    write_json(dict(tokens=args.tokens, pairs=args.pairs, with_sink_over_without=summary),
               out_path(args.out, "bench_sink.json"))


if __name__ == "__main__":
    main()
