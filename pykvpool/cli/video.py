"""The ``pykvpool video`` subcommand: KV per stream of the video generator presets (full
history vs sinks + window, bf16 vs fp8_e4m3) and the streams per GPU that keep real time,
simulated through a real ``BlockPool`` (:mod:`pykvpool.simulate.video`)."""

from __future__ import annotations

import argparse
import os
from typing import Any, Optional

from pykvpool.cli._common import write_outputs
from pykvpool.cli.argtypes import (
    MAX_BLOCK_SIZE,
    add_budget_args,
    add_quiet,
    budget_from_args,
    choice_list,
    hardware_list,
    count,
    number,
)
from pykvpool.planning.hardware import HARDWARE
from pykvpool.planning.ledger import GIB
from pykvpool.planning.video import VIDEO_KV_8BIT, VIDEO_MODELS, VideoModel
from pykvpool.progress import ProgressBar
from pykvpool.report.tables import markdown_table
from pykvpool.simulate.video import RealTimeCapacity, VideoRoofline, kv_pool_blocks, streams_at_real_time
from pykvpool.simulate.video_plots import REPORTED_FPS, plot_kv_over_time, stream_kv_curve

__all__ = ["MAX_SECONDS", "add_subcommand", "main_video"]

MAX_SECONDS = 3600.0
"""Longest video ``--seconds`` accepts (one hour)."""
MAX_FRAMES = 100_000
"""Largest ``--window`` / ``--sinks``, latent frames."""


def _variants(args: argparse.Namespace) -> list[tuple[str, VideoModel]]:
    out = []
    for key in args.models:
        m = VIDEO_MODELS[key]
        if args.window is not None or args.sinks is not None:
            m = m.with_window(m.window_frames if args.window is None else args.window, args.sinks)
        out += [(key, m.variant(False)), (key, m)]
    return out


def _cache(m: VideoModel) -> str:
    if m.window_frames is None:
        return "full history"
    return f"{m.sink_frames} sinks + {m.window_frames} frames + chunk {m.frames_per_chunk}"


def _reported(args: argparse.Namespace, key: str, m: VideoModel, hw_key: str) -> Optional[float]:
    """The fps the preset's source reports on ``hw_key``, for the preset's own policy."""
    r = REPORTED_FPS.get(key)
    own = m == VIDEO_MODELS[key]
    return r.fps if r is not None and own and r.hardware == hw_key else None


def _fps_lines(args: argparse.Namespace, caps: dict[tuple[str, str], RealTimeCapacity]) -> list[str]:
    """One stream alone: the roofline's fps beside what each selected preset's source reports."""
    lines = []
    for key in args.models:
        r = REPORTED_FPS.get(key)
        if r is None:
            continue
        name, hw = VIDEO_MODELS[key].name, HARDWARE[r.hardware].name
        cap = caps.get((key, r.hardware))
        if args.window is not None or args.sinks is not None:
            lines.append(f"{name}: {r.source} reports {r.fps:g} fps for its own window, not the one asked "
                         "(--window/--sinks)")
        elif cap is None:
            lines.append(f"{name}: {r.source} reports {r.fps:g} fps on the {hw} (add --hardware {r.hardware} "
                         "to compare)")
        else:
            lines.append(f"{name}, one stream alone on the {hw}: {cap.single_fps:.1f} fps estimated by this "
                         f"roofline (slowest chunk) vs {r.fps:g} fps reported ({r.source}); VAE decoding, text "
                         "encoding and kernels below 60% of peak are not modelled, so stream counts are upper "
                         "bounds")
    return lines


def _figure(args: argparse.Namespace, variants: list[tuple[str, VideoModel]],
            pool_blocks: dict[tuple[int, str], int]) -> Optional[str]:
    """``kv_over_time.png`` in ``--out``: one panel per preset, its variants' KV over the video."""
    if not args.out:
        return None
    panels: dict[str, list[Any]] = {}
    budgets: dict[str, dict[str, float]] = {}
    for i, (key, m) in enumerate(variants):
        title = f"{VIDEO_MODELS[key].name}, {args.seconds:g} s"
        panels.setdefault(title, []).append(stream_kv_curve(m, args.seconds, args.block_size))
        page = args.block_size * m.kv_bytes_per_token()
        budgets[title] = {HARDWARE[hk].name: pool_blocks[(i, hk)] * page / GIB for hk in args.hardware}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "kv_over_time.png")
    plot_kv_over_time(panels, path, budgets)
    return path


def main_video(args: argparse.Namespace) -> int:
    """Run ``pykvpool video``: print the KV table and the streams-per-GPU table (and write
    them under ``--out``). Returns 0.

    Raises:
        InvalidArgumentError: a budget the options make invalid, or one whose weights leave
            no room for KV (BudgetError).
        OSError: ``--out`` cannot be written.
    """
    variants = _variants(args)
    s = args.seconds
    hws = {k: HARDWARE[k] for k in args.hardware}
    budgets = {k: budget_from_args(args, hw) for k, hw in hws.items()}
    # Refused budgets fail here, before any progress bar.
    pool_blocks = {(i, hk): kv_pool_blocks(m, budgets[hk], args.block_size)
                   for i, (_, m) in enumerate(variants) for hk in hws}
    kv_rows = [[key, _cache(m), f"{m.kv_bytes_per_token('bf16'):,} / {m.kv_bytes_per_token(VIDEO_KV_8BIT):,}",
                f"{m.kv_stream_bytes(s, 'bf16') / GIB:.2f}", f"{m.kv_stream_bytes(s, VIDEO_KV_8BIT) / GIB:.2f}"]
               for key, m in variants]
    serve_rows: list[list[object]] = []
    data: dict[str, Any] = {"seconds": s, "block_size": args.block_size,
                            "budgets": {k: b.describe() for k, b in budgets.items()}, "kv": [], "streams": []}
    for key, m in variants:
        data["kv"].append({"preset": key, "cache": _cache(m),
                           "bytes": {d: m.kv_stream_bytes(s, d) for d in ("bf16", VIDEO_KV_8BIT)}})
    caps: dict[tuple[str, str], RealTimeCapacity] = {}
    with ProgressBar("simulating streams", len(variants) * len(hws), enabled=not args.quiet) as bar:
        for i, (key, m) in enumerate(variants):
            for hk, hw in hws.items():
                blocks = pool_blocks[(i, hk)]
                cap = streams_at_real_time(VideoRoofline(m, hw), s, blocks, args.block_size)
                reported = _reported(args, key, m, hk)
                if reported is not None:
                    caps[(key, hk)] = cap
                serve_rows.append([key, _cache(m), hw.name, f"{blocks:,}", cap.memory_streams,
                                   cap.streams, cap.limit if cap.memory_streams else "memory (does not fit)",
                                   f"{cap.single_fps:.1f}" if cap.memory_streams else "-",
                                   "-" if reported is None else f"{reported:g}"])
                data["streams"].append({"preset": key, "cache": _cache(m), "hardware": hk,
                                        "capacity": vars(cap), "reported_fps": reported})
                bar(len(serve_rows))
    kv_md = markdown_table(["preset", "cache", f"KV B/token bf16 / {VIDEO_KV_8BIT}",
                            f"GiB / stream @ {s:g} s bf16", VIDEO_KV_8BIT], kv_rows)
    serve_md = markdown_table(["preset", "cache", "GPU", "KV blocks", "streams in memory",
                               "streams at real time", "limit", "one stream alone (fps)",
                               "reported (fps)"], serve_rows)
    print(f"KV per stream at {s:g} s of video ({VIDEO_KV_8BIT}, the 8-bit KV a VideoCache stores: 1 B per "
          "element, one fp32 scale per layer, K/V and KV head):\n" + kv_md + "\n")
    print(f"Streams of {s:g} s per GPU at real time (bf16 KV, pages of {args.block_size} tokens; "
          "budgets: " + "; ".join(f"{hws[k].name} {b}" for k, b in data["budgets"].items()) + "):\n"
          + serve_md)
    fps = _fps_lines(args, caps)
    if fps:
        print("\n" + "\n".join(fps))
    write_outputs(args.out, "video", kv_md + "\n\n" + serve_md + "\n" + "".join(f"\n{ln}\n" for ln in fps), data)
    fig = _figure(args, variants, pool_blocks)
    if fig:
        print(f"wrote {fig} (KV held by one stream over the video)")
    return 0


def add_subcommand(sub: Any) -> None:
    """Add the ``video`` subcommand to a ``pykvpool`` CLI's subparsers; it calls
    :func:`main_video`.

    Raises:
        argparse.ArgumentError: ``subparsers`` already has a command of that name (Python
            3.11 and later).
    """
    pv = sub.add_parser("video", help="video generation: KV per stream and streams per GPU",
                        description="KV per stream of autoregressive video generators (full "
                                    f"history vs sinks + window, bf16 vs {VIDEO_KV_8BIT}) and the streams "
                                    "each GPU keeps at real time, simulated through a BlockPool.")
    pv.add_argument("--models", type=choice_list(tuple(VIDEO_MODELS)), default=list(VIDEO_MODELS),
                    metavar="NAMES", help=f"comma-separated presets (default all: {', '.join(VIDEO_MODELS)})")
    pv.add_argument("--hardware", type=hardware_list(), default=list(HARDWARE),
                    metavar="NAMES", help=f"comma-separated devices (default all: {', '.join(HARDWARE)})")
    pv.add_argument("--seconds", type=number(0.0, MAX_SECONDS), default=60.0,
                    help="seconds of video per stream (default 60)")
    pv.add_argument("--window", type=count(0, MAX_FRAMES), metavar="FRAMES",
                    help="latent frames before the chunk each query sees (default: each preset's)")
    pv.add_argument("--sinks", type=count(0, MAX_FRAMES), metavar="FRAMES",
                    help="sink frames (default: each preset's)")
    pv.add_argument("--block-size", type=count(1, MAX_BLOCK_SIZE), default=16,
                    help="tokens per page (default 16)")
    add_budget_args(pv.add_argument_group("budget (each device's default unless given)"))
    pv.add_argument("--out", metavar="DIR", help="also write the results into DIR: video.md, video.json and "
                    "kv_over_time.png (KV held by one stream over the video, per preset)")
    add_quiet(pv)
    pv.set_defaults(func=main_video)
