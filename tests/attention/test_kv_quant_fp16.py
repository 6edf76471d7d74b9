"""``q_dtype="f16", pv_dtype="f16"`` (fp8 caches): on the AVX-512 path of a CPU with avx512_fp16, block
size 16 and a head_dim that is a multiple of 64, q.K and P.V as f16 products summed in f16
(``rust/attention/avx512_fp16.rs``); every other path, block size and head_dim computes in
f32 as without it. On every path, both table forms:

- against a float64 reference on the dequantized K/V: within the documented bound
  (``decode_attention``'s docstring: each logit within ``D = scale (d / 4 + 3) 2^-11 max_t
  sum_i |q_i K_i|``, each output within ``(exp(2 D) - 1) max|V| + 18 2^-11 max|V|``) plus
  1e-5 of the output scale where the f16 path runs, within 1e-5 elsewhere; the LSE within
  D;
- on normal data the error is visible where the f16 path runs and far inside the bound;
- refused (naming ``q_dtype``/``pv_dtype`` and the valid pairs) for any other cache and
  in any other pairing (``pv_dtype="f16"`` with ``q_dtype="bf16"``), ``out`` untouched.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from test_kv_quant import decode_ref
from test_kv_quant import tables

import pykvpool as kv

PATHS = kv.kernel_paths()
FP8 = ["fp8_e4m3", "fp8_e5m2"]


def f16_path(path: str, d: int, bs: int) -> bool:
    """Whether ``path`` computes in f16 for head_dim ``d`` and block size ``bs``."""
    return path == "avx512" and "avx512fp16" in kv.cpu_features() and d % 64 == 0 and bs == 16


def case(dtype: str, seed: int, g: int, d: int, bs: int = 16
         ) -> tuple[kv.KvCache, npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.int64], list[int]]:
    """An fp8 cache of 2 KV heads (lengths with every tail kind), q with ``2 g`` heads."""
    rng = np.random.default_rng(seed)
    lens = [1, 15, 16, 17, 100, 333, 0]
    t, sl = tables(lens, bs)
    nb = int(t.max()) + 1
    k, v = (rng.standard_normal((nb * bs, 2, d)).astype(np.float32) for _ in range(2))
    c = kv.KvCache(1, nb, bs, 2, d, dtype)
    c.write(0, k, v, np.arange(nb * bs))
    q = (rng.standard_normal((len(lens), 2 * g, d)) * 2).astype(np.float32)
    return c, q, t, sl, lens


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("g,d,bs", [(1, 128, 16), (4, 128, 16), (2, 64, 16), (3, 256, 16), (4, 128, 32), (4, 80, 16)])
@pytest.mark.parametrize("path", PATHS)
def test_f16_precision_stays_within_its_bound_on_every_path(path: str, dtype: str, g: int, d: int, bs: int) -> None:
    c, q, t, sl, lens = case(dtype, g * 10 + d + bs, g, d, bs=bs)
    nb = t.max() + 1
    kd, vd = (x.reshape(nb, bs, 2, d).astype(np.float64) for x in c.dequantized(0))
    scale = 1 / np.sqrt(d)
    want = decode_ref(kd, vd, q, t, lens, bs, scale)
    out_scale = max(np.abs(want).max(), 1e-3)
    bound = np.zeros(q.shape[:2])
    lse_bound = np.zeros(q.shape[:2])
    for i, ln in enumerate(lens):
        if not ln or not f16_path(path, d, bs):
            continue
        rows = [t[i, j // bs] * bs + j % bs for j in range(ln)]
        for h in range(q.shape[1]):
            keys, vals = kd.reshape(-1, 2, d)[rows, h // g], vd.reshape(-1, 2, d)[rows, h // g]
            dd = scale * (d / 4 + 3) * 2.0**-11 * np.abs(keys * q[i, h].astype(np.float64)).sum(axis=1).max()
            vmax = np.abs(vals).max()
            bound[i, h] = (np.exp(2 * dd) - 1) * vmax + 18 * 2.0**-11 * vmax
            lse_bound[i, h] = dd
    _, want_lse = kv.decode_attention(c, 0, q, t, sl, tuning=kv.KernelTuning(isa=path), return_lse=True)
    for split in (None, bs):
        got, lse = kv.decode_attention(c, 0, q, t, sl, tuning=kv.KernelTuning(isa=path, split_size=split), return_lse=True,
                                       q_dtype="f16", pv_dtype="f16")
        err = np.abs(got.astype(np.float64) - want).max(axis=2)
        assert (err <= bound + 1e-5 * out_scale).all(), (path, split, float((err - bound).max()))
        finite = np.isfinite(want_lse)
        diff = np.abs(lse[finite] - want_lse[finite])
        assert (diff <= lse_bound[finite] + 1e-5 * np.maximum(1, np.abs(want_lse[finite]))).all(), path
    nblk = [-(-n // bs) for n in lens]
    indptr = np.concatenate([[0], np.cumsum(nblk)])
    indices = np.concatenate([t[i, :n] for i, n in enumerate(nblk)])
    last = np.array([(n - 1) % bs + 1 if n else 0 for n in lens])
    got = kv.decode_attention_paged(c, 0, q, indptr, indices, last, tuning=kv.KernelTuning(isa=path), q_dtype="f16", pv_dtype="f16")
    assert (np.abs(got.astype(np.float64) - want).max(axis=2) <= bound + 1e-5 * out_scale).all(), path


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("path", PATHS)
def test_f16_precision_errors_on_normal_data_are_visible_and_far_inside_the_bound(path: str, dtype: str) -> None:
    d, g, bs = 128, 4, 16
    c, q, t, sl, lens = case(dtype, 11, g, d, bs=bs)
    exact = kv.decode_attention(c, 0, q, t, sl, tuning=kv.KernelTuning(isa=path)).astype(np.float64)
    got = kv.decode_attention(c, 0, q, t, sl, tuning=kv.KernelTuning(isa=path), q_dtype="f16", pv_dtype="f16").astype(np.float64)
    vmax = float(np.abs(c.dequantized(0)[1]).max())
    err = float(np.abs(got - exact).max())
    if f16_path(path, d, bs):
        assert 0 < err < 18 * 2.0**-11 * vmax / 5, (err, vmax)
    else:
        assert err == 0


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "int8"])
def test_f16_precision_needs_an_fp8_cache(dtype: str) -> None:
    c = kv.KvCache(1, 4, 16, 2, 64, dtype)
    q = np.ones((1, 4, 64), np.float32)
    out = np.full((1, 4, 64), 7, np.float32)
    with pytest.raises(kv.InvalidArgumentError, match=f"q_dtype=f16 with pv_dtype=f16 is not a decode precision on a {dtype}"):
        kv.decode_attention(c, 0, q, [[0, 1]], [20], out=out, q_dtype="f16", pv_dtype="f16")
    assert (out == 7).all()


def test_f16_precision_takes_dtype_names_only_and_pairs_f16_with_f16() -> None:
    c = kv.KvCache(1, 4, 16, 2, 64, "fp8_e4m3")
    q = np.ones((1, 4, 64), np.float32)
    with pytest.raises(TypeError):
        kv.decode_attention(c, 0, q, [[0, 1]], [20], q_dtype=1)  # type: ignore[arg-type]
    out = np.full((1, 4, 64), 7, np.float32)
    for bad in [dict(q_dtype="bf16", pv_dtype="f16"), dict(q_dtype="f16"), dict(pv_dtype="f16")]:
        with pytest.raises(kv.InvalidArgumentError, match="valid .q_dtype, pv_dtype. there: .f32, f32., .bf16, f32., .f16, f16."):
            kv.decode_attention(c, 0, q, [[0, 1]], [20], out=out, **bad)  # type: ignore[arg-type]
    with pytest.raises(kv.InvalidArgumentError, match="q_dtype must be one of"):
        kv.decode_attention(c, 0, q, [[0, 1]], [20], out=out, q_dtype="fp8_e4m3")  # type: ignore[arg-type]
    assert (out == 7).all()
