"""prefill_attention / prefill_attention_paged beyond the conformance grid
(tests/attention/test_conformance.py, which checks both against the float64 reference over
every mask, path, cache dtype and precision): one query per sequence is decode, empty query
sets and rows that see nothing, ``out`` in place and aliasing, the arguments' errors, a
path this CPU lacks, that ``pv_dtype="bf16"`` changes the result, and the GIL.

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

import pykvpool as kv
from reference.attention import padded

PATHS = kv.kernel_paths()
DTYPES = ["f32", "f16", "bf16"]
F32 = npt.NDArray[np.float32]


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
        return padded(self.tables)

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


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_query_per_sequence_is_decode(path: str, dtype: str) -> None:
    b = make([300, 17, 64, 1], [1, 1, 1, 1], 16, 2, 4, 64, dtype, seed=5)
    out, lse = kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, tuning=kv.KernelTuning(isa=path), return_lse=True)
    dec, dlse = kv.decode_attention(b.cache, 0, b.q, b.padded(), b.lens, tuning=kv.KernelTuning(isa=path), return_lse=True)
    np.testing.assert_allclose(out, dec, rtol=0, atol=1e-6 * float(np.abs(dec).max()))
    np.testing.assert_allclose(lse, dlse, rtol=1e-6, atol=1e-6)


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
        ({"q_dtype": "bf16"}, "q_dtype=bf16 with pv_dtype=f32 is not a prefill precision for f32 caches"),
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
def test_bf16_pv_changes_the_result_on_every_path(path: str) -> None:
    """The option does change the arithmetic, with an f32 and with a bf16 query (its
    bound against the reference is the conformance grid's)."""
    b = make([300, 77], [120, 9], 16, 2, 4, 64, "bf16", seed=12)
    for q_dtype in ["f32", "bf16"]:
        kw = dict(tuning=kv.KernelTuning(isa=path), q_dtype=q_dtype)
        scores = kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, **kw)  # type: ignore[arg-type]
        got = kv.prefill_attention(b.cache, 0, b.q, b.indptr, b.padded(), b.lens, pv_dtype="bf16", **kw)  # type: ignore[arg-type]
        assert np.abs(got - scores).max() > 0, q_dtype


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
