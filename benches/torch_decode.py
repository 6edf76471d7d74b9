"""torch's fastest CPU decode-attention paths, the baselines of bench_attention.py.

Each path gets K/V gathered from the paged cache into contiguous tensors beforehand (the
gather is not timed: torch has no paged kernel on CPU, so this is torch at its best):

- ``matmul-expanded``: K/V repeated to all query heads (``repeat_kv``, as transformers'
  eager attention does) and contiguous, ``[B, Hq, S, d]``; ``matmul(q, K^T)``, softmax,
  ``matmul(P, V)`` (batched GEMV through ``bmm``).
- ``matmul-grouped``: no repetition: q viewed as ``[B, Hkv, g, d]`` against
  ``[B, Hkv, S, d]`` K/V, so each K/V row is read once (``g`` rows per GEMM).
- ``sdpa``: ``scaled_dot_product_attention(..., enable_gqa=True)`` on ``[B, Hkv, S, d]``.

each in f32 and in bf16 (K/V rounded to bf16 by ``Tensor.to``, nearest even, the values
of a pykvpool bf16 cache; q and P in bf16 for the matmuls, which accumulate in f32 on CPU;
softmax in f32, as transformers' eager attention computes it). Sequences of equal length
are one batch; otherwise every sequence is its own call, all timed as one decode step.

``paths(...)`` returns callables that compute the output ``[n, Hq, d]``, so a test can
check them against pykvpool's kernel on a small shape (``tests/test_bench_smoke.py``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

import pykvpool as kv

KINDS = ("matmul-expanded", "matmul-grouped", "sdpa")


def gathered(cache: kv.KvCache, table: np.ndarray, lens: list[int], bs: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per sequence, its K and V as contiguous float32 ``[Hkv, S, d]`` (logical order)."""
    kview, vview = cache.key(0), cache.value(0)
    out = []
    for i, n in enumerate(lens):
        t = np.arange(n)
        blocks = table[i][t // bs]
        k = np.ascontiguousarray(kview[blocks, t % bs].transpose(1, 0, 2))
        v = np.ascontiguousarray(vview[blocks, t % bs].transpose(1, 0, 2))
        out.append((k, v))
    return out


def batches(q: np.ndarray, kvs: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[Any, Any, Any]]:
    """``(q [B, Hq, d], K [B, Hkv, S, d], V)`` float32 tensors: one batch when every length
    is equal, else one per sequence."""
    import torch

    if len({k.shape[1] for k, _ in kvs}) == 1:
        k = torch.from_numpy(np.stack([k for k, _ in kvs]))
        v = torch.from_numpy(np.stack([v for _, v in kvs]))
        return [(torch.from_numpy(q), k, v)]
    return [(torch.from_numpy(q[i : i + 1]), torch.from_numpy(k[None]), torch.from_numpy(v[None]))
            for i, (k, v) in enumerate(kvs)]


def one_path(kind: str, q: Any, k: Any, v: Any) -> Callable[[], Any]:
    """A call computing ``[B, Hq, d]`` for one batch: float32 ``q`` ``[B, Hq, d]``, K/V
    ``[B, Hkv, S, d]`` contiguous in the path's dtype (float32 or bfloat16)."""
    import torch

    tdt = k.dtype
    b, hq, d = q.shape
    hkv, g = k.shape[1], hq // k.shape[1]
    scale = 1.0 / math.sqrt(d)
    if kind == "sdpa":
        qs = q.to(tdt)[:, :, None, :].contiguous()
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return lambda: sdpa(qs, k, v, enable_gqa=True).view(b, hq, d)
    if kind == "matmul-expanded":
        k, v = k.repeat_interleave(g, dim=1).contiguous(), v.repeat_interleave(g, dim=1).contiguous()
        qm = (q * scale).to(tdt)[:, :, None, :].contiguous()  # [B, Hq, 1, d]
    elif kind == "matmul-grouped":
        qm = (q * scale).to(tdt).view(b, hkv, g, d).contiguous()  # [B, Hkv, g, d]
    else:
        raise ValueError(f"unknown torch path {kind!r}")
    kt = k.transpose(-1, -2)

    def call() -> Any:
        s = torch.matmul(qm, kt)
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(tdt)
        return torch.matmul(p, v).view(b, hq, d)

    return call


def paths(cache: kv.KvCache, table: np.ndarray, lens: list[int], q: np.ndarray, bs: int,
          dtypes: tuple[str, ...] = ("f32", "bf16")) -> dict[tuple[str, str], Callable[[], Any]]:
    """``(kind, dtype) -> call`` returning the float32 output tensor ``[n, Hq, d]`` of one
    decode step over every sequence; K/V read from the float32 ``cache``."""
    import torch

    bats = batches(q, gathered(cache, table, lens, bs))
    out: dict[tuple[str, str], Callable[[], Any]] = {}
    for dt in dtypes:
        tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[dt]
        typed = [(qb, k.to(tdt).contiguous(), v.to(tdt).contiguous()) for qb, k, v in bats]  # shared by the kinds
        for kind in KINDS:
            out[kind, dt] = step([one_path(kind, *bt) for bt in typed])
    return out


def step(calls: list[Callable[[], Any]]) -> Callable[[], Any]:
    """One decode step: every batch's call, the outputs as one float32 ``[n, Hq, d]``."""
    import torch

    if len(calls) == 1:
        return lambda: calls[0]().float()
    return lambda: torch.cat([c() for c in calls]).float()


def best_of(fn: Callable[[], Any], n: int = 3) -> float:
    import time

    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def versus(mine: dict[str, Callable[[], Any]], theirs: dict[tuple[str, str], Callable[[], Any]], threads: int,
           reps: int) -> dict[str, Any]:
    """pykvpool (``dtype -> call``) against torch's paths in interleaved rounds with
    ``threads`` threads on both sides: per round the best of 3 calls of each; per path the
    per-round ratio torch time / pykvpool time (same dtype), and the headline: against the
    fastest torch path (lowest median time) of each dtype and of any dtype (vs pykvpool's
    fastest dtype). Ratios: median with IQR over rounds."""
    import torch

    kv.set_num_threads(threads)
    torch.set_num_threads(threads)
    calls: dict[str, Callable[[], Any]] = {f"pykvpool {dt}": fn for dt, fn in mine.items()}
    calls.update({f"torch {k} {dt}": fn for (k, dt), fn in theirs.items()})
    with torch.inference_mode():
        for fn in calls.values():
            fn()  # warm up: first-touch, thread wake-up, oneDNN primitive creation
        times: dict[str, list[float]] = {name: [] for name in calls}
        for r in range(reps):
            for name in (list(calls) if r % 2 else list(calls)[::-1]):
                times[name].append(best_of(calls[name]))
    t = {name: np.array(ts) for name, ts in times.items()}

    def ratio(torch_name: str, mine_name: str) -> dict[str, float]:
        x = t[torch_name] / t[mine_name]
        return dict(median=float(np.median(x)), q1=float(np.quantile(x, 0.25)), q3=float(np.quantile(x, 0.75)))

    rows: dict[str, dict[str, Any]] = {name: dict(best=float(ts.min()), median=float(np.median(ts)))
                                       for name, ts in t.items()}
    for (kind, dt) in theirs:
        rows[f"torch {kind} {dt}"]["pykvpool_speedup"] = ratio(f"torch {kind} {dt}", f"pykvpool {dt}")

    def fastest(names: list[str]) -> str:
        return min(names, key=lambda n: float(rows[n]["median"]))

    head: dict[str, dict[str, Any]] = {}
    for dt in mine:
        best_torch = fastest([f"torch {k} {d}" for (k, d) in theirs if d == dt])
        head[dt] = dict(torch=best_torch, **ratio(best_torch, f"pykvpool {dt}"))
    best_torch, best_mine = fastest([f"torch {k} {d}" for (k, d) in theirs]), fastest([f"pykvpool {d}" for d in mine])
    head["any"] = dict(torch=best_torch, pykvpool=best_mine, **ratio(best_torch, best_mine))
    return dict(threads=threads, reps=reps, rows=rows, headline=head)
