"""One video stream's KV over time, its figure, and the frame rates the presets' sources
report (what ``pykvpool video`` prints beside the roofline's estimate).

A stream holds, while it generates chunk ``c``, the pages the hybrid pool keeps under its
release rule (:meth:`pykvpool.planning.video.VideoModel.stream_blocks`, the count
:mod:`pykvpool.simulate.video` reaches by simulation): with full history they grow with the
video, with sinks + window they stop at the cap of the sinks, the window and the chunk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import numpy.typing as npt

from pykvpool.checks import check_count, check_positive, invalid
from pykvpool.planning.video import VideoModel
from pykvpool.plotting import new_figure, save

__all__ = ["DPI", "REPORTED_FPS", "KvCurve", "ReportedFps", "kv_over_time_figure", "plot_kv_over_time",
           "stream_kv_curve"]

GIB = 2**30
#: Pixels per inch of the written figure (it is laid out at it).
DPI = 120
#: Seconds of video long enough for any window to fill: ``VideoModel.peak_blocks`` reads only
#: the chunks up to one page period past that, so its answer is the windowed cap.
_LONG_S = 1e9


@dataclass(frozen=True)
class ReportedFps:
    """A generator's frame rate as its authors report it.

    Attributes:
        fps: video frames per second of one stream; hardware: the
            :data:`pykvpool.planning.hardware.HARDWARE` key it was measured on; source: where.
    """

    fps: float
    hardware: str
    source: str


#: Reported frame rates by :data:`pykvpool.planning.video.VIDEO_MODELS` key, for the
#: preset's own cache policy (LongLive: its paper's abstract and README, one H100, the
#: whole pipeline: text encoder, VAE decoding and kernels the roofline does not model).
REPORTED_FPS: dict[str, ReportedFps] = {
    "longlive": ReportedFps(20.7, "h100-sxm", "LongLive's paper and README (arXiv 2509.22622), one H100"),
}


@dataclass(frozen=True)
class KvCurve:
    """KV one stream holds during each chunk.

    Attributes:
        model: the generator and its cache policy.
        video_s: video seconds generated at the end of each chunk.
        latent_frames: latent frames generated at the end of each chunk.
        kv_bytes: bytes of the pages the stream holds during each chunk.
        cap_bytes: the most a stream of any length holds (sinks + window + chunk, in pages);
            None with full history, which has no cap.
        block_size: tokens per page; kv_dtype: the KV storage dtype.
    """

    model: VideoModel
    video_s: npt.NDArray[np.float64]
    latent_frames: npt.NDArray[np.int64]
    kv_bytes: npt.NDArray[np.float64]
    cap_bytes: Optional[float]
    block_size: int
    kv_dtype: str


def stream_kv_curve(model: VideoModel, duration_s: float, block_size: int = 16,
                    kv_dtype: str = "bf16") -> KvCurve:
    """The KV one stream of ``duration_s`` seconds of video holds during each of its chunks,
    in pages of ``block_size`` tokens of ``kv_dtype`` (pure arithmetic: no pool is made,
    so any length runs in time linear in its chunks).

    Raises:
        InvalidArgumentError: ``duration_s`` not a finite number > 0, ``block_size`` < 1, a
            malformed ``kv_dtype``.
        UnknownPresetError: an unknown ``kv_dtype``.
    """
    n = model.num_chunks(check_positive(duration_s, "duration_s"))
    bs = check_count(block_size, "block_size", 1)
    page = bs * model.kv_bytes_per_token(kv_dtype)
    chunks = np.arange(1, n + 1, dtype=np.int64)
    blocks = np.array([model.stream_blocks(c, bs) for c in range(n)], dtype=np.float64)
    cap = float(model.peak_blocks(_LONG_S, bs) * page) if model.windowed else None
    video_s: npt.NDArray[np.float64] = chunks.astype(np.float64) * model.chunk_seconds
    return KvCurve(model, video_s, chunks * model.frames_per_chunk, blocks * page, cap, bs, kv_dtype)


def _cap_label(m: VideoModel, cap: float) -> str:
    return (f"cap {cap / GIB:.2f} GiB: {m.sink_frames} sink + {m.window_frames} window + "
            f"{m.frames_per_chunk} chunk frames")


def _panel(ax: Any, curves: Sequence[KvCurve], budgets: dict[str, float]) -> None:
    """One preset's curves (full history dashed, windowed solid), its caps and budgets."""
    # full history first, thick dashed under the windowed curves: both show where they agree;
    # marked points hollow and each curve's smaller, so equal points nest as rings
    styles = [("--", "#e65100", 2.2, 9.0), ("-", "#1565c0", 1.6, 6.0), ("-.", "#2e7d32", 1.6, 3.5)]
    for i, c in enumerate(curves):
        ls, color, lw, ms = styles[i % len(styles)]
        m = c.model
        label = "full history" if c.cap_bytes is None else f"{m.sink_frames} sinks + {m.window_frames} frames"
        few = len(c.video_s) < 20  # a line through one or two points would not show: mark them
        ax.plot(c.video_s, c.kv_bytes / GIB, ls, color=color, lw=lw, label=label, zorder=3,
                marker="o" if few else None, ms=ms, mfc="none")
        if c.cap_bytes is not None:
            ax.axhline(c.cap_bytes / GIB, color=color, ls=":", lw=1, alpha=0.7, zorder=2,
                       label=_cap_label(c.model, c.cap_bytes))
    for (names, gibs), color in zip(_merged(budgets), ("#6d4c41", "#8e24aa", "#00838f")):
        values = " / ".join(f"{g:.0f}" for g in gibs)
        ax.axhline(gibs[0], color=color, ls=(0, (1, 3)), lw=1.2, zorder=1,
                   label=f"{', '.join(names)} KV budget ({values} GiB)")


def _merged(budgets: dict[str, float]) -> list[tuple[list[str], list[float]]]:
    """Budgets within 3% of each other as one line (two lines that close would hide one)."""
    out: list[tuple[list[str], list[float]]] = []
    for name, gib in sorted(budgets.items(), key=lambda kv: kv[1]):
        if out and gib <= out[-1][1][0] * 1.03:
            out[-1][0].append(name)
            out[-1][1].append(gib)
        else:
            out.append(([name], [gib]))
    return out


def kv_over_time_figure(panels: dict[str, list[KvCurve]],
                        budgets: Optional[dict[str, dict[str, float]]] = None) -> Any:
    """The figure :func:`plot_kv_over_time` writes (a matplotlib Figure, laid out at the
    :data:`DPI` it is saved at).

    Raises:
        InvalidArgumentError: ``panels`` is empty, or a panel has no curve.
    """
    if not panels or not all(panels.values()):
        raise invalid("panels: every panel needs at least one curve")
    from matplotlib import ticker

    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig = new_figure((6.4 * cols, 5.6 * rows))
    fig.set_dpi(DPI)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, (title, curves) in zip(axes, panels.items()):
        _panel(ax, curves, (budgets or {}).get(title, {}))
        m = curves[0].model
        per_s = m.fps / m.temporal_compression
        top = ax.secondary_xaxis("top", functions=(lambda s, k=per_s: s * k, lambda f, k=per_s: f / k))
        top.set_xlabel("latent frames generated", fontsize=8)
        ax.set_yscale("log")
        # plain numbers (0.5, 2, 100) rather than powers of ten
        ax.yaxis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=False))
        ax.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1.2, 0.5)))
        ax.set_xlim(left=0)
        ax.set_xlabel("video generated (s)")
        ax.set_ylabel(f"KV held by one stream (GiB, {curves[0].kv_dtype}, pages of {curves[0].block_size})")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.25, which="both")
        # below the axes: inside them it would cover the flat windowed curves
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.tight_layout()
    return fig


def plot_kv_over_time(panels: dict[str, list[KvCurve]], path: str | os.PathLike[str],
                      budgets: Optional[dict[str, dict[str, float]]] = None) -> None:
    """Draw one panel per entry of ``panels`` (title: its key), KV held (GiB, log scale)
    against video seconds generated (latent frames on the top axis), each windowed curve
    with its cap dotted, and ``budgets[title]`` (name -> GiB, e.g. each GPU's KV budget
    after that generator's weights) as horizontal lines; write it to ``path`` at
    :data:`DPI` (:func:`kv_over_time_figure`).

    Raises:
        InvalidArgumentError: ``panels`` is empty, or a panel has no curve.
        OSError: ``path`` cannot be written.
    """
    save(kv_over_time_figure(panels, budgets), path, dpi=DPI)
