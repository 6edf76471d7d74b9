"""8-bit KV caches (int8, fp8 e4m3 / e5m2): the conversions against ml_dtypes on all 256
codes, the int8 quantizer bit for bit against numpy, where the scales live (views, copies,
calibration), the byte counts, and decode on every path against the same attention over
the unquantized f32 cache: within the bound derived in :func:`pykvpool.decode_attention`'s
docstring (``(exp(2 D) - 1) max|V'| + max e_V``), on normal data and on data with outlier
channels.

Both kernels against a float64 reference on the dequantized values (within 1e-5 of the
output scale), and the refusals of the fast precisions on these caches, are the
conformance grid's (tests/attention/test_conformance.py).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

import pykvpool as kv

PATHS = kv.kernel_paths()
QDTYPES = ["int8", "fp8_e4m3", "fp8_e5m2"]
FP8 = {"fp8_e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "fp8_e5m2": (ml_dtypes.float8_e5m2, 57344.0)}
#: Per format: relative rounding of a normal value and half the subnormal step (x scale).
FP8_ERR = {"fp8_e4m3": (2.0**-4, 2.0**-10), "fp8_e5m2": (2.0**-3, 2.0**-17)}
F32 = npt.NDArray[np.float32]


def codes_u8(view: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    return np.ascontiguousarray(view).view(np.uint8)


# ----------------------------------------------------------------- conversions, storage


@pytest.mark.parametrize("dtype", list(FP8))
def test_fp8_decoding_of_all_256_codes_matches_ml_dtypes(dtype: str) -> None:
    ml, _ = FP8[dtype]
    c = kv.KvCache(1, 16, 16, 1, 1, dtype)
    c.set_fp8_scales(0, np.ones(1, np.float32), np.full(1, 0.5, np.float32))
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16, 1, 1)
    codes_u8(c.key(0))  # the raw view is the codes' bytes
    c.key(0).view(np.uint8)[...] = codes
    c.value(0).view(np.uint8)[...] = codes
    k, v = c.dequantized(0)
    want = codes.view(ml).astype(np.float32)
    np.testing.assert_array_equal(k, want)  # NaN == NaN here
    np.testing.assert_array_equal(v, want * np.float32(0.5))
    assert c.key(0).dtype == ml


@pytest.mark.parametrize("dtype", list(FP8))
def test_fp8_encoding_is_saturating_nearest_even_as_ml_dtypes(dtype: str) -> None:
    ml, top = FP8[dtype]
    vals = np.arange(256, dtype=np.uint8).view(ml).astype(np.float64)
    finite = np.unique(vals[np.isfinite(vals)])
    mids = (finite[1:] + finite[:-1]) / 2  # ties: exact in f32
    x = np.concatenate([finite, mids, np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
                        np.nextafter(mids.astype(np.float32), np.float32(-np.inf)),
                        [top * 1.01, top * 4, 3e38, -3e38, 1e-30, -1e-45]]).astype(np.float32)
    n = x.size
    c = kv.KvCache(1, n, 1, 1, 1, dtype)
    c.set_fp8_scales(0, np.ones(1, np.float32), np.ones(1, np.float32))
    c.write(0, x.reshape(n, 1, 1), x.reshape(n, 1, 1), np.arange(n))
    got = codes_u8(c.key(0)).reshape(n)
    want = np.clip(x, -top, top).astype(ml).view(np.uint8)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in bad[:5]]


def int8_reference(x: F32) -> tuple[npt.NDArray[np.int8], F32]:
    """scale = max|x| / 127 per row (last axis), codes = rint(x / scale) clamped; 0 rows 0."""
    amax = np.abs(x).max(axis=-1, keepdims=True)
    scale = (amax / np.float32(127)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    codes = np.where(scale == 0, 0, np.clip(np.rint(x / safe), -127, 127)).astype(np.int8)
    return codes, scale[..., 0]


def test_int8_write_is_bit_exact_with_per_token_head_scales_and_copies_carry_them() -> None:
    rng = np.random.default_rng(1)
    c = kv.KvCache(2, 6, 4, 3, 40, "int8")
    k = rng.standard_normal((10, 3, 40)).astype(np.float32) * 5
    v = rng.standard_normal((10, 3, 40)).astype(np.float32)
    k[2, 1] = 0.0  # an all-zero row: scale 0, codes 0
    k[3, 0, 7] = 1e4  # an outlier sets its row's scale
    slots = np.array([0, 1, 2, 3, 9, 10, 11, 17, 18, -1])
    c.write(1, k, v, slots)
    kc, ks = int8_reference(k)
    vc, vs = int8_reference(v)
    key, val = c.key(1), c.value(1)
    assert key.dtype == np.int8 and c.key_scales(1).shape == (6, 4, 3) and c.value_scales(1).dtype == np.float32
    for n, s in enumerate(slots[:-1]):
        b, t = divmod(int(s), 4)
        np.testing.assert_array_equal(key[b, t], kc[n])
        np.testing.assert_array_equal(val[b, t], vc[n])
        np.testing.assert_array_equal(c.key_scales(1)[b, t], ks[n])
        np.testing.assert_array_equal(c.value_scales(1)[b, t], vs[n])
    assert c.key_scales(1)[0, 2, 1] == 0 and not key[0, 2, 1].any()
    dk, dv = c.dequantized(1)
    np.testing.assert_array_equal(dk, key.astype(np.float32) * c.key_scales(1)[..., None])
    before = dk[4].copy(), dv[4].copy()  # block 4 holds slots 17 and 18
    c.copy_blocks([[4, 0]])
    dk2, dv2 = c.dequantized(1)
    np.testing.assert_array_equal(dk2[0], before[0])
    np.testing.assert_array_equal(dv2[0], before[1])
    assert not c.dequantized(0)[0].any()  # layer 0 untouched


def test_scale_views_are_zero_copy_writable_and_read_only_on_request() -> None:
    c = kv.KvCache(1, 2, 4, 2, 8, "int8")
    c.write(0, np.ones((1, 2, 8), np.float32), np.ones((1, 2, 8), np.float32), [5])
    ks = c.key_scales(0)
    assert ks[1, 1, 0] == pytest.approx(1 / 127)
    ks[1, 1, 0] = 2 / 127
    np.testing.assert_allclose(c.dequantized(0)[0][1, 1, 0], 2.0, rtol=1e-6)
    with pytest.raises(ValueError):
        c.value_scales(0, writable=False)[0, 0, 0] = 1.0
    with pytest.raises(kv.InvalidArgumentError, match="no scales"):
        kv.KvCache(1, 2, 4, 2, 8, "bf16").key_scales(0)
    f = kv.KvCache(1, 2, 4, 2, 8, "fp8_e5m2")
    assert f.key_scales(0).shape == (2,) and not f.key_scales(0).any()


def test_fp8_scales_calibrate_from_the_first_write_then_saturate() -> None:
    c = kv.KvCache(2, 4, 4, 2, 8, "fp8_e4m3")
    k = np.zeros((2, 2, 8), np.float32)
    k[:, 0] = np.linspace(-3, 2, 16, dtype=np.float32).reshape(2, 8)  # head 1 all zero
    v = np.full((2, 2, 8), 0.5, np.float32)
    c.write(0, k, v, [0, -1])  # the padding row does not count
    np.testing.assert_allclose(c.key_scales(0), [np.abs(k[0, 0]).max() / 448, 0], rtol=1e-7)
    np.testing.assert_allclose(c.value_scales(0), [0.5 / 448] * 2, rtol=1e-7)
    assert not c.key_scales(1).any()  # another layer calibrates on its own
    big = np.full((1, 2, 8), 100.0, np.float32)
    c.write(0, big, big, [1])
    dk, dv = c.dequantized(0)
    np.testing.assert_allclose(dk[0, 1, 0], np.abs(k[0, 0]).max(), rtol=1e-6)  # saturated
    np.testing.assert_allclose(dk[0, 1, 1], 100.0, rtol=1e-6)  # head 1 calibrated now
    c.set_fp8_scales(0, np.array([1.0, 2.0], np.float32), np.array([0.0, 3.0], np.float32))
    np.testing.assert_array_equal(c.value_scales(0), [0.0, 3.0])
    with pytest.raises(kv.InvalidArgumentError, match="fp8"):
        kv.KvCache(1, 4, 4, 2, 8, "int8").set_fp8_scales(0, np.ones(2, np.float32), np.ones(2, np.float32))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", *QDTYPES])
def test_nbytes_is_codes_padding_and_scales_from_bytes_per_token(dtype: str) -> None:
    layers, nb, bs, hk, d = 3, 7, 5, 2, 9
    c = kv.KvCache(layers, nb, bs, hk, d, dtype)
    per_token = kv.KvCache.bytes_per_token(hk, d, dtype)
    size = {"f32": 4, "f16": 2, "bf16": 2}.get(dtype, 1)
    assert per_token == 2 * hk * (d * size + (4 if dtype == "int8" else 0))
    codes = 2 * nb * bs * hk * d * size
    pad = (-codes) % 64 if dtype in QDTYPES else 0
    fixed = 2 * hk * 4 if dtype in FP8 else 0
    assert c.nbytes == layers * (nb * bs * per_token + pad + fixed)


# ---------------------------------------------------------------------------- kernels


def make_data(rng: np.random.Generator, shape: tuple[int, ...], outliers: bool) -> tuple[F32, F32]:
    k = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    if outliers:  # a few K channels 20x larger, as in real K caches
        k[..., :: max(1, shape[-1] // 4)] *= 20
    return k, v


def build(dtype: str, k: F32, v: F32, bs: int, nb: int) -> kv.KvCache:
    hk, d = k.shape[1], k.shape[2]
    c = kv.KvCache(1, nb, bs, hk, d, dtype)
    c.write(0, k, v, np.arange(k.shape[0]))
    return c


def tables(lens: list[int], bs: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Consecutive blocks per sequence (sequence i's keys are rows start_i..)."""
    width = max(-(-n // bs) for n in lens)
    t = np.full((len(lens), width), -1, np.int64)
    at = 0
    for i, n in enumerate(lens):
        nblk = -(-n // bs)
        t[i, :nblk] = np.arange(at, at + nblk)
        at += nblk
    return t, np.array(lens, np.int64)


def decode_bound(dtype: str, c: kv.KvCache, k: npt.NDArray[Any], v: npt.NDArray[Any], q: F32,
                 t: npt.NDArray[np.int64], lens: list[int], bs: int, scale: float) -> npt.NDArray[np.float64]:
    """The documented bound per (sequence, head): ``(exp(2 D) - 1) max|V'| + max e_V``."""
    n, hq, d = q.shape
    hk = k.shape[2]
    g = hq // hk
    vd = c.dequantized(0)[1].astype(np.float64)
    bound = np.zeros((n, hq))
    for i, ln in enumerate(lens):
        if ln == 0:
            continue
        rows = [t[i, j // bs] * bs + j % bs for j in range(ln)]
        kf = np.abs(k.reshape(-1, hk, d)[rows].astype(np.float64))
        vf = np.abs(v.reshape(-1, hk, d)[rows].astype(np.float64))
        vq = np.abs(vd.reshape(-1, hk, d)[rows])
        for h in range(hq):
            kh, qa = h // g, np.abs(q[i, h].astype(np.float64))
            if dtype == "int8":
                ek = 0.5 * kf[:, kh].max(axis=1, keepdims=True) / 127 * np.ones(d)
                ev = 0.5 * vf[:, kh].max(axis=1) / 127
            else:
                rel, sub = FP8_ERR[dtype]
                ks, vs = c.key_scales(0)[kh], c.value_scales(0)[kh]
                ek = rel * kf[:, kh] + sub * ks
                ev = (rel * vf[:, kh] + sub * vs).max(axis=1)
            dmax = scale * (ek @ qa).max()
            bound[i, h] = np.expm1(2 * dmax) * vq[:, kh].max() + ev.max()
    return bound


@pytest.mark.parametrize("outliers", [False, True], ids=["normal", "outliers"])
@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("path", PATHS)
def test_decode_on_every_path_stays_within_the_quantization_bound_of_the_f32_cache(
        path: str, dtype: str, outliers: bool) -> None:
    rng = np.random.default_rng(3 + outliers)
    bs, hk, g, d = 16, 2, 4, 64
    lens = [1, 17, 100, 333, 0]
    t, sl = tables(lens, bs)
    nb = int(t.max()) + 1
    k, v = make_data(rng, (nb * bs, hk, d), outliers)
    q = (rng.standard_normal((len(lens), hk * g, d)) * 2).astype(np.float32)
    scale = 1 / np.sqrt(d)
    c, cf = build(dtype, k, v, bs, nb), build("f32", k, v, bs, nb)
    got = kv.decode_attention(c, 0, q, t, sl, tuning=kv.KernelTuning(isa=path, split_size=64))
    exact = kv.decode_attention(cf, 0, q, t, sl, tuning=kv.KernelTuning(isa=path))
    out_scale = max(np.abs(exact).max(), 1e-3)
    bound = decode_bound(dtype, c, k.reshape(nb, bs, hk, d), v.reshape(nb, bs, hk, d), q, t, lens, bs, scale)
    err = np.abs(got - exact).max(axis=2)
    assert (err <= bound * 1.001 + 2e-5 * out_scale).all(), (err / np.maximum(bound, 1e-30)).max()
    assert err.max() > 0  # the quantization is real


# ------------------------------------------------------------- the ledger and simulator


@pytest.mark.parametrize("dtype,native", [("bf16", "bf16"), ("int8", "int8"), ("fp8_e4m3", "fp8_e4m3"),
                                          ("fp8_e5m2", "fp8_e5m2"), ("fp32", "f32")])
def test_ledger_counts_the_storage_bytes_of_each_format(dtype: str, native: str) -> None:
    from pykvpool.planning.hardware import hardware_preset
    from pykvpool.planning.models import model_preset, storage_dtype
    from pykvpool.simulate import kv_blocks_for_memory

    m = model_preset("llama-3-8b")
    per_layer = kv.KvCache.bytes_per_token(m.num_kv_heads, m.head_dim, native)
    assert m.kv_bytes_per_token(dtype) == m.num_layers * per_layer
    assert storage_dtype(dtype).native == native
    hw = hardware_preset("a100-80gb-sxm")
    blocks = kv_blocks_for_memory(m, hw, 16, kv_dtype=dtype)
    bf16 = kv_blocks_for_memory(m, hw, 16, kv_dtype="bf16")
    ratio = kv.KvCache.bytes_per_token(m.num_kv_heads, m.head_dim, "bf16") / per_layer
    assert blocks == pytest.approx(bf16 * ratio, rel=2e-4)
    with pytest.raises(kv.InvalidArgumentError):
        storage_dtype(f"{dtype}:g32" if dtype.startswith("fp8_") else "bf16:g32")


@pytest.mark.parametrize("dtype", QDTYPES)
def test_largest_finite_values_dequantize_finite(dtype: str) -> None:
    # float32's largest finite values keep a finite code x scale, within the format's bound.
    top = np.finfo(np.float32).max
    c = kv.KvCache(1, 4, 4, 1, 4, dtype)
    k = np.array([[top, -top, 1.0, 0.0], [-top, top / 3, 0.0, 2.0]], np.float32)
    c.write(0, k, -k, [0, 1])
    for got, want in zip(c.dequantized(0), (k, -k)):
        rows = got.reshape(-1, 4)[:2]
        assert np.isfinite(rows).all(), rows
        step = float(np.abs(want).max()) / (127.0 if dtype == "int8" else FP8[dtype][1])
        rel = FP8_ERR.get(dtype, (0.0, 0.0))[0]
        assert np.all(np.abs(rows.astype(np.float64) - want) <= step / 2 + rel * np.abs(want.astype(np.float64)))
