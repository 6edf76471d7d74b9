"""``q_dtype="bf16"`` on fp8 caches: the codes widened to bf16 (exact) and the
query rounded to bf16, on every path (``vdpbf16ps`` on AVX-512 with avx512_bf16 and
avx512vbmi, f32 FMAs on the rounded query elsewhere). Here:

- the rounded query is visible against the exact path on every path;
- the paths agree within f32 rounding, and an e4m3 NaN code reads as on the exact path;
- the AVX-512 path's NaN-code check: read-only views stay read-only, and a NaN code reads
  on AVX-512 as on AVX2.

Against a float64 reference of the rounded query on the dequantized values (1e-5 of the
output scale), against the exact reference (the bound ``(exp(2 D) - 1) max|V'|``, ``D =
scale 2^-8 max_t sum_i |q_i K'_ti|``, the LSE within D) with windows, sinks and paged
tables, and the refusal on f32, f16 and int8 caches, are the conformance grid's
(tests/attention/test_conformance.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import pykvpool as kv

PATHS = kv.kernel_paths()
FP8 = ["fp8_e4m3", "fp8_e5m2"]


def make(dtype: str, lens: list[int], bs: int, hkv: int, d: int, seed: int,
         outliers: bool = False) -> tuple[kv.KvCache, npt.NDArray[np.int64]]:
    """A cache holding random K/V for ``lens`` (scattered blocks) and its tables."""
    rng = np.random.default_rng(seed)
    nblk = [-(-n // bs) for n in lens]
    total = sum(nblk) + 2
    perm = rng.permutation(total)
    table = np.full((len(lens), max(nblk)), -1, np.int64)
    at = 0
    for i, nb in enumerate(nblk):
        table[i, :nb] = perm[at:at + nb]
        at += nb
    c = kv.KvCache(1, total, bs, hkv, d, dtype)
    k = rng.standard_normal((total * bs, hkv, d)).astype(np.float32)
    if outliers:
        k[..., ::4] *= 20
    v = rng.standard_normal((total * bs, hkv, d)).astype(np.float32)
    c.write(0, k, v, np.arange(total * bs))
    return c, table


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("outliers", [False, True])
def test_fp8_bf16_query_changes_the_result_on_every_path(path: str, dtype: str, outliers: bool) -> None:
    lens = [300, 64, 1, 129]
    c, table = make(dtype, lens, 16, 2, 128, seed=11, outliers=outliers)
    q = np.random.default_rng(6).standard_normal((len(lens), 8, 128)).astype(np.float32)
    exact = kv.decode_attention(c, 0, q, table, lens, tuning=kv.KernelTuning(isa=path))
    fast = kv.decode_attention(c, 0, q, table, lens, tuning=kv.KernelTuning(isa=path), q_dtype="bf16")
    assert (np.abs(fast.astype(np.float64) - exact) > 0).any(), "the rounded query changes something"


@pytest.mark.parametrize("dtype", FP8)
def test_fp8_bf16_query_agrees_across_paths_and_propagate_nan_codes(dtype: str) -> None:
    c, table = make(dtype, [50, 20], 16, 1, 32, seed=17)
    q = np.random.default_rng(8).standard_normal((2, 2, 32)).astype(np.float32)
    outs = [kv.decode_attention(c, 0, q, table, [50, 20], tuning=kv.KernelTuning(isa=p), q_dtype="bf16") for p in PATHS]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=0, atol=1e-6 * np.abs(outs[0]).max())
    # A NaN code in a visible key of sequence 1: the widened code is NaN, so its score is
    # NaN as on the exact path of the same kernel path (the scalar path returns NaN, the
    # SIMD paths' exp2 clamps a NaN score to a zero weight); sequence 0 is untouched.
    nan_code = 0x7F if dtype == "fp8_e4m3" else 0x7E
    c.key(0).view(np.uint8)[table[1, 0], 3, 0, 5] = nan_code
    for p in PATHS:
        fast = kv.decode_attention(c, 0, q, table, [50, 20], tuning=kv.KernelTuning(isa=p), q_dtype="bf16")
        exact = kv.decode_attention(c, 0, q, table, [50, 20], tuning=kv.KernelTuning(isa=p))
        np.testing.assert_array_equal(np.isnan(fast), np.isnan(exact))
        assert np.isfinite(fast[0]).all(), p
        if p == "scalar":
            assert np.isnan(fast[1]).all()


def test_only_writable_views_can_store_codes_the_writes_never_make() -> None:
    """The AVX-512 path checks an e4m3 cache's tiles for NaN codes only once the cache
    handed out a writable view (``KvCache.key``): ``write`` saturates and refuses
    non-finite values. So a read-only view must stay read-only, whatever numpy view of it
    is taken, and a cache read through read-only views decodes as on AVX2."""
    lens = [40, 17]
    c, table = make("fp8_e4m3", lens, 16, 2, 64, seed=9)
    views = [c.key(0, writable=False), c.value(0, writable=False)]
    for v in views + [v.view(np.uint8) for v in views] + [v[1:, ::2] for v in views]:
        assert not v.flags.writeable
        with pytest.raises(ValueError):
            v.flags.writeable = True
    assert np.all(np.abs(c.dequantized(0)[0]) <= 448 * c.key_scales(0, writable=False).max())
    q = np.random.default_rng(1).standard_normal((2, 8, 64)).astype(np.float32)
    got = {p: kv.decode_attention(c, 0, q, table, lens, tuning=kv.KernelTuning(isa=p)) for p in ("avx512", "avx2") if p in PATHS}
    for p, out in got.items():
        assert np.isfinite(out).all(), p
        np.testing.assert_allclose(out, next(iter(got.values())), rtol=0, atol=1e-5 * np.abs(out).max())


@pytest.mark.skipif(not {"avx512", "avx2"} <= set(PATHS), reason="needs the AVX-512 and AVX2 paths")
@pytest.mark.parametrize("bs", [16, 32])
def test_e4m3_nan_codes_read_on_avx512_as_on_avx2(bs: int) -> None:
    """The AVX-512 path widens e4m3 codes without a NaN mask and checks each tile for the
    two NaN codes instead; an item whose tiles hold one runs again on the AVX2 path. So a
    NaN code anywhere reads as on AVX2 (a NaN key: a zero weight; a NaN value: NaN in that
    dimension), and one in a slot no query sees changes nothing."""
    lens = [50, 20]
    q = np.random.default_rng(3).standard_normal((2, 8, 64)).astype(np.float32)

    def both(c: kv.KvCache, table: npt.NDArray[np.int64]) -> tuple[Any, Any]:
        return tuple(kv.decode_attention(c, 0, q, table, lens, tuning=kv.KernelTuning(isa=p)) for p in ("avx512", "avx2"))

    clean_c, table = make("fp8_e4m3", lens, bs, 2, 64, seed=5)
    clean = both(clean_c, table)[0]
    last = table[1, (lens[1] - 1) // bs]
    cases = {  # (view, block, slot, head, dim, code)
        "key": ("key", table[1, 0], 3, 1, 5, 0x7F),
        "value": ("value", table[0, 1], 1, 0, 60, 0xFF),
        "unread": ("key", last, lens[1] % bs + 1, 1, 0, 0x7F),
    }
    for name, (view, b, t, h, i, code) in cases.items():
        c, _ = make("fp8_e4m3", lens, bs, 2, 64, seed=5)
        getattr(c, view)(0).view(np.uint8)[b, t, h, i] = code
        a512, a2 = both(c, table)
        np.testing.assert_array_equal(np.isnan(a512), np.isnan(a2), err_msg=name)
        fin = np.isfinite(a2)
        np.testing.assert_allclose(a512[fin], a2[fin], rtol=0, atol=1e-5 * np.abs(a2[fin]).max(), err_msg=name)
        if name == "key":  # the NaN key's weight is zero: sequence 1's heads 4-7 move
            assert np.isfinite(a512).all() and np.abs(a512[1, 4:] - clean[1, 4:]).max() > 1e-3
        elif name == "value":
            assert np.isnan(a512[0, :4, 60]).all() and np.isfinite(np.delete(a512, 60, axis=2)).all()
        else:
            np.testing.assert_allclose(a512, clean, rtol=0, atol=1e-6 * np.abs(clean).max())
