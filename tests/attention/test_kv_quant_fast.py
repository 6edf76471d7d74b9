"""``q_dtype="int8"`` (int8 caches): the query quantized per (sequence, head) to int8,
scores by ``vpdpbusd`` on AVX-512 with VNNI and by f32 FMAs on the dequantized quantized
query elsewhere. On every path and both table forms:

- against a float64 reference on the dequantized K/V with the quantized query: within
  1e-5 of the output scale (the paths agree, whatever computes the scores);
- against the exact-query result on the same cache: within the bound of
  :func:`pykvpool.decode_attention`'s docstring, ``(exp(2 D) - 1) max|V'|`` with
  ``D = scale * (s_q / 2) * max_t sum_i |K'(t, i)|``, the LSE within ``D``;
- refused (naming ``q_dtype`` and the valid pairs) for any other cache, ``out`` untouched.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from test_kv_quant import decode_ref, make_data, tables

import pykvpool as kv

PATHS = kv.kernel_paths()
F32 = npt.NDArray[np.float32]


def quantized_query(q: F32) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per row (last axis): ``s = max|q| / 127``, codes ``rint(q / s)`` (half to even)
    times ``s``, as float64; and ``s``."""
    s = np.abs(q).max(axis=-1, keepdims=True).astype(np.float32) / np.float32(127)
    safe = np.where(s == 0, np.float32(1), s)
    codes = np.where(s == 0, 0, np.clip(np.rint(q / safe), -127, 127))
    return codes.astype(np.float64) * s.astype(np.float64), s[..., 0].astype(np.float64)


Case = tuple[kv.KvCache, F32, npt.NDArray[np.int64], npt.NDArray[np.int64], list[int]]


def case(seed: int, g: int, d: int, outliers: bool = False, bs: int = 16) -> Case:
    """An int8 cache of 2 KV heads (lengths with every tail kind), q with ``2 g`` heads."""
    rng = np.random.default_rng(seed)
    hk = 2
    lens = [1, 15, 16, 17, 100, 333, 0]
    t, sl = tables(lens, bs)
    nb = int(t.max()) + 1
    k, v = make_data(rng, (nb * bs, hk, d), outliers)
    c = kv.KvCache(1, nb, bs, hk, d, "int8")
    c.write(0, k, v, np.arange(nb * bs))
    q = (rng.standard_normal((len(lens), hk * g, d)) * 2).astype(np.float32)
    return c, q, t, sl, lens


@pytest.mark.parametrize("g,d,bs", [(1, 128, 16), (2, 64, 16), (4, 128, 16), (8, 65, 8), (3, 7, 32)])
@pytest.mark.parametrize("path", PATHS)
def test_int8_query_matches_the_quantized_query_reference_on_every_path(path: str, g: int, d: int, bs: int) -> None:
    c, q, t, sl, lens = case(g * 100 + d, g, d, bs=bs)
    nb = t.max() + 1
    kd, vd = (x.reshape(nb, bs, 2, d) for x in c.dequantized(0))
    qq, _ = quantized_query(q)
    want = decode_ref(kd, vd, qq.astype(np.float32), t, lens, bs, 1 / np.sqrt(d))
    out_scale = max(np.abs(want).max(), 1e-3)
    for split in (None, 16):
        got = kv.decode_attention(c, 0, q, t, sl, tuning=kv.KernelTuning(isa=path, split_size=split), q_dtype="int8")
        assert np.abs(got - want).max() <= 1e-5 * out_scale, (path, split)
    # The paged form: the same pages in FlashInfer's layout.
    nblk = [-(-n // bs) for n in lens]
    indptr = np.concatenate([[0], np.cumsum(nblk)])
    indices = np.concatenate([t[i, :n] for i, n in enumerate(nblk)])
    last = np.array([(n - 1) % bs + 1 if n else 0 for n in lens])
    got = kv.decode_attention_paged(c, 0, q, indptr, indices, last, tuning=kv.KernelTuning(isa=path), q_dtype="int8")
    assert np.abs(got - want).max() <= 1e-5 * out_scale, path


@pytest.mark.parametrize("outliers", [False, True], ids=["normal", "outliers"])
@pytest.mark.parametrize("path", PATHS)
def test_int8_query_stays_within_the_documented_bound_of_the_exact_query(path: str, outliers: bool) -> None:
    d, g = 128, 4
    c, q, t, sl, lens = case(7 + outliers, g, d, outliers)
    scale = 1 / np.sqrt(d)
    exact, exact_lse = kv.decode_attention(c, 0, q, t, sl, tuning=kv.KernelTuning(isa=path), return_lse=True)
    got, lse = kv.decode_attention(c, 0, q, t, sl, tuning=kv.KernelTuning(isa=path), return_lse=True, q_dtype="int8")
    kd, vd = (x.reshape(-1, 2, d).astype(np.float64) for x in c.dequantized(0))
    _, s_q = quantized_query(q)
    err = np.abs(got.astype(np.float64) - exact).max(axis=2)
    out_scale = max(np.abs(exact).max(), 1e-3)
    bs = 16
    for i, ln in enumerate(lens):
        if ln == 0:
            assert (got[i] == 0).all() and np.isneginf(lse[i]).all()
            continue
        rows = [t[i, j // bs] * bs + j % bs for j in range(ln)]
        for h in range(q.shape[1]):
            l1 = np.abs(kd[rows, h // g]).sum(axis=1).max()
            dl = scale * s_q[i, h] / 2 * l1
            bound = np.expm1(2 * dl) * np.abs(vd[rows, h // g]).max()
            assert err[i, h] <= bound + 1e-5 * out_scale, (i, h, err[i, h], bound)
            assert abs(lse[i, h] - exact_lse[i, h]) <= dl + 1e-5 * max(1.0, abs(exact_lse[i, h]))
    assert err.max() > 0  # the quantization is real


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("path", PATHS)
def test_int8_query_is_refused_for_other_caches_and_leaves_out_untouched(path: str, dtype: str) -> None:
    c = kv.KvCache(1, 4, 16, 2, 64, dtype)
    c.write(0, np.ones((64, 2, 64), np.float32), np.ones((64, 2, 64), np.float32), np.arange(64))
    q = np.ones((1, 4, 64), np.float32)
    out = np.full((1, 4, 64), 7.0, np.float32)
    with pytest.raises(kv.InvalidArgumentError, match=f"q_dtype=int8 with pv_dtype=f32 is not a decode precision on a {dtype} cache"):
        kv.decode_attention(c, 0, q, [[0, 1]], [20], out=out, tuning=kv.KernelTuning(isa=path), q_dtype="int8")
    with pytest.raises(kv.InvalidArgumentError, match=f"q_dtype=int8 with pv_dtype=f32 is not a decode precision on a {dtype} cache"):
        kv.decode_attention_paged(c, 0, q, [0, 2], [0, 1], [4], out=out, tuning=kv.KernelTuning(isa=path), q_dtype="int8")
    assert (out == 7.0).all()
