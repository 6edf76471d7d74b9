"""8-bit decode on every kernel path this CPU has (``KernelTuning(isa=...)``: scalar, AVX2 and AVX-512
on x86-64, NEON on aarch64), each dequantizing the codes in registers, against a float64
reference on the dequantized values, within 1e-5 of the output scale: every length 1..16
(the tails of 4-, 8- and 16-token chunks), GQA ratios 1, 2, 4 and 8, block sizes 1, 16
and 64, split and unsplit, with and without a window and sinks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import pykvpool as kv

PATHS = kv.kernel_paths()
QDTYPES = ["int8", "fp8_e4m3", "fp8_e5m2"]


def reference(c: kv.KvCache, q: npt.NDArray[np.float32], t: npt.NDArray[np.int64], lens: list[int],
              window: int | None, sinks: int) -> npt.NDArray[np.float64]:
    """float64 decode attention over the dequantized keys the query at ``len - 1`` sees."""
    kd, vd = (x.astype(np.float64) for x in c.dequantized(0))
    bs, hk, d = kd.shape[1:]
    n, hq, _ = q.shape
    g = hq // hk
    out = np.zeros((n, hq, d))
    for i, ln in enumerate(lens):
        keys = np.array([j for j in range(ln) if j < sinks or window is None or ln - 1 - j <= window], np.int64)
        if keys.size == 0:
            continue
        blocks, slots = t[i, keys // bs], keys % bs
        for h in range(hq):
            kf, vf = kd[blocks, slots, h // g], vd[blocks, slots, h // g]
            logit = kf @ q[i, h].astype(np.float64) / np.sqrt(d)
            p = np.exp(logit - logit.max())
            out[i, h] = p @ vf / p.sum()
    return out


@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("path", PATHS)
def test_8bit_decode_matches_the_dequantized_reference_over_tails_ratios_and_windows(path: str, dtype: str) -> None:
    rng = np.random.default_rng(7)
    lens = list(range(1, 17)) + [70]
    for bs, hk, g, d in [(1, 1, 1, 8), (16, 2, 2, 64), (64, 1, 4, 40), (16, 1, 8, 128), (5, 2, 8, 17)]:
        nblk = [-(-n // bs) for n in lens]
        nb = sum(nblk) + 1
        perm = rng.permutation(nb)
        t = np.full((len(lens), max(nblk)), -1, np.int64)
        at = 0
        for i, m in enumerate(nblk):
            t[i, :m] = perm[at:at + m]
            at += m
        c = kv.KvCache(1, nb, bs, hk, d, dtype)
        k, v = (rng.standard_normal((nb * bs, hk, d)).astype(np.float32) for _ in range(2))
        c.write(0, k, v, np.arange(nb * bs))
        q = rng.standard_normal((len(lens), hk * g, d)).astype(np.float32)
        for window, sinks in [(None, 0), (5, 2), (bs, 0)]:
            want = reference(c, q, t, lens, window, sinks)
            tol = 1e-5 * max(float(np.abs(want).max()), 1e-3)
            for split in (None, 1):
                got: Any = kv.decode_attention(c, 0, q, t, lens, tuning=kv.KernelTuning(isa=path, split_size=split),
                                               window_left=window, sink_tokens=sinks)
                err = float(np.abs(got - want).max())
                assert err <= tol, (path, dtype, bs, g, window, sinks, split, err / tol)
