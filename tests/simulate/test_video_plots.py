"""One video stream's KV over time (:mod:`pykvpool.simulate.video_plots`): the arithmetic
curve is the pages the simulator's hybrid pool holds, chunk by chunk; windowed curves stop
at their cap; the figure is written; the reported frame rates are data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pykvpool
from pykvpool.planning.hardware import HARDWARE
from pykvpool.planning.video import VIDEO_MODELS
from pykvpool.simulate.video import VideoRoofline, simulate_video, video_requests
from pykvpool.simulate.video_plots import REPORTED_FPS, plot_kv_over_time, stream_kv_curve


@pytest.mark.parametrize("key", ["longlive", "self-forcing", "article-720p"])
@pytest.mark.parametrize("windowed", [False, True])
@pytest.mark.parametrize("block_size", [16, 7])
def test_the_curve_is_what_the_pool_holds(key: str, windowed: bool, block_size: int) -> None:
    m = VIDEO_MODELS[key].variant(windowed)
    seconds = 12.0
    curve = stream_kv_curve(m, seconds, block_size)
    res = simulate_video(video_requests(1, seconds), VideoRoofline(m, HARDWARE["h100-sxm"]),
                         m.peak_blocks(seconds, block_size), block_size)
    held = np.array([b for _, b in res.streams[0].memory[:-1]], dtype=np.float64)
    np.testing.assert_array_equal(curve.kv_bytes, held * res.bytes_per_block)
    assert len(curve.video_s) == m.num_chunks(seconds)
    np.testing.assert_allclose(curve.video_s, np.arange(1, len(held) + 1) * m.chunk_seconds)
    np.testing.assert_array_equal(curve.latent_frames, np.arange(1, len(held) + 1) * m.frames_per_chunk)


def test_a_window_caps_the_curve_and_full_history_grows() -> None:
    m = VIDEO_MODELS["longlive"]
    long = stream_kv_curve(m, 120.0)
    assert long.cap_bytes is not None and long.kv_bytes.max() == long.cap_bytes
    # the cap of sinks + window + chunk (12 frames of 1,560 tokens), in pages of 16
    page = 16 * m.kv_bytes_per_token()
    assert long.cap_bytes >= 12 * 1560 * m.kv_bytes_per_token() and long.cap_bytes % page == 0
    short = stream_kv_curve(m, 1.0)  # before the window fills, the cap is still the long one
    assert short.cap_bytes == long.cap_bytes and short.kv_bytes.max() < short.cap_bytes
    full = stream_kv_curve(m.variant(False), 120.0)
    assert full.cap_bytes is None and np.all(np.diff(full.kv_bytes) > 0)
    assert full.kv_bytes[-1] == -(-len(full.video_s) * 3 * 1560 // 16) * page


def test_long_videos_are_arithmetic_not_a_pool() -> None:
    curve = stream_kv_curve(VIDEO_MODELS["article-720p"].variant(False), 3600.0)
    # an hour at 24 fps: 21,600 latent frames of 14,400 tokens x 131,072 B (37 TiB: no pool holds it)
    assert len(curve.kv_bytes) == 7200 and curve.kv_bytes[-1] == 21_600 * 14_400 * 131_072


def test_bad_arguments_are_named() -> None:
    m = VIDEO_MODELS["longlive"]
    for bad in (0.0, -1.0, float("nan"), True):
        with pytest.raises(pykvpool.InvalidArgumentError, match="duration_s"):
            stream_kv_curve(m, bad)  # type: ignore[arg-type]
    with pytest.raises(pykvpool.InvalidArgumentError, match="block_size"):
        stream_kv_curve(m, 10.0, 0)
    with pytest.raises(pykvpool.InvalidArgumentError, match="panels"):
        plot_kv_over_time({}, "never.png")


def test_the_figure_is_written(tmp_path: Path) -> None:
    m = VIDEO_MODELS["longlive"]
    panels = {"LongLive": [stream_kv_curve(m.variant(False), 30.0), stream_kv_curve(m, 30.0)],
              "one chunk": [stream_kv_curve(m, 0.5)]}
    out = tmp_path / "kv.png"
    plot_kv_over_time(panels, out, {"LongLive": {"H100": 73.0, "A100": 74.0, "H200": 134.0}})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_reported_fps_are_data() -> None:
    r = REPORTED_FPS["longlive"]
    assert r.fps == 20.7 and r.hardware in HARDWARE and "LongLive" in r.source
    assert set(REPORTED_FPS) <= set(VIDEO_MODELS)
