"""``q_dtype="int8"`` (int8 caches): the query quantized per (sequence, head) to int8,
scores by ``vpdpbusd`` on AVX-512 with VNNI and by f32 FMAs on the dequantized quantized
query elsewhere. On every path the quantization is visible: the result differs from the
exact query's.

Against the quantized-query reference (1e-5 of the output scale) and the exact-query
reference (the documented bound ``(exp(2 D) - 1) max|V'|``, ``D = scale * (s_q / 2) *
max_t sum_i |K'(t, i)|``, the LSE within ``D``) on both table forms, and the refusal on
every other cache, are the conformance grid's (tests/attention/test_conformance.py).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from test_kv_quant import make_data, tables

import pykvpool as kv

PATHS = kv.kernel_paths()
F32 = npt.NDArray[np.float32]

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


@pytest.mark.parametrize("outliers", [False, True], ids=["normal", "outliers"])
@pytest.mark.parametrize("path", PATHS)
def test_int8_query_changes_the_result_on_every_path(path: str, outliers: bool) -> None:
    d, g = 128, 4
    c, q, t, sl, _ = case(7 + outliers, g, d, outliers)
    exact = kv.decode_attention(c, 0, q, t, sl, tuning=kv.KernelTuning(isa=path))
    got = kv.decode_attention(c, 0, q, t, sl, tuning=kv.KernelTuning(isa=path), q_dtype="int8")
    assert np.abs(got.astype(np.float64) - exact).max() > 0  # the quantization is real
