"""Behaviour of :class:`pykvpool.video.VideoCache` against the video cache's contract
(``tests/reference/video_model.py`` writes it out): slots and (t, h, w) positions, eviction that
keeps ``t`` counting and never touches the sinks, flat memory over a long stream, the
batched chunk attention against a float64 reference built from positions and the K/V the
test wrote (never from the pool's tables), atomic exhaustion, the prompt switch's in-place
rewrite, and the argument checks (each failing call changes nothing)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from reference.poolcheck import snapshot
from reference.video_model import Geometry, poison_free_pages, reference_attention

import pykvpool as kv
from pykvpool.video import ChunkBatch, VideoCache

HQ, HKV, D, LAYERS = 4, 2, 8, 2


def make(window: int | None = 2, sinks: int = 1, bs: int = 4, tpf: int = 6, grid: tuple[int, int] = (2, 3),
         fpc: int = 2, blocks: int = 256) -> tuple[VideoCache, Geometry]:
    vc = VideoCache(num_layers=LAYERS, num_kv_heads=HKV, head_dim=D, tokens_per_frame=tpf, grid=grid,
                    frames_per_chunk=fpc, sink_frames=sinks, window_frames=window, num_blocks=blocks,
                    block_size=bs, dtype="f32")
    return vc, Geometry(tpf, grid[1], fpc, sinks, window, bs)


class Driver:
    """Runs chunks on a cache and keeps its own record of every K/V it wrote, by stream and
    logical token index, for the reference."""

    def __init__(self, vc: VideoCache, geo: Geometry, seed: int = 0) -> None:
        self.vc, self.geo = vc, geo
        self.rng = np.random.default_rng(seed)
        self.k: dict[int, dict[int, np.ndarray]] = {}  # stream -> layer -> [tokens, Hkv, D]
        self.v: dict[int, dict[int, np.ndarray]] = {}

    def add(self, s: int) -> None:
        self.vc.add_stream(s)
        self.k[s] = {layer: np.zeros((0, HKV, D), np.float32) for layer in range(LAYERS)}
        self.v[s] = {layer: np.zeros((0, HKV, D), np.float32) for layer in range(LAYERS)}

    def put(self, s: int, layer: int, first: int, k: np.ndarray, v: np.ndarray) -> None:
        n = first + len(k)
        for rec, x in ((self.k, k), (self.v, v)):
            arr = rec[s][layer]
            if len(arr) < n:
                arr = np.concatenate([arr, np.zeros((n - len(arr), HKV, D), np.float32)])
            arr[first:n] = x
            rec[s][layer] = arr

    def step(self, batch: ChunkBatch, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """One denoising step of ``layer``: fresh K/V written, attention run; returns
        (kernel output, float64 reference)."""
        t, c = batch.num_tokens, self.geo.chunk_tokens
        k = self.rng.standard_normal((t, HKV, D)).astype(np.float32)
        v = self.rng.standard_normal((t, HKV, D)).astype(np.float32)
        q = self.rng.standard_normal((t, HQ, D)).astype(np.float32)
        self.vc.write(layer, k, v, batch)
        want = np.zeros((t, HQ, D))
        for i, (s, chunk) in enumerate(zip(batch.stream_ids.tolist(), batch.chunks.tolist())):
            rows = slice(i * c, (i + 1) * c)
            self.put(s, layer, chunk * c, k[rows], v[rows])
            sees = self.geo.chunk_sees(chunk)
            want[rows] = reference_attention(q[rows], self.k[s][layer][sees], self.v[s][layer][sees])
        return self.vc.attention(layer, q, batch), want

    def chunk(self, ids: list[int], steps: int = 2) -> ChunkBatch:
        batch = self.vc.begin_chunk(ids)
        for _ in range(steps):
            for layer in range(LAYERS):
                got, want = self.step(batch, layer)
                assert np.isfinite(got).all()
                np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
        self.vc.commit_chunk(ids)
        return batch


def test_slots_and_positions_of_a_chunk() -> None:
    vc, geo = make()
    vc.add_stream(7)
    b = vc.begin_chunk([7])
    assert b.slots.shape == (1, 12) and b.positions.shape == (1, 12, 3) and b.chunks.tolist() == [0]
    assert b.positions[0].tolist() == geo.positions(np.arange(12)).tolist()
    assert b.positions[0, 7].tolist() == [1, 0, 1]  # token 7: frame 1, token 1 of the 2x3 grid
    assert b.q_positions.tolist() == [11] * 12 and b.qo_indptr.tolist() == [0, 12]
    # The slots are those of the pool's table, in token order.
    table = vc.pool.block_table(7, group=0)
    assert b.slots[0].tolist() == [int(table[p // 4]) * 4 + p % 4 for p in range(12)]
    with pytest.raises(ValueError):
        b.slots[0, 0] = 0  # read-only
    vc.commit_chunk([7])
    b2 = vc.begin_chunk([7])
    assert b2.chunks.tolist() == [1] and b2.positions[0, 0].tolist() == [2, 0, 0]
    assert set(b2.slots[0].tolist()).isdisjoint(vc.visible_slots(7).tolist())
    assert vc.stream_frames(7) == 2 and vc.has_open_chunk(7)


def test_t_keeps_counting_after_eviction_and_sinks_stay() -> None:
    vc, geo = make(window=2, sinks=1)
    d = Driver(vc, geo)
    d.add(1)
    d.chunk([1])
    sink_slots = vc.visible_slots(1)[: geo.tpf].tolist()
    for c in range(1, 8):
        d.chunk([1])
        frames = 2 * (c + 1)
        assert vc.stream_frames(1) == frames
        t = vc.visible_positions(1)[:, 0].tolist()
        assert t == [f for f in [0, frames - 2, frames - 1] for _ in range(geo.tpf)]
        assert vc.visible_positions(1).tolist() == geo.positions(geo.visible_tokens(frames)).tolist()
        assert vc.visible_slots(1)[: geo.tpf].tolist() == sink_slots
    # The sink frame's K are still those written in chunk 0.
    keys = vc.kv.key(0)
    stored = keys.reshape(-1, HKV, D)[sink_slots]
    np.testing.assert_array_equal(stored, d.k[1][0][: geo.tpf])


def test_commit_frees_the_frames_that_left_the_window_at_once() -> None:
    vc, geo = make(window=2, sinks=1, bs=3, tpf=3, grid=(1, 3), fpc=1)  # frame-aligned pages
    d = Driver(vc, geo)
    d.add(1)
    for _ in range(4):
        d.chunk([1], steps=1)
    assert vc.pool.num_used_blocks == 3  # frames 0 (sink), 2, 3
    b = vc.begin_chunk([1])
    assert vc.pool.num_used_blocks == 4
    vc.commit_chunk([1])
    # Frames 0, 3, 4 are what the next chunk sees: frame 2 went at the commit.
    assert vc.pool.num_used_blocks == 3
    assert sorted(vc.visible_slots(1)[::3] // 3) == sorted(b for b in vc.pool.block_table(1, group=0).tolist() if b >= 0)
    assert vc.stats()["streams"][1]["waste_tokens"] == 0
    with pytest.raises(kv.InvalidArgumentError, match="batch"):
        vc.write(0, np.zeros((3, HKV, D), np.float32), np.zeros((3, HKV, D), np.float32), b)


@pytest.mark.parametrize("window", [None, 3])
def test_memory_over_a_long_stream(window: int | None) -> None:
    vc, geo = make(window=window, sinks=2, blocks=1024)
    vc.add_stream(1)
    used = []
    for _ in range(40):
        vc.begin_chunk([1])
        vc.commit_chunk([1])
        used.append(vc.pool.num_used_blocks)
        assert used[-1] == geo.held_blocks(vc.stream_frames(1) * geo.tpf, vc.stream_frames(1) * geo.tpf)
    if window is None:
        assert used[-1] == -(-80 * 6 // 4)  # every token kept
    else:
        assert max(used[5:]) - min(used[5:]) <= 1  # flat (pages shared by two frames: +-1)
        assert max(used) <= -(-(2 + 3 + 1) * 6 // 4) + 2


@pytest.mark.parametrize("window,sinks", [(None, 0), (2, 1), (1, 0), (0, 2), (3, 2)])
@pytest.mark.parametrize("bs", [1, 4, 16])
def test_attention_equals_the_float64_reference(window: int | None, sinks: int, bs: int) -> None:
    vc, geo = make(window=window, sinks=sinks, bs=bs)
    d = Driver(vc, geo, seed=bs)
    for s in (3, 5):
        d.add(s)
    for _ in range(6):
        d.chunk([3, 5])
        poison_free_pages(vc.kv, vc.pool)


def test_batched_streams_at_different_frame_counts() -> None:
    vc, geo = make(window=2, sinks=1)
    d = Driver(vc, geo, seed=3)
    for s in (1, 2, 3):
        d.add(s)
    for _ in range(4):
        d.chunk([1])
    d.chunk([2, 1])
    d.chunk([3, 1, 2])
    b = d.chunk([2, 3, 1])
    assert b.chunks.tolist() == [2, 1, 6]
    assert [vc.stream_frames(s) for s in (1, 2, 3)] == [14, 6, 4]


def test_exhaustion_is_atomic() -> None:
    # Chunks of 12 tokens on 4-token pages: 3 pages each; a window of one 6-token frame.
    vc, geo = make(window=1, sinks=0, blocks=7)
    for s in (1, 2):
        vc.add_stream(s)
    vc.begin_chunk([1])
    vc.commit_chunk([1])
    assert vc.pool.num_used_blocks == geo.held_blocks(12, 12) == 2
    before = (snapshot(vc.pool), vc.stats())
    with pytest.raises(kv.PoolExhaustedError):
        vc.begin_chunk([2, 1])  # 3 + 3 pages, 5 free
    assert (snapshot(vc.pool), vc.stats()) == before
    assert not vc.has_open_chunk(1) and not vc.has_open_chunk(2)
    b = vc.begin_chunk([2])
    assert b.chunks.tolist() == [0] and vc.pool.num_free_blocks == 2


def test_rewrite_window_writes_in_place() -> None:
    vc, geo = make(window=2, sinks=1)
    d = Driver(vc, geo, seed=5)
    d.add(1)
    for _ in range(4):
        d.chunk([1])
    used = vc.pool.num_used_blocks
    slots, pos = vc.rewrite_window(1)
    assert slots.tolist() == vc.visible_slots(1).tolist() and pos.tolist() == vc.visible_positions(1).tolist()
    tokens = geo.visible_tokens(vc.stream_frames(1))
    assert pos.tolist() == geo.positions(tokens).tolist()
    # The new prompt's K/V of the visible history, written back at the same slots.
    for layer in range(LAYERS):
        k = d.rng.standard_normal((len(slots), HKV, D)).astype(np.float32)
        vc.kv.write(layer, k, 2 * k, slots)
        for i, t in enumerate(tokens.tolist()):
            d.put(1, layer, t, k[i:i + 1], 2 * k[i:i + 1])
    assert vc.pool.num_used_blocks == used  # nothing allocated
    d.chunk([1])  # the next chunk reads the rewritten window: equal to the reference


def test_abort_drops_the_open_chunk_only() -> None:
    vc, geo = make(window=2, sinks=1)
    d = Driver(vc, geo, seed=6)
    for s in (1, 2):
        d.add(s)
    d.chunk([1, 2])
    d.chunk([1, 2])
    before = (snapshot(vc.pool), vc.stats())
    b = vc.begin_chunk([1, 2])
    d.step(b, 0)
    vc.abort_chunk([2, 1])
    assert (snapshot(vc.pool), vc.stats()) == before
    with pytest.raises(kv.InvalidArgumentError, match="batch"):
        vc.attention(0, np.zeros((b.num_tokens, HQ, D), np.float32), b)
    b2 = d.chunk([2])
    assert b2.chunks.tolist() == [2]


def test_release_returns_every_page() -> None:
    vc, _ = make()
    vc.add_stream(1)
    vc.add_stream(2)
    vc.begin_chunk([1, 2])
    vc.commit_chunk([1])
    vc.begin_chunk([1])
    vc.release(1)
    vc.release(2)
    assert vc.pool.num_free_blocks == vc.pool.num_blocks and vc.stream_ids() == []
    with pytest.raises(kv.UnknownSequenceError):
        vc.stream_frames(1)


def test_stats_count_pages_and_bytes() -> None:
    vc, geo = make(window=2, sinks=1)
    vc.add_stream(4)
    vc.begin_chunk([4])
    st = vc.stats()
    per = st["streams"][4]
    assert per["open_chunk"] and per["chunk_tokens"] == 12 and per["blocks"] == 3 and per["frames"] == 0
    assert st["bytes_per_block"] == 2 * LAYERS * 4 * HKV * D * 4
    assert per["bytes"] == 3 * st["bytes_per_block"] and st["bytes_used"] == per["bytes"]
    assert per["waste_tokens"] == 0 and per["stored_tokens"] == 12


# ---- argument checks: every failing call changes nothing

def world() -> tuple[VideoCache, ChunkBatch]:
    vc, _ = make()
    for s in (1, 2, 3):
        vc.add_stream(s)
    vc.begin_chunk([1])
    vc.commit_chunk([1])
    return vc, vc.begin_chunk([1, 2])


K_OK = np.zeros((24, HKV, D), np.float32)
Q_OK = np.zeros((24, HQ, D), np.float32)
NOT_INT: list[Any] = [True, 1.5, "1", None, -1, 2**64]
IDS_BAD: list[Any] = [[], [1.5], [True], [-1], np.zeros((1, 1), np.int64), np.array([1.0]), [1, 1]]
ARR_BAD: list[Any] = [np.zeros((24, HKV, D)), np.zeros((23, HKV, D), np.float32), np.zeros((24, 3, D), np.float32),
                      np.zeros((24, HKV), np.float32)]

Call = Callable[[VideoCache, ChunkBatch, Any], Any]
INVALID: list[tuple[str, Call, list[Any]]] = [
    ("stream_id", lambda vc, b, x: vc.add_stream(x), NOT_INT),
    ("stream_id", lambda vc, b, x: vc.release(x), NOT_INT),
    ("stream_id", lambda vc, b, x: vc.stream_frames(x), NOT_INT),
    ("stream_id", lambda vc, b, x: vc.visible_slots(x), NOT_INT),
    ("stream_id", lambda vc, b, x: vc.rewrite_window(x), NOT_INT),
    ("stream_ids", lambda vc, b, x: vc.begin_chunk(x), IDS_BAD + [[1], [3, 2]]),  # 1, 2: open chunks
    ("stream_ids", lambda vc, b, x: vc.commit_chunk(x), IDS_BAD + [[3], [1, 3]]),  # 3: no open chunk
    ("stream_ids", lambda vc, b, x: vc.abort_chunk(x), IDS_BAD + [[3]]),
    ("layer", lambda vc, b, x: vc.write(x, K_OK, K_OK, b), NOT_INT + [2]),
    ("k", lambda vc, b, x: vc.write(0, x, K_OK, b), ARR_BAD),
    ("v", lambda vc, b, x: vc.write(0, K_OK, x, b), ARR_BAD),
    ("layer", lambda vc, b, x: vc.attention(x, Q_OK, b), NOT_INT + [2]),
    ("q", lambda vc, b, x: vc.attention(0, x, b), ARR_BAD[:2] + [np.zeros((24, 3, D), np.float32)]),
    ("scale", lambda vc, b, x: vc.attention(0, Q_OK, b, scale=x), [-1.0, 0.0, float("nan")]),
    ("out", lambda vc, b, x: vc.attention(0, Q_OK, b, out=x),
     [np.zeros((24, HQ, D)), np.zeros((2, HQ, D), np.float32)]),
]
CTOR: dict[str, Any] = dict(num_layers=1, num_kv_heads=1, head_dim=4, tokens_per_frame=6, grid=(2, 3),
                            frames_per_chunk=1, num_blocks=8)
CTOR_BAD: list[tuple[str, Any]] = [
    ("num_layers", 0), ("num_kv_heads", 1.5), ("head_dim", True), ("tokens_per_frame", 0), ("grid", (2, 2)),
    ("grid", (2, 3, 1)), ("grid", (2.0, 3)), ("frames_per_chunk", 0), ("frames_per_chunk", 2**26),
    ("sink_frames", -1), ("window_frames", -1), ("window_frames", 2**30), ("num_blocks", 0),
    ("block_size", 0), ("block_size", 2**20), ("dtype", "f64"),
]


def state(vc: VideoCache) -> tuple[Any, ...]:
    return snapshot(vc.pool), vc.stats(), float(np.nansum(vc.kv.key(0))), float(np.nansum(vc.kv.value(0)))


@pytest.mark.parametrize(("name", "call", "bad"), [(n, c, b) for n, c, bs in INVALID for b in bs])
def test_bad_value_raises_invalid_argument_naming_it(name: str, call: Call, bad: Any) -> None:
    vc, b = world()
    before = state(vc)
    with pytest.raises(kv.InvalidArgumentError) as info:
        call(vc, b, bad)
    assert name in str(info.value), str(info.value)
    assert state(vc) == before


@pytest.mark.parametrize(("name", "bad"), CTOR_BAD)
def test_bad_constructor_argument(name: str, bad: Any) -> None:
    with pytest.raises(kv.InvalidArgumentError, match=name):
        VideoCache(**{**CTOR, name: bad})


@pytest.mark.parametrize("call", [
    lambda vc, b: vc.begin_chunk("12"), lambda vc, b: vc.commit_chunk(1), lambda vc, b: vc.write(0, [[0.0]], K_OK, b),
    lambda vc, b: vc.attention(0, Q_OK.tolist(), b), lambda vc, b: vc.attention(0, Q_OK, "batch"),
    lambda vc, b: vc.write(0, K_OK, K_OK, None), lambda vc, b: VideoCache(**{**CTOR, "grid": 6}),
    lambda vc, b: VideoCache(**{**CTOR, "dtype": 2}),
])
def test_wrong_type_raises_type_error(call: Callable[[VideoCache, ChunkBatch], Any]) -> None:
    vc, b = world()
    before = state(vc)
    with pytest.raises(TypeError):
        call(vc, b)
    assert state(vc) == before


def test_unknown_streams_and_foreign_batches() -> None:
    vc, b = world()
    other, _ = world()
    before = state(vc)
    for call in (lambda: vc.begin_chunk([3, 9]), lambda: vc.commit_chunk([1, 9]), lambda: vc.release(9),
                 lambda: vc.visible_positions(9)):
        with pytest.raises(kv.UnknownSequenceError):
            call()
    with pytest.raises(kv.DuplicateSequenceError):
        vc.add_stream(2)
    with pytest.raises(kv.InvalidArgumentError, match="another VideoCache"):
        other.write(0, K_OK, K_OK, b)
    assert state(vc) == before


def test_default_bf16_cache_matches_the_reference_on_rounded_kv() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    vc = VideoCache(num_layers=1, num_kv_heads=HKV, head_dim=D, tokens_per_frame=6, grid=(2, 3), frames_per_chunk=2,
                    sink_frames=1, window_frames=2, num_blocks=64)
    assert vc.dtype == "bf16" and vc.block_size == 16
    geo = Geometry(6, 3, 2, 1, 2, 16)
    rng = np.random.default_rng(9)
    vc.add_stream(0)
    ks, vs = [], []
    for c in range(5):
        b = vc.begin_chunk([0])
        k, v = (rng.standard_normal((12, HKV, D)).astype(np.float32) for _ in range(2))
        q = rng.standard_normal((12, HQ, D)).astype(np.float32)
        vc.write(0, k, v, b)
        ks.append(k.astype(ml_dtypes.bfloat16).astype(np.float32))
        vs.append(v.astype(ml_dtypes.bfloat16).astype(np.float32))
        sees = geo.chunk_sees(c)
        want = reference_attention(q, np.concatenate(ks)[sees], np.concatenate(vs)[sees])
        np.testing.assert_allclose(vc.attention(0, q, b), want, atol=2e-5, rtol=1e-5)
        vc.commit_chunk([0])
