"""prefill_attention / prefill_attention_paged against a float64 numpy reference computed
from the values the cache stores, on every kernel path this CPU has.

Accuracy contract (as decode's, tests/attention/test_kernel.py): max abs error <= out_scale * (1e-5
+ 4e-7 * L), out_scale the largest |reference output|, L the largest |logit|.

Masks are on logical positions: key j of a sequence is at position j; query rows default
to the positions of the sequence's last n_q keys, or take ``q_positions``.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pykvpool as kv

PATHS = kv.kernel_paths()
DTYPES = ["f32", "f16", "bf16"]
F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


def as_f64(x: npt.NDArray[object]) -> F64:
    if x.dtype == np.uint16:  # bf16 bits without ml_dtypes
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(x, dtype=np.float64)


def bf16_round(x: F32) -> F32:
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


@dataclass
class MaskSpec:
    causal: bool = True
    chunk_size: int | None = None
    window_left: int | None = None
    sink_tokens: int = 0

    def visible(self, p: npt.NDArray[np.int64], k: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        if self.chunk_size is not None:
            ordered = k // self.chunk_size <= p // self.chunk_size
        else:
            ordered = (k <= p) if self.causal else np.ones(np.broadcast(p, k).shape, bool)
        near = (p - k <= self.window_left) if self.window_left is not None else True
        return ordered & (near | (k < self.sink_tokens))  # type: ignore[no-any-return]

    def kwargs(self) -> dict[str, object]:
        return {"causal": self.causal, "chunk_size": self.chunk_size, "window_left": self.window_left,
                "sink_tokens": self.sink_tokens}


MASKS = [
    MaskSpec(),
    MaskSpec(causal=False),
    MaskSpec(chunk_size=7),  # not aligned to any block size below
    MaskSpec(chunk_size=24),
    MaskSpec(window_left=9, sink_tokens=3),
    MaskSpec(chunk_size=10, window_left=25, sink_tokens=4),
]


@dataclass
class Batch:
    cache: kv.KvCache
    tables: list[list[int]]
    lens: list[int]
    indptr: list[int]
    q: F32
    positions: list[int] | None = None
    rng: np.random.Generator = field(default_factory=np.random.default_rng)

    def padded(self) -> npt.NDArray[np.int32]:
        width = max((len(t) for t in self.tables), default=0)
        out = np.full((len(self.tables), width), -1, np.int32)
        for i, t in enumerate(self.tables):
            out[i, : len(t)] = t
        return out

    def flashinfer(self) -> tuple[list[int], list[int], list[int]]:
        bs = self.cache.block_size
        indptr, indices, last = [0], [], []
        for t, n in zip(self.tables, self.lens):
            used = t[: -(-n // bs)]
            indices += used
            indptr.append(len(indices))
            last.append(n - (len(used) - 1) * bs if used else 0)
        return indptr, indices, last


def make(lens: list[int], nq: list[int], bs: int, hkv: int, g: int, d: int, dtype: str, seed: int,
         fork: bool = False, qmag: float = 1.0) -> Batch:
    """Sequences of ``lens`` tokens over a shuffled pool whose last block is used; with
    ``fork`` the last sequence shares the first one's blocks (a copy-on-write fork)."""
    rng = np.random.default_rng(seed)
    need = [-(-n // bs) for n in lens]
    nb = sum(need) + 2
    cache = kv.KvCache(1, nb, bs, hkv, d, dtype)
    slots = np.arange(nb * bs)
    k = rng.standard_normal((nb * bs, hkv, d)).astype(np.float32)
    cache.write(0, k, rng.standard_normal((nb * bs, hkv, d)).astype(np.float32), slots)
    ids = [nb - 1] + [int(x) for x in rng.permutation(nb - 1)]  # the pool's last block first
    tables: list[list[int]] = []
    for i, n in enumerate(need):
        if fork and i == len(need) - 1 and tables and len(tables[0]) >= n:
            tables.append(tables[0][:n])
            continue
        tables.append([ids.pop(0) for _ in range(n)])
    indptr = list(np.cumsum([0] + nq))
    q = (rng.standard_normal((indptr[-1], hkv * g, d)) * qmag).astype(np.float32)
    return Batch(cache, tables, list(lens), [int(x) for x in indptr], q, rng=rng)


def reference(b: Batch, m: MaskSpec, scale: float | None = None, cap: float | None = None,
              bf16: bool = False) -> tuple[F64, F64, float]:
    kc, vc = as_f64(b.cache.key(0)), as_f64(b.cache.value(0))
    total, hq, d = b.q.shape
    hkv, bs = b.cache.num_kv_heads, b.cache.block_size
    g = hq // hkv
    scale = 1 / np.sqrt(d) if scale is None else scale
    q = bf16_round(b.q) if bf16 else b.q
    out, lse, lmax = np.zeros((total, hq, d)), np.full((total, hq), -np.inf), 0.0
    for i, (t, n) in enumerate(zip(b.tables, b.lens)):
        a, e = b.indptr[i], b.indptr[i + 1]
        if a == e or n == 0:
            continue
        keys = np.arange(n)
        blocks = np.asarray(t)[keys // bs]
        k, v = kc[blocks, keys % bs], vc[blocks, keys % bs]
        pos = np.asarray(b.positions[a:e]) if b.positions is not None else n - (e - a) + np.arange(e - a)
        vis = m.visible(pos[:, None], keys[None, :])  # [nq, n]
        qg = q[a:e].astype(np.float64).reshape(e - a, hkv, g, d)
        logits = np.einsum("qhgd,thd->qhgt", qg, k) * scale
        if cap is not None:
            logits = cap * np.tanh(logits / cap)
        lmax = max(lmax, float(np.abs(logits).max(initial=0.0)))
        logits = np.where(vis[:, None, None, :], logits, -np.inf)
        mx = logits.max(axis=-1, keepdims=True)
        seen = np.isfinite(mx)
        p = np.where(seen, np.exp(logits - np.where(seen, mx, 0)), 0.0)
        z = p.sum(axis=-1, keepdims=True)
        o = np.einsum("qhgt,thd->qhgd", p / np.where(z > 0, z, 1), v)
        out[a:e] = o.reshape(e - a, hq, d)
        lse[a:e] = np.where(seen, mx + np.log(np.where(z > 0, z, 1)), -np.inf).reshape(e - a, hq)
    return out, lse, lmax


def assert_close(got: F32, want: F64, lmax: float, factor: float = 1.0) -> None:
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want).max(initial=0.0))
    assert np.isfinite(got).all()
    assert err <= factor * scale * (1e-5 + 4e-7 * lmax), f"max error {err:.3e} vs scale {scale:.3e}, logit {lmax:.1f}"


def check(b: Batch, m: MaskSpec, path: str, *, scale: float | None = None, cap: float | None = None,
          bf16: bool = False) -> None:
    want, want_lse, lmax = reference(b, m, scale, cap, bf16)
    kw = dict(m.kwargs(), q_positions=b.positions, scale=scale, logits_soft_cap=cap, tuning=kv.KernelTuning(isa=path),
              q_dtype="bf16" if bf16 else "f32")
    out, lse = kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, return_lse=True, **kw)
    assert out.shape == b.q.shape and out.dtype == np.float32 and lse.shape == b.q.shape[:2]
    assert_close(out, want, lmax)
    fin = np.isfinite(want_lse)
    assert (np.isneginf(lse) == ~fin).all()
    np.testing.assert_allclose(lse[fin], want_lse[fin], rtol=1e-5, atol=1e-5 * max(1.0, lmax))
    indptr, indices, last = b.flashinfer()
    out2 = kv.prefill_attention_paged(b.cache, 0, b.q, b.indptr, indptr, indices, last, **kw)
    np.testing.assert_array_equal(out, out2)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bs", [1, 5, 16, 64])
def test_mask_grid_matches_float64_reference(path: str, dtype: str, bs: int) -> None:
    # Ragged lengths on and off block boundaries, an empty query set, a fork.
    for hkv, g in [(2, 1), (1, 3), (2, 4), (1, 8)]:
        b = make([2 * bs + 37, 3 * bs, 50, 41], [20, min(11, 3 * bs), 0, 41], bs, hkv, g, 32, dtype, seed=bs * 10 + g, fork=True)
        for m in MASKS:
            check(b, m, path)


@pytest.mark.parametrize("path", PATHS)
def test_long_tiles_head_dim_tails_and_splits(path: str) -> None:
    # Queries over many key tiles (several work items per sequence), d with a tail; a
    # single short query set makes the kernel split keys and merge by LSE.
    b = make([700, 300], [150, 1], 16, 2, 4, 72, "f32", seed=3)
    for m in [MaskSpec(), MaskSpec(chunk_size=100), MaskSpec(window_left=120, sink_tokens=5), MaskSpec(causal=False)]:
        check(b, m, path)


@pytest.mark.parametrize("path", PATHS)
def test_positions_soft_cap_scale_and_bf16_query(path: str) -> None:
    b = make([90, 50], [5, 4], 16, 2, 2, 64, "bf16", seed=4, qmag=3.0)
    b.positions = [3, 0, 89, 1000, 40, 7, 7, 49, 0]
    for m in MASKS:
        check(b, m, path, scale=0.2, cap=5.0)
        check(b, m, path, bf16=True)
        check(b, m, path, cap=30.0, bf16=True)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_query_per_sequence_is_decode(path: str, dtype: str) -> None:
    b = make([300, 17, 64, 1], [1, 1, 1, 1], 16, 2, 4, 64, dtype, seed=5)
    out, lse = kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, tuning=kv.KernelTuning(isa=path), return_lse=True)
    dec, dlse = kv.decode_attention(b.cache, 0, b.q, b.padded(), b.lens, tuning=kv.KernelTuning(isa=path), return_lse=True)
    np.testing.assert_allclose(out, dec, rtol=0, atol=1e-6 * float(np.abs(dec).max()))
    np.testing.assert_allclose(lse, dlse, rtol=1e-6, atol=1e-6)


def test_last_block_of_the_pool_is_read_on_every_path() -> None:
    for bs, d in [(5, 7), (16, 64), (1, 3), (64, 130)]:
        b = make([2 * bs + 1, bs], [3, bs], bs, 3, 2, d, "bf16", seed=bs + d)
        assert b.tables[0][0] == b.cache.num_blocks - 1
        for path in PATHS:
            for m in [MaskSpec(), MaskSpec(causal=False)]:
                check(b, m, path)
                check(b, m, path, bf16=True)


def test_empty_query_sets_and_empty_batch() -> None:
    b = make([10, 20], [0, 0], 4, 1, 2, 8, "f32", seed=6)
    out, lse = kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, return_lse=True)
    assert out.shape == (0, 2, 8) and lse.shape == (0, 2)
    empty = np.zeros((0, 2, 8), np.float32)
    out = kv.prefill_attention(b.cache, 0, empty, [0], np.zeros((0, 0), np.int32), [])
    assert out.shape == (0, 2, 8)


def test_rows_that_see_nothing_are_zero_with_lse_minus_inf() -> None:
    b = make([10], [2], 4, 1, 1, 8, "f32", seed=7)
    b.positions = [3, 5]
    # A window of 0 with the query beyond every key: nothing visible.
    b.lens = [2]
    out, lse = kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, q_positions=b.positions,
                                    window_left=0, return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_out_in_place_and_aliasing_refused() -> None:
    b = make([40], [8], 16, 2, 2, 16, "f32", seed=8)
    out = np.full(b.q.shape, np.nan, np.float32)
    got = kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, out=out)
    assert got is out and np.isfinite(out).all()
    want = kv.prefill_attention(b.cache, 0, np.asfortranarray(b.q), b.indptr, b.padded(), b.lens)
    np.testing.assert_array_equal(out, want)  # a non-C-contiguous q is copied, not misread
    with pytest.raises(kv.InvalidArgumentError, match="out"):
        kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, out=b.q)
    with pytest.raises(kv.InvalidArgumentError, match="out"):
        kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, out=np.asfortranarray(out))
    key = b.cache.key(0)
    view = np.lib.stride_tricks.as_strided(key, shape=b.q.shape, strides=(4 * 64, 4 * 16, 4))
    before = key.copy()
    with pytest.raises(kv.InvalidArgumentError, match="out"):
        kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, out=view)
    np.testing.assert_array_equal(b.cache.key(0), before)


def test_invalid_arguments_name_the_argument_and_leave_out_untouched() -> None:
    b = make([40, 10], [8, 2], 16, 2, 2, 16, "f32", seed=9)
    out = np.full(b.q.shape, 7.0, np.float32)
    good: dict[str, object] = dict(cache=b.cache, layer=0, q=b.q, qo_indptr=b.indptr, block_tables=b.padded(),
                                   seq_lens=b.lens)
    bad: list[tuple[dict[str, object], str]] = [
        ({"layer": 1}, "layer"),
        ({"layer": -1}, "layer"),
        ({"layer": True}, "layer"),
        ({"q": b.q.astype(np.float64)}, "q"),
        ({"q": b.q[:, :1]}, "query heads"),
        ({"q": b.q[..., :8]}, "head_dim"),
        ({"qo_indptr": [0, 8]}, "qo_indptr"),
        ({"qo_indptr": [1, 8, 10]}, "qo_indptr"),
        ({"qo_indptr": [0, 9, 8]}, "qo_indptr"),
        ({"qo_indptr": [0, 8, 11]}, "qo_indptr"),
        ({"seq_lens": [40, 1]}, "queries"),
        ({"seq_lens": [40, 100]}, "seq_lens"),
        ({"seq_lens": [40]}, "seq_lens"),
        ({"block_tables": np.full((2, 3), 99)}, "block"),
        ({"q_positions": [0] * 9}, "q_positions"),
        ({"q_positions": [0] * 9 + [-1]}, "q_positions"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": 4, "causal": False}, "chunk_size"),
        ({"chunk_size": True}, "chunk_size"),
        ({"chunk_size": 2.0}, "chunk_size"),
        ({"window_left": -1}, "window_left"),
        ({"sink_tokens": -2}, "sink_tokens"),
        ({"scale": float("nan")}, "scale"),
        ({"logits_soft_cap": 0.0}, "logits_soft_cap"),
        ({"logits_soft_cap": float("inf")}, "logits_soft_cap"),
        ({"q_dtype": "int8"}, "q_dtype=int8 with pv_dtype=f32 is not a prefill precision"),
        ({"q_dtype": "bf16"}, "q_dtype=bf16 with pv_dtype=f32 is not a prefill precision on a f32 cache"),
        ({"pv_dtype": "bf16"}, "pv_dtype=bf16 is not a prefill precision"),
        ({"pv_dtype": "f64"}, "pv_dtype must be one of"),
        ({"tuning": kv.KernelTuning(kv_heads_per_item=1)}, "kv_heads_per_item is a decode knob"),
        ({"out": out[:, :1]}, "out"),
        ({"out": out.astype(np.float64)}, "out"),
    ]
    for change, word in bad:
        # A changed q makes out's shape wrong too: that case is checked without out.
        o = None if "q" in change else out
        with pytest.raises(kv.InvalidArgumentError, match=word):
            kv.prefill_attention(**{**good, "out": o, **change})  # type: ignore[arg-type]
        assert (out == 7.0).all(), change
    with pytest.raises(kv.InvalidArgumentError, match="kv_last_page_len"):
        kv.prefill_attention_paged(b.cache, 0, b.q, b.indptr, [0, 3, 4], [0, 1, 2, 3], [16, 17])


def test_forcing_a_path_this_cpu_lacks_names_it() -> None:
    lacking = [p for p in ["scalar", "avx2", "avx512", "neon"] if p not in PATHS]
    if not lacking:
        pytest.skip("this CPU has every kernel path")
    b = make([8], [2], 4, 1, 1, 8, "f32", seed=10)
    for p in lacking:
        with pytest.raises(kv.InvalidArgumentError, match=p):
            kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, tuning=kv.KernelTuning(isa=p))


@pytest.mark.parametrize("path", PATHS)
def test_bf16_pv_stays_within_its_documented_bound(path: str) -> None:
    # Each probability rounded to bf16 moves each output by at most 2^-9 * max|V| (plus
    # the f32 tolerance); with a bf16 query too, against the rounded-query reference.
    b = make([300, 77], [120, 9], 16, 2, 4, 64, "bf16", seed=12)
    vmax = float(np.abs(as_f64(b.cache.value(0))).max())
    for m in [MaskSpec(), MaskSpec(chunk_size=50), MaskSpec(window_left=40, sink_tokens=4)]:
        for scores in [False, True]:
            want, _, lmax = reference(b, m, bf16=scores)
            got = kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, tuning=kv.KernelTuning(isa=path),
                                       q_dtype="bf16" if scores else "f32", pv_dtype="bf16", **m.kwargs())  # type: ignore[arg-type]
            slack = float(np.abs(want).max()) * (1e-5 + 4e-7 * lmax) * (4 if scores else 1)
            err = float(np.abs(got - want).max())
            assert err <= 2.0**-9 * vmax + slack, (m, scores, err)
            assert err > 0  # the option does change the arithmetic


def test_avx512_bf16_dot_path_is_exercised_or_skipped_loudly() -> None:
    if "avx512" not in PATHS or "avx512bf16" not in kv.cpu_features():
        pytest.skip("no avx512_bf16 on this CPU: the vdpbf16ps path is not exercised")
    b = make([200], [64], 16, 1, 4, 128, "bf16", seed=11)
    check(b, MaskSpec(), "avx512", bf16=True)


def test_gil_is_released_while_it_runs() -> None:
    code = """
import threading, time, numpy as np, pykvpool as kv
c = kv.KvCache(1, 300, 16, 8, 128)
q = np.ones((1024, 32, 128), np.float32)
t = np.arange(300, dtype=np.int32)[None, :].repeat(1, 0)
ticks = []
def spin():
    end = time.perf_counter() + 10
    while time.perf_counter() < end and len(ticks) < 50:
        ticks.append(1); time.sleep(0.001)
th = threading.Thread(target=spin); th.start()
kv.set_num_threads(1)
t0 = time.perf_counter()
kv.prefill_attention(c, 0, q, [0, 1024], t, [4096], causal=False)
took = time.perf_counter() - t0
th.join()
print(len(ticks), took)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ticks, took = r.stdout.split()
    # The other thread kept running during the call (it would get no tick otherwise).
    assert float(took) < 0.05 or int(ticks) >= 10, r.stdout


@st.composite
def cases(draw: st.DrawFn) -> tuple[object, ...]:
    bs = draw(st.sampled_from([1, 3, 16, 32, 64]))
    hkv = draw(st.sampled_from([1, 2, 3]))
    g = draw(st.sampled_from([1, 2, 4, 5, 8]))
    d = draw(st.sampled_from([1, 8, 33, 64]))
    lens = draw(st.lists(st.integers(0, 150), min_size=1, max_size=4))
    nq = [draw(st.integers(0, n)) for n in lens]
    chunk = draw(st.one_of(st.none(), st.integers(1, 80)))
    causal = True if chunk is not None else draw(st.booleans())
    window = draw(st.one_of(st.none(), st.integers(0, 100)))
    sinks = draw(st.integers(0, 20))
    positions = draw(st.booleans())
    return (bs, hkv, g, d, lens, nq, MaskSpec(causal, chunk, window, sinks), draw(st.sampled_from(DTYPES)),
            draw(st.sampled_from(PATHS)), positions, draw(st.booleans()), draw(st.integers(0, 2**31)))


@settings(max_examples=40, deadline=None)
@given(cases())
def test_random_masks_and_layouts_match_reference(case: tuple[object, ...]) -> None:
    bs, hkv, g, d, lens, nq, m, dtype, path, positions, fork, seed = case
    b = make(lens, nq, bs, hkv, g, d, dtype, seed, fork=fork)  # type: ignore[arg-type]
    if positions:
        b.positions = [int(x) for x in b.rng.integers(0, 200, b.indptr[-1])]
    check(b, m, path)  # type: ignore[arg-type]
