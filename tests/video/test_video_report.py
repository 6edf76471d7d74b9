"""The report's video section (section 8, figure 10): its tables against arithmetic done
here from the presets' published shapes and the datasheets, not from the implementation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from figcheck import assert_png

from pykvpool.report.video_serving import video_serving_section

GIB = 2**30
WAN_BPT = 2 * 30 * 12 * 128 * 2  # 184,320 B per token, bf16
WAN_BPT8 = 2 * 30 * 12 * 128  # 92,160 in fp8_e4m3: one byte per element (its scales are per layer)
TPF = 1560
WAN_WEIGHTS = 1.3e9 * 2


@pytest.fixture(scope="module")
def section(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], dict[str, Path]]:
    return video_serving_section(tmp_path_factory.mktemp("video"), progress=False)


def _kv(data: dict[str, Any], preset: str, windowed: bool) -> dict[str, Any]:
    return next(r for r in data["kv"] if r["preset"] == preset and r["windowed"] == windowed)


def _serving(data: dict[str, Any], preset: str, windowed: bool, hw: str) -> dict[str, Any]:
    return next(r for r in data["serving"] if r["preset"] == preset and r["windowed"] == windowed
                and r["hardware"] == hw)


def test_kv_table(section: tuple[str, dict[str, Any], dict[str, Path]]) -> None:
    md, data, _ = section
    art = _kv(data, "article-720p", False)
    assert [f"{art['gib'][5]['bf16']:.2f}"] == ["52.73"]
    ll_full, ll_win = _kv(data, "longlive", False), _kv(data, "longlive", True)
    assert ll_full["bytes_per_token"] == {"bf16": WAN_BPT, "fp8_e4m3": WAN_BPT8}
    # 240 s at 16 fps = 960 latent frames; LongLive keeps 3 + 6 + 3 = 12 of them.
    assert ll_full["gib"][240]["bf16"] == pytest.approx(960 * TPF * WAN_BPT / GIB)
    assert ll_full["gib"][240]["fp8_e4m3"] == pytest.approx(960 * TPF * WAN_BPT8 / GIB)
    for s in (5, 60, 240):
        assert ll_win["gib"][s]["bf16"] == pytest.approx(12 * TPF * WAN_BPT / GIB)
    assert "| longlive | 3 sinks + 6 frames + chunk 3 | 184,320 / 92,160 | 3.21 / 1.61" in md


def test_streams_at_real_time_by_hand(section: tuple[str, dict[str, Any], dict[str, Path]]) -> None:
    _, data, _ = section
    row = _serving(data, "longlive", True, "h100-sxm")
    # H100 SXM: 81,559 MiB - 4 GiB reserve - 2.6 GB of weights, pages of 16 x 184,320 B.
    blocks = math.floor((81559 * 2**20 - 4 * GIB - WAN_WEIGHTS) / (16 * WAN_BPT))
    assert row["bf16"].num_blocks == blocks
    # A stream's peak: 3 sink frames (4,680 tokens: 293 pages of 16) + 6 frames + the chunk;
    # 1,560 % 16 = 8, so the window + chunk (14,040 tokens) straddle 878 pages: 1,171.
    assert row["bf16"].memory_streams == blocks // 1171
    # Steady pass per stream: 2 x 1.3e9 x 4,680 + 4 x 30 x 1,536 x 4,680 x (4,680 + 9 x 1,560
    # + 512) FLOPs at 0.6 x 989 TFLOP/s; 5 passes + 2 ms each within 0.75 s.
    flops = 2 * 1.3e9 * 4680 + 4 * 30 * 1536 * 4680 * (4680 + 9 * 1560 + 512)
    per_stream = flops / (0.6 * 989e12)
    assert row["bf16"].streams == math.floor((0.75 / 5 - 2e-3) / per_stream)
    assert row["bf16"].limit == "compute"
    assert row["bf16"].single_fps == pytest.approx(12 / (5 * (per_stream + 2e-3)))
    # 8-bit KV: more pages, the same compute.
    assert row["fp8_e4m3"].streams == row["bf16"].streams
    assert row["fp8_e4m3"].memory_streams > row["bf16"].memory_streams
    # Full history: 240 latent frames per 60 s stream, 23,400 pages; the last chunk attends to
    # 237 frames and is far below 16 fps.
    full = _serving(data, "longlive", False, "h100-sxm")["bf16"]
    assert full.memory_streams == blocks // (240 * TPF // 16) and full.streams == 0
    # The article's 720p full history does not fit at all.
    assert _serving(data, "article-720p", False, "h200")["bf16"].memory_streams == 0


def test_time_to_first_chunk(section: tuple[str, dict[str, Any], dict[str, Path]]) -> None:
    _, data, _ = section
    assert data["ttfc"]
    for r in data["ttfc"]:
        cap = _serving(data, r["preset"], True, r["hardware"])["bf16"]
        assert r["streams"] == cap.streams > 0
        assert r["real_time"] == 1.0  # admission control keeps every admitted stream real time
        assert r["rate"] == pytest.approx(0.8 * cap.streams / 60)
        # The first chunk is at least 5 passes of the chunk alone (no history).
        alone = 5 * ((2 * 1.3e9 * 4680 + 4 * 30 * 1536 * 4680 * (4680 + 512)) / (0.6 * 989e12) + 2e-3)
        assert r["ttfc_p99"] >= r["ttfc_p50"] >= alone * (1 - 1e-9)


def test_figure_data(section: tuple[str, dict[str, Any], dict[str, Path]]) -> None:
    md, data, figs = section
    assert_png(figs["fig10_video_serving"])
    assert f"![video serving]({figs['fig10_video_serving'].name})" in md
    assert data["windows"][-1] == "full"
    for hw in ("a100-80gb-sxm", "h100-sxm", "h200"):
        streams = data["window_sweep"][hw]
        assert all(a >= b for a, b in zip(streams, streams[1:]))  # a longer window costs FLOPs
        assert streams[-1] == 0
    # LongLive's own window (6) on the H100 is the section's table row.
    i = data["windows"].index(6)
    assert data["window_sweep"]["h100-sxm"][i] == _serving(data, "longlive", True, "h100-sxm")["bf16"].streams
    mem = data["memory"]
    assert mem["full"][-1] == pytest.approx(960 * TPF * WAN_BPT / GIB)  # 93,600 whole pages
    assert max(mem["windowed"]) == pytest.approx(1171 * 16 * WAN_BPT / GIB)
    assert mem["video_s"][-1] == 240 and len(mem["full"]) == 320
    assert mem["full"][0] == pytest.approx(math.ceil(3 * TPF / 16) * 16 * WAN_BPT / GIB)
    assert "## 8. Video generation" in md
