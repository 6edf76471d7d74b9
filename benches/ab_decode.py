"""Paired A/B of two builds of pykvpool on decode attention: the B / A figures of
``benches/RESULTS.md`` ("Hardening costs") and ``docs/experiments.md`` come from this script.

A and B are directories that each hold a ``pykvpool`` package with its built
``_native*.so`` (for instance ``cp -r pykvpool /tmp/A`` after ``maturin develop --release``
on one commit, and again into ``/tmp/B`` on the other). Every round runs one process per
side, in alternating order (A first on even rounds, B first on odd ones), so both builds
see the same phases of a shared machine; each process builds the same seeded cache and
times every row, best of ``--calls`` calls, by the thread's CPU time at 1 thread (the
wall clock at more). Reported per row: the median over rounds of the per-round ratio B / A
of those times (below 1: B is faster) and its range. The machine's noise is larger than
most changes: 8 rounds resolve about 3%.

``--interleave N`` measures in one process instead: both builds' native modules are loaded
side by side (each ``_native*.so`` by its path), each builds the same cache, and the calls
alternate A, B, B, A, ... N pairs per row, each pair's two calls within a millisecond or so
of each other, so a slow phase of the machine slows both. Reported per row: the median and
the quartiles of the per-pair ratios B / A, and the ratio of the best calls. A build against
itself reads 1.000 with quartiles within 2-3% where alternating processes spread over
0.7-1.4 on this project's shared machines (L2-resident). Where the cache streams from memory
(``full``, ``mha``) each build reads its own allocation, and on a virtual machine the read rate
depends on where its pages landed: a build against itself read 1.12 (quartiles 1.04-1.20) at
``mha`` int8 in one run of three, one allocation each. ``--reallocate K`` gives both builds a
fresh cache written from the same rows (new pages, the same codes and scales) every K pairs, so the
ratios mix many placements instead of carrying one. ``--layers L`` (both modes) gives each cache L
layers and cycles the calls over them, as a decode step reads each layer once: a host whose
last-level cache holds one layer of ``full`` (64 MiB at 8 bits, 128 MiB at 16) re-reads it from
there on repeated calls, and only L layers' worth above that cache make every call read memory.

Shapes (head_dim 128): ``full`` 8 sequences x 4,096 tokens, 32 query / 8 KV heads (the
benchmark's GQA decode shape, blocks scattered by a random permutation); ``mha`` the same with
32 KV heads; ``g2`` with 16 (two query heads per KV head); ``l2`` 1 sequence x 2,048
tokens, 4 / 1 heads (an int8 cache of 512 KiB: L2-resident); ``l2mha`` 1 sequence x 1,024 tokens, 4 / 4 heads (MHA's one query head per KV
head, an 8-bit cache of 1 MiB: L2-resident); ``l1`` the same table as ``l2`` with every
entry block 0 (the codes L1-resident); ``batch`` 64 sequences x 512 tokens, 32 / 8 heads (a serving
batch: the per-call work on the query and the output grows with the sequences); ``short`` 64 x 16
tokens (that work dominates); ``tiny`` 8 sequences of 1 token (a call is its dispatch to the
threads).
Rows: a dtype, optionally with one opt-in switch joined by ``+`` (``int8+int8_scores``), each
switch named after the keyword that chose its path before ``q_dtype`` / ``pv_dtype``:
``bf16_scores`` is ``q_dtype="bf16"``, ``int8_scores`` ``q_dtype="int8"``, ``fp16_reduction``
``q_dtype="f16", pv_dtype="f16"`` (``SWITCHES``). ``--force-isa`` passes
``tuning=KernelTuning(isa=...)``. A build from before ``KernelTuning`` (an older A) is given
the keywords it took: the switch as a boolean keyword of its name, ``force_isa=``.

Usage::

    python benches/ab_decode.py /tmp/A /tmp/B --shape full --rows int8,bf16,int8+int8_scores --rounds 8
    python benches/ab_decode.py /tmp/A /tmp/B --shape l2 --rows int8,bf16 --interleave 2000
    python benches/ab_decode.py /tmp/A /tmp/B --shape mha --rows int8,bf16 --interleave 60 --reallocate 2
    python benches/ab_decode.py /tmp/A /tmp/B --shape full --rows fp8_e4m3,bf16 --interleave 200 --layers 8
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benches.common import out_path, write_json

#: A row's opt-in switch -> the ``decode_attention`` keywords it passes.
SWITCHES: dict[str, dict[str, str]] = {
    "bf16_scores": {"q_dtype": "bf16"},
    "int8_scores": {"q_dtype": "int8"},
    "fp16_reduction": {"q_dtype": "f16", "pv_dtype": "f16"},
}
#: ``--force-isa``: the kernel path every call runs (None: the CPU's best).
FORCE_ISA: str | None = None
DTYPES = ("f32", "f16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2")

SHAPES = {
    "full": ([4096] * 8, 32, 8),
    "mha": ([4096] * 8, 32, 32),
    "g2": ([4096] * 8, 32, 16),
    "l2": ([2048], 4, 1),
    "l2mha": ([1024], 4, 4),
    "l1": ([2048], 4, 1),
    "batch": ([512] * 64, 32, 8),
    "short": ([16] * 64, 32, 8),
    "tiny": ([1] * 8, 32, 8),
}


def parse_row(row: str) -> tuple[str, list[str]] | None:
    """A row's dtype and switches (at most one: each sets ``q_dtype``), or None when it is
    not a dtype with at most one known switch."""
    dtype, *switches = row.split("+")
    return (dtype, switches) if dtype in DTYPES and len(switches) <= 1 and set(switches) <= set(SWITCHES) else None


def call_kwargs(m: Any, switches: list[str]) -> dict[str, Any]:
    """The ``decode_attention`` keywords of a row's ``switches`` and ``FORCE_ISA`` for module
    ``m`` (the ``pykvpool`` package or a native module): ``q_dtype`` / ``pv_dtype`` and
    ``tuning=m.KernelTuning(isa=...)`` (its own class: a module refuses another build's); a
    build without ``KernelTuning`` (from before it) takes each switch as a boolean keyword of
    its name and ``force_isa=``."""
    if not hasattr(m, "KernelTuning"):
        return {s: True for s in switches} | ({"force_isa": FORCE_ISA} if FORCE_ISA else {})
    kw: dict[str, Any] = {}
    for s in switches:
        kw |= SWITCHES[s]
    if FORCE_ISA:
        kw["tuning"] = m.KernelTuning(isa=FORCE_ISA)
    return kw


def setup(shape: str, block_size: int) -> tuple[Any, ...]:
    """The shape's seeded inputs: K rows, query, block table, lengths, output and heads."""
    import numpy as np

    lens, hq, hkv = SHAPES[shape]
    d = 128
    rng = np.random.default_rng(0)
    nblocks = [-(-n // block_size) for n in lens]
    total = sum(nblocks)
    perm = rng.permutation(total).astype(np.int32)
    table = np.zeros((len(lens), max(nblocks)), np.int32)
    at = 0
    for i, n in enumerate(nblocks):
        table[i, :n] = perm[at:at + n]
        at += n
    if shape == "l1":
        table[:] = 0
    seq_lens = np.array(lens, np.int32)
    q = rng.standard_normal((len(lens), hq, d)).astype(np.float32)
    k = rng.standard_normal((block_size * total, hkv, d)).astype(np.float32)
    return k, q, table, seq_lens, np.zeros_like(q), total, hkv, d


def make_cache(kv: Any, dtype: str, k: Any, total: int, block_size: int, hkv: int, d: int, layers: int = 1) -> Any:
    """A cache of ``dtype`` with ``layers`` layers, each holding K rows ``k`` and their
    reverse as V."""
    import numpy as np

    cache = kv.KvCache(layers, total, block_size, hkv, d, dtype)
    v = k[::-1].copy()
    for layer in range(layers):
        cache.write(layer, k, v, np.arange(block_size * total))
    return cache


def clone_cache(kv: Any, src: Any) -> Any:
    """A new cache of module ``kv`` (fresh pages) of ``src``'s shape and dtype holding its
    codes and scales, copied through views (``src`` may come from another build). The
    writable views turn on the e4m3 NaN-code check of the AVX-512 path in the new cache
    (``KvCache.key``): an e4m3 speed comparison writes its caches instead (``make_cache``)."""
    cache = kv.KvCache(src.num_layers, src.num_blocks, src.block_size, src.num_kv_heads, src.head_dim, src.dtype)
    for layer in range(src.num_layers):
        cache.key(layer)[...] = src.key(layer, writable=False)
        cache.value(layer)[...] = src.value(layer, writable=False)
        if src.dtype in ("int8", "fp8_e4m3", "fp8_e5m2"):
            cache.key_scales(layer)[...] = src.key_scales(layer, writable=False)
            cache.value_scales(layer)[...] = src.value_scales(layer, writable=False)
    return cache


def measure(package_dir: str, shape: str, rows: list[str], calls: int, threads: int, block_size: int,
            layers: int = 1) -> list[float]:
    """Best call time (seconds) of each row with the pykvpool found in ``package_dir``
    (call ``i`` on layer ``i % layers``)."""
    sys.path.insert(0, package_dir)
    import pykvpool as kv

    k, q, table, seq_lens, out, total, hkv, d = setup(shape, block_size)
    kv.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    caches: dict[str, Any] = {}
    best = []
    for row in rows:
        parsed = parse_row(row)
        assert parsed is not None, row  # main() refuses such rows before any process starts
        dtype, switches = parsed
        if dtype not in caches:
            caches[dtype] = make_cache(kv, dtype, k, total, block_size, hkv, d, layers)
        on = call_kwargs(kv, switches)
        times = []
        for i in range(calls):
            t0 = clock()
            kv.decode_attention(caches[dtype], i % layers, q, table, seq_lens, out=out, **on)
            times.append(clock() - t0)
        best.append(min(times))
    return best


def load_extension(so_dir: str, name: str = "pykvpool._native") -> Any:
    """The ``_native*.so`` in ``so_dir`` loaded by its path as module ``name`` (two builds'
    modules live side by side in one process: each ``.so`` has its own statics).

    Raises:
        FileNotFoundError: ``so_dir`` holds no ``_native*.so``.
    """
    so = sorted(glob.glob(os.path.join(so_dir, "_native*.so")))
    if not so:
        raise FileNotFoundError(f"{so_dir} holds no built _native module")
    spec = importlib.util.spec_from_file_location(name, so[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_native(package_dir: str) -> Any:
    """The native module of the ``pykvpool`` package in ``package_dir`` (see ``load_extension``)."""
    return load_extension(os.path.join(package_dir, "pykvpool"))


def interleaved(a_dir: str, b_dir: str, shape: str, rows: list[str], pairs: int, threads: int,
                block_size: int, reallocate: int | None = None, layers: int = 1) -> list[list[tuple[float, float]]]:
    """Per row, ``pairs`` pairs (time A, time B) of calls that alternate A, B, B, A, ...,
    pair ``i`` on layer ``i % layers``; with ``reallocate`` K, both sides' caches are
    written anew every K pairs. Each allocation is followed by one untimed pass over every
    layer of both sides (``warm``), and which side is written last alternates
    (``fresh_caches``)."""
    natives = [load_native(a_dir), load_native(b_dir)]
    k, q, table, seq_lens, out, total, hkv, d = setup(shape, block_size)
    for m in natives:
        m.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    result = []
    for row in rows:
        parsed = parse_row(row)
        assert parsed is not None, row
        dtype, switches = parsed
        on = [call_kwargs(m, switches) for m in natives]

        def make(m: Any, dtype: str = dtype) -> Any:
            return make_cache(m, dtype, k, total, block_size, hkv, d, layers)

        def call(m: Any, c: Any, layer: int, on: list[dict[str, Any]] = on) -> None:
            m.decode_attention(c, layer, q, table, seq_lens, out=out, **on[natives.index(m)])

        caches = fresh_caches(natives, 0, make)
        warm(natives, caches, layers, call)
        got = []
        for i in range(pairs):
            if reallocate and i and i % reallocate == 0:
                # The old caches go first: at most one per side alive. Written anew from the
                # same rows (the same codes and scales), not copied through writable views,
                # which would turn on the e4m3 NaN-code check (`KvCache.key`).
                caches = []
                caches = fresh_caches(natives, i // reallocate, make)
                warm(natives, caches, layers, call)
            t = [0.0, 0.0]
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                t0 = clock()
                natives[side].decode_attention(caches[side], i % layers, q, table, seq_lens, out=out, **on[side])
                t[side] = clock() - t0
            got.append((t[0], t[1]))
        result.append(got)
    return result


def fresh_caches(natives: list[Any], n: int, make: Any) -> list[Any]:
    """Both sides' caches made by ``make(native)``, the side written last alternating with
    ``n`` (the ``n``-th allocation): the last-written pages are the ones a large last-level
    cache still holds, and always writing B's last gave B that head start (a build against
    itself read 0.91 at ``full``, 16 layers, on a host with a 480 MiB last-level cache)."""
    order = (0, 1) if n % 2 == 0 else (1, 0)
    made: dict[int, Any] = {}
    for side in order:
        made[side] = make(natives[side])
    return [made[0], made[1]]


def warm(natives: list[Any], caches: list[Any], layers: int, call: Any) -> None:
    """One untimed ``call(native, cache, layer)`` per side and layer, the sides alternating
    layer by layer (A's layer 0, B's layer 0, ...), so what the last-level cache holds
    afterwards is both sides' last layers, which the timed pairs, starting at layer 0, push
    out before they reach them."""
    for layer in range(layers):
        for side in (0, 1):
            call(natives[side], caches[side], layer)


def summarize_pairs(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """The median and quartiles of the per-pair ratios B / A, and the best calls' ratio."""
    ratios = sorted(b / a for a, b in pairs)
    q1, med, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return {"median": med, "q1": q1, "q3": q3, "best": min(b for _, b in pairs) / min(a for a, _ in pairs)}


def summarize(a: list[list[float]], b: list[list[float]], rows: list[str]) -> list[dict[str, Any]]:
    """Per row: the median, lowest and highest of the per-round ratios B / A."""
    out = []
    for i, row in enumerate(rows):
        ratios = sorted(tb[i] / ta[i] for ta, tb in zip(a, b))
        out.append({"row": row, "median": statistics.median(ratios), "low": ratios[0], "high": ratios[-1],
                    "rounds": len(ratios)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="directory holding build A's pykvpool package")
    ap.add_argument("b", help="directory holding build B's pykvpool package")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="full")
    ap.add_argument("--rows", default="int8,bf16", help="comma-separated rows, e.g. int8,int8+int8_scores")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=5, help="calls per row and process; the best is kept")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--force-isa", help="the kernel path of every call, as tuning=KernelTuning(isa=...) (e.g. avx2; "
                    "default: the CPU's best)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--interleave", type=int, metavar="N",
                    help="measure in one process, N alternating pairs of calls per row (instead of --rounds)")
    ap.add_argument("--reallocate", type=int, metavar="K",
                    help="with --interleave: fresh copies of both caches (new pages) every K pairs")
    ap.add_argument("--layers", type=int, default=1, metavar="L",
                    help="caches of L layers, the calls cycling over them as a decode step does: with L x the "
                         "cache's size above the last-level cache, every call reads from memory (default 1)")
    ap.add_argument("--out", help="JSON output path (default benches/out/ab_decode.json)")
    ap.add_argument("--measure", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    global FORCE_ISA
    FORCE_ISA = args.force_isa
    if args.measure:
        print(json.dumps(measure(args.measure, args.shape, rows, args.calls, args.threads, args.block_size,
                                 args.layers)))
        return
    if args.block_size < 1:
        ap.error("--block-size must be at least 1")
    if args.layers < 1:
        ap.error("--layers must be at least 1")
    for row in rows:
        if parse_row(row) is None:
            ap.error(f"row {row!r}: a dtype of {', '.join(DTYPES)}, then at most one switch of {', '.join(SWITCHES)} "
                     "joined by +")
    for side in (args.a, args.b):
        if not os.path.isdir(os.path.join(side, "pykvpool")):
            ap.error(f"{side} holds no pykvpool package")
    if args.interleave is not None:
        if args.interleave < 1:
            ap.error("--interleave must be at least 1")
        if args.reallocate is not None and args.reallocate < 1:
            ap.error("--reallocate must be at least 1")
        try:
            got = interleaved(args.a, args.b, args.shape, rows, args.interleave, args.threads, args.block_size,
                              args.reallocate, args.layers)
        except FileNotFoundError as e:
            ap.error(str(e))
        fresh = f", fresh caches every {args.reallocate} pairs" if args.reallocate else ""
        fresh += f", {args.layers} layers" if args.layers > 1 else ""
        print(f"B / A time, shape {args.shape}, {args.threads} thread(s), {args.interleave} interleaved pairs of "
              f"calls{fresh}")
        print("| row | median | quartiles | best calls |\n|---|---|---|---|")
        summary = [dict(row=row, pairs=len(pairs), **summarize_pairs(pairs)) for row, pairs in zip(rows, got)]
        for s in summary:
            print(f"| {s['row']} | {s['median']:.3f} | {s['q1']:.3f}-{s['q3']:.3f} | {s['best']:.3f} |")
        write_json(dict(args=vars(args), b_over_a=summary), out_path(args.out, "ab_decode.json"))
        return
    times: dict[str, list[list[float]]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
            cmd = [sys.executable, __file__, args.a, args.b, "--measure", getattr(args, side), "--shape", args.shape,
                   "--rows", args.rows, "--calls", str(args.calls), "--threads", str(args.threads),
                   "--block-size", str(args.block_size), "--layers", str(args.layers)] + (["--force-isa", args.force_isa] if args.force_isa else [])
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            times[side].append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(f"B / A time, shape {args.shape}, {args.threads} thread(s), best of {args.calls} calls, "
          f"{args.rounds} alternating rounds" + (f", {args.layers} layers" if args.layers > 1 else ""))
    print("| row | median | range |\n|---|---|---|")
    summary = summarize(times["a"], times["b"], rows)
    for s in summary:
        print(f"| {s['row']} | {s['median']:.3f} | {s['low']:.3f}-{s['high']:.3f} |")
    write_json(dict(args=vars(args), b_over_a=summary), out_path(args.out, "ab_decode.json"))


if __name__ == "__main__":
    main()
