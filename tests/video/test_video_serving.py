"""Video presets (KV per stream, full history vs sinks + window, bf16 vs 8-bit) and the video
serving simulator (roofline pass times, batching, admission through a real BlockPool,
memory over time, streams at real time), against numbers derived by hand."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pykvpool
from pykvpool.errors import BudgetError, UnknownPresetError
from pykvpool.planning.hardware import Hardware, hardware_preset
from pykvpool.planning.ledger import GIB, Budget, default_budget
from pykvpool.planning.video import VIDEO_KV_8BIT, VIDEO_MODELS, VideoModel, video_model_preset
from pykvpool.simulate.video import (
    VideoRequest,
    VideoRoofline,
    kv_pool_blocks,
    simulate_video,
    streams_at_real_time,
    video_requests,
)

# --- presets -----------------------------------------------------------------------------


def test_wan_presets_kv_per_token_and_per_stream() -> None:
    sf, ll = video_model_preset("self-forcing"), video_model_preset("LongLive")
    for m in (sf, ll):
        assert m.tokens_per_frame == 1560 and m.chunk_tokens == 4680
        assert m.kv_bytes_per_token("bf16") == 2 * 30 * 12 * 128 * 2 == 184_320
        # 8-bit: one byte per element plus one fp32 scale per (token, layer, K/V, head).
        assert m.kv_bytes_per_token("fp8") == 2 * 30 * 12 * (128 + 4) == 95_040
        assert m.passes_per_chunk == 5 and m.chunk_seconds == 0.75
    # 5 s at 16 fps: 80 frames, 20 latent, 7 chunks of 3 = 21 frames: Self-Forcing's cache.
    assert sf.num_chunks(5) == 7
    assert sf.variant(False).kv_stream_bytes(5) == 21 * 1560 * 184_320
    assert f"{21 * 1560 * 184_320 / GIB:.2f}" == "5.62"
    # LongLive: 3 sinks + 6 frames + the 3-frame chunk = 12 frames (local_attn_size 12), flat.
    for seconds in (5, 60, 240):
        assert ll.kv_stream_bytes(seconds) == 12 * 1560 * 184_320
        assert ll.kv_stream_bytes(seconds, "fp8") == 12 * 1560 * 95_040
    # Full history grows with the video: 240 s = 960 latent frames.
    assert ll.variant(False).kv_stream_bytes(240) == 960 * 1560 * 184_320


def test_the_video_plans_8bit_kv_is_the_video_caches() -> None:
    # The plans' 8-bit KV is KvCache's fp8_e4m3: one byte per element, its scales per layer
    # and KV head (none per token), as the VideoCache the plan is for stores it.
    ll = video_model_preset("longlive")
    assert VIDEO_KV_8BIT == "fp8_e4m3"
    assert ll.kv_bytes_per_token(VIDEO_KV_8BIT) == 2 * 30 * 12 * 128 == 92_160
    assert ll.kv_bytes_per_token(VIDEO_KV_8BIT) == 30 * pykvpool.KvCache.bytes_per_token(12, 128, "fp8_e4m3")
    assert ll.kv_stream_bytes(60, VIDEO_KV_8BIT) == 12 * 1560 * 92_160


def test_article_preset_keeps_the_articles_numbers() -> None:
    a = video_model_preset("article-720p")
    assert a.tokens_per_frame == 160 * 90 and a.kv_bytes_per_token() == 131_072
    full = a.variant(False)
    got = [f"{full.kv_stream_bytes(s) / GIB:.2f}" for s in (5, 10, 30)]
    assert got == ["52.73", "105.47", "316.41"]
    assert not full.windowed and a.windowed


def test_magi_like_preset_marks_what_is_derived() -> None:
    m = video_model_preset("magi-1-like")
    assert m.kv_bytes_per_token() == 2 * 48 * 8 * 128 * 2
    assert m.tokens_per_frame == (720 // 16) * (1280 // 16) == 3600
    assert {"grid", "window_frames"} <= set(m.derived)
    # 6 latent frames per second at 24 fps: about 4 GiB of bf16 KV per second of video.
    assert 3.9 < m.variant(False).kv_stream_bytes(10) / 10 / GIB < 4.0
    assert all(isinstance(v, VideoModel) and v.source for v in VIDEO_MODELS.values())


def test_unknown_preset_and_bad_values_are_named() -> None:
    with pytest.raises(UnknownPresetError, match="video model"):
        video_model_preset("sora")
    m = video_model_preset("longlive")
    with pytest.raises(pykvpool.InvalidArgumentError, match="duration_s"):
        m.kv_stream_bytes(0)
    with pytest.raises(pykvpool.InvalidArgumentError, match="window_frames"):
        m.with_window(-1)
    with pytest.raises(pykvpool.InvalidArgumentError, match="num_kv_heads"):
        VideoModel("x", 2, 3, 2, 4, 1e3, (2, 2), 8, 1, 1)
    with pytest.raises(pykvpool.InvalidArgumentError, match="block_size"):
        m.stream_blocks(0, 0)


def _toy(**kw: object) -> VideoModel:
    """10 tokens per frame (2 x 5), chunks of 2 frames (20 tokens), 3 steps + clean pass,
    8 fps and 4 frames per latent frame: a chunk is 1 s of video."""
    args: dict[str, object] = dict(num_layers=2, num_q_heads=2, num_kv_heads=1, head_dim=4,
                                   num_params=1000.0, grid=(2, 5), fps=8, frames_per_chunk=2,
                                   denoising_steps=3)
    args.update(kw)
    return VideoModel("toy", **args)  # type: ignore[arg-type]


def test_stream_blocks_follow_a_real_hybrid_pool() -> None:
    # 10 tokens per frame, chunks of 3 frames, 3 sinks (30 tokens), 6-frame window, block 16:
    # during chunk c the stream holds blocks 0-1 (sinks) and the blocks from token 30c - 60
    # to 30c + 30: 2, 4, 6, 8, then 2 + (10 - 3) = 9 and 2 + (12 - 5) = 9.
    m = _toy(grid=(2, 5), frames_per_chunk=3, sink_frames=3, window_frames=6)
    assert [m.stream_blocks(c, 16) for c in range(6)] == [2, 4, 6, 8, 9, 9]
    pool = pykvpool.BlockPool(100, 16, [pykvpool.SlidingWindow(61, sink_tokens=30)])
    pool.add_sequence(7, 0)
    for c in range(12):
        pool.step([7], 30)
        assert pool.num_used_blocks == m.stream_blocks(c, 16)
    full = m.with_window(None)
    assert [full.stream_blocks(c, 16) for c in range(3)] == [2, 4, 6]  # ceil(30 (c + 1) / 16)


# --- roofline ----------------------------------------------------------------------------

TOY_HW = Hardware("toy", 1e12, 1e15, {"bf16": 1e9})


def _roof(model: VideoModel, hw: Hardware = TOY_HW) -> VideoRoofline:
    return VideoRoofline(model, hw, flops_efficiency=1.0, bandwidth_efficiency=1.0, overhead=0.0)


def test_pass_time_is_compute_bound_flops_over_peak() -> None:
    r = _roof(_toy())
    # 2 x 1000 params x 20 tokens + 4 x 2 layers x 8 (q width) x 20 x (h + 20).
    assert r.pass_flops([0]) == 40_000 + 1280 * 20
    assert r.pass_flops([40]) == 40_000 + 1280 * 60
    assert r.pass_time([40]) == pytest.approx((40_000 + 1280 * 60) / 1e9)
    # Batched: FLOPs add up.
    assert r.pass_flops([0, 40]) == 2 * 40_000 + 1280 * 80


def test_batching_reads_the_weights_once_when_memory_bound() -> None:
    slow_memory = Hardware("toy", 1e12, 1e6, {"bf16": 1e15})
    r = _roof(_toy(), slow_memory)
    kv = 2 * 2 * 1 * 4 * 2  # 32 B/token
    assert r.pass_bytes([0]) == 2000 + 20 * kv
    assert r.pass_time([0, 0]) == pytest.approx((2000 + 2 * 20 * kv) / 1e6)
    assert r.pass_time([0, 0]) < 2 * r.pass_time([0])


# --- simulator ---------------------------------------------------------------------------


def test_one_stream_chunk_times_by_hand() -> None:
    m = _toy()  # full history
    res = simulate_video([VideoRequest(0.5, 3.0)], _roof(m), num_blocks=1000)
    s = res.streams[0]
    assert s.chunks == 3 and s.admitted == 0.5  # 3 s x 8 fps / (4 x 2) = 3 chunks
    # 4 passes per chunk; chunk c's history is 20 c tokens.
    per = [4 * (40_000 + 1280 * (20 + 20 * c)) / 1e9 for c in range(3)]
    assert s.chunk_times == pytest.approx(list(0.5 + np.cumsum(per)))
    assert s.time_to_first_chunk == pytest.approx(per[0])
    assert res.passes == 12 and res.real_time(s)
    # Memory: ceil(20 (c + 1) / 16) blocks during chunk c, then freed.
    assert [b for _, b in s.memory] == [2, 3, 4, 0]
    assert res.used_blocks.tolist() == [2] * 4 + [3] * 4 + [4] * 4


def test_batched_streams_share_each_pass() -> None:
    m = _toy(sink_frames=0, window_frames=0)  # the chunk alone: history 0
    res = simulate_video(video_requests(2, 2.0), _roof(m), num_blocks=1000)
    one = 4 * (40_000 + 1280 * 20) / 1e9
    for s in res.streams:
        assert s.chunk_times == pytest.approx([2 * one, 4 * one])
    assert res.running.tolist() == [2] * 8


def test_admission_waits_for_the_peak_and_rejects_what_never_fits() -> None:
    m = _toy()
    peak = m.peak_blocks(2.0, 16)  # 2 chunks: ceil(40 / 16) = 3 blocks
    assert peak == 3
    reqs = [VideoRequest(0.0, 2.0), VideoRequest(0.0, 2.0), VideoRequest(0.0, 100.0)]
    res = simulate_video(reqs, _roof(m), num_blocks=5)
    a, b, big = res.streams
    assert a.admitted == 0.0 and b.admitted == a.chunk_times[-1]  # 3 + 3 > 5 blocks
    assert big.rejected and big.admitted is None
    assert res.used_blocks.max() <= 5


def test_max_streams_caps_admission_and_windows_free_pages() -> None:
    m = _toy(sink_frames=1, window_frames=2)
    res = simulate_video(video_requests(3, 10.0), _roof(m), num_blocks=1000, max_streams=2)
    assert res.running.max() == 2 and res.streams[2].admitted == res.streams[0].chunk_times[-1]
    # A windowed stream holds sinks + window + chunk at most: tokens [0, 10) and 30 tokens
    # before the chunk plus its 20: ceil(10/16) + ... bounded by the formula's peak.
    s = res.streams[0]
    held = [b for _, b in s.memory[:-1]]
    assert held == [m.stream_blocks(c, 16) for c in range(10)]
    assert max(held) == m.peak_blocks(10.0, 16) < m.with_window(None).peak_blocks(10.0, 16)


def test_streams_at_real_time_compute_and_memory_limits() -> None:
    # Sinks 1 + window 2 frames: from chunk 2 on the history is 30 tokens, so a pass costs
    # 40,000 + 1,280 x 50 = 104,000 FLOPs per stream; 4 passes per 1 s chunk at 1.3 MFLOP/s
    # keep real time for n x 416,000 <= 1.3e6: n = 3.
    m = _toy(sink_frames=1, window_frames=2)
    hw = Hardware("toy", 1e12, 1e15, {"bf16": 1.3e6})
    cap = streams_at_real_time(_roof(m, hw), 10.0, num_blocks=1000)
    assert (cap.streams, cap.limit) == (3, "compute")
    assert cap.single_fps == pytest.approx(8 / (4 * 104_000 / 1.3e6))
    peak = m.peak_blocks(10.0, 16)
    cap = streams_at_real_time(_roof(m, hw), 10.0, num_blocks=2 * peak)
    assert (cap.streams, cap.memory_streams, cap.limit) == (2, 2, "memory")
    assert streams_at_real_time(_roof(m, hw), 10.0, num_blocks=peak - 1).streams == 0


def test_simulation_is_deterministic_with_poisson_arrivals() -> None:
    m = video_model_preset("longlive")
    roof = VideoRoofline(m, hardware_preset("h100-sxm"))
    reqs = video_requests(20, (5.0, 20.0), rate=0.5, seed=3)
    a = simulate_video(reqs, roof, 3000)
    b = simulate_video(reqs, roof, 3000)
    assert [s.chunk_times for s in a.streams] == [s.chunk_times for s in b.streams]
    assert all(s.time_to_first_chunk > 0 for s in a.streams)
    assert np.all(np.diff(a.times) > 0)
    assert a.used_blocks.max() <= 3000


def test_kv_pool_blocks_and_budget_error() -> None:
    m = video_model_preset("longlive")
    budget = default_budget(hardware_preset("h100-sxm"))
    blocks = kv_pool_blocks(m, budget, 16)
    assert blocks == math.floor((budget.available_bytes - 1.3e9 * 2) / (16 * 184_320))
    assert kv_pool_blocks(m, budget, 16, "fp8") == math.floor(
        (budget.available_bytes - 2.6e9) / (16 * 95_040))
    with pytest.raises(BudgetError):
        kv_pool_blocks(video_model_preset("magi-1-like"), Budget(40 * GIB, 1.0, 0.0), 16)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: video_requests(0, 1.0), "num"),
    (lambda: video_requests(1, 0.0), "durations"),
    (lambda: video_requests(1, (3.0, 1.0)), "durations"),
    (lambda: video_requests(1, 1.0, rate=math.inf), "rate"),
    (lambda: simulate_video([], _roof(_toy()), 10), "requests"),
    (lambda: simulate_video([VideoRequest(0, 1)], _roof(_toy()), 0), "num_blocks"),
    (lambda: simulate_video([VideoRequest(0, 1)], _roof(_toy()), 10, max_streams=0), "max_streams"),
    (lambda: VideoRoofline(_toy(), TOY_HW, flops_efficiency=0), "flops_efficiency"),
])
def test_bad_arguments_are_named(call: object, match: str) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match=match):
        call()  # type: ignore[operator]


def test_peak_blocks_is_the_most_a_real_pool_ever_holds() -> None:
    rng = np.random.default_rng(14)
    for _ in range(60):
        h, w, f = (int(x) for x in rng.integers(1, 6, 3))
        sinks, window = int(rng.integers(0, 4)), int(rng.integers(0, 7))
        bs = int(rng.choice([1, 3, 8, 16, 24]))
        m = _toy(grid=(h, w), frames_per_chunk=f, sink_frames=sinks, window_frames=window)
        seconds = float(rng.integers(1, 40))
        tpf = h * w
        pool = pykvpool.BlockPool(10_000, bs, [pykvpool.SlidingWindow(window * tpf + 1,
                                                                        sink_tokens=sinks * tpf)])
        pool.add_sequence(0, 0)
        most = 0
        for _c in range(m.num_chunks(seconds)):
            pool.step([0], f * tpf)
            most = max(most, pool.num_used_blocks)
        assert m.peak_blocks(seconds, bs) == most, (h, w, f, sinks, window, bs, seconds)


def _replayed_blocks(m: VideoModel, chunks: int, streams: int, bs: int) -> list[int]:
    """Blocks each of ``streams`` streams stepping together holds after each chunk, counted
    on the entries of its whole block table (the slow, obvious count)."""
    tpf = m.tokens_per_frame
    group = (pykvpool.FullAttention() if m.window_frames is None
             else pykvpool.SlidingWindow(m.window_frames * tpf + 1, sink_tokens=m.sink_frames * tpf))
    pool = pykvpool.BlockPool(100_000, bs, [group])
    for i in range(streams):
        pool.add_sequence(i, 0)
    held = []
    for _ in range(chunks):
        pool.step(list(range(streams)), m.chunk_tokens)
        counts = {int(np.count_nonzero(pool.block_table(i, group=0) >= 0)) for i in range(streams)}
        assert len(counts) == 1
        held.append(counts.pop())
    return held


def test_simulated_blocks_are_the_stored_entries_of_the_block_table() -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        h, w, f = (int(x) for x in rng.integers(1, 5, 3))
        window = None if rng.random() < 0.3 else int(rng.integers(0, 6))
        sinks = 0 if window is None else int(rng.integers(0, 4))
        bs = int(rng.choice([1, 3, 8, 16, 24]))
        m = _toy(grid=(h, w), frames_per_chunk=f, sink_frames=sinks, window_frames=window)
        seconds = float(rng.integers(1, 30))
        res = simulate_video(video_requests(2, seconds), _roof(m), 100_000, bs)
        want = _replayed_blocks(m, m.num_chunks(seconds), 2, bs)
        for s in res.streams:
            assert [b for _, b in s.memory] == [*want, 0], (h, w, f, sinks, window, bs, seconds)


def test_an_hour_of_video_in_pages_of_one_token_ends_in_linear_time() -> None:
    """One hour of LongLive at block size 1: a windowed stream's logical table (holes
    included) grows with the video, so a per-chunk count over it takes quadratic time (past
    5 minutes here); the stored blocks are read in time bounded by the window instead."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    args = ["video", "--quiet", "--block-size", "1", "--models", "longlive", "--hardware", "h200",
            "--seconds", "3600"]
    try:
        r = subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True,
                           timeout=150, env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("an hour of video at block size 1 did not finish within 150 s")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "3 sinks + 6 frames" in line and "H200" in line)
    assert row.split("|")[4:8] == [" 780,489 ", " 41 ", " 3 ", " compute "]
