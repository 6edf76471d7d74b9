"""Section 8 of the report, "Video generation: KV per stream and streams per GPU":
the KV one generation stream holds for the video presets
(:data:`pykvpool.planning.video.VIDEO_MODELS`), full history against sinks + window, in bf16
and 8-bit (:data:`pykvpool.planning.video.VIDEO_KV_8BIT`); the concurrent streams each GPU keeps at real time and the time to first chunk,
from the video serving simulator (:mod:`pykvpool.simulate.video`: roofline passes batched
over streams, admission through a real :class:`pykvpool.HybridPool`); and figure 10 (streams
per GPU against the window length; memory per stream over a long video).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pykvpool.planning.hardware import HARDWARE
from pykvpool.planning.ledger import GIB, default_budget
from pykvpool.planning.video import VIDEO_KV_8BIT, VIDEO_MODELS, VideoModel
from pykvpool.plotting import new_figure, save
from pykvpool.progress import ProgressBar
from pykvpool.report.tables import markdown_table
from pykvpool.simulate.video import (
    VideoRoofline,
    kv_pool_blocks,
    simulate_video,
    streams_at_real_time,
    video_requests,
)

__all__ = ["BLOCK_SIZE", "KV_LENGTHS", "LONG_VIDEO", "SERVING_SECONDS", "TTFC_LOAD",
           "TTFC_REQUESTS", "WINDOWS", "video_serving_section"]

BLOCK_SIZE = 16
"""Tokens per block of every pool of the section."""
KV_LENGTHS = (5, 60, 240)
"""Video lengths of the KV table, seconds."""
SERVING_SECONDS = 60
"""Length of the videos the real-time tables and the window sweep serve, seconds."""
TTFC_LOAD = 0.8
"""Arrival rate of the time-to-first-chunk runs, as a share of the real-time capacity."""
TTFC_REQUESTS = 100
"""Requests per time-to-first-chunk run."""
WINDOWS = (0, 3, 6, 12, 18, 24, 36, 48, None)
"""Windows (latent frames before the chunk; None: full history) of figure 10's left panel,
on LongLive's geometry (3 sink frames)."""
LONG_VIDEO = 240
"""Length of figure 10's right panel, seconds (LongLive's longest video)."""


_DTYPES = ("bf16", VIDEO_KV_8BIT)
"""The KV dtypes of the section's tables: bf16 and the video cache's 8-bit one."""


def _policy(m: VideoModel) -> str:
    if m.window_frames is None:
        return "full history"
    return f"{m.sink_frames} sinks + {m.window_frames} frames + chunk {m.frames_per_chunk}"


def _kv_rows() -> list[dict[str, Any]]:
    rows = []
    for key, m in VIDEO_MODELS.items():
        for windowed in (False, True):
            v = m.variant(windowed)
            rows.append({"preset": key, "policy": _policy(v), "windowed": windowed,
                         "bytes_per_token": {d: v.kv_bytes_per_token(d) for d in _DTYPES},
                         "gib": {s: {d: v.kv_stream_bytes(s, d) / GIB for d in _DTYPES}
                                 for s in KV_LENGTHS}})
    return rows


def _serving_rows(progress: Callable[[int], None]) -> list[dict[str, Any]]:
    rows = []
    for key, m in VIDEO_MODELS.items():
        for windowed in (False, True):
            v = m.variant(windowed)
            for hw_key, hw in HARDWARE.items():
                row: dict[str, Any] = {"preset": key, "policy": _policy(v), "windowed": windowed,
                                       "hardware": hw_key}
                for dt in _DTYPES:
                    blocks = kv_pool_blocks(v, default_budget(hw), BLOCK_SIZE, dt)
                    cap = streams_at_real_time(VideoRoofline(v, hw, kv_dtype=dt), SERVING_SECONDS,
                                               blocks, BLOCK_SIZE)
                    row[dt] = cap
                rows.append(row)
            progress(len(rows) // len(HARDWARE))
    return rows


def _ttfc_rows(serving: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Poisson arrivals at :data:`TTFC_LOAD` of the real-time capacity, at most that many
    streams at once, for the windowed presets that keep real time."""
    rows = []
    for r in serving:
        cap = r["bf16"]
        if not r["windowed"] or cap.streams == 0:
            continue
        v, hw = VIDEO_MODELS[r["preset"]], HARDWARE[r["hardware"]]
        rate = TTFC_LOAD * cap.streams / SERVING_SECONDS
        reqs = video_requests(TTFC_REQUESTS, float(SERVING_SECONDS), rate=rate, seed=14)
        res = simulate_video(reqs, VideoRoofline(v, hw), cap.num_blocks, BLOCK_SIZE,
                             max_streams=cap.streams)
        ttfc = np.array([s.time_to_first_chunk for s in res.streams])
        rows.append({"preset": r["preset"], "hardware": r["hardware"], "streams": cap.streams,
                     "rate": rate, "ttfc_p50": float(np.median(ttfc)),
                     "ttfc_p99": float(np.percentile(ttfc, 99)),
                     "real_time": sum(res.real_time(s) for s in res.streams) / len(res.streams),
                     "peak_gib": float(res.used_blocks.max()) * res.bytes_per_block / GIB})
    return rows


def _window_sweep() -> dict[str, list[int]]:
    base = VIDEO_MODELS["longlive"]
    out: dict[str, list[int]] = {}
    for hw_key, hw in HARDWARE.items():
        for w in WINDOWS:
            m = base.with_window(w)
            blocks = kv_pool_blocks(m, default_budget(hw), BLOCK_SIZE)
            cap = streams_at_real_time(VideoRoofline(m, hw), SERVING_SECONDS, blocks, BLOCK_SIZE)
            out.setdefault(hw_key, []).append(cap.streams)
            out.setdefault(f"{hw_key} memory", []).append(cap.memory_streams)
    return out


def _memory_curves() -> dict[str, Any]:
    """One LongLive stream of :data:`LONG_VIDEO` s through the simulator, full history and
    sinks + window, in a pool that holds its whole history: GiB held during each chunk."""
    hw = HARDWARE["h100-sxm"]
    out: dict[str, Any] = {}
    for windowed in (False, True):
        m = VIDEO_MODELS["longlive"].variant(windowed)
        res = simulate_video(video_requests(1, float(LONG_VIDEO)), VideoRoofline(m, hw),
                             m.peak_blocks(LONG_VIDEO, BLOCK_SIZE), BLOCK_SIZE)
        held = [b for _, b in res.streams[0].memory[:-1]]
        out["full" if not windowed else "windowed"] = [b * res.bytes_per_block / GIB for b in held]
    n = len(out["full"])
    m = VIDEO_MODELS["longlive"]
    out["video_s"] = [(c + 1) * m.chunk_seconds for c in range(n)]
    out["kv_budget_gib"] = {k: kv_pool_blocks(m, default_budget(h), BLOCK_SIZE) * BLOCK_SIZE
                            * m.kv_bytes_per_token() / GIB for k, h in HARDWARE.items()}
    return out


def _fig(path: str | os.PathLike[str], sweep: dict[str, list[int]], mem: dict[str, Any]) -> None:
    fig = new_figure((13.5, 4.8))
    a1, a2 = fig.subplots(1, 2)
    xs = list(range(len(WINDOWS)))
    colors = {"a100-80gb-sxm": "#2e7d32", "h100-sxm": "#1565c0", "h200": "#c62828"}
    marks = {"a100-80gb-sxm": ("o", 6, None), "h100-sxm": ("s", 10, "none"), "h200": ("^", 5, None)}
    for hw_key, color in colors.items():
        name = HARDWARE[hw_key].name
        mk, ms, mfc = marks[hw_key]
        a1.plot(xs, [max(v, 0.8) for v in sweep[hw_key]], "-", marker=mk, ms=ms, mfc=mfc,
                color=color, label=f"{name}: at real time (16 fps)")
        a1.plot(xs, sweep[f"{hw_key} memory"], ":", color=color, lw=1, label=f"{name}: memory only")
    a1.set_yscale("log")
    a1.set_xticks(xs, [str(w) if w is not None else "full" for w in WINDOWS])
    a1.set_xlabel("window (latent frames before the chunk; 3 sink frames)")
    a1.set_ylabel("concurrent streams per GPU (0 drawn at 0.8)")
    a1.set_title(f"LongLive geometry, {SERVING_SECONDS} s videos, bf16 KV", fontsize=10)
    a1.grid(alpha=0.25, which="both")
    a1.legend(fontsize=7)
    a2.plot(mem["video_s"], mem["full"], "--", color="#e65100", label="full history")
    a2.plot(mem["video_s"], mem["windowed"], "-", color="#1565c0",
            label=f"{_policy(VIDEO_MODELS['longlive'])}")
    for hw_key, color in colors.items():
        a2.axhline(mem["kv_budget_gib"][hw_key], color=color, ls=":", lw=1,
                   label=f"{HARDWARE[hw_key].name} KV budget")
    a2.set_xlabel("video generated (s)")
    a2.set_ylabel("KV held by the stream (GiB, bf16, pages of 16)")
    a2.set_title(f"One LongLive stream over {LONG_VIDEO} s", fontsize=10)
    a2.grid(alpha=0.25)
    a2.legend(fontsize=7)
    save(fig, path)


def video_serving_section(out_dir: Path, progress: bool = True
                          ) -> tuple[str, dict[str, Any], dict[str, Path]]:
    """Compute the section's tables and simulations, draw ``fig10_video_serving.png`` into
    ``out_dir``, and return the Markdown, the data and the figure. Each GPU's budget is its
    :func:`pykvpool.planning.ledger.default_budget`.

    Raises:
        OSError: the figure cannot be written.
    """
    total = 2 * len(VIDEO_MODELS) + 3
    with ProgressBar("video serving (simulator)", total, enabled=progress) as bar:
        kv = _kv_rows()
        serving = _serving_rows(bar)
        ttfc = _ttfc_rows(serving)
        bar(total - 2)
        sweep = _window_sweep()
        bar(total - 1)
        mem = _memory_curves()
        bar(total)
    figs = {"fig10_video_serving": out_dir / "fig10_video_serving.png"}
    _fig(figs["fig10_video_serving"], sweep, mem)
    data = {"block_size": BLOCK_SIZE, "kv_lengths": list(KV_LENGTHS), "kv": kv,
            "serving_seconds": SERVING_SECONDS, "serving": serving, "ttfc": ttfc,
            "windows": [w if w is not None else "full" for w in WINDOWS], "window_sweep": sweep,
            "memory": mem, "budgets": {k: default_budget(h).describe() for k, h in HARDWARE.items()}}
    return _markdown(kv, serving, ttfc, mem, figs), data, figs


def _cell(cap: Any) -> str:
    if cap.memory_streams == 0:
        return "0 (one stream does not fit)"
    return f"{cap.streams} ({cap.limit})"


def _markdown(kv: list[dict[str, Any]], serving: list[dict[str, Any]], ttfc: list[dict[str, Any]],
              mem: dict[str, Any], figs: dict[str, Path]) -> str:
    kv_table = markdown_table(
        ["preset", "cache", f"KV B/token bf16 / {VIDEO_KV_8BIT}"]
        + [f"{s} s (GiB, bf16 / {VIDEO_KV_8BIT})" for s in KV_LENGTHS],
        [[r["preset"], r["policy"], " / ".join(f"{r['bytes_per_token'][d]:,}" for d in _DTYPES)]
         + [" / ".join(f"{r['gib'][s][d]:.2f}" for d in _DTYPES) for s in KV_LENGTHS] for r in kv])
    serve_table = markdown_table(
        ["preset", "cache", "GPU", "KV blocks (bf16)", "streams in memory (bf16)",
         "streams at real time, bf16 KV", f"streams at real time, {VIDEO_KV_8BIT} KV",
         "one stream alone, slowest chunk (fps)"],
        [[r["preset"], r["policy"], HARDWARE[r["hardware"]].name, f"{r['bf16'].num_blocks:,}",
          r["bf16"].memory_streams, _cell(r["bf16"]), _cell(r[VIDEO_KV_8BIT]),
          f"{r['bf16'].single_fps:.1f}" if r["bf16"].memory_streams else "-"] for r in serving])
    ttfc_table = markdown_table(
        ["preset", "GPU", "streams at once", "arrivals (streams/min)", "TTFC p50 (s)",
         "TTFC p99 (s)", "streams at real time", "peak KV (GiB)"],
        [[r["preset"], HARDWARE[r["hardware"]].name, r["streams"], f"{r['rate'] * 60:.2f}",
          f"{r['ttfc_p50']:.2f}", f"{r['ttfc_p99']:.2f}", f"{r['real_time']:.0%}",
          f"{r['peak_gib']:.2f}"] for r in ttfc])
    derived = "; ".join(f"{k}: {', '.join(m.derived)}" for k, m in VIDEO_MODELS.items() if m.derived)
    ll = VIDEO_MODELS["longlive"]
    h100 = next(r for r in serving if r["preset"] == "longlive" and r["windowed"]
                and r["hardware"] == "h100-sxm")["bf16"]
    return "\n".join([
        "## 8. Video generation: KV per stream and streams per GPU\n",
        "Presets (`pykvpool.planning.video.VIDEO_MODELS`): the article's 720p example (Llama-3-8B's "
        "KV shape, 14,400 tokens per latent frame), Self-Forcing and LongLive on Wan2.1-T2V-1.3B "
        "(1,560 tokens per latent frame, chunks of 3, 4 denoising steps + a clean pass, 16 fps) "
        "and a MAGI-1-like 24B model (48 layers, GQA 8 x 128, 720x1280, 24 fps, chunks of 6, 16 "
        f"steps). Derived or unverified fields: {derived}. Self-Forcing's 21-frame cache is the "
        "chunk plus 18 frames; LongLive's `local_attn_size: 12` is its whole attended span: 3 "
        "sinks, 6 frames before the chunk and the chunk's 3. KV per token = 2 x layers x KV "
        "heads x vector, a vector being head_dim x 2 bytes in bf16 and head_dim x 1 byte in "
        f"{VIDEO_KV_8BIT}, the 8-bit KV `pykvpool.video.VideoCache` stores (`KvCache`'s fp8: one fp32 "
        "scale per layer, K/V and KV head, none per token; the bytes are "
        "`KvCache.bytes_per_token`'s). A stream's KV is its peak (the "
        "last chunk, unpaged); with full history it grows with the video, with sinks + window "
        "it is flat.\n",
        kv_table + "\n",
        f"Streams per GPU at real time: `n` streams of {SERVING_SECONDS} s arriving together "
        "through the video serving simulator (`pykvpool.simulate.video`); each GPU's budget is "
        "its `default_budget` (" + "; ".join(f"{h.name} {default_budget(h).describe()}"
                                             for h in HARDWARE.values())
        + ") minus the generator's bf16 weights (text encoder and VAE excluded), in a "
        f"`pykvpool.HybridPool` of {BLOCK_SIZE}-token pages (one group: `FullAttention` or "
        "`SlidingWindow(window x tpf + 1, sink_tokens=sinks x tpf)`). A stream is admitted when "
        "the pool holds its peak (sinks + window + chunk, or its whole history). Each GPU pass "
        "runs one denoising (or clean) pass of every running stream's chunk: time = max(FLOPs / "
        "(0.6 x peak bf16), bytes / (0.8 x bandwidth)) + 2 ms, FLOPs = 2 x params x chunk "
        "tokens + 4 x layers x q width x chunk tokens x (visible history + chunk + text tokens), "
        "bytes = weights once + each stream's visible K/V. Real time: every chunk generated within "
        "the video time it holds (16 fps for the Wan presets); `compute` or `memory` says which "
        "bound stops the count. A bisection over simulations finds it "
        "(`pykvpool.simulate.video.streams_at_real_time`). Reproduce with `pykvpool video`.\n",
        serve_table + "\n",
        f"Sanity check: one LongLive stream alone on the H100 runs at {h100.single_fps:.1f} fps "
        "on this roofline; LongLive's README reports 20.7 fps on an H100 (VAE decoding, text "
        "encoding and kernels below 60% of peak are not modelled): the counts above are upper "
        "bounds. The chunk attention is compute-bound, so 8-bit KV changes a count only where "
        "memory binds.\n",
        f"Time to first chunk under load: {TTFC_REQUESTS} requests of {SERVING_SECONDS} s, Poisson "
        f"arrivals at {TTFC_LOAD:.0%} of the real-time capacity, at most that many streams at "
        "once (admission control), windowed presets that keep real time:\n",
        ttfc_table + "\n",
        f"![video serving]({figs['fig10_video_serving'].name})\n",
        f"Left: streams per GPU at real time against the window on LongLive's geometry "
        f"({ll.sink_frames} sinks, chunks of {ll.frames_per_chunk}, {SERVING_SECONDS} s videos), "
        "with the memory-only count dotted. Right: KV held by one LongLive stream over "
        f"{LONG_VIDEO} s through the simulator's pool: {mem['full'][-1]:.1f} GiB at the end with "
        f"full history, {max(mem['windowed']):.2f} GiB flat with sinks + window; the dotted lines "
        "are each GPU's KV budget after the weights.\n",
    ])
