""":class:`pykvpool.video.VideoCache` on the 8-bit storage dtypes (int8, fp8 e4m3 / e5m2).

- The dtype is checked before anything is built: an unknown string or a wrong type (a bool
  included) is a typed error and no pool or cache is made.
- Bytes per page come from :meth:`pykvpool.KvCache.bytes_per_token` (int8's per-token
  scales included).
- Every operation (write, the batched chunk attention, commit, abort, eviction, the visible
  history, the prompt-switch rewrite, release) on each 8-bit dtype: each attention against a
  float64 reference on the values the format stores (``tests/reference/video_model.py``'s
  :class:`Storage`, bit for bit) and against the same attention over the unquantized K/V
  within the documented 8-bit bound (``pykvpool.decode_attention``'s, which prefill
  follows row by row).
- End to end: the toy video transformer's cached route on an 8-bit cache, every attention
  call checked against an f32 twin cache driven in lockstep, within that bound; and its
  frames against the recompute route (:mod:`pykvpool.video.toy`), within one stored
  element's relative rounding of the frames' scale (a criterion from the format, not a
  proven bound: none is documented through a network; measured 0.14%, 1.3% and 1.7% of the
  scale for int8, e4m3 and e5m2 against 0.39%, 6.25% and 12.5%).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from reference.poolcheck import snapshot
from reference.video_model import FP8, QDTYPES, Geometry, Storage, attention_bound, poison_free_pages, reference_attention

import pykvpool as kv
from pykvpool.video import ChunkBatch, VideoCache
from pykvpool.video import cache as cache_mod
from pykvpool.video import toy as tv
from pykvpool.video import toy_cached

HQ, HKV, D, LAYERS = 4, 2, 16, 2
#: The range fp8 scales are set to cover here (K has outlier channels 8x larger).
FP8_RANGE = 64.0


def make(dtype: str, window: int | None = 2, sinks: int = 1, bs: int = 4, set_scales: bool = True,
         blocks: int = 256) -> tuple[VideoCache, Geometry, Storage]:
    vc = VideoCache(num_layers=LAYERS, num_kv_heads=HKV, head_dim=D, tokens_per_frame=6, grid=(2, 3),
                    frames_per_chunk=2, sink_frames=sinks, window_frames=window, num_blocks=blocks,
                    block_size=bs, dtype=dtype)
    st = Storage(dtype, LAYERS, HKV)
    if set_scales and dtype in FP8:
        for layer in range(LAYERS):
            s = np.full(HKV, FP8_RANGE / FP8[dtype][0], np.float32)
            vc.set_fp8_scales(layer, s, s)
            st.scales[layer] = s
    return vc, Geometry(6, 3, 2, sinks, window, bs), st


class Driver:
    """Runs chunks and keeps, per stream, layer and logical token, the K/V it wrote
    (``raw``) and what the format stores of them (``held``)."""

    def __init__(self, vc: VideoCache, geo: Geometry, st: Storage, seed: int, bound: bool) -> None:
        self.vc, self.geo, self.st, self.bound = vc, geo, st, bound
        self.rng = np.random.default_rng(seed)
        self.raw: dict[tuple[int, int], np.ndarray] = {}  # (stream, layer) -> [2, tokens, Hkv, D]
        self.held: dict[tuple[int, int], np.ndarray] = {}
        self.moved = 0.0  # largest deviation from the unquantized attention

    def kv_pair(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        k = self.rng.standard_normal((n, HKV, D)).astype(np.float32)
        k[..., ::4] *= 8  # outlier channels, as in real K caches
        v = self.rng.standard_normal((n, HKV, D)).astype(np.float32)
        if self.bound and self.st.dtype in FP8:
            assert max(np.abs(k).max(), np.abs(v).max()) <= FP8_RANGE  # no saturation: the bound holds
        return k, v

    def put(self, s: int, layer: int, tokens: np.ndarray, k: np.ndarray, v: np.ndarray, kh: np.ndarray,
            vh: np.ndarray) -> None:
        """Record K/V written and held (``kh``, ``vh``) at logical ``tokens``."""
        for rec, pair in ((self.raw, (k, v)), (self.held, (kh, vh))):
            arr = rec.get((s, layer), np.zeros((2, 0, HKV, D), np.float32))
            if arr.shape[1] <= tokens.max():
                arr = np.concatenate([arr, np.zeros((2, tokens.max() + 1 - arr.shape[1], HKV, D), np.float32)], 1)
            arr[0, tokens], arr[1, tokens] = pair
            rec[(s, layer)] = arr

    def step(self, batch: ChunkBatch, layer: int) -> None:
        n, c = batch.num_tokens, self.geo.chunk_tokens
        k, v = self.kv_pair(n)
        q = self.rng.standard_normal((n, HQ, D)).astype(np.float32)
        self.vc.write(layer, k, v, batch)
        kh, vh = self.st.store(layer, k, v)  # one write: fp8 calibrates on all of it
        got = self.vc.attention(layer, q, batch)
        for i, (s, chunk) in enumerate(zip(batch.stream_ids.tolist(), batch.chunks.tolist())):
            rows = slice(i * c, (i + 1) * c)
            self.put(s, layer, np.arange(chunk * c, (chunk + 1) * c), k[rows], v[rows], kh[rows], vh[rows])
            sees = self.geo.chunk_sees(chunk)
            raw, held = self.raw[(s, layer)][:, sees], self.held[(s, layer)][:, sees]
            want = reference_attention(q[rows], held[0], held[1])
            np.testing.assert_allclose(got[rows], want, atol=2e-5, rtol=1e-5)
            if self.bound:
                exact = reference_attention(q[rows], raw[0], raw[1])
                err = np.abs(got[rows] - exact).max(axis=2)
                bound = attention_bound(self.st, layer, q[rows], raw[0], raw[1], held[1])
                assert (err <= bound * 1.001 + 2e-5 * np.abs(exact).max()).all(), (err / bound).max()
                self.moved = max(self.moved, float(err.max()))

    def chunk(self, ids: list[int], steps: int = 2, abort: bool = False) -> None:
        batch = self.vc.begin_chunk(ids)
        for _ in range(steps):
            for layer in range(LAYERS):
                self.step(batch, layer)
        if abort:
            self.vc.abort_chunk(ids)
        else:
            self.vc.commit_chunk(ids)
        poison_free_pages(self.vc.kv, self.vc.pool)

    def rewrite(self, s: int) -> None:
        """A prompt switch: new K/V for the visible history, written in place."""
        slots, pos = self.vc.rewrite_window(s)
        tokens = self.geo.visible_tokens(self.vc.stream_frames(s))
        assert pos.tolist() == self.geo.positions(tokens).tolist()
        for layer in range(LAYERS):
            k, v = self.kv_pair(len(slots))
            self.vc.kv.write(layer, k, v, slots)
            self.put(s, layer, tokens, k, v, *self.st.store(layer, k, v))


# ---- construction: the dtype, checked first; the bytes of a page


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", *QDTYPES])
def test_every_kvcache_dtype_builds_with_its_bytes_per_page(dtype: str) -> None:
    vc, _, _ = make(dtype, set_scales=False, blocks=10)
    assert vc.dtype == vc.kv.dtype == dtype
    per_token = kv.KvCache.bytes_per_token(HKV, D, dtype)
    size = {"f32": 4, "f16": 2, "bf16": 2}.get(dtype, 1)
    assert per_token == 2 * HKV * (D * size + (4 if dtype == "int8" else 0))  # int8: a scale per token and head
    assert vc.bytes_per_block == LAYERS * 4 * per_token
    # The rest of the storage is per layer: padding before the scales, fp8's per-head scales.
    assert 0 <= vc.kv.nbytes - 10 * vc.bytes_per_block < LAYERS * (64 + 2 * HKV * 4)
    vc.add_stream(1)
    vc.begin_chunk([1])
    st = vc.stats()
    assert st["bytes_per_block"] == vc.bytes_per_block and st["bytes_used"] == 3 * vc.bytes_per_block


@pytest.mark.parametrize(("bad", "error"), [
    ("f64", kv.InvalidArgumentError), ("", kv.InvalidArgumentError), ("int4", kv.InvalidArgumentError),
    ("fp8", kv.InvalidArgumentError), (True, TypeError), (False, TypeError), (8, TypeError), (None, TypeError),
    (b"int8", TypeError), (np.float32(1), TypeError),
])
def test_a_bad_dtype_is_refused_before_anything_is_built(monkeypatch: pytest.MonkeyPatch, bad: Any,
                                                         error: type[Exception]) -> None:
    class Refused:
        bytes_per_token = staticmethod(kv.KvCache.bytes_per_token)

        def __init__(self, *_: Any) -> None:
            raise AssertionError("built before the dtype was checked")

    monkeypatch.setattr(cache_mod, "BlockPool", Refused)
    monkeypatch.setattr(cache_mod, "KvCache", Refused)
    with pytest.raises(error) as info:
        make(bad, blocks=8)
    assert "dtype" in str(info.value)


# ---- every operation, checked on the stored values and against the unquantized K/V


@pytest.mark.parametrize("window,sinks,bs", [(None, 0, 4), (2, 1, 4), (1, 0, 16), (3, 2, 1)])
@pytest.mark.parametrize("dtype", QDTYPES)
def test_every_operation_within_the_8bit_bound(dtype: str, window: int | None, sinks: int, bs: int) -> None:
    vc, geo, st = make(dtype, window, sinks, bs)
    d = Driver(vc, geo, st, seed=bs + sinks, bound=True)
    for s in (3, 5):
        vc.add_stream(s)
    for c in range(6):
        d.chunk([3, 5] if c % 2 else [5, 3])
        if c == 2:
            d.chunk([5], abort=True)  # dropped: history untouched
        if c == 3:
            d.rewrite(3)
    assert [vc.stream_frames(s) for s in (3, 5)] == [12, 12]
    assert d.moved > 0  # the quantization is real
    vc.release(5)
    d.chunk([3])
    vc.release(3)
    assert vc.pool.num_free_blocks == vc.pool.num_blocks


@pytest.mark.parametrize("dtype", list(FP8))
def test_fp8_scales_calibrate_from_the_first_write_of_each_layer(dtype: str) -> None:
    """Unset fp8 scales follow KvCache's rule (the first write of a layer with a non-zero
    value of a head sets ``max|x| / largest``; later values saturate): the stored values
    equal the model's bit for bit, and the cache's scales its."""
    vc, geo, st = make(dtype, set_scales=False)
    d = Driver(vc, geo, st, seed=1, bound=False)
    for s in (1, 2):
        vc.add_stream(s)
    for _ in range(3):
        d.chunk([1, 2])
    d.rewrite(2)
    d.chunk([2, 1])
    assert (st.scales > 0).all()
    for layer in range(LAYERS):
        np.testing.assert_array_equal(vc.kv.key_scales(layer), st.scales[layer, 0])
        np.testing.assert_array_equal(vc.kv.value_scales(layer), st.scales[layer, 1])


@pytest.mark.parametrize("dtype", list(FP8))
def test_set_fp8_scales_before_any_page_is_held_only(dtype: str) -> None:
    vc, _, _ = make(dtype, set_scales=False)
    ones = np.ones(HKV, np.float32)
    vc.set_fp8_scales(1, ones, 2 * ones)
    np.testing.assert_array_equal(vc.kv.value_scales(1), 2 * ones)
    for bad, name in (((-ones, ones), "k_scales"), ((ones, np.ones(3, np.float32)), "v_scales")):
        with pytest.raises(kv.InvalidArgumentError, match=name):
            vc.set_fp8_scales(0, *bad)
    with pytest.raises(kv.InvalidArgumentError, match="layer"):
        vc.set_fp8_scales(LAYERS, ones, ones)
    vc.add_stream(1)
    vc.set_fp8_scales(0, ones, ones)  # a stream without pages yet
    vc.begin_chunk([1])
    before = (snapshot(vc.pool), vc.stats(), vc.kv.key_scales(0).tolist())
    with pytest.raises(kv.InvalidArgumentError, match="pages"):
        vc.set_fp8_scales(0, 3 * ones, ones)  # stored K/V would be read with other scales
    assert (snapshot(vc.pool), vc.stats(), vc.kv.key_scales(0).tolist()) == before
    vc.release(1)
    vc.set_fp8_scales(0, 3 * ones, ones)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8"])
def test_set_fp8_scales_on_another_dtype_is_refused(dtype: str) -> None:
    vc, _, _ = make(dtype)
    with pytest.raises(kv.InvalidArgumentError, match="fp8"):
        vc.set_fp8_scales(0, np.ones(HKV, np.float32), np.ones(HKV, np.float32))


@pytest.mark.parametrize("dtype", QDTYPES)
def test_a_non_finite_value_is_refused_and_nothing_is_written(dtype: str) -> None:
    vc, _, _ = make(dtype)
    vc.add_stream(1)
    b = vc.begin_chunk([1])
    ok = np.ones((b.num_tokens, HKV, D), np.float32)
    vc.write(0, ok, ok, b)
    before = vc.kv.dequantized(0)
    for bad in (np.nan, np.inf):
        k = ok.copy()
        k[3, 1, 2] = bad
        with pytest.raises(kv.InvalidArgumentError, match="k"):
            vc.write(0, k, ok, b)
        with pytest.raises(kv.InvalidArgumentError, match="v"):
            vc.write(0, ok, k, b)
    for a, c in zip(before, vc.kv.dequantized(0)):
        np.testing.assert_array_equal(a, c)


# ---- end to end: the toy video transformer, every call against an f32 twin


class _BothKv:
    """``vc.kv`` of a :class:`Twin`: writes (the prompt-switch rewrite) go to both caches."""

    def __init__(self, a: kv.KvCache, b: kv.KvCache) -> None:
        self.a, self.b = a, b

    def write(self, layer: int, k: np.ndarray, v: np.ndarray, slots: np.ndarray) -> None:
        self.a.write(layer, k, v, slots)
        self.b.write(layer, k, v, slots)


class Twin(VideoCache):
    """An 8-bit VideoCache and an f32 one driven in lockstep (same pool steps, so same
    slots); each chunk attention is checked against the f32 twin's within the bound."""

    ratios: list[float] = []

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.f32 = VideoCache(**{**kw, "dtype": "f32"})
        self.st = Storage(self.dtype, self.num_layers, self.num_kv_heads)
        self.pair: dict[int, ChunkBatch] = {}

    @property
    def kv(self) -> Any:
        return _BothKv(self._kv, self.f32.kv)

    def add_stream(self, stream_id: int) -> None:
        super().add_stream(stream_id)
        self.f32.add_stream(stream_id)

    def release(self, stream_id: int) -> None:
        super().release(stream_id)
        self.f32.release(stream_id)

    def begin_chunk(self, stream_ids: Any) -> ChunkBatch:
        b = super().begin_chunk(stream_ids)
        self.pair[b._serial] = b32 = self.f32.begin_chunk(stream_ids)
        np.testing.assert_array_equal(b.slots, b32.slots)
        return b

    def commit_chunk(self, stream_ids: Any) -> None:
        super().commit_chunk(stream_ids)
        self.f32.commit_chunk(stream_ids)

    def write(self, layer: int, k: Any, v: Any, batch: ChunkBatch) -> None:
        super().write(layer, k, v, batch)
        self.f32.write(layer, k, v, self.pair[batch._serial])

    def attention(self, layer: int, q: Any, batch: ChunkBatch, *, scale: float | None = None,
                  out: Any = None) -> Any:
        got = super().attention(layer, q, batch, scale=scale, out=out)
        exact = self.f32.attention(layer, q, self.pair[batch._serial], scale=scale)
        if self.dtype in FP8:
            self.st.scales[layer] = [self._kv.key_scales(layer), self._kv.value_scales(layer)]
        raw = (x.reshape(-1, self.num_kv_heads, self.head_dim) for x in self.f32.kv.dequantized(layer))
        rk, rv = raw
        held_v = self._kv.dequantized(layer)[1].reshape(rk.shape)
        c = self.chunk_tokens
        for i, s in enumerate(batch.stream_ids.tolist()):
            sees = np.concatenate([self.visible_slots(s), batch.slots[i]])
            rows = slice(i * c, (i + 1) * c)
            err = np.abs(got[rows] - exact[rows]).max(axis=2)
            bound = attention_bound(self.st, layer, q[rows], rk[sees], rv[sees], held_v[sees], scale)
            assert (err <= bound * 1.001 + 2e-5 * np.abs(exact[rows]).max()).all(), (err / bound).max()
            Twin.ratios.append(float((err / bound).max()))
        return got


TINY = tv.VideoToyConfig(n_layer=3, grid=(4, 4), sigmas=(1.0, 0.6, 0.3), seed=5)
TINY_WIN = tv.Window(sink_frames=1, window_frames=2)
TINY_SPECS = [tv.StreamSpec(prompt=1, seed=1, frames=10, switch=(3, 9)),
              tv.StreamSpec(prompt=2, seed=2, frames=6, start=1)]
#: One stored element's relative rounding per 8-bit format (int8: of its row's largest value).
REL = {"int8": 0.5 / 127, **{name: fmt[1] for name, fmt in FP8.items()}}


@pytest.fixture(scope="module")
def routes() -> tuple[tv.VideoModel, toy_cached.CachedRun, list[np.ndarray]]:
    """The toy model, its f32 cached run and the recompute route's frames."""
    model = tv.make_model(TINY)
    ref = [tv.generate_recompute(model, s, TINY_WIN, tv.FlopCounter()) for s in TINY_SPECS]
    return model, toy_cached.generate_cached(model, TINY_SPECS, TINY_WIN, tv.FlopCounter()), ref


@pytest.mark.parametrize("dtype", QDTYPES)
def test_toy_video_end_to_end_within_the_bound_of_an_f32_twin(
        monkeypatch: pytest.MonkeyPatch, routes: tuple[tv.VideoModel, toy_cached.CachedRun, list[np.ndarray]],
        dtype: str) -> None:
    model, f32, ref = routes
    scales = toy_cached.calibrated_fp8_scales(f32.kv_absmax, dtype) if dtype in FP8 else None
    monkeypatch.setattr(toy_cached, "VideoCache", Twin)
    Twin.ratios = []
    fc = tv.FlopCounter()
    run = toy_cached.generate_cached(model, TINY_SPECS, TINY_WIN, fc, dtype=dtype, fp8_scales=scales)
    passes = len(TINY.sigmas) + 1
    assert len(Twin.ratios) == passes * TINY.n_layer * sum(s.frames // TINY.frames_per_chunk for s in TINY_SPECS)
    assert 0 < max(Twin.ratios) <= 1.001
    assert run.max_stored_tokens == f32.max_stored_tokens and run.blocks_used_after == 0
    diff = max(float(np.abs(a - b).max()) for a, b in zip(run.frames, ref))
    scale = max(float(np.abs(r).max()) for r in ref)
    assert 0 < diff <= REL[dtype] * scale
