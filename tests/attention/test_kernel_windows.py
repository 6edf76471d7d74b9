"""Sliding windows and attention sinks in the kernels, on logical positions.

``decode_attention`` / ``decode_attention_paged`` (``window_left``, ``sink_tokens``,
``kv_page_start``) and ``prefill_attention`` / ``prefill_attention_paged`` against a
float64 numpy reference over the keys each query sees. Every slot of the cache that holds
no visible key is poisoned (NaN K and V: a released block reused by another sequence), and
the tables' holes are given as a pad (-1) or as the ids of poisoned blocks: the outputs must
be finite and match, so nothing outside the visible keys was read. Decode also equals plain
attention over a contiguous copy of only the visible keys; the FlashInfer form (only stored
pages, ``kv_page_start``) gives the same bits as the padded one; a hole inside the window
is an InvalidArgumentError naming the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import numpy.typing as npt
import pytest

import pykvpool as kv

PATHS = kv.kernel_paths()
DTYPES = ["f32", "f16", "bf16"]
POISON = 3  # poisoned blocks at the end of the pool
F64 = npt.NDArray[np.float64]
Rule = Callable[[int, int], bool]  # (query position, key position) -> visible


def as_f64(x: npt.NDArray[Any]) -> F64:
    if x.dtype == np.uint16:  # bf16 bits without ml_dtypes
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(x, dtype=np.float64)


def rule(wl: int | None, sinks: int, causal: bool = True, chunk: int | None = None) -> Rule:
    """The prefill mask's rule (and decode's, with the query at ``len - 1``)."""
    def visible(p: int, k: int) -> bool:
        ordered = k // chunk <= p // chunk if chunk else (k <= p or not causal)
        return ordered and (wl is None or p - k <= wl or k < sinks)
    return visible


@dataclass
class Case:
    cache: kv.KvCache
    table: npt.NDArray[np.int32]
    lens: list[int]
    positions: list[list[int]]  # query positions per sequence
    seen: list[npt.NDArray[np.bool_]]  # per sequence: keys some query sees
    paged: tuple[list[int], list[int], list[int], list[int]]  # indptr, indices, last, page_start


def build(lens: list[int], positions: list[list[int]], vis: Rule, sinks: int, bs: int, hkv: int, d: int,
          dtype: str, holes: str, seed: int = 0) -> Case:
    """Only the keys some query sees hold data (random K, V); every other slot is NaN.
    Logical blocks without such a key are holes: ``-1`` or a poisoned block's id. The
    FlashInfer pages are the sink pages, then the run from the first needed block past
    them, starting one poisoned page earlier when there is room (a page the window left)."""
    seen = [np.array([any(vis(p, k) for p in pos) for k in range(n)], bool) for n, pos in zip(lens, positions)]
    need = [[bool(s[b * bs:(b + 1) * bs].any()) for b in range(-(-len(s) // bs))] for s in seen]
    nvis = sum(map(sum, need))
    nb = nvis + POISON
    width = max([len(x) for x in need] + [1])
    table = np.full((len(lens), width), -1, np.int32)
    rng = np.random.default_rng(seed)
    cache = kv.KvCache(1, nb, bs, hkv, d, dtype)
    nan = np.full((nb * bs, hkv, d), np.nan, np.float32)
    cache.write(0, nan, nan, np.arange(nb * bs))
    indptr, indices, last, starts = [0], [], [], []
    nxt = 0
    for i, (s, nd) in enumerate(zip(seen, need)):
        for b, needed in enumerate(nd):
            if needed:
                table[i, b] = nxt
                toks = np.flatnonzero(s[b * bs:(b + 1) * bs])
                k, v = (rng.standard_normal((len(toks), hkv, d)).astype(np.float32) for _ in range(2))
                cache.write(0, 2 * k, v, nxt * bs + toks)
                nxt += 1
            elif holes == "poison":
                table[i, b] = nvis + b % POISON
        sink_blocks = min(-(-sinks // bs), len(nd))
        first = next((b for b in range(sink_blocks, len(nd)) if nd[b]), len(nd))
        start = first - 1 if first > sink_blocks else sink_blocks
        indices += [nvis if (b == start and start < first) else int(table[i, b])
                    for b in [*range(sink_blocks), *range(start, len(nd))]]
        indptr.append(len(indices))
        last.append((lens[i] - 1) % bs + 1 if lens[i] else 0)
        starts.append(start)
    return Case(cache, table, lens, positions, seen, (indptr, indices, last, starts))


def reference(c: Case, q: npt.NDArray[np.float32], vis: Rule) -> tuple[F64, F64]:
    """float64 attention of query row ``r`` (positions in order) over its visible keys,
    gathered through the table; returns ``(out [rows, hq, d], lse [rows, hq])``."""
    kc, vc = as_f64(c.cache.key(0)), as_f64(c.cache.value(0))
    bs, hkv = c.cache.block_size, c.cache.num_kv_heads
    rows, hq, d = q.shape
    g = hq // hkv
    out, lse = np.zeros((rows, hq, d)), np.full((rows, hq), -np.inf)
    r = 0
    for i, pos in enumerate(c.positions):
        for p in pos:
            keys = np.array([k for k in range(c.lens[i]) if vis(p, k)], int)
            if len(keys):
                blocks = c.table[i][keys // bs]
                k, v = kc[blocks, keys % bs], vc[blocks, keys % bs]
                logits = np.einsum("hgd,thd->hgt", q[r].astype(np.float64).reshape(hkv, g, d), k) / np.sqrt(d)
                m = logits.max(axis=-1, keepdims=True)
                e = np.exp(logits - m)
                out[r] = np.einsum("hgt,thd->hgd", e / e.sum(-1, keepdims=True), v).reshape(hq, d)
                lse[r] = (m + np.log(e.sum(-1, keepdims=True))).reshape(hq)
            r += 1
    return out, lse


def assert_matches(got: tuple[Any, Any], want: tuple[F64, F64], what: str) -> None:
    out, lse = got
    assert np.isfinite(out).all(), f"{what}: a poisoned slot was read"
    scale = max(1e-3, float(np.abs(want[0]).max()))
    err = float(np.abs(out - want[0]).max())
    assert err <= 1e-5 * scale, f"{what}: max error {err:.3g} vs output scale {scale:.3g}"
    np.testing.assert_allclose(lse, want[1], rtol=1e-5, atol=1e-5, err_msg=what)


def decode_case(bs: int, wl: int | None, sinks: int, dtype: str, holes: str, d: int = 16) -> Case:
    lens = [1, 2, bs, 3 * bs + 2, 7 * bs + 5, 5 * bs]
    return build(lens, [[n - 1] for n in lens], rule(wl, sinks), sinks, bs, 2, d, dtype, holes, seed=bs)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bs", [1, 3, 16, 64])
def test_decode_windows_and_sinks_read_only_visible_keys(path: str, dtype: str, bs: int) -> None:
    """Windows on and off block boundaries, sinks of 0 to 2 blocks, GQA (6 query heads on
    2 KV heads), ragged lengths, splits: padded with pads and with poisoned ids, and
    FlashInfer pages with ``kv_page_start`` (the same bits)."""
    for wl in [None, 0, 1, bs - 1, bs, 2 * bs + 3, 100 * bs]:
        for sinks in [0, 1, bs, 2 * bs]:
            holes = "pad" if (wl or 0) % 2 == 0 else "poison"
            c = decode_case(bs, wl, sinks, dtype, holes)
            q = np.random.default_rng(wl or 0).standard_normal((len(c.lens), 6, 16)).astype(np.float32)
            want = reference(c, q, rule(wl, sinks))
            indptr, indices, last, starts = c.paged
            for split in [None, 1, 2 * bs + 1]:
                kw: dict[str, Any] = dict(return_lse=True, tuning=kv.KernelTuning(isa=path, split_size=split), window_left=wl,
                                          sink_tokens=sinks)
                what = f"{path} {dtype} bs={bs} window_left={wl} sinks={sinks} split={split} {holes}"
                got = kv.decode_attention(c.cache, 0, q, c.table, c.lens, **kw)
                assert_matches(got, want, what)
                paged = kv.decode_attention_paged(c.cache, 0, q, indptr, indices, last, kv_page_start=starts, **kw)
                assert all(np.array_equal(a, b) for a, b in zip(got, paged)), what


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_equals_attention_over_a_contiguous_copy_of_the_visible_keys(path: str, dtype: str) -> None:
    """Attention with a window and sinks over a sparse, poisoned table is attention with
    no window over just the visible keys copied into contiguous blocks."""
    bs, hkv, d = 16, 2, 64
    for wl, sinks in [(5, 0), (16, 3), (40, 16), (127, 32)]:
        c = decode_case(bs, wl, sinks, dtype, "poison", d)
        q = np.random.default_rng(3).standard_normal((len(c.lens), 8, d)).astype(np.float32)
        got = kv.decode_attention(c.cache, 0, q, c.table, c.lens, tuning=kv.KernelTuning(isa=path), window_left=wl, sink_tokens=sinks)
        counts = [int(s.sum()) for s in c.seen]
        width = max(-(-n // bs) for n in counts)
        copy = kv.KvCache(1, len(counts) * width, bs, hkv, d, dtype)
        kc, vc = c.cache.key(0), c.cache.value(0)
        for i, s in enumerate(c.seen):
            keys = np.flatnonzero(s)
            blocks = c.table[i][keys // bs]
            k, v = as_f64(kc[blocks, keys % bs]), as_f64(vc[blocks, keys % bs])
            copy.write(0, k.astype(np.float32), v.astype(np.float32), i * width * bs + np.arange(len(keys)))
        table = np.arange(len(counts) * width, dtype=np.int32).reshape(len(counts), width)
        plain = kv.decode_attention(copy, 0, q, table, counts, tuning=kv.KernelTuning(isa=path))
        np.testing.assert_allclose(got, plain, rtol=0, atol=2e-6 * max(1.0, float(np.abs(plain).max())))


PREFILL_MASKS = [  # (window_left, sinks, causal, chunk_size)
    (0, 0, True, None), (5, 0, True, None), (16, 3, True, None), (31, 20, True, None), (None, 0, True, None),
    (7, 2, True, 8), (12, 0, False, None),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bs", [1, 5, 16, 64])
def test_prefill_masks_read_only_keys_some_query_sees(path: str, dtype: str, bs: int) -> None:
    """Chunked prefill (the last ``n_q`` positions), a decode-like single query, and two
    far-apart explicit positions (the keys between their windows are holes too), under
    windows, sinks, block-causal chunks and a bidirectional window; padded tables with pads
    and poisoned ids, and FlashInfer pages with ``kv_page_start``."""
    lens = [3 * bs + 70, 40, 1, 9 * bs + 130]
    nq = [20, 1, 1, 6]
    for wl, sinks, causal, chunk in PREFILL_MASKS:
        vis = rule(wl, sinks, causal, chunk)
        for explicit in [False, True]:
            pos = [list(range(n - m, n)) for n, m in zip(lens, nq)]
            if explicit:
                pos[3] = [3, lens[3] - 2]
            holes = "poison" if explicit else "pad"
            c = build(lens, pos, vis, sinks, bs, 2, 12, dtype, holes, seed=bs + len(pos[3]))
            q = np.random.default_rng(1).standard_normal((sum(map(len, pos)), 4, 12)).astype(np.float32)
            want = reference(c, q, vis)
            qo = np.cumsum([0] + [len(p) for p in pos])
            kw: dict[str, Any] = dict(causal=causal, chunk_size=chunk, window_left=wl, sink_tokens=sinks,
                                      return_lse=True, tuning=kv.KernelTuning(isa=path),
                                      q_positions=np.concatenate(pos) if explicit else None)
            what = f"{path} {dtype} bs={bs} mask={(wl, sinks, causal, chunk)} explicit={explicit}"
            got = kv.prefill_attention(c.cache, 0, q, qo, c.table, lens, **kw)
            assert_matches(got, want, what)
            indptr, indices, last, starts = c.paged
            paged = kv.prefill_attention_paged(c.cache, 0, q, qo, indptr, indices, last, kv_page_start=starts, **kw)
            assert all(np.array_equal(a, b) for a, b in zip(got, paged)), what


def test_bf16_fast_paths_read_only_visible_keys() -> None:
    """A bf16 query and bf16 probabilities pack keys differently (bf16 pairs, V token
    pairs): the keys no query sees are packed as zeros there too."""
    wl, sinks = 9, 3
    vis = rule(wl, sinks)
    lens = [200, 77]
    pos = [list(range(180, 200)), [5, 76]]
    c = build(lens, pos, vis, sinks, 16, 2, 32, "bf16", "poison")
    q = np.random.default_rng(2).standard_normal((22, 4, 32)).astype(np.float32)
    qo = [0, 20, 22]
    for path in PATHS:
        out = kv.prefill_attention(c.cache, 0, q, qo, c.table, lens, q_positions=np.concatenate(pos), window_left=wl,
                                   sink_tokens=sinks, q_dtype="bf16", pv_dtype="bf16", tuning=kv.KernelTuning(isa=path))
        assert np.isfinite(out).all(), path
        dec = kv.decode_attention(c.cache, 0, q[[19, 21]], c.table, lens, window_left=wl, sink_tokens=sinks,
                                  q_dtype="bf16", tuning=kv.KernelTuning(isa=path))
        assert np.isfinite(dec).all(), path


def test_a_hole_inside_the_window_or_the_sinks_is_an_error_naming_the_table() -> None:
    c = decode_case(4, 9, 2, "f32", "pad")  # sequence 4 (33 tokens) holds blocks 0, 5..8
    q = np.ones((len(c.lens), 6, 16), np.float32)
    out = np.full_like(q, 7.0)
    indptr, indices, last, starts = c.paged
    for wl, sinks in [(13, 2), (9, 5)]:
        with pytest.raises(kv.InvalidArgumentError, match=r"block_tables\[4, 4\]|block_tables\[4, 1\]"):
            kv.decode_attention(c.cache, 0, q, c.table, c.lens, window_left=wl, sink_tokens=sinks, out=out)
    with pytest.raises(kv.InvalidArgumentError, match="kv_page_start"):
        kv.decode_attention_paged(c.cache, 0, q, indptr, indices, last, window_left=17, sink_tokens=2,
                                  kv_page_start=starts, out=out)
    with pytest.raises(kv.InvalidArgumentError, match="block_tables"):
        kv.prefill_attention(c.cache, 0, q[:1], [0, 0, 0, 0, 0, 1, 1], c.table, c.lens, window_left=13,
                             sink_tokens=2, out=out[:1])
    with pytest.raises(kv.InvalidArgumentError, match="kv_page_start"):
        kv.decode_attention_paged(c.cache, 0, q, indptr, indices, last, window_left=9, sink_tokens=2, out=out,
                                  kv_page_start=starts[:-1])
    assert (out == 7.0).all()
    kv.decode_attention(c.cache, 0, q, c.table, c.lens, window_left=9, sink_tokens=2, out=out)
    assert np.isfinite(out).all()


def test_kv_page_start_edge_cases() -> None:
    """Only sink pages stored (the sequence ends inside its sinks); a page start below
    the sinks (contiguous pages); the default is FlashInfer's plain layout."""
    cache = kv.KvCache(1, 8, 4, 1, 8)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 1, 8)).astype(np.float32)
    cache.write(0, x, -x, np.arange(32))
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    plain = kv.decode_attention(cache, 0, q, [[5, 6]], [6])
    # 8 sink tokens = 2 sink pages; kv_page_start 9 is ignored: length (2 - 1) * 4 + 2.
    only_sinks = kv.decode_attention_paged(cache, 0, q, [0, 2], [5, 6], [2], sink_tokens=8, kv_page_start=[9])
    assert np.array_equal(only_sinks, plain)
    below = kv.decode_attention_paged(cache, 0, q, [0, 2], [5, 6], [2], sink_tokens=8, kv_page_start=[1])
    assert np.array_equal(below, plain)
    assert np.array_equal(kv.decode_attention_paged(cache, 0, q, [0, 2], [5, 6], [2], sink_tokens=8), plain)
    # A window run from block 3 after one sink page: length (3 + 3 - 1 - 1) * 4 + 2 = 18,
    # the query at 17 sees 14..18 (blocks 3, 4) and the sink tokens 0..2.
    pages = kv.decode_attention_paged(cache, 0, q, [0, 3], [5, 1, 2], [2], window_left=3, sink_tokens=2,
                                      kv_page_start=[3])
    table = [[5, -1, -1, 1, 2]]
    assert np.array_equal(pages, kv.decode_attention(cache, 0, q, table, [18], window_left=3, sink_tokens=2))
