"""``q_dtype="bf16"`` on fp8 caches: the codes widened to bf16 (exact) and the
query rounded to bf16, on every path (``vdpbf16ps`` on AVX-512 with avx512_bf16 and
avx512vbmi, f32 FMAs on the rounded query elsewhere):

- against a float64 reference of the rounded query on the dequantized values: within
  1e-5 of the output scale (the rounded query is the option's only rounding);
- against the exact path on the same cache: within the bound of
  :func:`pykvpool.decode_attention`'s docstring, ``(exp(2 D) - 1) max|V'|`` with
  ``D = scale 2^-8 max_t sum_i |q_i K'_ti|``, and the LSE within D;
- f32, f16 and int8 caches refuse it and leave ``out`` untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import pykvpool as kv

PATHS = kv.kernel_paths()
FP8 = ["fp8_e4m3", "fp8_e5m2"]
F64 = npt.NDArray[np.float64]


def bf16_round(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """f32 rounded to bf16 (nearest, ties to even), as f32 (finite inputs)."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


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


def reference(c: kv.KvCache, q: npt.NDArray[np.float32], table: npt.NDArray[np.int64], lens: list[int],
              scale: float, window_left: int | None = None, sinks: int = 0) -> tuple[F64, F64, F64]:
    """f64 attention over the dequantized values: (out, lse, the bf16 query's bound on out)."""
    kd, vd = (x.astype(np.float64) for x in c.dequantized(0))
    n, hq, d = q.shape
    hkv, bs = c.num_kv_heads, c.block_size
    g = hq // hkv
    out, lse, bound = np.zeros((n, hq, d)), np.full((n, hq), -np.inf), np.zeros((n, hq))
    for i, ln in enumerate(lens):
        t = np.array([k for k in range(ln) if k < sinks or window_left is None or ln - 1 - k <= window_left])
        if t.size == 0:
            continue
        kt, vt = kd[table[i, t // bs], t % bs], vd[table[i, t // bs], t % bs]  # [T, hkv, d]
        for h in range(hq):
            qh = q[i, h].astype(np.float64)
            logits = scale * kt[:, h // g] @ qh
            m = logits.max()
            p = np.exp(logits - m)
            out[i, h] = p @ vt[:, h // g] / p.sum()
            lse[i, h] = m + np.log(p.sum())
            dmax = scale * 2.0**-8 * (np.abs(kt[:, h // g]) @ np.abs(qh)).max()
            bound[i, h] = np.expm1(2 * dmax) * np.abs(vt[:, h // g]).max()
    return out, lse, bound


CASES = [  # (dtype, lens, bs, hkv, hq, d)
    ("fp8_e4m3", [1, 15, 16, 17, 100], 16, 2, 8, 128),
    ("fp8_e5m2", [1, 15, 16, 17, 100], 16, 2, 8, 128),
    ("fp8_e4m3", [3, 33, 70], 8, 1, 1, 65),
    ("fp8_e5m2", [5, 32, 64], 32, 4, 8, 96),
    ("fp8_e4m3", [7, 9], 1, 2, 4, 7),
    ("fp8_e5m2", [40, 2], 16, 1, 3, 130),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-bs{c[2]}-{c[3]}x{c[4] // c[3]}-d{c[5]}")
@pytest.mark.parametrize("split", [None, 1])
def test_fp8_bf16_query_matches_the_rounded_query_reference(path: str, case: tuple[Any, ...],
                                                           split: int | None) -> None:
    dtype, lens, bs, hkv, hq, d = case
    c, table = make(dtype, lens, bs, hkv, d, seed=d + bs)
    q = np.random.default_rng(5).standard_normal((len(lens), hq, d)).astype(np.float32) * 2
    scale = 1 / np.sqrt(d)
    want, want_lse, _ = reference(c, bf16_round(q), table, lens, scale)
    got, lse = kv.decode_attention(c, 0, q, table, lens, return_lse=True, tuning=kv.KernelTuning(isa=path, split_size=split), q_dtype="bf16")
    tol = 1e-5 * np.abs(want).max()
    assert np.abs(got - want).max() <= tol
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("outliers", [False, True])
def test_fp8_bf16_query_stays_within_the_documented_bound_of_the_exact_path(path: str, dtype: str,
                                                                            outliers: bool) -> None:
    lens = [300, 64, 1, 129]
    c, table = make(dtype, lens, 16, 2, 128, seed=11, outliers=outliers)
    q = np.random.default_rng(6).standard_normal((len(lens), 8, 128)).astype(np.float32)
    scale = 1 / np.sqrt(128)
    _, _, bound = reference(c, q, table, lens, scale)
    exact, exact_lse = kv.decode_attention(c, 0, q, table, lens, return_lse=True, tuning=kv.KernelTuning(isa=path))
    fast, fast_lse = kv.decode_attention(c, 0, q, table, lens, return_lse=True, tuning=kv.KernelTuning(isa=path), q_dtype="bf16")
    err = np.abs(fast.astype(np.float64) - exact).max(axis=2)
    slack = 2e-6 * np.abs(exact).max()  # f32 rounding of both runs
    assert (err <= bound + slack).all(), float((err - bound).max())
    assert (err > 0).any(), "the rounded query changes something"
    # The LSE moves by at most D, and D <= the bound's argument: expm1(2D) >= 2D.
    kd = np.abs(c.dequantized(0)[0].astype(np.float64))
    for i, ln in enumerate(lens):
        t = np.arange(ln)
        kt = kd[table[i, t // 16], t % 16]
        dmax = scale * 2.0**-8 * np.einsum("hgd,thd->hgt", np.abs(q[i].reshape(2, 4, 128)), kt).max(axis=-1)
        assert (np.abs(fast_lse[i] - exact_lse[i]) <= dmax.reshape(8) + 1e-5 * np.abs(exact_lse[i]).max()).all()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", FP8)
def test_fp8_bf16_query_with_windows_sinks_and_paged_tables(path: str, dtype: str) -> None:
    lens, bs = [1, 30, 77], 16
    c, table = make(dtype, lens, bs, 2, 64, seed=13)
    q = np.random.default_rng(7).standard_normal((len(lens), 4, 64)).astype(np.float32)
    scale = 1 / 8
    for wl, sinks in [(5, 0), (20, 3), (0, 1)]:
        want, _, _ = reference(c, bf16_round(q), table, lens, scale, wl, sinks)
        got = kv.decode_attention(c, 0, q, table, lens, tuning=kv.KernelTuning(isa=path), q_dtype="bf16", window_left=wl,
                                  sink_tokens=sinks)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    nb = [-(-n // bs) for n in lens]
    indptr = np.concatenate([[0], np.cumsum(nb)])
    indices = np.concatenate([table[i, :b] for i, b in enumerate(nb)])
    last = [n - (b - 1) * bs for n, b in zip(lens, nb)]
    paged = kv.decode_attention_paged(c, 0, q, indptr, indices, last, tuning=kv.KernelTuning(isa=path), q_dtype="bf16")
    np.testing.assert_array_equal(paged, kv.decode_attention(c, 0, q, table, lens, tuning=kv.KernelTuning(isa=path),
                                                             q_dtype="bf16"))


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


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", ["f32", "f16", "int8"])
def test_bf16_query_refuses_f32_f16_and_int8_caches_and_leave_out_untouched(path: str, dtype: str) -> None:
    c = kv.KvCache(1, 4, 16, 1, 8, dtype)
    q = np.ones((1, 2, 8), np.float32)
    out = np.full((1, 2, 8), 7.0, np.float32)
    with pytest.raises(kv.InvalidArgumentError, match=f"q_dtype=bf16 with pv_dtype=f32 is not a decode precision on a {dtype} cache"):
        kv.decode_attention(c, 0, q, [[0]], [3], out=out, tuning=kv.KernelTuning(isa=path), q_dtype="bf16")
    with pytest.raises(kv.InvalidArgumentError, match="q_dtype=bf16"):
        kv.decode_attention_paged(c, 0, q, [0, 1], [0], [3], out=out, tuning=kv.KernelTuning(isa=path), q_dtype="bf16")
    assert (out == 7.0).all()


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
