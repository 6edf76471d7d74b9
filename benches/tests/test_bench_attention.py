"""bench_attention's torch baselines (``benches/torch_decode.py``) against pykvpool's decode."""

from __future__ import annotations

import numpy as np
import pytest

import pykvpool
from benches import bench_attention, torch_decode


@pytest.mark.parametrize("lens", [[40, 40], [17, 40, 5]], ids=["batched", "per-sequence"])
def test_torch_decode_baselines_agree_with_pykvpool(lens: list[int]) -> None:
    """bench_attention's torch paths (expanded and grouped matmul, SDPA with enable_gqa)
    compute pykvpool's decode on a tiny GQA shape: f32 within 1e-4, bf16 (q, scores and P
    rounded to bf16 by torch) within 3e-2 of pykvpool's bf16 cache; the paired timing
    gives a positive ratio against the fastest path of each dtype."""
    pytest.importorskip("torch")
    shape = dict(lens=lens, hq=8, hkv=2, d=32)
    caches, table, q = bench_attention.build(shape, ["f32", "bf16"], seed=3)
    mine = {dt: pykvpool.decode_attention(caches[dt], 0, q, table, lens) for dt in ("f32", "bf16")}
    paths = torch_decode.paths(caches["f32"], table, lens, q, bench_attention.BS)
    assert {k for k, _ in paths} == set(torch_decode.KINDS) and {d for _, d in paths} == {"f32", "bf16"}
    for (kind, dt), fn in paths.items():
        got = fn().numpy()
        assert got.shape == q.shape
        assert np.abs(got - mine[dt]).max() <= (1e-4 if dt == "f32" else 3e-2), (kind, dt)
    calls = {dt: (lambda c=caches[dt]: pykvpool.decode_attention(c, 0, q, table, lens)) for dt in ("f32", "bf16")}
    res = torch_decode.versus(calls, paths, threads=1, reps=2)
    assert set(res["headline"]) == {"f32", "bf16", "any"}
    assert all(h["median"] > 0 and h["torch"].startswith("torch ") for h in res["headline"].values())
