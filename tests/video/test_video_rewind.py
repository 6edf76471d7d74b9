"""``VideoCache.rewind``: a stream taken back to an earlier frame generates the same frames
again, bit for bit, when the pages its window had released come back from the spill
(``spill_blocks``), on the toy video transformer (:mod:`pykvpool.video.toy`); without a
spill copy, the visible tokens of those pages are listed for the caller to recompute."""

from __future__ import annotations

import numpy as np
import pytest

from pykvpool import InvalidArgumentError, UnknownSequenceError
from pykvpool.video import VideoCache
from pykvpool.video.toy import FlopCounter, StreamSpec, VideoModel, VideoToyConfig, Window, make_model
from pykvpool.video.toy_cached import _round

WIN = Window(sink_frames=2, window_frames=2)
SPEC = StreamSpec(prompt=1, seed=5, frames=16)


def cache(model: VideoModel, spill_blocks: int | None, block_size: int = 16) -> VideoCache:
    cfg = model.cfg
    return VideoCache(num_layers=cfg.n_layer, num_kv_heads=cfg.n_kv_head, head_dim=cfg.d_head,
                      tokens_per_frame=cfg.tokens_per_frame, grid=cfg.grid, frames_per_chunk=cfg.frames_per_chunk,
                      sink_frames=WIN.sink_frames, window_frames=WIN.window_frames, num_blocks=64,
                      block_size=block_size, dtype="f32", spill_blocks=spill_blocks)


def generate(model: VideoModel, vc: VideoCache, clean: np.ndarray, chunks: range) -> None:
    absmax = np.zeros((model.cfg.n_layer, 2, model.cfg.n_kv_head), np.float32)
    for _ in chunks:
        _round(model, vc, [0], [SPEC], [clean], FlopCounter(), absmax)


@pytest.fixture(scope="module")
def model() -> VideoModel:
    return make_model(VideoToyConfig())


@pytest.mark.parametrize("block_size", [16, 24])  # 24: pages straddle frames (64 tokens each)
@pytest.mark.parametrize("back_to", [1, 3, 6])  # chunks
def test_a_rewound_stream_generates_the_same_frames_again(model: VideoModel, block_size: int, back_to: int) -> None:
    cfg = model.cfg
    vc = cache(model, spill_blocks=64, block_size=block_size)
    vc.add_stream(0)
    clean = np.zeros((SPEC.frames, cfg.tokens_per_frame, cfg.channels), np.float32)
    chunks = SPEC.frames // cfg.frames_per_chunk
    generate(model, vc, clean, range(chunks))
    first = clean.copy()
    frames = back_to * cfg.frames_per_chunk
    slots, pos = vc.rewind(0, frames)
    assert slots.size == 0 and pos.shape == (0, 3)  # every visible page came back
    assert vc.stream_frames(0) == frames
    assert vc.stats()["spill"]["restored"] > 0 or back_to == 1  # chunk 1 sees only held sinks
    clean[frames:] = 0
    generate(model, vc, clean, range(back_to, chunks))
    np.testing.assert_array_equal(clean, first)
    vc.pool.check_invariants()


def test_without_a_spill_copy_the_visible_tokens_of_released_pages_are_listed(model: VideoModel) -> None:
    cfg = model.cfg
    vc = cache(model, spill_blocks=None)
    vc.add_stream(0)
    clean = np.zeros((SPEC.frames, cfg.tokens_per_frame, cfg.channels), np.float32)
    generate(model, vc, clean, range(8))
    slots, pos = vc.rewind(0, 12)
    # At frame 12 the next chunk sees sinks 0-1 (held) and frames 10-11 (released by then).
    assert sorted(set(pos[:, 0].tolist())) == [10, 11]
    np.testing.assert_array_equal(slots, vc.visible_slots(0)[-len(slots):])
    np.testing.assert_array_equal(pos, vc.visible_positions(0)[-len(slots):])
    # A spill of 6 pages (16 tokens each, 4 per frame) keeps the 6 stored last: of
    # frames 12-13, released by the last commit, frame 12's first two pages are gone.
    small = cache(model, spill_blocks=6)
    small.add_stream(0)
    generate(model, small, clean, range(8))
    slots, pos = small.rewind(0, 14)
    assert small.stats()["spill"]["dropped"] > 0
    assert len(slots) == 32 and set(pos[:, 0].tolist()) == {12}


def test_bad_rewinds_change_nothing(model: VideoModel) -> None:
    vc = cache(model, spill_blocks=8)
    vc.add_stream(0)
    clean = np.zeros((SPEC.frames, model.cfg.tokens_per_frame, model.cfg.channels), np.float32)
    generate(model, vc, clean, range(3))
    table = vc.pool.block_table(0, group=0).copy()
    for frames in (7, 1, -2, True, 2.0):
        with pytest.raises((InvalidArgumentError, TypeError)):
            vc.rewind(0, frames)
    with pytest.raises(UnknownSequenceError):
        vc.rewind(9, 2)
    vc.begin_chunk([0])
    with pytest.raises(InvalidArgumentError, match="open chunk"):
        vc.rewind(0, 2)
    vc.abort_chunk([0])
    np.testing.assert_array_equal(vc.pool.block_table(0, group=0), table)
    assert vc.stream_frames(0) == 6
    with pytest.raises(InvalidArgumentError, match="spill_blocks"):
        VideoCache(num_layers=1, num_kv_heads=1, head_dim=8, tokens_per_frame=4, grid=(2, 2), frames_per_chunk=1,
                   num_blocks=8, spill_blocks=4)
    with pytest.raises(InvalidArgumentError, match="spill_blocks"):
        cache(model, spill_blocks=0)
