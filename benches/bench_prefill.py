"""Prefill (multi-query) attention benchmark: pykvpool's paged kernel against the
machine's peak FLOP rate and torch's ``scaled_dot_product_attention``, measured side by
side in one run.

Shapes (block size 16, blocks scattered by a random permutation as in a pool after churn):
  (a) text prefill: 8 sequences x 512 new tokens over 4,096 cached (seq_lens 4,608, the
      queries at the last 512 positions), 32 query / 8 KV heads, head_dim 128, causal;
  (b) video chunk: one stream, a 1,560-token frame over 6,240 cached tokens plus itself
      (seq_len 7,800), 12 / 12 heads, head_dim 128, block-causal with chunk 1,560.

FLOPs count only the visible (query, key) pairs: ``4 * head_dim * Hq * sum(visible)``
(``Q K^T`` and ``P V``, 2 FLOP per multiply-add). Implementations:

- ``pykvpool-f32``: f32 cache, exact;
- ``pykvpool-bf16dp``: bf16 cache with ``q_dtype="bf16"`` (the query rounded to bf16,
  ``vdpbf16ps`` scores where the CPU has avx512_bf16; ``P V`` exact f32, decode's rule);
- ``pykvpool-bf16dp+pv``: the same plus ``pv_dtype="bf16"`` (probabilities rounded to
  bf16, ``P V`` by ``vdpbf16ps`` too: the whole bf16 fast path);
- ``pykvpool-bf16`` and, with ``--dtypes`` (default ``int8,fp8_e4m3,fp8_e5m2``),
  ``pykvpool-int8`` / ``-fp8_e4m3`` / ``-fp8_e5m2``: caches of those dtypes holding the
  same values, exact f32 arithmetic (the 8-bit ones dequantized in the key-tile pack);
  each 8-bit row also reports the median of its per-round ratio to ``pykvpool-bf16``
  with the IQR (the 8-bit target: multi-query no slower than bf16 per query token);
- ``torch``: ``torch.nn.functional.scaled_dot_product_attention`` in f32 on the same K/V
  gathered into contiguous ``[B, H, S, d]`` tensors (gathering not timed), its fastest
  of: GQA by ``enable_gqa`` or by expanded K/V, with the mask as a boolean tensor (the
  bottom-right causal mask of (a)) or none ((b): the frame sees every key). Same thread
  count (``torch.set_num_threads``).

Each round times every implementation once (plus one peak-FLOP probe at the same thread
count); ratios are taken per round and the median over ``--reps`` rounds is reported,
with the best time of each implementation. The machine is shared: read ratios, not
absolute times.

Run: ``python benches/bench_prefill.py`` (writes ``benches/out/bench_prefill.json`` and
prints a markdown table); ``--quick`` divides the batch/lengths by 4; ``--isa avx2``
forces every pykvpool row onto one kernel path (``tuning=KernelTuning(isa="avx2")``);
``--no-torch`` leaves torch out; ``--only bf16,int8`` runs those pykvpool rows (and f32)
only.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Literal, cast

import numpy as np

import pykvpool as kv

BS = 16


def shapes(quick: bool) -> dict[str, dict[str, Any]]:
    s = 4 if quick else 1
    return {
        "a": dict(n=8 // s if quick else 8, cached=4096 // s, new=512 // s, hq=32, hkv=8, d=128, chunk=None),
        "b": dict(n=1, cached=6240 // s, new=1560 // s, hq=12, hkv=12, d=128, chunk=1560 // s),
    }


def visible_pairs(sh: dict[str, Any]) -> int:
    """Visible (query, key) pairs per sequence and head."""
    L, new = sh["cached"] + sh["new"], sh["new"]
    pos = np.arange(L - new, L)
    if sh["chunk"] is None:
        return int((pos + 1).sum())
    c = sh["chunk"]
    return int(np.minimum((pos // c + 1) * c, L).sum())


def build(sh: dict[str, Any], seed: int = 0, dtypes: tuple[str, ...] = ()) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n, hkv, d, L = sh["n"], sh["hkv"], sh["d"], sh["cached"] + sh["new"]
    per = -(-L // BS)
    nb = n * per + 1
    caches = {dt: kv.KvCache(1, nb, BS, hkv, d, dt) for dt in ["f32", "bf16", *dtypes]}
    k = rng.standard_normal((nb * BS, hkv, d), dtype=np.float32)
    v = rng.standard_normal((nb * BS, hkv, d), dtype=np.float32)
    for c in caches.values():
        for i in range(0, nb * BS, 16384):
            j = min(i + 16384, nb * BS)
            c.write(0, k[i:j], v[i:j], np.arange(i, j))
    table = rng.permutation(nb)[: n * per].reshape(n, per).astype(np.int32)
    q = rng.standard_normal((n * sh["new"], sh["hq"], d), dtype=np.float32)
    indptr = np.arange(n + 1) * sh["new"]
    # Contiguous copies for torch: [n, hkv, L, d] read through the same table.
    kc, vc = caches["f32"].key(0), caches["f32"].value(0)
    t = np.arange(L)
    kg = np.stack([kc[table[i][t // BS], t % BS].transpose(1, 0, 2) for i in range(n)])
    vg = np.stack([vc[table[i][t // BS], t % BS].transpose(1, 0, 2) for i in range(n)])
    return dict(caches=caches, table=table, q=q, indptr=indptr, lens=[L] * n, kg=kg, vg=vg)


def torch_fns(sh: dict[str, Any], data: dict[str, Any]) -> dict[str, Callable[[], object]]:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}
    n, new, hq, hkv, d = sh["n"], sh["new"], sh["hq"], sh["hkv"], sh["d"]
    L = sh["cached"] + new
    q = torch.from_numpy(data["q"].reshape(n, new, hq, d).transpose(0, 2, 1, 3).copy())
    k, v = torch.from_numpy(data["kg"]), torch.from_numpy(data["vg"])
    mask = None
    if sh["chunk"] is None:
        pos = torch.arange(L - new, L)[:, None]
        mask = torch.arange(L)[None, :] <= pos
    else:
        c = sh["chunk"]
        pos = torch.arange(L - new, L)[:, None]
        m = (torch.arange(L)[None, :] // c) <= pos // c
        mask = None if bool(m.all()) else m
    g = hq // hkv
    ke, ve = (k.repeat_interleave(g, 1).contiguous(), v.repeat_interleave(g, 1).contiguous()) if g > 1 else (k, v)
    out: dict[str, Callable[[], object]] = {}
    with torch.no_grad():
        if g > 1:
            out["gqa"] = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        out["expanded"] = lambda: F.scaled_dot_product_attention(q, ke, ve, attn_mask=mask)
    return out


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_shape(name: str, sh: dict[str, Any], threads: int, reps: int, dtypes: tuple[str, ...] = (),
              isa: str | None = None, torch: bool = True, only: tuple[str, ...] = ()) -> dict[str, Any]:
    data = build(sh, dtypes=dtypes)
    flops = 4 * sh["d"] * sh["hq"] * sh["n"] * visible_pairs(sh)
    c32, c16 = data["caches"]["f32"], data["caches"]["bf16"]
    args = (data["q"], data["indptr"], data["table"], data["lens"])
    # --isa: a path of kernel_paths() (KernelTuning refuses others).
    tuning = kv.KernelTuning(isa=cast(Literal["scalar", "neon", "avx2", "avx512"], isa)) if isa else None
    kw: dict[str, Any] = {"causal": True, "chunk_size": sh["chunk"], "tuning": tuning}
    impls: dict[str, Callable[[], object]] = {
        "pykvpool-f32": lambda: kv.prefill_attention(c32, 0, *args, **kw),
        "pykvpool-bf16dp": lambda: kv.prefill_attention(c16, 0, *args, q_dtype="bf16", **kw),
        "pykvpool-bf16dp+pv": lambda: kv.prefill_attention(c16, 0, *args, q_dtype="bf16", pv_dtype="bf16", **kw),
    }
    if dtypes:
        impls["pykvpool-bf16"] = lambda: kv.prefill_attention(c16, 0, *args, **kw)
        for dt in dtypes:
            impls[f"pykvpool-{dt}"] = lambda c=data["caches"][dt]: kv.prefill_attention(c, 0, *args, **kw)
    if only:
        impls = {k: f for k, f in impls.items() if k == "pykvpool-f32" or k.removeprefix("pykvpool-") in only}
    tfns = torch_fns(sh, data) if torch else {}
    kv.set_num_threads(threads)
    if tfns:
        import torch

        torch.set_num_threads(threads)
        # torch's fastest variant, picked once (one warm call each).
        best = min(tfns, key=lambda k: min(timed(tfns[k]) for _ in range(2)))
        impls[f"torch-sdpa ({best})"] = tfns[best]
        ref = np.asarray(tfns[best]()).transpose(0, 2, 1, 3).reshape(data["q"].shape)
        got = np.asarray(impls["pykvpool-f32"]())
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
    else:
        err = float("nan")
    for fn in impls.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in impls}
    peaks: list[float] = []
    for _ in range(reps):
        peaks.append(kv.peak_flops(threads))
        for k, fn in impls.items():
            times[k].append(timed(fn))
    base = times["pykvpool-f32"]
    rows = {}
    for k, ts in times.items():
        rows[k] = dict(
            best_s=min(ts),
            gflops=flops / min(ts) / 1e9,
            pct_peak=statistics.median(flops / t / p * 100 for t, p in zip(ts, peaks)),
            speedup_vs_f32=statistics.median(b / t for b, t in zip(base, ts)),
        )
        if k.removeprefix("pykvpool-") in dtypes:
            # Per query token, 8-bit over bf16 (both exact f32 arithmetic): >= 1 is no slower.
            r = [b / t for b, t in zip(times["pykvpool-bf16"], ts)]
            rows[k]["x_bf16"] = [float(np.median(r)), float(np.quantile(r, 0.25)), float(np.quantile(r, 0.75))]
    return dict(shape=name, threads=threads, isa=isa or kv.kernel_paths()[-1], flops=flops,
                peak_gflops=statistics.median(peaks) / 1e9, torch_rel_err=err, impls=rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shapes", default="ab")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="int8,fp8_e4m3,fp8_e5m2", help="8-bit caches to add ('' for none)")
    ap.add_argument("--isa", default=None, help="force one kernel path (scalar, avx2, avx512, neon)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--only", default="", help="pykvpool rows to run besides f32, e.g. 'bf16,int8' ('': all)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "bench_prefill.json"))
    a = ap.parse_args()
    dtypes = tuple(x for x in a.dtypes.split(",") if x)
    results = []
    for name in a.shapes:
        sh = shapes(a.quick)[name]
        for t in [int(x) for x in a.threads.split(",")]:
            only = tuple(x for x in a.only.split(",") if x)
            r = run_shape(name, sh, t, a.reps, dtypes, a.isa, not a.no_torch, only)
            results.append(r)
            print(f"\n({name}) path {r['isa']} threads={t} peak {r['peak_gflops']:.1f} GFLOP/s (FMA probe), "
                  f"{r['flops'] / 1e9:.1f} GFLOP per call, pykvpool vs torch max rel diff {r['torch_rel_err']:.1e}")
            print("| impl | best s | GFLOP/s | % peak (median) | x pykvpool-f32 (median) | x bf16 per query token (IQR) |")
            print("|---|---|---|---|---|---|")
            for k, row in r["impls"].items():
                xb = "{:.2f} ({:.2f}-{:.2f})".format(*row["x_bf16"]) if "x_bf16" in row else "-"
                print(f"| {k} | {row['best_s']:.3f} | {row['gflops']:.1f} | {row['pct_peak']:.0f}% | "
                      f"{row['speedup_vs_f32']:.2f} | {xb} |")
    meta = dict(machine=platform.machine(), cpu_features=kv.cpu_features(), paths=kv.kernel_paths())
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(dict(meta=meta, results=results), indent=1))


if __name__ == "__main__":
    main()
