"""``q_dtype="f16", pv_dtype="f16"`` (fp8 caches): on the AVX-512 path of a CPU with avx512_fp16, block
size 16 and a head_dim that is a multiple of 64, q.K and P.V as f16 products summed in f16
(``rust/attention/avx512_fp16.rs``); every other path, block size and head_dim computes in
f32 as without it. Here:

- on normal data the error is visible where the f16 path runs and far inside the bound
  (exactly zero elsewhere);
- the pair takes dtype names only and pairs f16 with f16 (``pv_dtype="f16"`` with
  ``q_dtype="bf16"`` is refused naming the valid pairs), ``out`` untouched.

Against a float64 reference on the dequantized K/V within the documented bound
(``decode_attention``'s docstring: each logit within ``D = scale (d / 4 + 3) 2^-11 max_t
sum_i |q_i K_i|``, each output within ``(exp(2 D) - 1) max|V| + 18 2^-11 max|V|``; within
1e-5 where the f16 path does not run; the LSE within D) on every path and both table forms,
and the refusal on every other cache, are the conformance grid's
(tests/attention/test_conformance.py).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
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
