"""Decode-attention benchmark: pykvpool's kernel against the machine's read bandwidth,
measured in the same run, and against a numpy grouped-matmul reference.

Shapes (block size 16, blocks scattered by a random permutation as in a pool after churn):
  (a) 8 sequences x 4096 tokens, 32 query / 8 KV heads, head_dim 128
  (b) as (a) with lengths uniform in 512..4096
  (c) 1 sequence x 32768 tokens (needs FlashDecoding split-K to use two cores)
  (d) MHA: 8 x 4096 tokens, 32 / 32 heads
each in f32, f16 and bf16 storage, at 1 and 2 threads, and bf16 with ``q_dtype="bf16"``
(impl "pykvpool-dp": query rounded to bf16, scores by ``vdpbf16ps`` on CPUs with
avx512_bf16; its largest deviation from the exact bf16 output is printed below the table).

Effective bandwidth = useful K+V bytes (sum of lengths x Hkv x d x 2 x bytes per element)
/ best wall time. "% probe" pairs each kernel measurement with a read-bandwidth probe of
the same cache's own pages (``pykvpool.read_bandwidth(cache=...)``: the same memory, the
same thread count), taken right before it: ``--reps`` rounds of (probe, best of 3 sweeps;
kernel, best of 3 calls), and the median of the per-round ratios is reported with its
interquartile range. On this virtual machine the read rate of memory depends on where
its pages landed and swings with the other tenants (fresh 128 MiB buffers at 2 threads:
45 to 100 GB/s from one run to the next), so a probe of other memory, or the best probe
against the best kernel call, mostly measures luck; "best / best probe" is printed too.
torch and numpy read gathered tensors in fresh memory, so their % is against a fresh-buffer
probe (256 MiB, same thread count). "GB/s per CPU-s" divides by process CPU time /
threads instead (what the code does while it runs).

torch at its best (when importable; ``--no-torch`` skips it): ``torch_decode.py``'s paths
on K/V gathered contiguous beforehand (pre-expanded to all query heads through ``matmul``;
grouped ``matmul`` reading each K/V row once; ``scaled_dot_product_attention`` with
``enable_gqa``), each in f32 and bf16, with ``torch.set_num_threads`` equal to pykvpool's
(1 and 2). They run in interleaved rounds with pykvpool's f32 and bf16 decode (best of 3
calls each per round); each torch row's "pykvpool ..x" is the median of the per-round
ratios torch time / pykvpool time (same dtype) with its IQR, and the headline table
compares pykvpool with the fastest torch path (lowest median) of each dtype, and of any
dtype against pykvpool's fastest dtype.

Run: ``python benches/bench_attention.py`` (writes ``benches/out/bench_attention.json``
and prints a markdown table). ``--quick`` shrinks every shape 8x for a smoke run.

``--window`` runs the sliding-window case instead: 8 sequences, 32 query / 8 KV heads,
head_dim 128, bf16, ``window_left`` 4095 (a 4096-token window) and 16 sink tokens, at
logical lengths 8k to 512k. Only the blocks a windowed pool keeps are stored (the sink
block and the window's 256 blocks per sequence, scattered; the pool does not grow with
the length), and the tables are the hybrid pool's exports: FlashInfer pages with
``kv_page_start`` (only stored pages) and a padded ``[8, L / 16]`` table whose released
columns are -1. The
kernel reads the same keys at every length (the outputs are bitwise equal), so its time
must not grow with the logical length; the padded form still converts its whole table
(``L / 16`` entries per row) in the binding. Lengths are timed in interleaved rounds.

``--ab DIR`` compares this build's decode (no window) with another build's extension
(``DIR/_native*.so``, e.g. an older commit built with ``maturin build`` and unpacked) in
one process, calls alternating, on shapes (a) and (c) in f32 and bf16 (``--resident 16``:
from cache; both builds get fresh copies of the cache every ``REALLOCATE`` pairs, as a
copy's read rate depends on where its pages landed); prints the median of the per-pair
time ratios this/other with its IQR.
``--resident N`` makes every sequence read only N distinct blocks (table entries modulo
N): the data stays in cache, so the rate is the kernel's compute ceiling, not DRAM's.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import pykvpool as kv
from benches import ab_decode, torch_decode
from benches.common import write_json

BS = 16
ESIZE = {"f32": 4, "f16": 2, "bf16": 2}


def shapes(scale: int) -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng(0)
    uniform = rng.integers(512, 4097, 8) // scale
    return {
        "a": dict(lens=[4096 // scale] * 8, hq=32, hkv=8, d=128),
        "b": dict(lens=[int(x) for x in uniform], hq=32, hkv=8, d=128),
        "c": dict(lens=[32768 // scale], hq=32, hkv=8, d=128),
        "d": dict(lens=[4096 // scale] * 8, hq=32, hkv=32, d=128),
    }


def best_time(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    fn()  # warm up (page tables, thread wake-up)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts), float(np.median(ts))


def paired(fn: Callable[[], object], cache: kv.KvCache, nbytes: int, threads: int, reps: int) -> dict[str, Any]:
    """``reps`` rounds of: a read-bandwidth probe over the cache's own memory (best of
    3 sweeps), then the kernel (best of 3 calls). Each round gives one ratio of two
    rates measured back to back on the same pages with the same threads and the same
    best-of-3 rule; the median ratio over rounds is the "% probe" (robust to a shared
    machine's swings, which move both halves of a round together). Also returns the best
    and median kernel wall time, the best process CPU time and the best probe."""
    fn()
    walls, cpus, probes, ratios = [], [], [], []
    for _ in range(reps):
        p = kv.read_bandwidth(cache=cache, threads=threads, passes=3)
        best = float("inf")
        for _ in range(3):
            c, t = time.process_time(), time.perf_counter()
            fn()
            w = time.perf_counter() - t
            walls.append(w)
            cpus.append(time.process_time() - c)
            best = min(best, w)
        probes.append(p)
        ratios.append(nbytes / best / p)
    return dict(seconds=min(walls), median=float(np.median(walls)), cpu_seconds=min(cpus), probe=max(probes),
                probe_median=float(np.median(probes)), paired_ratio=float(np.median(ratios)),
                paired_ratio_q1=float(np.quantile(ratios, 0.25)), paired_ratio_q3=float(np.quantile(ratios, 0.75)))


def build(shape: dict[str, Any], dtypes: list[str], seed: int) -> tuple[dict[str, kv.KvCache], np.ndarray, np.ndarray]:
    """Caches of every dtype holding the same values, a scattered block table, q."""
    lens = shape["lens"]
    nblk = [-(-n // BS) for n in lens]
    total = sum(nblk)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(total).astype(np.int32)
    table = np.full((len(lens), max(nblk)), -1, np.int32)
    at = 0
    for i, nb in enumerate(nblk):
        table[i, :nb] = perm[at : at + nb]
        at += nb
    caches = {dt: kv.KvCache(1, total, BS, shape["hkv"], shape["d"], dt) for dt in dtypes}
    step = 256
    for b0 in range(0, total, step):
        nb = min(step, total - b0)
        k, v = (rng.standard_normal((nb * BS, shape["hkv"], shape["d"]), dtype=np.float32) for _ in range(2))
        slots = np.arange(b0 * BS, (b0 + nb) * BS, dtype=np.int64)
        for c in caches.values():
            # The cache's own write kernel rounds to the storage dtype (nearest even).
            # (Before bf16 views required ml_dtypes, a view without it was uint16 and
            # assigning floats to it stored float-to-integer casts, not bf16 values.)
            c.write(0, k, v, slots)
    q = rng.standard_normal((len(lens), shape["hq"], shape["d"]), dtype=np.float32)
    return caches, table, q


def numpy_reference_time(cache: kv.KvCache, table: np.ndarray, lens: list[int], q: np.ndarray, reps: int) -> float:
    """Grouped matmul per sequence (q viewed as [Hkv, g, d], no np.repeat) over K/V
    already gathered contiguous: only the attention math is timed."""
    hkv, d = cache.num_kv_heads, cache.head_dim
    g = q.shape[1] // hkv
    kview, vview = cache.key(0), cache.value(0)
    per_seq = []
    for i, n in enumerate(lens):
        t = np.arange(n)
        blocks = table[i][t // BS]
        k = np.ascontiguousarray(kview[blocks, t % BS].transpose(1, 2, 0))  # [Hkv, d, n]
        v = np.ascontiguousarray(vview[blocks, t % BS].transpose(1, 0, 2))  # [Hkv, n, d]
        per_seq.append((q[i].reshape(hkv, g, d) * np.float32(1 / np.sqrt(d)), k, v))

    def step() -> None:
        # Every sequence in one timed step, as the kernel does (see torch_time).
        for qi, k, v in per_seq:
            s = qi @ k
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            s @ v

    return best_time(step, max(2, reps // 3))[0]


def torch_rows(name: str, shape: dict[str, Any], caches: dict[str, kv.KvCache], table: np.ndarray, q: np.ndarray,
               threads: list[int], reps: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """torch's fastest CPU decode paths (``torch_decode.py``: pre-expanded and grouped
    matmul, SDPA with ``enable_gqa``; f32 and bf16) against pykvpool's f32 and bf16 caches
    in interleaved rounds, torch's thread count set to pykvpool's. Returns the per-path rows
    and the headline rows (pykvpool vs the fastest torch path); both empty without torch."""
    try:
        import torch  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return [], []
    lens = shape["lens"]
    theirs = torch_decode.paths(caches["f32"], table, lens, q, BS)
    mine = {dt: (lambda c=caches[dt]: kv.decode_attention(c, 0, q, table, lens)) for dt in ("f32", "bf16")}
    rows, heads = [], []
    for t in threads:
        res = torch_decode.versus(mine, theirs, t, reps)
        for (kind, dt) in theirs:
            r = res["rows"][f"torch {kind} {dt}"]
            tbytes = sum(lens) * shape["hkv"] * shape["d"] * 2 * ESIZE[dt]
            sp = r["pykvpool_speedup"]
            rows.append(dict(shape=name, dtype=dt, threads=t, impl=f"torch-{kind}", seconds=r["best"], median=r["median"],
                             bytes=tbytes, gbps=tbytes / r["best"] / 1e9, pykvpool_speedup=sp["median"],
                             pykvpool_speedup_q1=sp["q1"], pykvpool_speedup_q3=sp["q3"]))
        for dt, h in res["headline"].items():
            mine_name = h.get("pykvpool", f"pykvpool {dt}")
            heads.append(dict(shape=name, threads=t, dtype=dt, torch=h["torch"], pykvpool=mine_name,
                              torch_median_ms=res["rows"][h["torch"]]["median"] * 1e3,
                              pykvpool_median_ms=res["rows"][mine_name]["median"] * 1e3,
                              speedup=h["median"], q1=h["q1"], q3=h["q3"]))
    torch.set_num_threads(max(threads))
    return rows, heads


WINDOW, SINKS, WIN_LENGTHS = 4096, 16, [8 << 10, 32 << 10, 128 << 10, 512 << 10]


def window_case(reps: int, out: Path) -> None:
    """Decode time with a 4096-token window at logical lengths 8k..512k (see the module
    docstring). One cache serves every length (the same physical blocks and data; only the
    tables' logical places change); the lengths and table forms are timed in interleaved
    rounds, so a shared machine's drift moves them together, and each figure's ratio to
    8k is the median of the per-round ratios. Prints a markdown table and writes ``out``."""
    n, hq, hkv, d = 8, 32, 8, 128
    rng = np.random.default_rng(0)
    q = rng.standard_normal((n, hq, d), dtype=np.float32)
    sink_blocks = -(-SINKS // BS)
    stored = sink_blocks + WINDOW // BS  # the sink block and the window's (lengths are multiples of 16)
    perm = rng.permutation(n * stored).astype(np.int32).reshape(n, stored)
    cache = kv.KvCache(1, n * stored, BS, hkv, d, "bf16")
    for b0 in range(0, n * stored, 256):
        nb = min(256, n * stored - b0)
        k, v = (rng.standard_normal((nb * BS, hkv, d), dtype=np.float32) for _ in range(2))
        cache.write(0, k, v, np.arange(b0 * BS, (b0 + nb) * BS))
    kw: dict[str, Any] = dict(window_left=WINDOW - 1, sink_tokens=SINKS)
    calls: dict[tuple[int, str], Callable[[], Any]] = {}
    for length in WIN_LENGTHS:
        nblk = -(-length // BS)
        first = (length - WINDOW) // BS  # the block holding the window's first key
        assert sink_blocks + nblk - first == stored
        table = np.full((n, nblk), -1, np.int32)
        table[:, list(range(sink_blocks)) + list(range(first, nblk))] = perm
        indptr = np.arange(n + 1, dtype=np.int32) * stored
        last = np.full(n, (length - 1) % BS + 1, np.int32)
        start = np.full(n, first, np.int32)
        calls[length, "paged"] = lambda indptr=indptr, last=last, start=start: kv.decode_attention_paged(
            cache, 0, q, indptr, perm.ravel(), last, kv_page_start=start, **kw)
        calls[length, "padded"] = lambda table=table, length=length: kv.decode_attention(
            cache, 0, q, table, [length] * n, **kw)
    ref = calls[WIN_LENGTHS[0], "paged"]()
    assert all(np.array_equal(fn(), ref) for fn in calls.values()), "the same keys at every length"
    times: dict[tuple[int, str], list[float]] = {key: [] for key in calls}
    for r in range(reps):
        for key in (list(calls) if r % 2 else list(calls)[::-1]):
            t = time.perf_counter()
            calls[key]()
            times[key].append(time.perf_counter() - t)
    rows = []
    for (length, form), ts in times.items():
        ratio = np.array(ts) / np.array(times[WIN_LENGTHS[0], form])
        rows.append(dict(length=length, form=form, stored_blocks=n * stored, seconds=min(ts), median=float(np.median(ts)),
                         ratio_median=float(np.median(ratio)), ratio_q1=float(np.quantile(ratio, 0.25)),
                         ratio_q3=float(np.quantile(ratio, 0.75))))
    print(f"window {WINDOW} (window_left {WINDOW - 1}), {SINKS} sinks, {n} x {hq}/{hkv} heads, d {d}, bf16, "
          f"{kv.get_num_threads()} threads, {reps} interleaved rounds; load {os.getloadavg()}")
    print("| logical length | tables | stored blocks | best ms | median ms | time / time at 8k, per-round median [IQR] |")
    print("|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["form"], r["length"])):
        print(f"| {r['length']} | {r['form']} | {r['stored_blocks']} | {r['seconds'] * 1e3:.2f} | {r['median'] * 1e3:.2f} | "
              f"{r['ratio_median']:.2f} [{r['ratio_q1']:.2f}-{r['ratio_q3']:.2f}] |")
    write_json(dict(window=WINDOW, sinks=SINKS, threads=kv.get_num_threads(), rows=rows), out)


#: ``--ab``: pairs of calls per allocation. Each build reads its own copy of the cache,
#: and a copy's read rate depends on where its pages landed (``ab_decode --reallocate``:
#: a build against itself read 1.12 with one allocation each), so both get fresh copies
#: every few pairs.
REALLOCATE = 4


def ab_case(other_dir: str, reps: int, resident: int) -> None:
    """This build's decode against another build's, alternating calls (see the module
    docstring): a shared machine's drift moves both halves of a pair together."""
    try:
        other = ab_decode.load_extension(other_dir, "pykvpool_other._native")
    except FileNotFoundError:
        raise SystemExit(f"bench_attention: error: no _native*.so in {other_dir}") from None
    mods = {"this": kv._native, "other": other}
    print(f"{kv.get_num_threads()} threads, {reps} pairs, resident {resident}; load {os.getloadavg()}")
    print("| shape | dtype | this best ms | other best ms | this/other, per-pair median [IQR] |")
    print("|---|---|---|---|---|")
    for name, shape in shapes(1).items():
        if name not in "ac":
            continue
        for dt in ("f32", "bf16"):
            caches, table, q = build(shape, [dt], seed=ord(name))
            if resident:
                table = np.where(table >= 0, table % resident, -1).astype(np.int32)
            lens = shape["lens"]
            src = caches[dt]
            for m in mods.values():
                m.set_num_threads(kv.get_num_threads())
            cs = {tag: ab_decode.clone_cache(m, src) for tag, m in mods.items()}
            outs = [mods[t].decode_attention(cs[t], 0, q, table, lens) for t in mods]
            assert np.array_equal(outs[0], outs[1]), "both builds compute the same thing"
            ts: dict[str, list[float]] = {"this": [], "other": []}
            for r in range(reps):
                if r and r % REALLOCATE == 0:
                    cs = {}  # fresh pages for both sides (see ab_decode --reallocate)
                    cs = {tag: ab_decode.clone_cache(m, src) for tag, m in mods.items()}
                for tag in (("this", "other") if r % 2 else ("other", "this")):
                    t = time.perf_counter()
                    mods[tag].decode_attention(cs[tag], 0, q, table, lens)
                    ts[tag].append(time.perf_counter() - t)
            ratio = np.array(ts["this"]) / np.array(ts["other"])
            print(f"| {name} | {dt} | {min(ts['this']) * 1e3:.2f} | {min(ts['other']) * 1e3:.2f} | "
                  f"{np.median(ratio):.3f} [{np.quantile(ratio, 0.25):.3f}-{np.quantile(ratio, 0.75):.3f}] |")
            del caches, cs


def print_headline(heads: list[dict[str, Any]]) -> None:
    print("\npykvpool vs torch at its best (same run, same threads; time torch / time pykvpool, per-round median [IQR]):")
    print("| shape | threads | dtype | fastest torch path | torch median ms | pykvpool | pykvpool median ms | speedup |")
    print("|---|---|---|---|---|---|---|---|")
    for h in heads:
        print(f"| {h['shape']} | {h['threads']} | {h['dtype']} | {h['torch']} | {h['torch_median_ms']:.2f} | "
              f"{h['pykvpool']} | {h['pykvpool_median_ms']:.2f} | {h['speedup']:.2f}x [{h['q1']:.2f}-{h['q3']:.2f}] |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--shapes", default="abcd")
    ap.add_argument("--resident", type=int, default=0, help="blocks actually read (0: all; e.g. 16 for cache-resident)")
    ap.add_argument("--window", action="store_true", help="only the sliding-window case (logical lengths 8k..512k)")
    ap.add_argument("--ab", metavar="DIR", help="only: this build's decode against DIR/_native*.so, alternating")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch baselines")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "bench_attention.json"))
    args = ap.parse_args()
    if args.window:
        window_case(args.reps, Path(args.out).with_name("bench_attention_window.json"))
        return
    if args.ab:
        ab_case(args.ab, args.reps, args.resident)
        return
    scale = 8 if args.quick else 1
    dtypes = ["f32", "f16", "bf16"]
    threads = [1, 2]
    probe: dict[int, float] = {}

    def measure_probe() -> None:
        for t in threads:
            probe[t] = max(probe.get(t, 0.0), kv.read_bandwidth(threads=t))

    measure_probe()
    flops = {t: kv.peak_flops(threads=t) for t in threads}
    rows: list[dict[str, Any]] = []
    headline: list[dict[str, Any]] = []  # pykvpool vs torch's fastest path, per shape and threads
    huge_pages: dict[str, bool] = {}  # whether the OS took the THP advice for every cache of a shape
    for name, shape in shapes(scale).items():
        if name not in args.shapes:
            continue
        caches, table, q = build(shape, dtypes, seed=ord(name))
        if args.resident:
            table = np.where(table >= 0, table % args.resident, -1).astype(np.int32)
        huge_pages[name] = all(c.huge_pages for c in caches.values())
        lens = shape["lens"]
        tokens = sum(lens)
        for t in threads:
            kv.set_num_threads(t)
            for dt in dtypes:
                c = caches[dt]
                nbytes = tokens * shape["hkv"] * shape["d"] * 2 * ESIZE[dt]
                r = paired(lambda: kv.decode_attention(c, 0, q, table, lens), c, nbytes, t, args.reps)
                r.update(shape=name, dtype=dt, threads=t, impl="pykvpool", bytes=nbytes, gbps=nbytes / r["seconds"] / 1e9,
                         cpu_gbps=nbytes * t / r["cpu_seconds"] / 1e9)
                rows.append(r)
            # bf16 with q_dtype="bf16": the query rounded to bf16, scores by vdpbf16ps
            # where the CPU has avx512_bf16; its distance from the exact bf16 output.
            c = caches["bf16"]
            nbytes = tokens * shape["hkv"] * shape["d"] * 2 * ESIZE["bf16"]
            r = paired(lambda: kv.decode_attention(c, 0, q, table, lens, q_dtype="bf16"), c, nbytes, t, args.reps)
            exact = kv.decode_attention(c, 0, q, table, lens)
            err = np.abs(kv.decode_attention(c, 0, q, table, lens, q_dtype="bf16") - exact).max()
            r.update(shape=name, dtype="bf16", threads=t, impl="pykvpool-dp", bytes=nbytes, gbps=nbytes / r["seconds"] / 1e9,
                     cpu_gbps=nbytes * t / r["cpu_seconds"] / 1e9, err_vs_exact=float(err / np.abs(exact).max()))
            rows.append(r)
        f32 = caches["f32"]
        nbytes = tokens * shape["hkv"] * shape["d"] * 8
        tn = numpy_reference_time(f32, table, lens, q, args.reps)
        rows.append(dict(shape=name, dtype="f32", threads=0, impl="numpy", seconds=tn, bytes=nbytes, gbps=nbytes / tn / 1e9))
        if not args.no_torch:
            trows, theads = torch_rows(name, shape, caches, table, q, threads, args.reps)
            rows += trows
            headline += theads
        del caches
    for r in rows:
        if r["impl"].startswith("pykvpool"):
            r["pct_probe"] = 100 * r["paired_ratio"]
            r["pct_best_probe"] = 100 * r["gbps"] * 1e9 / r["probe"]
            base = next(x for x in rows if x["impl"] == "pykvpool" and x["shape"] == r["shape"]
                        and x["threads"] == r["threads"] and x["dtype"] == "f32")
            r["speed_vs_f32"] = base["seconds"] / r["seconds"]
        else:
            # Gathered, contiguous tensors in fresh memory: the fresh-buffer probe of the
            # same thread count (numpy's BLAS threads: the 1-thread probe).
            r["pct_probe"] = 100 * r["gbps"] * 1e9 / probe[max(1, r["threads"])]
    meta = dict(
        machine=platform.machine(), cpu_features=kv.cpu_features(), kernel_paths=kv.kernel_paths(),
        probe_gbps={t: p / 1e9 for t, p in probe.items()}, peak_gflops={t: f / 1e9 for t, f in flops.items()},
        load_average=os.getloadavg(), huge_pages=huge_pages, resident_blocks=args.resident, quick=args.quick, reps=args.reps, block_size=BS,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(dict(meta=meta, rows=rows, vs_torch=headline), args.out)
    print(f"probe GB/s: {', '.join(f'{t} thr {p / 1e9:.1f}' for t, p in probe.items())}; "
          f"peak GFLOP/s: {', '.join(f'{t} thr {f / 1e9:.0f}' for t, f in flops.items())}; load {meta['load_average']}; "
          f"huge pages: {huge_pages}")
    print("| shape | impl | dtype | threads | best ms | GB/s | probe GB/s | % probe, paired median [IQR] | best / best probe | speed vs f32 | GB/s per CPU-s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        thr = r["threads"] or "BLAS"
        sp = f"{r['speed_vs_f32']:.2f}x" if "speed_vs_f32" in r else ""
        if "pykvpool_speedup" in r:
            sp = (f"pykvpool {r['pykvpool_speedup']:.2f}x [{r['pykvpool_speedup_q1']:.2f}-"
                  f"{r['pykvpool_speedup_q3']:.2f}]")
        cpu = f"{r['cpu_gbps']:.1f}" if "cpu_gbps" in r else ""
        if r["impl"].startswith("pykvpool"):
            pr = f"{r['probe_median'] / 1e9:.1f} (own pages)"
            pct = f"{r['pct_probe']:.0f}% [{100 * r['paired_ratio_q1']:.0f}-{100 * r['paired_ratio_q3']:.0f}]"
            bb = f"{r['pct_best_probe']:.0f}%"
        else:
            pr, pct, bb = f"{probe[max(1, r['threads'])] / 1e9:.1f} (fresh)", f"{r['pct_probe']:.0f}%", ""
        print(f"| {r['shape']} | {r['impl']} | {r['dtype']} | {thr} | {r['seconds'] * 1e3:.2f} | {r['gbps']:.1f} | {pr} | "
              f"{pct} | {bb} | {sp} | {cpu} |")
    if headline:
        print_headline(headline)
    dp = [r for r in rows if "err_vs_exact" in r]
    if dp:
        print('pykvpool-dp (q_dtype="bf16") max |out - exact bf16 out| / max |exact out|: '
              + ", ".join(f"{r['shape']} {r['threads']} thr {r['err_vs_exact']:.1e}" for r in dp))

if __name__ == "__main__":
    main()
