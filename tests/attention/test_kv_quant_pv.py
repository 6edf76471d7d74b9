"""``int8_pv=True`` (int8 caches): on the AVX-512 path of a CPU with avx512_vnni and a
head_dim that is a multiple of 64, P.V on the probabilities quantized to 8 bits per
(16-token chunk, query head) by ``vpdpbusd``; every other path and head_dim keeps the f32
P.V. On every path, both table forms, with and without ``int8_scores``:

- against a float64 reference on the dequantized K/V (with the quantized query under
  ``int8_scores``): within ``(16 / 510) max|V'|`` of each sequence's KV head plus 1e-5 of
  the output scale where the integer P.V runs, within 1e-5 of the output scale elsewhere;
  the LSE (the softmax sum is untouched) within 1e-5;
- on normal data the error is visible where the integer P.V runs and far inside the bound;
- a bool only; refused (naming ``int8_pv``) for any other cache with ``out`` untouched
  (tests/attention/test_kv_quant_fast.py, with ``int8_scores``'s refusal).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from test_kv_quant import decode_ref
from test_kv_quant_fast import case, quantized_query

import pykvpool as kv

PATHS = kv.kernel_paths()


def integer_pv(path: str, d: int) -> bool:
    """Whether ``path`` runs P.V on integers for head_dim ``d``."""
    return path == "avx512" and "avx512vnni" in kv.cpu_features() and d % 64 == 0


@pytest.mark.parametrize("int8_scores", [False, True], ids=["exact_q", "int8_scores"])
@pytest.mark.parametrize("g,d,bs", [(1, 128, 16), (4, 128, 16), (2, 64, 8), (3, 256, 32), (4, 80, 16)])
@pytest.mark.parametrize("path", PATHS)
def test_int8_pv_stays_within_its_bound_on_every_path(path: str, g: int, d: int, bs: int, int8_scores: bool) -> None:
    c, q, t, sl, lens = case(g * 10 + d + bs, g, d, bs=bs)
    nb = t.max() + 1
    kd, vd = (x.reshape(nb, bs, 2, d) for x in c.dequantized(0))
    qq = quantized_query(q)[0].astype(np.float32) if int8_scores else q
    want = decode_ref(kd, vd, qq, t, lens, bs, 1 / np.sqrt(d))
    out_scale = max(np.abs(want).max(), 1e-3)
    vmax = np.zeros(q.shape[:2])
    for i, ln in enumerate(lens):
        rows = [t[i, j // bs] * bs + j % bs for j in range(ln)]
        for h in range(q.shape[1]):
            vmax[i, h] = np.abs(vd.reshape(-1, 2, d)[rows, h // g]).max() if ln else 0
    bound = (16 / 510 * vmax if integer_pv(path, d) else 0) + 1e-5 * out_scale
    _, want_lse = kv.decode_attention(c, 0, q, t, sl, force_isa=path, return_lse=True, int8_scores=int8_scores)
    for split in (None, bs):
        got, lse = kv.decode_attention(c, 0, q, t, sl, force_isa=path, split_size=split, return_lse=True,
                                       int8_scores=int8_scores, int8_pv=True)
        err = np.abs(got.astype(np.float64) - want).max(axis=2)
        assert (err <= bound).all(), (path, split, float((err - bound).max()))
        finite = np.isfinite(want_lse)
        assert np.allclose(lse[finite], want_lse[finite], rtol=1e-5, atol=1e-5)
    nblk = [-(-n // bs) for n in lens]
    indptr = np.concatenate([[0], np.cumsum(nblk)])
    indices = np.concatenate([t[i, :n] for i, n in enumerate(nblk)])
    last = np.array([(n - 1) % bs + 1 if n else 0 for n in lens])
    got = kv.decode_attention_paged(c, 0, q, indptr, indices, last, force_isa=path, int8_scores=int8_scores,
                                    int8_pv=True)
    assert (np.abs(got.astype(np.float64) - want).max(axis=2) <= bound).all(), path


@pytest.mark.parametrize("path", PATHS)
def test_int8_pv_errors_on_normal_data_are_visible_and_far_inside_the_bound(path: str) -> None:
    d, g, bs = 128, 4, 16
    c, q, t, sl, lens = case(11, g, d, bs=bs)
    exact = kv.decode_attention(c, 0, q, t, sl, force_isa=path).astype(np.float64)
    got = kv.decode_attention(c, 0, q, t, sl, force_isa=path, int8_pv=True).astype(np.float64)
    vmax = float(np.abs(c.dequantized(0)[1]).max())
    err = float(np.abs(got - exact).max())
    if integer_pv(path, d):
        assert 0 < err < 16 / 510 * vmax / 5, (err, vmax)
    else:
        assert err <= 1e-6 * max(np.abs(exact).max(), 1e-3)


def test_int8_pv_takes_a_bool_only() -> None:
    c = kv.KvCache(1, 4, 16, 2, 64, "int8")
    q = np.ones((1, 4, 64), np.float32)
    with pytest.raises(TypeError):
        kv.decode_attention(c, 0, q, [[0, 1]], [20], int8_pv=1)  # type: ignore[arg-type]
