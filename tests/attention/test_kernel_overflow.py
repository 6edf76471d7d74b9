"""Finite inputs whose answer is finite give a finite answer on every kernel path.

The f32 paths keep an unnormalised ``P V`` sum and scores ``scale * q . k`` in f32, which
can overflow where the answer does not (four keys of ``V = 1e38`` with equal weights sum
past ``f32::MAX``; a score past it). Such rows are computed again in f64: the answer here
is exact (equal weights over equal values), so each case asserts it to the value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pykvpool as kv

PATHS = kv.kernel_paths()
DTYPES = ["f32", "f16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2"]
HKV, G, D, BS = 2, 2, 64, 16
BIG = 1e38


def big_value(dtype: str) -> float:
    # f16 cannot hold 1e38 (writes saturate at its maximum): its largest value instead.
    return 65504.0 if dtype == "f16" else BIG


def cache_with(dtype: str, n: int, v: float, k: float = 1.0) -> tuple[kv.KvCache, np.ndarray, Any]:
    """A cache whose one sequence holds `n` equal keys and values `v` on every head."""
    nb = -(-n // BS) + 1
    c = kv.KvCache(1, nb, BS, HKV, D, dtype)
    keys = np.full((n, HKV, D), k, np.float32)
    vals = np.full((n, HKV, D), v, np.float32)
    vals[:, :, 1::2] *= -1  # both signs
    c.write(0, keys, vals, np.arange(n))
    tables = np.arange(nb, dtype=np.int32)[None, :]
    return c, tables, c.dequantized(0)[1].reshape(-1, HKV, D)[:n]


def options(dtype: str, path: str) -> list[dict[str, Any]]:
    """The opt-in paths each dtype takes on ``path`` (each ignored where the CPU lacks it)."""
    on = kv.KernelTuning(isa=path)
    opts: list[dict[str, Any]] = [{"tuning": on}, {"tuning": kv.KernelTuning(isa=path, split_size=BS)}]
    if dtype in ("bf16", "fp8_e4m3", "fp8_e5m2"):
        opts.append({"tuning": on, "q_dtype": "bf16"})
    if dtype == "int8":
        opts.append({"tuning": on, "q_dtype": "int8"})
    if dtype.startswith("fp8"):
        opts.append({"tuning": on, "q_dtype": "f16", "pv_dtype": "f16"})
    return opts


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [4, 64])
def test_decode_keeps_large_equal_values_finite(path: str, dtype: str, n: int) -> None:
    c, tables, stored = cache_with(dtype, n, big_value(dtype))
    q = np.ones((1, HKV * G, D), np.float32)
    want = np.repeat(stored[0], G, axis=0)  # every key equal: the output is any one value
    for opt in options(dtype, path):
        out, lse = kv.decode_attention(c, 0, q, tables, [n], return_lse=True, **opt)
        assert np.isfinite(out).all(), (opt, out[0, 0, :4])
        np.testing.assert_allclose(out[0], want, rtol=1e-6, err_msg=str(opt))
        assert np.isfinite(lse).all()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_keeps_large_equal_values_finite(path: str, dtype: str) -> None:
    n = 40
    c, tables, stored = cache_with(dtype, n, big_value(dtype))
    q = np.ones((n, HKV * G, D), np.float32)
    opts: list[dict[str, Any]] = [{}, {"logits_soft_cap": 30.0}, {"window_left": 8, "sink_tokens": 2}]
    if dtype == "bf16":
        opts.append({"q_dtype": "bf16", "pv_dtype": "bf16"})
    want = np.repeat(stored[0], G, axis=0)
    for opt in opts:
        out = kv.prefill_attention(c, 0, q, [0, n], tables, [n], tuning=kv.KernelTuning(isa=path), **opt)
        assert np.isfinite(out).all(), opt
        np.testing.assert_allclose(out, np.broadcast_to(want, out.shape), rtol=1e-6, err_msg=str(opt))


@pytest.mark.parametrize("path", PATHS)
def test_scores_past_f32_max_give_the_softmax_of_the_finite_logits(path: str) -> None:
    # q . k = 1e20 * 1e20 * 64 overflows f32; the logits are finite, the weights one-hot.
    n = 8
    c, tables, _ = cache_with("f32", n, 1.0, k=1e20)
    vals = np.arange(n * HKV * D, dtype=np.float32).reshape(n, HKV, D)
    keys = np.full((n, HKV, D), 1e20, np.float32)
    keys[5] *= 1.5  # the one key with the largest logit, by a margin of 1e39
    c.write(0, keys, vals, np.arange(n))
    q = np.full((1, HKV * G, D), 1e20, np.float32)
    out = kv.decode_attention(c, 0, q, tables, [n], tuning=kv.KernelTuning(isa=path))
    np.testing.assert_array_equal(out[0], np.repeat(vals[5], G, axis=0))
    qp = np.full((2, HKV * G, D), 1e20, np.float32)
    out = kv.prefill_attention(c, 0, qp, [0, 2], tables, [n], tuning=kv.KernelTuning(isa=path))
    np.testing.assert_array_equal(out[1], np.repeat(vals[5], G, axis=0))


def test_non_finite_inputs_stay_non_finite() -> None:
    # The fallback recomputes; it does not invent an answer for a NaN written through a view.
    c, tables, _ = cache_with("f32", 4, 1.0)
    c.value(0)[0, 0, 0, 0] = np.nan
    out = kv.decode_attention(c, 0, np.ones((1, HKV * G, D), np.float32), tables, [4])
    assert np.isnan(out).any()
