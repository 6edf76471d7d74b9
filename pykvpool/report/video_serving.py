"""Section 8 of the report, "Video generation: KV per stream and streams per GPU":
the KV one generation stream holds for the video presets
(:data:`pykvpool.planning.video.VIDEO_MODELS`), full history against sinks + window, in bf16
and 8-bit (:data:`pykvpool.planning.video.VIDEO_KV_8BIT`); the concurrent streams each GPU keeps at real time and the time to first chunk,
from the video serving simulator (:mod:`pykvpool.simulate.video`: roofline passes batched
over streams, admission through a real :class:`pykvpool.BlockPool`); and figure 10 (streams
per GPU against the window length; memory per stream over a long video).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pykvpool.planning.hardware import HARDWARE
from pykvpool.planning.ledger import GIB, default_budget
from pykvpool.planning.video import VIDEO_KV_8BIT, VIDEO_MODELS, VideoModel
from pykvpool.plotting import Collision, new_figure
from pykvpool.progress import ProgressBar
from pykvpool.report.figures import save_figure
from pykvpool.report.tables import Table
from pykvpool.simulate.video import (
    VideoRoofline,
    kv_pool_blocks,
    simulate_video,
    streams_at_real_time,
    video_requests,
)
from pykvpool.simulate.video_plots import REPORTED_FPS, stream_kv_curve

__all__ = ["BLOCK_SIZE", "KV_HEADER", "KV_LENGTHS", "LONG_VIDEO", "SERVE_HEADER", "SERVING_SECONDS",
           "TTFC_LOAD", "TTFC_REQUESTS", "WINDOWS", "kv_table", "serve_table", "video_serving_section"]

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
    """One LongLive stream of :data:`LONG_VIDEO` s, full history and sinks + window: GiB of
    the pages it holds during each chunk (:func:`pykvpool.simulate.video_plots.stream_kv_curve`,
    the simulator's pool count), and each GPU's KV budget after the weights."""
    m = VIDEO_MODELS["longlive"]
    out: dict[str, Any] = {}
    for windowed in (False, True):
        curve = stream_kv_curve(m.variant(windowed), float(LONG_VIDEO), BLOCK_SIZE)
        out["windowed" if windowed else "full"] = [float(b) / GIB for b in curve.kv_bytes]
    out["video_s"] = [float(t) for t in curve.video_s]
    out["kv_budget_gib"] = {k: kv_pool_blocks(m, default_budget(h), BLOCK_SIZE) * BLOCK_SIZE
                            * m.kv_bytes_per_token() / GIB for k, h in HARDWARE.items()}
    return out


#: Each GPU's line style in figure 10: colour, marker, line style, a horizontal dodge
#: (window ticks) so that equal counts of two GPUs stay side by side, and the marker's face
#: (only the lowest GPU's is filled: a hollow marker drawn over another hides nothing).
_STYLES = {"a100-80gb-sxm": ("#2e7d32", "o", "-", -0.2, "#2e7d32"), "h100-sxm": ("#1565c0", "s", "--", 0.0, "none"),
           "h200": ("#c62828", "^", "-.", 0.2, "none")}


_Lines = list[tuple[int, str, list[float], list[float]]]


def _draw(sweep: dict[str, list[int]], mem: dict[str, Any]) -> tuple[Any, _Lines]:
    """Figure 10: streams at real time and in memory against the window (one panel each,
    every GPU its own colour, marker, dash and dodge), and one LongLive stream's KV over a
    long video with each GPU's budget (dashed lines marked at staggered times, so that two
    nearly equal budgets both show). Returns the figure and every drawn line: (panel,
    label, xs, ys)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator  # matplotlib loads only with a figure

    fig = new_figure((16.5, 4.8))
    axes = fig.subplots(1, 3)
    lines: _Lines = []
    ticks = list(range(len(WINDOWS)))
    for i, (suffix, what) in enumerate((("", "at real time (16 fps)"), (" memory", "memory only"))):
        ax = axes[i]
        for hw_key, (color, mk, ls, dx, face) in _STYLES.items():
            xs = [x + dx for x in ticks]
            ys = [float(v) if i == 0 else max(v, 0.8) for v in sweep[hw_key + suffix]]
            ax.plot(xs, ys, ls, marker=mk, ms=6, mfc=face,
                    color=color, label=HARDWARE[hw_key].name)
            lines.append((i, HARDWARE[hw_key].name, xs, ys))
        if i == 0:  # a few streams: a linear axis with whole numbers
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        else:  # up to a hundred: a log axis, 0 drawn at 0.8
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xticks(ticks, [str(w) if w is not None else "full" for w in WINDOWS])
        ax.set_xlabel("window (latent frames before the chunk; 3 sink frames)")
        ax.set_ylabel("concurrent streams per GPU" + (" (0 drawn at 0.8)" if i else ""))
        ax.set_title(f"LongLive geometry, {SERVING_SECONDS} s videos, bf16 KV: {what}", fontsize=9)
        ax.grid(alpha=0.25, which="both")
        ax.legend(fontsize=7, loc="upper right")  # counts fall with the window: that corner is free
    a2 = axes[2]
    a2.plot(mem["video_s"], mem["full"], "--", color="#e65100", label="full history")
    a2.plot(mem["video_s"], mem["windowed"], "-", color="#6a1b9a",
            label=f"{_policy(VIDEO_MODELS['longlive'])}")
    lines += [(2, "full history", list(mem["video_s"]), list(mem["full"])),
              (2, "windowed", list(mem["video_s"]), list(mem["windowed"]))]
    end = float(mem["video_s"][-1])
    for j, (hw_key, (color, mk, ls, _, face)) in enumerate(_STYLES.items()):
        gib = float(mem["kv_budget_gib"][hw_key])
        xs = [end * (j + 1 + 3 * n) / 10 for n in range(3) if (j + 1 + 3 * n) < 10]
        a2.axhline(gib, color=color, ls=ls, lw=1)
        a2.plot(xs, [gib] * len(xs), mk, color=color, mfc=face,
                label=f"{HARDWARE[hw_key].name} KV budget ({gib:.1f} GiB)")
        lines.append((2, f"{HARDWARE[hw_key].name} KV budget", xs, [gib] * len(xs)))
    a2.set_xlabel("video generated (s)")
    a2.set_ylabel("KV held by the stream (GiB, bf16, pages of 16)")
    a2.set_title(f"One LongLive stream over {LONG_VIDEO} s", fontsize=10)
    a2.grid(alpha=0.25)
    a2.legend(fontsize=7, loc="upper left")  # the full history rises to the right, from zero
    return fig, lines


def video_serving_section(out_dir: Path, progress: bool = True
                          ) -> tuple[str, dict[str, Any], dict[str, Path]]:
    """Compute the section's tables and simulations, draw ``fig10_video_serving.png`` into
    ``out_dir``, and return the Markdown, the data (with ``collisions``: figure name -> what
    the drawn figure hides, see :func:`pykvpool.report.figures.save_figure`) and the
    figure. Each GPU's budget is its
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
    fig, _ = _draw(sweep, mem)
    hidden: list[Collision] = save_figure(fig, figs["fig10_video_serving"])["collisions"]
    data = {"collisions": {"fig10_video_serving": hidden}, "block_size": BLOCK_SIZE, "kv_lengths": list(KV_LENGTHS), "kv": kv,
            "serving_seconds": SERVING_SECONDS, "serving": serving, "ttfc": ttfc,
            "windows": [w if w is not None else "full" for w in WINDOWS], "window_sweep": sweep,
            "memory": mem, "budgets": {k: default_budget(h).describe() for k, h in HARDWARE.items()}}
    full = serve_table([r for r in serving if not r["windowed"]])
    data["full_history_table"] = {"header": list(full.header), "rows": [list(r) for r in full.rows]}
    return _markdown(kv, serving, ttfc, mem, figs), data, figs


def _cell(cap: Any) -> str:
    if cap.memory_streams == 0:
        return "0 (one stream does not fit)"
    return f"{cap.streams} ({cap.limit})"


KV_HEADER = ("preset", "cache", f"KV B/token bf16 / {VIDEO_KV_8BIT}",
             *(f"{s} s (GiB, bf16 / {VIDEO_KV_8BIT})" for s in KV_LENGTHS))
"""Columns of the KV table (the text and the summary page quote its cells)."""
SERVE_HEADER = ("preset", "cache", "GPU", "KV blocks (bf16)", "streams in memory (bf16)",
                "streams at real time, bf16 KV", f"streams at real time, {VIDEO_KV_8BIT} KV",
                "one stream alone, slowest chunk (fps)")
"""Columns of the streams-per-GPU table."""


def kv_table(kv: list[dict[str, Any]]) -> Table:
    """The KV table: per preset and cache, bytes per token and GiB per stream at each of
    :data:`KV_LENGTHS`, bf16 / 8-bit in one cell.

    Raises:
        KeyError: a row lacks a length or dtype of the section.
    """
    return Table.of(KV_HEADER, [
        [r["preset"], r["policy"], " / ".join(f"{r['bytes_per_token'][d]:,}" for d in _DTYPES)]
        + [" / ".join(f"{r['gib'][s][d]:.2f}" for d in _DTYPES) for s in KV_LENGTHS] for r in kv])


def serve_table(serving: list[dict[str, Any]]) -> Table:
    """The streams-per-GPU table, one row per preset, cache and GPU of ``serving``.

    Raises:
        KeyError: a row lacks a dtype or hardware of the section.
    """
    return Table.of(SERVE_HEADER, [
        [r["preset"], r["policy"], HARDWARE[r["hardware"]].name, f"{r['bf16'].num_blocks:,}",
         r["bf16"].memory_streams, _cell(r["bf16"]), _cell(r[VIDEO_KV_8BIT]),
         f"{r['bf16'].single_fps:.1f}" if r["bf16"].memory_streams else "-"] for r in serving])


def _markdown(kv: list[dict[str, Any]], serving: list[dict[str, Any]], ttfc: list[dict[str, Any]],
              mem: dict[str, Any], figs: dict[str, Path]) -> str:
    kvt = kv_table(kv)
    ttfc_table = Table.of(
        ["preset", "GPU", "streams at once", "arrivals (streams/min)", "TTFC p50 (s)",
         "TTFC p99 (s)", "streams at real time", "peak KV (GiB)"],
        [[r["preset"], HARDWARE[r["hardware"]].name, r["streams"], f"{r['rate'] * 60:.2f}",
          f"{r['ttfc_p50']:.2f}", f"{r['ttfc_p99']:.2f}", f"{r['real_time']:.0%}",
          f"{r['peak_gib']:.2f}"] for r in ttfc]).markdown()
    windowed = serve_table([r for r in serving if r["windowed"]])
    kv_table_md, serve_table_md = kvt.markdown(), windowed.markdown()
    full = [r for r in serving if not r["windowed"]]
    live = sum(r["bf16"].streams > 0 for r in full)
    derived = "; ".join(f"{k}: {', '.join(m.derived)}" for k, m in VIDEO_MODELS.items() if m.derived)
    ll = VIDEO_MODELS["longlive"]
    reported = REPORTED_FPS["longlive"]
    gpu = HARDWARE[reported.hardware].name
    family = gpu.split()[0]  # "H100" of "H100 SXM": the model the source names
    alone_fps = windowed.cell(SERVE_HEADER[-1], {"preset": "longlive", "cache": _policy(ll), "GPU": gpu})
    long_col = f"{LONG_VIDEO} s (GiB, bf16 / {VIDEO_KV_8BIT})"
    full_gib, win_gib = (kvt.cell(long_col, {"preset": "longlive", "cache": _policy(v)}).split(" / ")[0]
                         for v in (ll.variant(False), ll))
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
        kv_table_md + "\n",
        f"Streams per GPU at real time: `n` streams of {SERVING_SECONDS} s arriving together "
        "through the video serving simulator (`pykvpool.simulate.video`); each GPU's budget is "
        "its `default_budget` (" + "; ".join(f"{h.name} {default_budget(h).describe()}"
                                             for h in HARDWARE.values())
        + ") minus the generator's bf16 weights (text encoder and VAE excluded), in a "
        f"`pykvpool.BlockPool` of {BLOCK_SIZE}-token pages (one group: `FullAttention` or "
        "`SlidingWindow(window x tpf + 1, sink_tokens=sinks x tpf)`). A stream is admitted when "
        "the pool holds its peak (sinks + window + chunk, or its whole history). Each GPU pass "
        "runs one denoising (or clean) pass of every running stream's chunk: time = max(FLOPs / "
        "(0.6 x peak bf16), bytes / (0.8 x bandwidth)) + 2 ms, FLOPs = 2 x params x chunk "
        "tokens + 4 x layers x q width x chunk tokens x (visible history + chunk + text tokens), "
        "bytes = weights once + each stream's visible K/V. Real time: every chunk generated within "
        "the video time it holds (16 fps for the Wan presets); `compute` or `memory` says which "
        "bound stops the count. A bisection over simulations finds it "
        "(`pykvpool.simulate.video.streams_at_real_time`). Reproduce with `pykvpool video`.\n",
        serve_table_md + "\n",
        f"With full history, {live} of the {len(full)} (preset, GPU) pairs keep a {SERVING_SECONDS} s "
        "stream at real time (their rows: the appendix).\n",
        f"Sanity check: one LongLive stream alone on the {family} runs at {alone_fps} fps "
        f"on this roofline; LongLive's README reports {reported.fps:g} fps on an {family} (VAE decoding, text "
        "encoding and kernels below 60% of peak are not modelled): the counts above are upper "
        "bounds. The chunk attention is compute-bound, so 8-bit KV changes a count only where "
        "memory binds.\n",
        f"Time to first chunk under load: {TTFC_REQUESTS} requests of {SERVING_SECONDS} s, Poisson "
        f"arrivals at {TTFC_LOAD:.0%} of the real-time capacity, at most that many streams at "
        "once (admission control), windowed presets that keep real time:\n",
        ttfc_table + "\n",
        f"![video serving]({figs['fig10_video_serving'].name})\n",
        f"Left and middle: streams per GPU at real time, and in memory only, against the window "
        f"on LongLive's geometry ({ll.sink_frames} sinks, chunks of {ll.frames_per_chunk}, "
        f"{SERVING_SECONDS} s videos); each GPU has its own colour, marker and dash, shifted "
        "a little sideways where two GPUs keep the same count. Right: KV held by one LongLive "
        f"stream over {LONG_VIDEO} s through the simulator's pool: {full_gib} GiB at {LONG_VIDEO} s "
        f"with full history, flat at {win_gib} GiB with sinks + window (the KV table's bf16 "
        "values; the curves count whole pages of 16 tokens, a little more); the marked lines "
        "are each GPU's KV budget after the weights.\n",
    ])
