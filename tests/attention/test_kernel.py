"""KvCache and decode attention against a float64 numpy reference computed from the
values the cache actually stores (so f16/bf16 rounding of K/V is not counted as error).

Accuracy contract: max abs error <= out_scale * (1e-5 + 4e-7 * L), where out_scale is the
largest |reference output| and L the largest |logit|. The second term is f32 arithmetic
itself: a logit of magnitude L carries a rounding error of about L * 6e-8 per term, which
moves softmax weights by that relative amount; for ordinary logits (L of order 10) the
bound is about 1e-5 of the output scale.
"""

from __future__ import annotations

import os
import platform
import subprocess
import textwrap
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pykvpool as kv

PATHS = kv.kernel_paths()
DTYPES = ["f32", "f16", "bf16"]
#: Every kernel path of this architecture, whether this CPU runs it or not.
ARCH_PATHS = ["scalar", "neon"] if platform.machine().lower() in ("aarch64", "arm64") else ["scalar", "avx2", "avx512"]


def path_params() -> list[Any]:
    """Every path of this architecture; one this CPU lacks is a skip with its reason
    (listed by ``pytest -ra``), never silently absent. The hypothesis grids draw from
    the supported paths only: these skips report what they could not cover."""
    return [
        pytest.param(p, marks=pytest.mark.skipif(
            p not in PATHS, reason=f"kernel path {p} not tested: this CPU lacks it (kernel_paths() = {PATHS})"))
        for p in ARCH_PATHS
    ]


F64 = npt.NDArray[np.float64]


def as_f64(x: npt.NDArray[object]) -> F64:
    if x.dtype == np.uint16:  # bf16 bits without ml_dtypes
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(x, dtype=np.float64)


def reference(
    cache: kv.KvCache, layer: int, q: npt.NDArray[np.float32], tables: list[npt.NDArray[np.int32]], lens: list[int],
    scale: float,
) -> tuple[F64, F64, float]:
    """Grouped (no repeat) float64 attention; returns (out, lse, max |logit|)."""
    kc, vc = as_f64(cache.key(layer)), as_f64(cache.value(layer))
    n, hq, d = q.shape
    hkv, bs = cache.num_kv_heads, cache.block_size
    g = hq // hkv
    out = np.zeros((n, hq, d))
    lse = np.full((n, hq), -np.inf)
    lmax = 0.0
    for i in range(n):
        t = np.arange(lens[i])
        if lens[i] == 0:
            continue
        blocks = tables[i][t // bs]
        k = kc[blocks, t % bs]  # [len, hkv, d]
        v = vc[blocks, t % bs]
        qg = q[i].astype(np.float64).reshape(hkv, g, d)
        logits = np.einsum("hgd,thd->hgt", qg, k) * scale
        lmax = max(lmax, float(np.abs(logits).max()))
        m = logits.max(axis=-1, keepdims=True)
        p = np.exp(logits - m)
        z = p.sum(axis=-1, keepdims=True)
        out[i] = np.einsum("hgt,thd->hgd", p / z, v).reshape(hq, d)
        lse[i] = (m + np.log(z)).reshape(hq)
    return out, lse, lmax


def assert_close(got: npt.NDArray[np.float32], want: F64, lmax: float) -> None:
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want).max(initial=0.0))
    assert np.isfinite(got).all()
    assert err <= scale * (1e-5 + 4e-7 * lmax), f"max error {err:.3e} vs output scale {scale:.3e}, max logit {lmax:.1f}"


@dataclass
class Setup:
    pool: kv.BlockPool
    cache: kv.KvCache
    seqs: list[int]
    rng: np.random.Generator

    def fill(self, slots: npt.NDArray[np.int64], layer: int = 0, mag: float = 1.0) -> None:
        h, d = self.cache.num_kv_heads, self.cache.head_dim
        k = (self.rng.standard_normal((len(slots), h, d)) * mag).astype(np.float32)
        v = self.rng.standard_normal((len(slots), h, d)).astype(np.float32)
        self.cache.write(layer, k, v, slots)

    def step(self, ids: list[int], counts: int = 1) -> None:
        slots, cow, _ = self.pool.step(ids, counts)
        self.cache.copy_blocks(cow)
        self.fill(slots)

    def tables(self) -> tuple[list[npt.NDArray[np.int32]], list[int]]:
        return [self.pool.block_table(s) for s in self.seqs], [self.pool.seq_len(s) for s in self.seqs]


def make(lens: list[int], bs: int, hkv: int, d: int, dtype: str, seed: int = 0, mag: float = 1.0) -> Setup:
    nb = sum(-(-n // bs) for n in lens) * 2 + 8
    s = Setup(kv.BlockPool(nb, bs), kv.KvCache(1, nb, bs, hkv, d, dtype), [], np.random.default_rng(seed))
    for i, n in enumerate(lens):
        s.fill(s.pool.add_sequence(i, n), mag=mag)
        s.seqs.append(i)
    return s


def run_and_check(
    s: Setup, g: int, path: str, split: int | None, kpi: int | None, qmag: float = 1.0, bf16_query: bool = False
) -> None:
    """With ``bf16_query`` (``q_dtype="bf16"``) the reference uses the bf16-rounded query (the option's
    semantics), to the same tolerance, and the exact-query reference is met within
    :func:`bf16_query_bound`."""
    tables, lens = s.tables()
    n, hq, d = len(lens), s.cache.num_kv_heads * g, s.cache.head_dim
    q = (s.rng.standard_normal((n, hq, d)) * qmag).astype(np.float32)
    width = max((len(t) for t in tables), default=0)
    padded = np.full((n, width), -1, np.int32)
    for i, t in enumerate(tables):
        padded[i, : len(t)] = t
    qref = bf16_round(q) if bf16_query else q
    want, want_lse, lmax = reference(s.cache, 0, qref, tables, lens, 1 / np.sqrt(d))
    out, lse = kv.decode_attention(
        s.cache, 0, q, padded, np.array(lens), return_lse=True, tuning=kv.KernelTuning(isa=path, split_size=split, kv_heads_per_item=kpi), q_dtype="bf16" if bf16_query else "f32",
    )
    if bf16_query:
        exact, exact_lse, _ = reference(s.cache, 0, q, tables, lens, 1 / np.sqrt(d))
        out_bound, lse_bound = bf16_query_bound(s.cache, q, tables, lens, 1 / np.sqrt(d))
        slack = float(np.abs(want).max(initial=0.0)) * (1e-5 + 4e-7 * lmax)
        assert (np.abs(out - exact) <= out_bound[..., None] + slack).all()
        fin = np.isfinite(exact_lse)
        assert (np.abs(lse[fin] - exact_lse[fin]) <= lse_bound[fin] + 1e-5 * max(1.0, lmax)).all()
    assert out.shape == (n, hq, d) and out.dtype == np.float32
    assert_close(out, want, lmax)
    finite = np.isfinite(want_lse)
    assert (np.isneginf(lse) == ~finite).all()
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-5, atol=1e-5 * max(1.0, lmax))
    # The FlashInfer form of the same tables gives the same numbers.
    indptr, indices, last = s.pool.flashinfer_tables(s.seqs)
    out2 = kv.decode_attention_paged(
        s.cache, 0, q, indptr, indices, last, tuning=kv.KernelTuning(isa=path, split_size=split, kv_heads_per_item=kpi),
        q_dtype="bf16" if bf16_query else "f32",
    )
    np.testing.assert_array_equal(out, out2)


def bf16_round(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """f32 rounded to bf16 (nearest, ties to even), as f32 (finite inputs)."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def bf16_query_bound(
    cache: kv.KvCache, q: npt.NDArray[np.float32], tables: list[npt.NDArray[np.int32]], lens: list[int], scale: float
) -> tuple[F64, F64]:
    """Worst-case effect of ``q_dtype="bf16"`` against the exact query, per (sequence, head).

    Rounding to bf16 (8 significant bits, nearest) moves each query element by at most
    2^-8 of itself, so logit t moves by at most D = scale * 2^-8 * max_t sum_i |q_i K_ti|.
    Each softmax weight then changes by a factor in [exp(-2D), exp(2D)], so
    |sum_t (p'_t - p_t) v_t| <= (exp(2D) - 1) * max |v|, and the LSE moves by at most D.
    Returns (output bound, LSE bound), both ``[n, Hq]``; f32 rounding comes on top."""
    kc, vc = np.abs(as_f64(cache.key(0))), np.abs(as_f64(cache.value(0)))
    n, hq, d = q.shape
    hkv, bs = cache.num_kv_heads, cache.block_size
    g = hq // hkv
    out, lse = np.zeros((n, hq)), np.zeros((n, hq))
    for i in range(n):
        if lens[i] == 0:
            continue
        t = np.arange(lens[i])
        blocks = tables[i][t // bs]
        qa = np.abs(q[i].astype(np.float64)).reshape(hkv, g, d)
        dmax = np.einsum("hgd,thd->hgt", qa, kc[blocks, t % bs]).max(axis=-1) * scale * 2.0**-8
        vmax = vc[blocks, t % bs].max(axis=(0, 2))  # [hkv]
        out[i] = (np.expm1(2 * dmax) * vmax[:, None]).reshape(hq)
        lse[i] = dmax.reshape(hq)
    return out, lse


def lengths(bs: int) -> st.SearchStrategy[int]:
    edge = st.sampled_from([1, bs, bs + 1, 2 * bs, 2 * bs - 1 if bs > 1 else 3])
    return st.one_of(edge, st.integers(1, 300))


@st.composite
def cases(draw: st.DrawFn) -> tuple[object, ...]:
    bs = draw(st.sampled_from([1, 8, 16, 32]))
    hkv = draw(st.sampled_from([1, 2, 4, 8]))
    g = draw(st.sampled_from([1, 2, 4, 8]))
    d = draw(st.sampled_from([64, 80, 96, 128, 256]))
    lens = draw(st.lists(lengths(bs), min_size=1, max_size=4))
    dtype = draw(st.sampled_from(DTYPES))
    path = draw(st.sampled_from(PATHS))
    split = draw(st.sampled_from([None, 0, 1, 16, 64]))
    kpi = draw(st.sampled_from([None, 1]))
    fork = draw(st.booleans())
    seed = draw(st.integers(0, 2**31))
    return bs, hkv, g, d, lens, dtype, path, split, kpi, fork, seed


@given(cases())
def test_matches_float64_reference(case: tuple[object, ...]) -> None:
    bs, hkv, g, d, lens, dtype, path, split, kpi, fork, seed = case
    assert isinstance(lens, list)
    s = make(lens, int(bs), int(hkv), int(d), str(dtype), int(seed))  # type: ignore[call-overload]
    if fork:
        # Parallel sampling: the child shares the parent's blocks, then both diverge
        # (copy-on-write of the shared partial block through copy_blocks).
        s.pool.fork(0, 100)
        s.seqs.append(100)
        s.step([0, 100], 2)
    run_and_check(s, int(g), str(path), split, kpi)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", path_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_logits_do_not_overflow(path: str, dtype: str) -> None:
    s = make([700, 33], 16, 2, 128, dtype, seed=5, mag=30.0)
    run_and_check(s, 4, path, None, None, qmag=30.0)  # logits in the thousands


@pytest.mark.parametrize("path", path_params())
def test_single_long_sequence_is_split_and_matches(path: str) -> None:
    s = make([5000], 16, 2, 64, "bf16", seed=9)
    for split in (None, 0, 256):
        run_and_check(s, 4, path, split, None)


def test_empty_batch_and_empty_sequence() -> None:
    c = kv.KvCache(1, 4, 16, 2, 64)
    q = np.zeros((0, 4, 64), np.float32)
    out, lse = kv.decode_attention(c, 0, q, np.zeros((0, 3), np.int32), np.zeros(0, np.int32), return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4)
    q1 = np.ones((1, 4, 64), np.float32)
    out, lse = kv.decode_attention(c, 0, q1, np.full((1, 2), -1, np.int32), [0], return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_out_is_written_in_place_and_scale_is_used() -> None:
    s = make([40], 8, 2, 64, "f32")
    tables, lens = s.tables()
    q = s.rng.standard_normal((1, 2, 64)).astype(np.float32)
    out = np.empty((1, 2, 64), np.float32)
    res = kv.decode_attention(s.cache, 0, q, np.array(tables), lens, scale=0.3, out=out)
    assert res is out
    want, _, lmax = reference(s.cache, 0, q, tables, lens, 0.3)
    assert_close(out, want, lmax)


def test_views_are_zero_copy_logical_and_writable() -> None:
    c = kv.KvCache(2, 3, 4, 2, 8, "f16")
    k = c.key(1)
    assert k.shape == (3, 4, 2, 8) and k.dtype == np.float16
    assert np.shares_memory(k, c.key(1)) and not np.shares_memory(k, c.key(0))
    x = np.arange(2 * 2 * 8, dtype=np.float32).reshape(2, 2, 8)
    c.write(1, x, -x, np.array([5, -1]))  # slot 5 = block 1, offset 1; -1 skipped
    np.testing.assert_array_equal(k[1, 1], x[0].astype(np.float16))
    np.testing.assert_array_equal(c.value(1)[1, 1], -x[0].astype(np.float16))
    assert np.count_nonzero(k) == np.count_nonzero(x[0])
    k[0, 0, 0, 0] = 3.0  # the view writes the cache itself
    assert c.key(1)[0, 0, 0, 0] == 3.0


def test_write_rounds_to_nearest_even() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 1, 16)).astype(np.float32) * 1e3
    # Exact halfway cases for bf16 (low 16 bits 0x8000) on odd and even mantissas.
    x.view(np.uint32)[0, 0, :4] = [0x3F808000, 0x3F818000, 0xBF808000, 0x7F7F8000]
    c = kv.KvCache(1, 4, 16, 1, 16, "bf16")
    c.write(0, x, x, np.arange(64))
    bits = c.key(0).reshape(64, 1, 16).view(np.uint16) if c.key(0).dtype != np.uint16 else c.key(0).reshape(64, 1, 16)
    u = x.view(np.uint32)
    rne = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(bits, rne)
    c16 = kv.KvCache(1, 4, 16, 1, 16, "f16")
    c16.write(0, x, x, np.arange(64))
    with np.errstate(over="ignore"):  # 3.4e38 -> inf, as in the cache
        np.testing.assert_array_equal(c16.value(0).reshape(64, 1, 16), x.astype(np.float16))


def test_copy_blocks_copies_every_layer() -> None:
    c = kv.KvCache(2, 4, 2, 1, 4)
    x = np.arange(8, dtype=np.float32).reshape(2, 1, 4)
    for layer in range(2):
        c.write(layer, x, x + 1, [2, 3])  # block 1
    c.copy_blocks(np.array([[1, 3]]))
    for layer in range(2):
        np.testing.assert_array_equal(c.key(layer)[3], c.key(layer)[1])
        np.testing.assert_array_equal(c.value(layer)[3], c.value(layer)[1])
    c.copy_blocks(np.zeros((0, 2), np.int64))
    with pytest.raises(kv.InvalidArgumentError):
        c.copy_blocks([[0, 4]])
    with pytest.raises(kv.InvalidArgumentError):
        c.copy_blocks([[0, 1, 2]])


def test_invalid_arguments_raise_and_change_nothing() -> None:
    c = kv.KvCache(1, 4, 4, 2, 8)
    q = np.zeros((1, 4, 8), np.float32)
    t = np.array([[0, 1]], np.int32)
    bad_calls = [
        lambda: kv.decode_attention(c, 0, q, np.array([[0, 4]]), [5]),  # block outside pool
        lambda: kv.decode_attention(c, 0, q, np.array([[0, -1]]), [5]),  # padding within length
        lambda: kv.decode_attention(c, 0, q, t, [9]),  # beyond table capacity
        lambda: kv.decode_attention(c, 0, q, t, [-1]),
        lambda: kv.decode_attention(c, 0, np.zeros((1, 3, 8), np.float32), t, [5]),  # heads
        lambda: kv.decode_attention(c, 0, np.zeros((1, 4, 16), np.float32), t, [5]),  # dim
        lambda: kv.decode_attention(c, 0, q.astype(np.float64), t, [5]),  # dtype
        lambda: kv.decode_attention(c, 0, q[0], t, [5]),  # ndim
        lambda: kv.decode_attention(c, 0, q, t, [5, 5]),  # rows vs lens
        lambda: kv.decode_attention(c, 1, q, t, [5]),  # layer
        lambda: kv.decode_attention(c, 0, q, t, [5], out=np.zeros((1, 4, 7), np.float32)),
        lambda: kv.decode_attention(c, 0, q, t, [5], out=np.zeros((1, 4, 16), np.float32)[..., ::2]),
        lambda: kv.decode_attention(c, 0, q, t, [5], tuning=kv.KernelTuning(isa="neon") if "neon" not in PATHS else "avx2"),
        lambda: kv.decode_attention(c, 0, q, t, [5], tuning=kv.KernelTuning(isa="sve")),  # type: ignore[arg-type]  # unknown
        lambda: kv.decode_attention(c, 0, q, t, [5], tuning=kv.KernelTuning(kv_heads_per_item=3)),
        lambda: kv.decode_attention(c, 0, q, t, [5], scale=float("inf")),
        lambda: kv.decode_attention_paged(c, 0, q, [0, 2], [0, 1], [5]),  # last page > block
        lambda: kv.decode_attention_paged(c, 0, q, [0, 3], [0, 1], [1]),  # indptr past indices
        lambda: kv.decode_attention_paged(c, 0, q, [0, 1], [7], [1]),
        lambda: c.write(0, np.zeros((1, 2, 8), np.float32), np.zeros((1, 2, 8), np.float32), [16]),
        lambda: c.write(0, np.zeros((1, 2, 8), np.float64), np.zeros((1, 2, 8), np.float32), [0]),
        lambda: c.write(0, np.zeros((2, 2, 8), np.float32), np.zeros((2, 2, 8), np.float32), [0]),
        lambda: c.key(1),
        lambda: kv.KvCache(1, 4, 4, 2, 8, "int4"),
        lambda: kv.KvCache(1, 0, 4, 2, 8),
        lambda: kv.set_num_threads(0),
    ]
    for call in bad_calls:
        with pytest.raises(kv.InvalidArgumentError):
            call()
    assert not c.key(0).any() and not c.value(0).any()


def test_every_supported_path_is_listed_and_scalar_always() -> None:
    assert PATHS[0] == "scalar"
    feats = kv.cpu_features()
    assert ("avx512" in PATHS) == all(f in feats for f in ("avx512f", "avx512bw", "avx512vl"))
    assert ("avx2" in PATHS) == all(f in feats for f in ("avx2", "fma", "f16c"))
    assert ("neon" in PATHS) == ("neon" in feats)
    assert not ("neon" in PATHS and "avx2" in PATHS)


def test_forcing_a_path_this_cpu_lacks_names_it() -> None:
    c = kv.KvCache(1, 4, 4, 2, 8)
    q = np.zeros((1, 4, 8), np.float32)
    t = np.array([[0, 1]], np.int32)
    lacking = [p for p in ("neon", "avx2", "avx512") if p not in PATHS]
    assert lacking  # no CPU has both the x86 and the aarch64 paths
    for path in lacking:
        with pytest.raises(kv.InvalidArgumentError, match=f"kernel path {path} is not supported by this CPU"):
            kv.decode_attention(c, 0, q, t, [5], tuning=kv.KernelTuning(isa=path))  # type: ignore[arg-type]
    with pytest.raises(kv.InvalidArgumentError, match='unknown kernel path "sve"; known: scalar, neon, avx2, avx512'):
        kv.decode_attention(c, 0, q, t, [5], tuning=kv.KernelTuning(isa="sve"))  # type: ignore[arg-type]


def test_thread_count_is_settable_and_read_from_env() -> None:
    before = kv.get_num_threads()
    try:
        kv.set_num_threads(1)
        assert kv.get_num_threads() == 1
        s = make([100], 16, 2, 64, "f32")
        run_and_check(s, 2, PATHS[-1], None, None)
    finally:
        kv.set_num_threads(before)
    env = dict(os.environ, PYKVPOOL_NUM_THREADS="3")
    code = "import pykvpool; print(pykvpool.get_num_threads())"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "3"


def test_probes_report_positive_rates() -> None:
    assert kv.read_bandwidth(8 << 20, threads=1) > 1e8
    assert kv.peak_flops(threads=1) > 1e8
    with pytest.raises(kv.InvalidArgumentError):
        kv.read_bandwidth(1000)
    with pytest.raises(kv.InvalidArgumentError):
        kv.read_bandwidth(8 << 20, passes=0)


def test_cpu_clock_leaves_out_the_time_the_cpu_ran_something_else() -> None:
    """Probe and a busy loop pinned to one CPU share it: the wall clock sees about half the
    machine's rate, the probe thread's CPU time all of it (a clock that ignored ``clock``
    would read the two alike)."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs sched_setaffinity")
    code = textwrap.dedent("""
        import os, subprocess, sys
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            import pykvpool as kv
            f = [kv.peak_flops(1, clock=c) for c in ("wall", "cpu")]
            b = [kv.read_bandwidth(256 << 20, 1, passes=2, clock=c) for c in ("wall", "cpu")]
        finally:
            hog.kill()
        print(f[1] / f[0], b[1] / b[0])
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    flops, bandwidth = map(float, res.stdout.split())
    assert flops > 1.4, res.stdout
    assert bandwidth > 1.4, res.stdout


def test_probe_reads_a_caches_own_memory_and_leaves_it_unchanged() -> None:
    # 2 layers x 64 blocks x 16 tokens x 4 heads x 64 dims x 2 (K, V) x 2 bytes = 2 MiB.
    c = kv.KvCache(2, 64, 16, 4, 64, "bf16")
    assert c.nbytes == 2 << 20
    c.key(1)[3, 5] = 7
    before = [c.key(1).copy(), c.value(0).copy()]
    assert kv.read_bandwidth(cache=c, threads=2, passes=2) > 1e8
    assert np.array_equal(c.key(1), before[0]) and np.array_equal(c.value(0), before[1])
    with pytest.raises(kv.InvalidArgumentError, match="not both"):
        kv.read_bandwidth(8 << 20, cache=c)
    small = kv.KvCache(1, 4, 16, 1, 64, "f32")
    with pytest.raises(kv.InvalidArgumentError, match="1 MiB"):
        kv.read_bandwidth(cache=small)


def test_probe_of_a_block_table_reads_the_calls_blocks_and_refuses_bad_tables() -> None:
    """With tables, the probe reads what decode reads: a table naming a block outside the
    cache is refused, as decode refuses it, and a table reading under 1 MiB too."""
    c = kv.KvCache(2, 80, 16, 8, 128, "int8")  # an int8 block of 8 heads: 32 KiB + 1 KiB scales
    table = np.random.default_rng(0).permutation(80).reshape(2, 40)
    lens = np.array([640, 500])
    for threads in (1, 2):
        assert kv.read_bandwidth(cache=c, threads=threads, passes=2, block_tables=table, seq_lens=lens, layer=1) > 1e8
    with pytest.raises(kv.InvalidArgumentError, match="block_tables"):
        kv.read_bandwidth(cache=c, block_tables=np.where(table == 7, 80, table), seq_lens=lens)
    # Entries past a sequence's blocks are never read, as in decode.
    short = table.copy()
    short[1, 32:] = 99  # the second sequence's 500 tokens fill 32 blocks
    assert kv.read_bandwidth(cache=c, passes=1, block_tables=short, seq_lens=lens) > 1e8
    with pytest.raises(kv.InvalidArgumentError, match="1 MiB"):
        kv.read_bandwidth(cache=c, block_tables=table, seq_lens=[16, 16])
    with pytest.raises(kv.InvalidArgumentError, match="together"):
        kv.read_bandwidth(cache=c, block_tables=table)
    with pytest.raises(kv.InvalidArgumentError, match="need a cache"):
        kv.read_bandwidth(8 << 20, block_tables=table, seq_lens=lens)
    with pytest.raises(kv.InvalidArgumentError, match="layer"):
        kv.read_bandwidth(cache=c, layer=1)
    with pytest.raises(kv.InvalidArgumentError, match="layer"):
        kv.read_bandwidth(cache=c, block_tables=table, seq_lens=lens, layer=2)


@given(cases())
def test_bf16_query_matches_the_rounded_query_reference(case: tuple[object, ...]) -> None:
    """``q_dtype="bf16"`` on every path: within the usual tolerance of the reference
    computed from the bf16-rounded query, and within :func:`bf16_query_bound` of the
    exact-query reference (the issue's grid; the drawn storage dtype is replaced by bf16)."""
    bs, hkv, g, d, lens, _, path, split, kpi, fork, seed = case
    assert isinstance(lens, list)
    s = make(lens, int(bs), int(hkv), int(d), "bf16", int(seed))  # type: ignore[call-overload]
    if fork:
        s.pool.fork(0, 100)
        s.seqs.append(100)
        s.step([0, 100], 2)
    run_and_check(s, int(g), str(path), split, kpi, bf16_query=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", path_params())
def test_bf16_query_large_logits_and_odd_head_dim(path: str) -> None:
    run_and_check(make([700, 33], 16, 2, 128, "bf16", seed=5, mag=30.0), 4, path, None, None, 30.0, True)
    for bs in (1, 8, 16, 32):
        run_and_check(make([2 * bs + 1, bs - 1 or 1], bs, 2, 65, "bf16", seed=bs), 3, path, 1, 1, bf16_query=True)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_bf16_query_needs_a_bf16_or_fp8_cache_and_leaves_out_untouched(dtype: str) -> None:
    s = make([40], 8, 2, 64, dtype)
    tables, lens = s.tables()
    q = s.rng.standard_normal((1, 4, 64)).astype(np.float32)
    out = np.full((1, 4, 64), 7.0, np.float32)
    indptr, indices, last = s.pool.flashinfer_tables(s.seqs)
    for path in PATHS:
        with pytest.raises(kv.InvalidArgumentError, match=r"q_dtype=bf16 with pv_dtype=f32 is not a decode precision on a f\d+ cache"):
            kv.decode_attention(s.cache, 0, q, np.array(tables), lens, out=out, tuning=kv.KernelTuning(isa=path), q_dtype="bf16")
        with pytest.raises(kv.InvalidArgumentError, match=r"q_dtype=bf16 with pv_dtype=f32 is not a decode precision on a f\d+ cache"):
            kv.decode_attention_paged(s.cache, 0, q, indptr, indices, last, out=out, tuning=kv.KernelTuning(isa=path), q_dtype="bf16")
    assert (out == 7.0).all()


def test_bf16_round_is_nearest_even() -> None:
    """The tests' rounding is the cache's own (round to nearest even on write)."""
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-20), 3.0e-3, -7.5e5], np.float32)
    assert bf16_round(x)[:4].tolist() == [1.0, 1.0, 1 + 2**-6, -(1 + 2**-7)]
    c = kv.KvCache(1, 1, 1, 1, 4096, "bf16")
    y = np.concatenate([x, np.random.default_rng(3).standard_normal(4096 - len(x)).astype(np.float32)])
    c.write(0, y.reshape(1, 1, 4096), y.reshape(1, 1, 4096), [0])
    np.testing.assert_array_equal(as_f64(c.key(0)).ravel(), bf16_round(y))
