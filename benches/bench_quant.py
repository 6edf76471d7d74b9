"""8-bit KV caches: decode speed against bf16, their roofs, the write path,
and accuracy against the unquantized f32 result (kernel and toy decoder).

Speed: the benchmark's decode shapes, 8 sequences x 4096 tokens, head_dim 128, block size
16, blocks scattered by a random permutation, (a) 32 query / 8 KV heads and (d) 32 / 32,
in bf16, int8, fp8_e4m3 and fp8_e5m2, at 1 and 2 threads. ``--reps`` rounds; in each,
every dtype (in a rotating order, each round on fresh copies of the caches: a cache's read
rate depends on where its pages landed) gets a read-bandwidth probe of its own cache's pages
(``pykvpool.read_bandwidth(cache=...)``) then its kernel, best of 3 calls. Reported per
dtype: decode tokens/s (sequences per call / best time), the median over rounds of the
per-round ratio to bf16's tokens/s (with its IQR), the median of the ratios of alternating
pairs of calls (the row's and bf16's, 6 pairs per round, after an untimed sweep of bf16's
cache: a phase of a shared machine that lasts seconds moves a round's ratios but slows both
calls of a pair), and the median of the per-round
"% of the bandwidth roof" (bytes the call reads: codes + scales of the visible tokens,
over the probe), and of the same bytes over the table-order probe
(``read_bandwidth(cache=..., block_tables=..., seq_lens=...)``: exactly the runs this call
reads, block by block in table order, without the compute; the scattered blocks' short
runs read slower than the front-to-back stream, "table / bw" the ratio of the two
probes). Two compute roofs per row: the FMA-only roof, ``4 Hq d`` FLOP per token
(q.k and p.v, 2 per FMA) at ``pykvpool.peak_flops``, which ignores the conversions; and
the instruction-mix roof of ``benches/quant_roofs.py``: the codes/s of the minimal
instruction sequence the path issues per cached code (widening + dot products, K and V,
at the shape's g and thread count), measured by ``cargo bench --bench dot_rates`` (run
by this script first, its output kept in ``benches/out/dot_rates.txt``; ``--dot-rates
FILE`` reads a saved output instead; with ``--quick`` it runs ``dot_rates --quick``),
over the codes per sequence. A shared machine's other tenants slow these loops by up to
40% for seconds at a time (thread CPU time does not leave that out: they share the core),
so ``dot_rates --quick`` runs again before every round at the round's thread count, and
a roof is the best of all its runs (``quant_roofs.merge_rates``; the lowest run's roof
is printed beside it). "% min roof" is tokens/s over min(bandwidth roof,
instruction-mix roof); a second table gives per row which roof binds, the check that
the instruction-mix roof is at most the FMA-only one, the softmax exp2's cost (apart,
not in the roof) and whether the 8-bit target is within the roofs. Rows
"+bf16_scores" time the opt-in bf16 query (``q_dtype="bf16"``) on bf16 and fp8 caches
(see ``FAST`` for their FMA-only roof). The opt-in rows keep the names of the keywords
that chose their paths before ``q_dtype`` / ``pv_dtype`` (``bf16_scores``,
``int8_scores``, ``fp16_reduction``): ``benches/RESULTS.md``'s recorded figures use them.

Rows ``fp8_e4m3+fp16_reduction`` and ``fp8_e5m2+fp16_reduction``: the fp8 caches with
``q_dtype="f16", pv_dtype="f16"`` (q.k and p.v as f16 products summed in f16 by
``vfmadd231ph``, 32 per instruction, where the CPU has avx512_fp16); FMA-only roof
``d/32 + d/32`` instructions per token and query head, instruction-mix roof
``dot_rates``' (``benches/dot_rates/f16.rs``).

Row ``int8_scores``: the int8 cache with ``q_dtype="int8"`` (query quantized to int8,
scores by ``vpdpbusd`` where the CPU has avx512_vnni). Its compute roof is that of the
instructions it uses: per token and query head ``d / 64`` ``vpdpbusd`` (64 multiply-adds
each) for q.k and ``d / 16`` FMAs for p.v, issued at the FMA instruction rate
(``peak_flops / 32`` per second: 16 lanes x 2 FLOP), i.e. ``peak / (2.5 Hq d)`` tokens/s
against the FMA roof's ``peak / (4 Hq d)``. That ``vpdpbusd`` issues at the rate of
``vfmadd231ps``, on the same pipes (mixed 1:4 they share one instruction per cycle), is
measured by ``cargo bench --bench dot_rates`` (``benches/dot_rates.rs``: thread CPU time,
same run), not by this script.

Write: ``KvCache.write`` of 4096 tokens x 8 heads x 128 (f32 input), GB/s of input.

Accuracy: shape (a) at 8 x 1024 tokens, K and V standard normal ("normal") or with a
quarter of the K channels 20x larger ("outliers"); per dtype the largest and median
|out - out_f32| over the output scale, and the largest error over the documented bound.
Toy decoder: tokens equal to the f32 run's over 192 greedy steps (and the first
divergence), and the largest |logit - logit_f32| of the teacher-forced run on the f32
tokens, against the logit scale.

Clocks (``--clock``, default ``cpu``): with ``cpu`` a call at 1 thread is timed by the
calling thread's CPU time (``time.thread_time``: a one-thread pool runs the call on the
caller), at 2 threads by the process's CPU time over 2 (``time.process_time() / 2``, pool
threads' idle spin included), and both probes by their busiest thread's CPU time
(``clock="cpu"``), as ``dot_rates`` times the instruction-mix roofs: time a shared virtual
machine's hypervisor took the CPU away (steal, seen here at up to a quarter of a probe's
wall time in busy phases) is left out of calls and roofs alike. ``wall`` times everything by
``time.perf_counter`` and the wall-clock probes.

Layers (``--layers L``, default ``auto``): each cache has L layers holding the same values,
and every call of the speed table (and of its pairs) reads the next layer of its cache in
turn, as a decode step reads each layer once. A host whose last-level cache holds a whole
layer (a 260 MiB L3 holds shape (a)'s 64 MiB 8-bit and 128 MiB bf16 caches) re-reads a
one-layer cache from that cache on repeated calls: neither memory-bound nor comparable
across dtypes. ``auto`` takes the fewest layers whose 8-bit cache is at least twice the
last-level cache (from ``/sys/devices/system/cpu/cpu0/cache``; at most 16; 1 with
``--quick`` or where the size is unknown). The front-to-back probe reads every layer
(the whole cache, from memory); the table-order probe is the best of 3 single sweeps, each
of the next layer.

Portable paths (AVX2 on x86-64, NEON on aarch64, when the CPU has them): the same shapes
on that path (``tuning=KernelTuning(isa=...)``), each 8-bit dtype against bf16 on the same
path and against the scalar path (what the portable paths ran for 8-bit caches before they
dequantized in registers), per-round ratios (median and IQR), rotating order, best of 3
(``--isa-only`` runs just this section; ``--isa avx2`` picks the path).

Run: ``python benches/bench_quant.py [--reps 7] [--quick] [--clock cpu|wall] [--isa avx2] [--isa-only]
[--dot-rates FILE] [--layers auto|L]``; writes
``benches/out/bench_quant.json`` and prints markdown.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Literal, cast

import numpy as np

import pykvpool as kv
from benches.quant_roofs import instr_roof, load_dot_rates, merge_rates, print_roofs, run_dot_rates, sane
from pykvpool import toy_decoder

BS = 16
#: The clock of calls and probes (``--clock``): ``"cpu"`` or ``"wall"``.
CLOCK: Literal["cpu", "wall"] = "cpu"


def call_clock(threads: int) -> Callable[[], float]:
    """Seconds by ``CLOCK`` for a call on ``threads`` threads (see the module docstring)."""
    if CLOCK == "wall":
        return time.perf_counter
    if threads == 1:
        return time.thread_time
    return lambda: time.process_time() / threads
DTYPES = ["bf16", "int8", "fp8_e4m3", "fp8_e5m2"]
#: Opt-in fast paths timed beside the exact ones: row -> (cache dtype, decode keywords,
#: compute-roof FLOP per token over ``Hq d``), each row named after the keyword that chose
#: its path before ``q_dtype`` / ``pv_dtype``. ``bf16_scores`` (``q_dtype="bf16"``): q.k
#: by ``vdpbf16ps`` (fp8 codes widened to bf16 in registers), counted at twice the FMA
#: rate (one instruction, 32 products and 32 sums, assumed to issue at the FMA rate; not
#: probed), p.v by FMAs: ``2 Hq d / 2 + 2 Hq d`` FMA-equivalent FLOP, a roof 4/3 the FMA
#: roof.
FAST: dict[str, tuple[str, dict[str, Any], float]] = {f"{dt}+bf16_scores": (dt, {"q_dtype": "bf16"}, 3.0) for dt in ["bf16", "fp8_e4m3", "fp8_e5m2"]}
#: ``int8_scores`` (``q_dtype="int8"``): q.k by ``vpdpbusd`` (64 products per
#: instruction, issuing at the FMA rate: measured by ``cargo bench --bench dot_rates``),
#: p.v by FMAs: ``d/64 + d/16`` FMA slots per token and query head against the exact
#: ``d/16 + d/16``, a factor 2.5.
FAST["int8_scores"] = ("int8", {"q_dtype": "int8"}, 2.5)
#: ``fp16_reduction`` (fp8, ``q_dtype="f16", pv_dtype="f16"``): q.k and p.v by
#: ``vfmadd231ph`` (32 f16 products per instruction, issuing at the FMA rate: ``cargo
#: bench --bench dot_rates``): ``d/32 + d/32`` FMA slots per token and query head, half
#: the exact count.
for _dt in ["fp8_e4m3", "fp8_e5m2"]:
    FAST[f"{_dt}+fp16_reduction"] = (_dt, {"q_dtype": "f16", "pv_dtype": "f16"}, 2.0)
#: The instructions behind each row's compute roof.
ROOF_INSTR = {"int8_scores": "vpdpbusd + FMA",
              **{f"{dt}+fp16_reduction": "vfmadd231ph" for dt in ["fp8_e4m3", "fp8_e5m2"]},
              **{f"{dt}+bf16_scores": "vdpbf16ps + FMA" for dt in ["bf16", "fp8_e4m3", "fp8_e5m2"]}}
ROWS: dict[str, tuple[str, dict[str, Any], float]] = {**{dt: (dt, {}, 4.0) for dt in DTYPES}, **FAST}
FP8_ERR = {"fp8_e4m3": (2.0**-4, 2.0**-10), "fp8_e5m2": (2.0**-3, 2.0**-17)}


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The size in bytes of the CPU's highest-level cache as sysfs lists it (``index*/level``
    and ``size``, e.g. ``266240K``), or None where it is not listed."""
    best: tuple[int, int] | None = None
    for index in Path(root).glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        digits = size.rstrip("KMG")
        if digits.isdigit() and (best is None or level > best[0]):
            best = (level, int(digits) * unit)
    return None if best is None else best[1]


def auto_layers(layer_bytes: int, llc: int | None, most: int = 16) -> int:
    """The fewest layers of ``layer_bytes`` each that hold at least twice ``llc`` bytes (so
    a call cycling over them reads memory, not the last-level cache), at most ``most``;
    1 when ``llc`` is unknown."""
    if not llc or layer_bytes <= 0:
        return 1
    return max(1, min(most, math.ceil(2 * llc / layer_bytes)))


#: KV heads of the speed table's shapes (32 query heads, head_dim 128): (a) GQA, (d) MHA.
SHAPE_KV_HEADS = {"a": 8, "d": 32}


def streaming_layers(lens: list[int], hkv: int, d: int = 128) -> int:
    """``auto_layers`` for int8 layers of sequences of ``lens`` tokens with ``hkv`` KV heads
    of ``d`` dimensions, against this machine's last-level cache."""
    return auto_layers(sum(lens) * kv.KvCache.bytes_per_token(hkv, d, "int8"), last_level_cache_bytes())


def build(lens: list[int], hq: int, hkv: int, d: int, dtypes: list[str], seed: int,
          outliers: bool = False, layers: int = 1) -> tuple[dict[str, kv.KvCache], np.ndarray, np.ndarray,
                                                             Callable[[], dict[str, kv.KvCache]]]:
    """Caches of each dtype with ``layers`` layers holding the same values (fp8 scales set
    for the data's range first, so no chunk saturates), a scattered table, q, and a
    function giving new caches (fresh pages) written from the same values: written, not
    copied through writable views, which would turn on e4m3's NaN-code check
    (``KvCache.key``)."""
    nblk = [-(-n // BS) for n in lens]
    total = sum(nblk)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(total)
    table = np.full((len(lens), max(nblk)), -1, np.int64)
    at = 0
    for i, nb in enumerate(nblk):
        table[i, :nb] = perm[at:at + nb]
        at += nb
    chunks = []
    for b0 in range(0, total, 256):
        nb = min(256, total - b0)
        k, v = (rng.standard_normal((nb * BS, hkv, d), dtype=np.float32) for _ in range(2))
        if outliers:
            k[..., ::4] *= 20
        chunks.append((k, v, np.arange(b0 * BS, (b0 + nb) * BS)))
    amax = {i: [float(np.abs(np.concatenate([x[i][:, h] for x in chunks])).max()) for h in range(hkv)] for i in (0, 1)}

    def fresh() -> dict[str, kv.KvCache]:
        caches = {dt: kv.KvCache(layers, total, BS, hkv, d, dt) for dt in dtypes}
        for (dt, c), layer in itertools.product(caches.items(), range(layers)):
            if dt.startswith("fp8"):
                top = 448.0 if dt == "fp8_e4m3" else 57344.0
                c.set_fp8_scales(layer, np.array(amax[0], np.float32) / top, np.array(amax[1], np.float32) / top)
            for k, v, slots in chunks:
                c.write(layer, k, v, slots)
        return caches

    q = rng.standard_normal((len(lens), hq, d), dtype=np.float32)
    return fresh(), table, q, fresh


def paired_ratios(base: Callable[[], None], row: Callable[[], None], pairs: int,
                  clock: Callable[[], float], warm: Callable[[], None] = lambda: None) -> list[float]:
    """Per pair of calls, ``base``'s time over ``row``'s (the speedup of ``row``), the calls
    alternating base, row, row, base, ... so that a slow phase of a shared machine slows
    both calls of a pair instead of one row of a round. ``warm`` runs once, untimed, before
    the first pair: ``speed`` sweeps bf16's cache there, as memory left unread for seconds
    reads slower on some hosts (a VM whose guest runs DAMON: 7.5-9 GB/s one core, against 13
    read again within 0.1 s), and bf16's cache lay unread while the other rows ran, which
    made every pair's bf16 call slower (paired 2.0-2.2x where the warm rounds read 1.5-1.85x)."""
    warm()
    out = []
    for i in range(pairs):
        t = {}
        for side, fn in (("base", base), ("row", row)) if i % 2 == 0 else (("row", row), ("base", base)):
            t0 = clock()
            fn()
            t[side] = clock() - t0
        out.append(t["base"] / max(t["row"], 1e-9))
    return out


def speed(shape: str, lens: list[int], hq: int, hkv: int, d: int, reps: int,
          resample: Callable[[int], None] = lambda t: None, pairs: int = 6, layers: int = 1) -> list[dict[str, Any]]:
    """The speed rows of one shape at 1 and 2 threads, without their instruction-mix roofs
    (``add_roofs`` puts them in once every round has run); ``resample(threads)`` runs
    before each round (a ``dot_rates`` run, so that the roofs sample the whole benchmark).
    Besides the per-round ratios to bf16 (each row's best call of the round over bf16's),
    each round times ``pairs`` alternating pairs of a row's call and bf16's
    (``paired_ratios``): ``paired`` is the median of those ratios over all rounds. Each
    cache has ``layers`` layers and each call reads the next one (see the module docstring)."""
    _, table, q, fresh = build(lens, hq, hkv, d, DTYPES, seed=1, layers=layers)
    caches: dict[str, kv.KvCache] = {}
    sl = np.array(lens)
    read = {name: sum(lens) * kv.KvCache.bytes_per_token(hkv, d, ROWS[name][0]) for name in ROWS}
    names = list(ROWS)
    rows = []
    for t in (1, 2):
        kv.set_num_threads(t)
        peak = kv.peak_flops(t, clock=CLOCK)
        clock = call_clock(t)
        out = np.empty_like(q)
        rounds: dict[str, list[tuple[float, float, float, float, float]]] = {name: [] for name in names}
        paired: dict[str, list[float]] = {name: [] for name in names}
        for r in range(reps):
            resample(t)
            k = r % len(names)
            # Fresh copies each round: a cache's read rate depends on where its pages
            # landed, so the ratios to bf16 mix placements instead of carrying one.
            caches = {}  # the last round's copies go first
            caches = fresh()
            # Each cache's next layer: every call and table sweep reads the one after the last.
            turn = {dt: itertools.cycle(range(layers)) for dt in caches}
            for name in names[k:] + names[:k]:
                dt, kw, _ = ROWS[name]
                c = caches[dt]

                def call(c: kv.KvCache = c, kw: dict[str, Any] = kw, dt: str = dt) -> None:
                    kv.decode_attention(c, next(turn[dt]), q, table, sl, out=out, **kw)

                call()
                probe = kv.read_bandwidth(cache=c, threads=t, passes=3, clock=CLOCK)
                tab = max(kv.read_bandwidth(cache=c, threads=t, passes=1, clock=CLOCK, block_tables=table, seq_lens=sl,
                                            layer=next(turn[dt])) for _ in range(3))
                best = min(_timed(call, clock) for _ in range(3))
                rounds[name].append((len(lens) / best, probe, read[name] / best / probe, tab, read[name] / best / tab))
                if name != "bf16":

                    def bf16_call(c: kv.KvCache = caches["bf16"]) -> None:
                        kv.decode_attention(c, next(turn["bf16"]), q, table, sl, out=out)

                    def warm_bf16(c: kv.KvCache = caches["bf16"]) -> None:
                        kv.read_bandwidth(cache=c, threads=t, passes=1, clock=CLOCK)

                    paired[name] += paired_ratios(bf16_call, call, pairs, clock, warm_bf16)
        base = [x[0] for x in rounds["bf16"]]
        for name in names:
            tps = [x[0] for x in rounds[name]]
            ratio = [a / b for a, b in zip(tps, base)]
            probe = float(np.median([x[1] for x in rounds[name]]))
            bw_roof = probe / read[name] * len(lens)
            fma_roof = peak / (ROWS[name][2] * hq * d * sum(lens)) * len(lens)
            rows.append(dict(shape=shape, threads=t, dtype=name, tokens_per_s=max(tps),
                             roof_instr=ROOF_INSTR.get(name, "FMA"), peak_gflops=peak / 1e9,
                             ratio=float(np.median(ratio)), ratio_q1=float(np.quantile(ratio, 0.25)),
                             ratio_q3=float(np.quantile(ratio, 0.75)),
                             **_paired_stats(paired[name]),
                             pct_bw=float(np.median([x[2] for x in rounds[name]])),
                             pct_table=float(np.median([x[4] for x in rounds[name]])),
                             table_over_probe=float(np.median([x[3] / x[1] for x in rounds[name]])),
                             bw_roof=bw_roof, fma_roof=fma_roof, probe_gbs=probe / 1e9, g=hq // hkv,
                             codes_per_seq=2 * hkv * d * sum(lens) / len(lens), read_mb=read[name] / 1e6,
                             layers=layers))
    del caches, fresh
    return rows


def _paired_stats(ratios: list[float]) -> dict[str, Any]:
    """The median and quartiles of a row's paired ratios (bf16: 1, no pairs)."""
    if not ratios:
        return dict(paired=1.0, paired_q1=1.0, paired_q3=1.0, pairs=0)
    return dict(paired=float(np.median(ratios)), paired_q1=float(np.quantile(ratios, 0.25)),
                paired_q3=float(np.quantile(ratios, 0.75)), pairs=len(ratios))


def add_roofs(rows: list[dict[str, Any]], rates: dict[str, Any] | None) -> None:
    """Each speed row's instruction-mix roof (``mix``), binding roof (``roof``, ``binds``)
    and share of it (``pct_roof``), from the ``dot_rates`` runs merged in ``rates``."""
    for r in rows:
        mix = instr_roof(rates, r["dtype"], r["g"], r["threads"], r["codes_per_seq"])
        roof = min(r["bw_roof"], r["fma_roof"] if mix is None else mix["roof"])
        r.update(mix=mix, roof=roof, binds="bw" if roof == r["bw_roof"] else ("instr" if mix is not None else "FMA"),
                 pct_roof=r["tokens_per_s"] / roof)


def isa_speed(shape: str, lens: list[int], hq: int, hkv: int, d: int, reps: int, isa: str) -> list[dict[str, Any]]:
    """Decode on the portable path ``isa``: every dtype there, 8-bit also on the scalar path."""
    caches, table, q, _ = build(lens, hq, hkv, d, DTYPES, seed=1)
    sl = np.array(lens)
    read = {dt: sum(lens) * kv.KvCache.bytes_per_token(hkv, d, dt) for dt in DTYPES}
    impls = [(dt, isa) for dt in DTYPES] + [(dt, "scalar") for dt in DTYPES[1:]]
    rows = []
    for t in (1, 2):
        kv.set_num_threads(t)
        peak = kv.peak_flops(t, clock=CLOCK)
        clock = call_clock(t)
        out = np.empty_like(q)
        tps: dict[tuple[str, str], list[float]] = {i: [] for i in impls}
        probes: dict[str, list[float]] = {dt: [] for dt in DTYPES}
        for r in range(reps):
            for dt in DTYPES:
                probes[dt].append(kv.read_bandwidth(cache=caches[dt], threads=t, passes=3, clock=CLOCK))
            for dt, path in impls[r % len(impls):] + impls[:r % len(impls)]:
                def call(c: kv.KvCache = caches[dt], path: str = path) -> None:
                    # `path` is "scalar" or a path of ``kernel_paths()`` / ``--isa``'s choices.
                    tuning = kv.KernelTuning(isa=cast(Literal["scalar", "neon", "avx2", "avx512"], path))
                    kv.decode_attention(c, 0, q, table, sl, out=out, tuning=tuning)

                call()
                tps[(dt, path)].append(len(lens) / min(_timed(call, clock) for _ in range(3)))
        for dt in DTYPES:
            mine = tps[(dt, isa)]
            vs_bf16 = [a / b for a, b in zip(mine, tps[("bf16", isa)])]
            vs_scalar = [a / b for a, b in zip(mine, tps[(dt, "scalar")])] if dt != "bf16" else [float("nan")]
            probe = float(np.median(probes[dt]))
            rows.append(dict(shape=shape, threads=t, isa=isa, dtype=dt, tokens_per_s=max(mine),
                             scalar_tokens_per_s=max(tps[(dt, "scalar")]) if dt != "bf16" else None,
                             x_bf16=_iqr(vs_bf16), x_scalar=_iqr(vs_scalar),
                             pct_bw=float(np.median([read[dt] * x / len(lens) / p for x, p in zip(mine, probes[dt])])),
                             bw_roof=probe / read[dt] * len(lens), fma_roof=peak / (4 * hq * d * sum(lens)) * len(lens)))
    del caches
    return rows


def _iqr(x: list[float]) -> tuple[float, float, float]:
    """Median, first and third quartile."""
    return float(np.median(x)), float(np.quantile(x, 0.25)), float(np.quantile(x, 0.75))


def print_isa(rows: list[dict[str, Any]]) -> None:
    print("\n| path | shape | thr | dtype | tokens/s | x bf16 same path (IQR) | x scalar path (IQR) | % bw probe | "
          "bw roof | FMA roof |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fmt = "{:.2f} ({:.2f}-{:.2f})".format
        print(f"| {r['isa']} | {r['shape']} | {r['threads']} | {r['dtype']} | {r['tokens_per_s']:,.0f} | "
              f"{fmt(*r['x_bf16'])} | {fmt(*r['x_scalar']) if r['dtype'] != 'bf16' else '-'} | "
              f"{100 * r['pct_bw']:.0f}% | {r['bw_roof']:,.0f} | {r['fma_roof']:,.0f} |")
    print("bw roof: tokens/s if the call read its codes + scales at the cache's read-bandwidth probe; FMA roof: "
          "4 Hq d FLOP per token at pykvpool.peak_flops (the AVX-512 FMA probe: an upper bound of the AVX2 "
          "path's FMA roof, equal to it where 512-bit FMAs run as two 256-bit halves)")


def write_speed(reps: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(2)
    n, hkv, d = 4096, 8, 128
    k, v = (rng.standard_normal((n, hkv, d), dtype=np.float32) for _ in range(2))
    rows = []
    for dt in ["f32", "bf16", *DTYPES[1:]]:
        c = kv.KvCache(1, n // BS, BS, hkv, d, dt)
        slots = np.arange(n)
        c.write(0, k, v, slots)
        best = min(_timed(lambda: c.write(0, k, v, slots)) for _ in range(reps))
        rows.append(dict(dtype=dt, seconds=best, input_gbs=2 * k.nbytes / best / 1e9))
    return rows


def _timed(fn: Any, clock: Callable[[], float] = time.perf_counter) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def accuracy(seq: int) -> list[dict[str, Any]]:
    hq, hkv, d = 32, 8, 128
    lens = [seq] * 8
    rows = []
    for outliers in (False, True):
        caches, table, q, _ = build(lens, hq, hkv, d, ["f32", *DTYPES[1:]], seed=3, outliers=outliers)
        sl = np.array(lens)
        exact = kv.decode_attention(caches["f32"], 0, q, table, sl).astype(np.float64)
        scale_out = np.abs(exact).max()
        kf, vf = (x.reshape(-1, hkv, d).astype(np.float64) for x in caches["f32"].dequantized(0))
        for name, (dt, kw, _) in ROWS.items():
            if dt == "bf16" or kw.get("q_dtype") == "bf16":  # the bound below is the 8-bit exact / int8-query one
                continue
            got = kv.decode_attention(caches[dt], 0, q, table, sl, **kw).astype(np.float64)
            err = np.abs(got - exact).max(axis=2)
            bound = _bound(dt, caches[dt], kf, vf, q, table, lens, hq // hkv, kw.get("q_dtype") == "int8",
                           kw.get("q_dtype") == "f16")
            rows.append(dict(data="outliers" if outliers else "normal", dtype=name,
                             max_err=float(err.max() / scale_out), median_err=float(np.median(err) / scale_out),
                             max_err_over_bound=float((err / bound).max()),
                             median_bound=float(np.median(bound) / scale_out)))
    return rows


def _bound(dt: str, c: kv.KvCache, kf: np.ndarray, vf: np.ndarray, q: np.ndarray, table: np.ndarray,
           lens: list[int], g: int, int8_query: bool = False, f16_sums: bool = False) -> np.ndarray:
    """The bound of :func:`pykvpool.decode_attention`'s docstring per (sequence, head);
    with ``int8_query`` (``q_dtype="int8"``) the query's rounding (``s_q / 2`` per element,
    times the L1 norm of the dequantized key) adds to the logit deviation; ``f16_sums``
    (``q_dtype="f16", pv_dtype="f16"``) adds ``(d / 4 + 3)
    2^-11 max_t sum_i |q_i K'_i|`` to the logit deviation and ``18 2^-11 max|V'|`` (the f16
    sums), where the f16 path runs (else the bound is looser than needed, not wrong)."""
    n, hq, d = q.shape
    vd = np.abs(c.dequantized(0)[1].reshape(-1, vf.shape[1], d))
    kd = np.abs(c.dequantized(0)[0].reshape(-1, vf.shape[1], d)).astype(np.float64)
    out = np.zeros((n, hq))
    for i, ln in enumerate(lens):
        rows = (table[i, np.arange(ln) // BS] * BS + np.arange(ln) % BS)
        ka, va = np.abs(kf[rows]), np.abs(vf[rows])
        for h in range(hq):
            kh, qa = h // g, np.abs(q[i, h]).astype(np.float64)
            if dt == "int8":
                dmax = (0.5 * ka[:, kh].max(axis=1) / 127 * qa.sum()).max()
                ev = 0.5 * va[:, kh].max() / 127
            else:
                rel, sub = FP8_ERR[dt]
                ks, vs = float(c.key_scales(0)[kh]), float(c.value_scales(0)[kh])
                dmax = (rel * ka[:, kh] @ qa + sub * ks * qa.sum()).max()
                ev = rel * va[:, kh].max() + sub * vs
            if int8_query:
                dmax += np.abs(q[i, h]).max() / 127 / 2 * kd[rows, kh].sum(axis=1).max()
            if f16_sums:
                dmax += (d / 4 + 3) * 2.0**-11 * (kd[rows, kh] @ qa).max()
            out[i, h] = np.expm1(2 * dmax / np.sqrt(d)) * vd[rows, kh].max() + ev
            if f16_sums:
                out[i, h] += 18 * 2.0**-11 * vd[rows, kh].max()
    return out


def toy() -> list[dict[str, Any]]:
    """The toy decoder's greedy tokens and teacher-forced logits against its f32 run: every
    dtype at head_dim 32; int8 and fp8 with the opt-in fast paths (rows of ``ROWS``) at
    head_dim 64 (the f16 sums of ``q_dtype="f16", pv_dtype="f16"`` take head_dims that are
    multiples of 64), against that model's own f32 run."""
    rows = _toy_rows(toy_decoder.ToyConfig(), ["bf16", *DTYPES[1:]])
    fast = ["int8", "int8_scores", "fp8_e4m3", "fp8_e4m3+fp16_reduction", "fp8_e5m2", "fp8_e5m2+fp16_reduction"]
    return rows + _toy_rows(toy_decoder.ToyConfig(d_head=64), fast)


def _toy_rows(cfg: toy_decoder.ToyConfig, runs: list[str]) -> list[dict[str, Any]]:
    """Per row of ``ROWS`` in ``runs``: its cache dtype with its decode keywords, named
    ``dtype+row`` (``int8+int8_scores``) or the row where that starts with its dtype."""
    model = toy_decoder.make_model(cfg)
    prompt = [int(t) for t in np.random.default_rng(cfg.seed + 1).integers(0, cfg.vocab, cfg.prompt)]
    ref, _ = toy_decoder.generate_cached(model, prompt, "f32")
    ref_logits = toy_decoder.cached_logits(model, prompt, ref, "f32")
    rows = []
    for row in runs:
        dt, kw, _ = ROWS[row]
        opts = cast(toy_decoder.DecodeSwitches, kw) if kw else None  # q_dtype, pv_dtype; None: exact
        toks, _ = toy_decoder.generate_cached(model, prompt, dt, decode_options=opts)
        same = [a == b for a, b in zip(toks, ref)]
        first = same.index(False) if False in same else None
        logits = toy_decoder.cached_logits(model, prompt, ref, dt, decode_options=opts)
        diff = np.abs(logits - ref_logits)
        top2 = np.sort(ref_logits, axis=1)[:, -2:]
        name = (row if row == dt or row.startswith(dt + "+") else f"{dt}+{row}") + f" (d {cfg.d_head})"
        rows.append(dict(dtype=name, same_tokens=sum(same), first_divergence=first, max_logit_err=float(diff.max()),
                         logit_scale=float(np.abs(ref_logits).max()),
                         min_top2_gap=float((top2[:, 1] - top2[:, 0]).min())))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="8x smaller shapes, 3 rounds")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="time calls and probes by CPU time (default: leaves out a shared machine's steal) or wall time")
    ap.add_argument("--isa", choices=["avx2", "neon"], help="the portable path to measure (default: the CPU's)")
    ap.add_argument("--isa-only", action="store_true", help="only the portable-path section")
    ap.add_argument("--dot-rates", metavar="FILE", help="a saved `cargo bench --bench dot_rates` output to take the "
                    "instruction-mix roofs from (default: run it first)")
    ap.add_argument("--speed-only", action="store_true", help="only the decode speed table")
    ap.add_argument("--shape", choices=["a", "d"], action="append",
                    help="the speed table's shapes: a (32/8 heads), d (32/32); default both")
    ap.add_argument("--layers", default="auto",
                    help="layers per cache in the speed table, the calls cycling over them: a number (1-64) or auto "
                         "(default: 8-bit caches at least twice the last-level cache; 1 with --quick)")
    args = ap.parse_args()
    if args.layers != "auto" and not (args.layers.isdigit() and 1 <= int(args.layers) <= 64):
        ap.error(f"--layers: auto or a number of layers from 1 to 64, not {args.layers!r}")
    global CLOCK
    CLOCK = args.clock
    div, reps = (8, 3) if args.quick else (1, args.reps)
    res: dict[str, Any] = {"cpu_features": kv.cpu_features(), "paths": kv.kernel_paths(),
                           "clock": CLOCK}
    isas = [args.isa] if args.isa else [p for p in kv.kernel_paths() if p in ("avx2", "neon")]
    res["isa_speed"] = [] if args.speed_only else [r for isa in isas for sh, hk in SHAPE_KV_HEADS.items()
                                                   for r in isa_speed(sh, [4096 // div] * 8, 32, hk, 128, reps, isa)]
    if args.isa_only:
        print_isa(res["isa_speed"])
        return
    out = Path(__file__).parent / "out"
    rates = load_dot_rates(args.dot_rates, args.quick, out)

    def resample(threads: int) -> None:
        nonlocal rates
        if rates is not None and args.dot_rates is None:
            rates = merge_rates(rates, run_dot_rates(threads, out))

    heads = SHAPE_KV_HEADS
    res["llc_bytes"] = llc = last_level_cache_bytes()

    def layers_of(shape: str) -> int:
        if args.layers != "auto":
            return int(args.layers)
        return 1 if args.quick else streaming_layers([4096 // div] * 8, heads[shape])

    res["speed"] = [r for sh in args.shape or ["a", "d"]
                    for r in speed(sh, [4096 // div] * 8, 32, heads[sh], 128, reps, resample, 2 if args.quick else 6,
                                   layers_of(sh))]
    add_roofs(res["speed"], rates)
    res["dot_rates"] = rates
    res["roofs_sane"] = all(sane(r) for r in res["speed"])
    res["write"] = [] if args.speed_only else write_speed(reps)
    res["accuracy"] = [] if args.speed_only else accuracy(1024 // div)
    res["toy"] = [] if args.speed_only else toy()
    out.mkdir(exist_ok=True)
    (out / "bench_quant.json").write_text(json.dumps(res, indent=1))
    for t in (1, 2):
        r = next(x for x in res["speed"] if x["threads"] == t)
        print(f"Roofs at {t} thread(s): vfmadd231ps zmm (16 FMA = 32 FLOP per instruction) "
              f"{r['peak_gflops']:.0f} GFLOP/s measured (pykvpool.peak_flops, clock {CLOCK!r}), "
              f"{r['peak_gflops'] / 32:.2f} G instr/s; "
              f"vpdpbusd zmm (64 int8 MAC per instruction) at the same instruction rate, sharing the pipes "
              f"(cargo bench --bench dot_rates): "
              f"{2 * r['peak_gflops']:.0f} G MAC/s. Compute roof per row: exact paths d/16 FMAs for q.k + "
              f"d/16 for p.v per token and query head; int8_scores d/64 vpdpbusd + d/16 FMAs; "
              f"bf16_scores d/32 vdpbf16ps (same instruction rate) + d/16 FMAs.")
    llc_text = "unknown" if llc is None else f"{llc / 2**20:,.0f} MiB"
    for sh in args.shape or ["a", "d"]:
        r = next(x for x in res["speed"] if x["shape"] == sh)
        print(f"Shape {sh}: caches of {r['layers']} layer(s) ({r['read_mb'] / 1e3 * r['layers']:.2f} GB of "
              f"{r['dtype']} read per cycle), every call on the next layer; last-level cache {llc_text}.")
    print(f"\nCalls and probes timed by the {res['clock']} clock"
          f"{' (thread CPU time at 1 thread, process CPU time / 2 at 2)' if CLOCK == 'cpu' else ''}.\n")
    print("| shape | thr | dtype | tokens/s | x bf16 (IQR) | x bf16 paired (IQR, pairs) | % bw probe | "
          "% table probe (table / bw) | bw roof | FMA-only roof (instr) | compute roof (instr mix) | binds | % min roof |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in res["speed"]:
        mix = "-" if r["mix"] is None else f"{r['mix']['roof']:,.0f}"
        print(f"| {r['shape']} | {r['threads']} | {r['dtype']} | {r['tokens_per_s']:,.0f} | {r['ratio']:.2f} "
              f"({r['ratio_q1']:.2f}-{r['ratio_q3']:.2f}) | {r['paired']:.2f} ({r['paired_q1']:.2f}-"
              f"{r['paired_q3']:.2f}, {r['pairs']}) | {100 * r['pct_bw']:.0f}% | "
              f"{100 * r['pct_table']:.0f}% ({r['table_over_probe']:.2f}) | {r['bw_roof']:,.0f} | "
              f"{r['fma_roof']:,.0f} ({r['roof_instr']}) | {mix} | {r['binds']} | {100 * r['pct_roof']:.0f}% |")
    print("x bf16 (IQR): the median over rounds of each round's best call against bf16's; x bf16 paired: the "
          "median over alternating pairs of calls (row, bf16) of bf16's time over the row's")
    print("compute roof (instr mix): the codes/s of the path's minimal per-code instruction sequence "
          "(cargo bench --bench dot_rates, thread CPU time) over the codes per sequence (K and V); "
          "% min roof: tokens/s over min(bw roof, instr-mix roof) (the FMA-only roof if dot_rates did not run)")
    print_roofs(res["speed"], rates)
    print("\n| write dtype | ms | GB/s of f32 input |\n|---|---|---|")
    for r in res["write"]:
        print(f"| {r['dtype']} | {1e3 * r['seconds']:.2f} | {r['input_gbs']:.2f} |")
    print("\n| data | dtype | max err / out scale | median | max err / bound | median bound / out scale |")
    print("|---|---|---|---|---|---|")
    for r in res["accuracy"]:
        print(f"| {r['data']} | {r['dtype']} | {r['max_err']:.2e} | {r['median_err']:.2e} | "
              f"{r['max_err_over_bound']:.3f} | {r['median_bound']:.2e} |")
    print("\n| toy KV dtype | tokens = f32 (of 192) | first divergence | max logit err | logit scale | "
          "min top-2 gap |\n|---|---|---|---|---|---|")
    for r in res["toy"]:
        print(f"| {r['dtype']} | {r['same_tokens']} | {r['first_divergence']} | {r['max_logit_err']:.2e} | "
              f"{r['logit_scale']:.2f} | {r['min_top2_gap']:.2e} |")
    print_isa(res["isa_speed"])


if __name__ == "__main__":
    main()
