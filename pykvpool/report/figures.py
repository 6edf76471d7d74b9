"""The report's figures (matplotlib, PNG, English labels).

Each ``fig_*`` function draws one figure from data computed elsewhere (ledger, sweeps,
measurements, a live pool), writes it to ``path`` and returns the data it plotted as a
plain dict, so tests can compare it with the sweep that produced it. Every returned dict
also holds what the drawn figure hides (:func:`save_figure`): ``collisions`` (labels over
labels, markers over markers, lines and markers under labels) and ``overlapping_labels``
(the pairs of labels among them), both empty for a readable figure.

Figures are :class:`matplotlib.figure.Figure` objects rendered by the Agg canvas directly:
nothing here selects a global backend or touches ``pyplot``'s state.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.patches as mpatches
import matplotlib.patheffects as pe
import numpy as np
import numpy.typing as npt
from matplotlib.figure import Figure

from pykvpool._native import BlockPool
from pykvpool.planning.hardware import Hardware
from pykvpool.planning.ledger import GIB, MemoryLedger
from pykvpool.planning.roofline import KernelPoint, PrefillPoint
from pykvpool.planning.sweeps import BlockSizeRow, SweepResult
from pykvpool.planning.video import VideoSpec, block_causal_mask
from pykvpool.plotting import Collision, collisions, new_figure, overlapping_labels, save

__all__ = [
    "PoolPicture",
    "fig_block_size_and_traces",
    "fig_memory_ledger",
    "fig_paging",
    "fig_roofline",
    "fig_video",
    "overlapping_labels",
    "paging_demo",
    "save_figure",
]

BLUE, ORANGE, GREEN, PURPLE, GRAY, LIGHT, RED = (
    "#1f4e79", "#c1440e", "#2e7d32", "#7b1fa2", "#8a8a8a", "#bcd7ee", "#b71c1c")
SEQ_COLORS = (BLUE, ORANGE, GREEN, PURPLE, "#00838f", "#6d4c41")
HALO = [pe.withStroke(linewidth=2.2, foreground="white")]
"""White outline that keeps dark text readable on any fill."""


def save_figure(fig: Figure, path: str | os.PathLike[str], dpi: int = 110) -> dict[str, Any]:
    """Lay ``fig`` out, write it to ``path`` (format from the suffix) and say what it hides:
    ``collisions``, everything :func:`pykvpool.plotting.collisions` finds (labels over
    labels, markers over markers, lines and markers under labels), and
    ``overlapping_labels``, the pairs of labels among them. ``dpi``: pixels per inch.

    Raises:
        OSError: ``path`` cannot be written.
        ValueError: matplotlib cannot write the format of ``path``'s suffix, or as
            :func:`pykvpool.plotting.collisions`.
        MemoryError: as :func:`pykvpool.plotting.collisions`.
    """
    fig.set_dpi(dpi)  # a legend placed "best" lands where it will at this resolution
    fig.tight_layout()
    found: list[Collision] = collisions(fig)
    save(fig, path, dpi=dpi, tight_bbox=True)
    return {"collisions": found,
            "overlapping_labels": [(c.first, c.second) for c in found if c.kind == "text/text"]}


def fig_memory_ledger(path: str | os.PathLike[str], gqa: MemoryLedger, mha: MemoryLedger,
                      batches: Sequence[int] = (1, 8, 16, 32, 64, 128), seq_len: int = 8192,
                      seq_lens: Sequence[int] = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
                      ) -> dict[str, Any]:
    """Figure 1. Left: weights / KV / reserve stacked vs batch at ``seq_len`` with the
    device budget line; each bar is labelled with its whole height (weights + KV +
    reserve). Right: KV vs sequence length (log-log) for GQA batch 1, GQA batch 8 and MHA
    batch 8, with the KV budget line. Values in GiB.

    Returns:
        The plotted data (GiB per bar and per point, and the budget lines).

    Raises:
        InvalidArgumentError: a batch or sequence length < 1.
        OSError: ``path`` cannot be written.
        ValueError: matplotlib cannot write the format of ``path``'s suffix.
    """
    w = gqa.weight_bytes / GIB
    kv = [gqa.kv_bytes(seq_len=seq_len, batch=b) / GIB for b in batches]
    reserve = gqa.budget.reserve_bytes / GIB
    device = gqa.budget.usable_bytes / GIB
    kv_budget = gqa.kv_budget_bytes / GIB
    totals = [w + k + reserve for k in kv]
    curves = {
        "GQA batch 1": [gqa.kv_bytes(seq_len=s, batch=1) / GIB for s in seq_lens],
        "GQA batch 8": [gqa.kv_bytes(seq_len=s, batch=8) / GIB for s in seq_lens],
        "MHA batch 8": [mha.kv_bytes(seq_len=s, batch=8) / GIB for s in seq_lens],
    }
    fig = new_figure((12.5, 4.8))
    a1, a2 = fig.subplots(1, 2)
    xs = np.arange(len(batches))
    a1.bar(xs, [w] * len(xs), color=BLUE, label=f"weights ({w:.2f} GiB)")
    a1.bar(xs, kv, bottom=[w] * len(xs), color=ORANGE, label="KV cache")
    a1.bar(xs, [reserve] * len(xs), bottom=[w + k for k in kv], color=LIGHT,
           label=f"activations / framework reserve ({reserve:.0f} GiB)")
    a1.axhline(device, color=RED, ls="--", lw=1.5)
    a1.text(-0.4, device + 3, f"budget {device:.0f} GiB", color=RED, fontsize=9)
    for x, t in zip(xs, totals):
        a1.text(x, t + 2, f"{t:.1f}", ha="center", fontsize=8)
    a1.set_xticks(xs, [str(b) for b in batches])
    a1.set_ylim(0, max(totals) * 1.12)
    a1.set_xlabel(f"batch (sequences of {seq_len} tokens)")
    a1.set_ylabel("memory (GiB)")
    a1.set_title(f"{gqa.model.name} {gqa.dtype.name}: KV overtakes the weights at batch 16+")
    a1.legend(fontsize=8, loc="upper left",
              title="bar label: weights + KV + reserve (GiB)", title_fontsize=8)
    for (label, ys), color, style in zip(curves.items(), (BLUE, ORANGE, PURPLE), ("-o", "-o", "--s")):
        a2.plot(list(seq_lens), ys, style, ms=3.5, color=color, label=label)
    a2.axhline(kv_budget, color=GRAY, ls=":", lw=1.5)
    a2.text(seq_lens[0], kv_budget * 1.12, f"KV budget {kv_budget:.1f} GiB", color=GRAY, fontsize=9)
    a2.set_xscale("log", base=2)
    a2.set_yscale("log")
    a2.set_xlabel("sequence length (tokens)")
    a2.set_ylabel("KV cache (GiB, log)")
    a2.set_title("KV grows linearly with length and batch")
    a2.grid(alpha=0.25, which="both")
    a2.legend(fontsize=8, loc="lower right")
    hidden = save_figure(fig, path)
    return {"batches": list(batches), "seq_len": seq_len, "weights_gib": w, "kv_gib": kv,
            "reserve_gib": reserve, "bar_label_gib": totals, "budget_gib": device,
            "kv_budget_gib": kv_budget, "seq_lens": list(seq_lens), "curves_gib": curves,
            **hidden}


def _roof_panel(ax: Any, hw: Hardware, dtype: str, points: Sequence[tuple[str, float]],
                scale: float, unit: str, color: str) -> list[dict[str, Any]]:
    """The roof of ``hw`` and the ideal points on it (hollow rings drawn over everything,
    so a measured point under one still shows); every label goes to the legend (no
    free-floating annotation to collide), the ridge is labelled above the roof, right of
    its line."""
    peak, bw = hw.flops(dtype), hw.bandwidth
    xs = np.logspace(-1, 5, 300)
    ax.plot(xs, np.minimum(peak, xs * bw) / scale, color=color, lw=2,
            label=f"roof: {bw / 1e9:.4g} GB/s, {peak / scale:.3g} {unit}")
    ridge = peak / bw
    ax.axvline(ridge, color=color, ls=":", lw=1)
    ax.text(ridge * 1.25, peak / scale * 1.6, f"ridge {ridge:.3g} FLOP/B", ha="left", va="bottom",
            color=color, fontsize=8)
    out = []
    for (label, i), c in zip(points, (RED, GREEN, PURPLE, BLUE, ORANGE)):
        y = min(peak, i * bw)
        ax.plot([i], [y / scale], "o", ms=8, mfc="none", mec=c, mew=2.2, zorder=8,
                label=f"{label}: I={i:.3g}, bound {y / scale:.3g} {unit}")
        out.append({"label": label, "intensity": i, "bound_flops": y})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel(f"attainable {unit}")
    ax.set_title(f"{hw.name}: {peak / scale:.3g} {unit} {dtype}, {bw / 1e9:.4g} GB/s\n({hw.source})",
                 fontsize=10)
    ax.grid(alpha=0.25, which="both")
    return out


def _finish_roof_panel(ax: Any, peak: float, ridge: float, title: str) -> None:
    """Ranges fitted to the points and the ridge (more pixels per decade keeps markers
    apart), with room for the ridge label above the roof, and the legend under the panel,
    where it cannot hide a point."""
    marked = [ln for ln in ax.get_lines() if ln.get_marker() not in ("None", "", None)]
    xs = [x for ln in marked for x in np.atleast_1d(ln.get_xdata()) if x > 0] + [ridge]
    ys = [y for ln in marked for y in np.atleast_1d(ln.get_ydata()) if y > 0] + [peak]
    ax.set_xlim(min(xs) / 4, max(xs) * 4)
    ax.set_ylim(min(ys) / 4, peak * 6)
    ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2,
              title=title, title_fontsize=7.5, frameon=False)


def _kernel_points(ax: Any, machine: Hardware, kernel: Sequence[KernelPoint]) -> list[dict[str, Any]]:
    """pykvpool's measured kernel on the machine's roof: each point's share of the roof at
    its own intensity, flagged (label and data) when it lies above it."""
    peak, bw = machine.flops("fp32"), machine.bandwidth
    out = []
    for kp, c in zip(kernel, (RED, GREEN, PURPLE, ORANGE)):
        roof = min(peak, kp.intensity * bw)
        share = kp.flops_per_s / roof
        above = share > 1.0
        label = (f"kernel g={kp.group_size}: {kp.bytes_per_s / 1e9:.1f} GB/s, {share:.0%} of roof"
                 + (" (ABOVE the measured roof)" if above else ""))
        ax.plot([kp.intensity], [kp.flops_per_s / 1e9], "*", ms=11, color=c, mec="black",
                zorder=6, label=label)
        out.append({"group_size": kp.group_size, "intensity": kp.intensity,
                    "flops_per_s": kp.flops_per_s, "bytes_per_s": kp.bytes_per_s,
                    "roof_flops": roof, "share_of_roof": share, "above_roof": above})
    return out


def _prefill_points(ax: Any, machine: Hardware, prefill: Sequence[PrefillPoint]) -> list[dict[str, Any]]:
    """pykvpool's measured multi-query kernel on the machine's roof, each labelled with its
    share of the roof at its intensity: the compute roof, right of the ridge; flagged when
    above it. The shapes' intensities are close: each point gets its own hollow marker
    (diamond, hexagon, pentagon, square) of its own size, so two measured alike nest
    inside each other and both stay visible."""
    peak, bw = machine.flops("fp32"), machine.bandwidth
    out = []
    shapes = (("D", 10.0), ("h", 6.0), ("p", 12.0), ("s", 4.0))  # sizes nest when the points meet
    for pp, c, (m, ms) in zip(prefill, (ORANGE, "#00838f", GRAY, PURPLE), shapes):
        roof = min(peak, pp.intensity * bw)
        share = pp.flops_per_s / roof
        above = share > 1.0
        bound = "compute" if pp.intensity >= peak / bw else "memory"
        label = (f"prefill kernel, {pp.shape.name}: I={pp.intensity:.0f}, "
                 f"{pp.flops_per_s / 1e9:.1f} GFLOP/s, {share:.0%} of the {bound} roof"
                 + (" (ABOVE the measured roof)" if above else ""))
        ax.plot([pp.intensity], [pp.flops_per_s / 1e9], m, ms=ms, mfc="none", mec=c, mew=2.0,
                zorder=7, label=label)
        out.append({"name": pp.shape.name, "intensity": pp.intensity,
                    "flops_per_s": pp.flops_per_s, "bytes_per_s": pp.bytes_per_s,
                    "roof_flops": roof, "share_of_roof": share, "compute_bound": bound == "compute",
                    "above_roof": above})
    return out


def fig_roofline(path: str | os.PathLike[str], accelerator: Hardware,
                 ideal_points: Sequence[tuple[str, float]], machine: Hardware | None,
                 kernel: Sequence[KernelPoint] | None, unavailable_reason: str = "",
                 accelerator_dtype: str = "bf16",
                 prefill: Sequence[PrefillPoint] | None = None) -> dict[str, Any]:
    """Figure 2. Left: this machine's measured fp32 roof with the ideal decode/prefill
    points at fp32 (rings; I halves: 4-byte elements), pykvpool's decode kernel measured
    at those g (stars) and its multi-query kernel measured on ``prefill``'s shapes (one
    hollow shape each), each labelled with its share of the roof at its intensity. Right:
    the accelerator's datasheet roof with the same ideal points at bf16.

    The left roof is ``machine.bandwidth``: pass the bandwidth measured on the kernel's own
    cache (:attr:`KernelPoint.roof_bandwidth`), the measurement the kernel is compared
    with. A kernel point above that roof is flagged in its label and in the returned
    ``kernel[i]["above_roof"]``.

    ``ideal_points`` are (label, intensity at bf16) pairs. When ``machine`` is None the
    left panel states ``unavailable_reason`` instead of a roof.

    Returns:
        The plotted data: roofs (FLOP/s, bytes/s) and points (FLOP/byte, FLOP/s).

    Raises:
        UnknownPresetError: ``accelerator`` has no peak for ``accelerator_dtype``.
        OSError: ``path`` cannot be written.
        ValueError: matplotlib cannot write the format of ``path``'s suffix.
    """
    fig = new_figure((13.0, 6.6))
    a1, a2 = fig.subplots(1, 2)
    data: dict[str, Any] = {"accelerator": accelerator.name, "machine": None, "kernel": [],
                            "prefill": []}
    if machine is not None:
        local = [(label, i / 2) for label, i in ideal_points]
        data["machine"] = {"peak_flops": machine.flops("fp32"), "bandwidth": machine.bandwidth,
                           "points": _roof_panel(a1, machine, "fp32", local, 1e9, "GFLOP/s", BLUE)}
        data["kernel"] = _kernel_points(a1, machine, kernel or [])
        data["prefill"] = _prefill_points(a1, machine, prefill or [])
        _finish_roof_panel(a1, machine.flops("fp32") / 1e9, machine.ridge_point("fp32"),
                           "ideal bounds (rings); pykvpool measured: decode (stars), "
                           "prefill (hollow shapes)")
    else:
        a1.axis("off")
        a1.text(0.5, 0.5, "this machine was not measured:\n" + unavailable_reason,
                ha="center", va="center", fontsize=10, wrap=True, transform=a1.transAxes)
    data["accelerator_points"] = _roof_panel(a2, accelerator, accelerator_dtype, ideal_points,
                                             1e12, "TFLOP/s", ORANGE)
    _finish_roof_panel(a2, accelerator.flops(accelerator_dtype) / 1e12,
                       accelerator.ridge_point(accelerator_dtype), "ideal bounds (rings)")
    data["accelerator_peak_flops"] = accelerator.flops(accelerator_dtype)
    data["accelerator_bandwidth"] = accelerator.bandwidth
    fig.suptitle("Roofline: decode attention (I = 2g/p) sits far below the ridge; prefill above it",
                 fontsize=11)
    data["titles"] = [a1.get_title(), a2.get_title()]
    data["ylabels"] = [a1.get_ylabel(), a2.get_ylabel()]
    data.update(save_figure(fig, path))
    return data


@dataclass(frozen=True)
class PoolPicture:
    """A small live pool's state: each sequence's block table and length, every block's
    refcount and fill (tokens), after interleaved decoding and one fork."""

    block_size: int
    num_blocks: int
    seq_ids: list[int]
    seq_lens: list[int]
    tables: list[list[int]]
    refcounts: list[int]
    fill: list[int]
    owner: list[int]
    shared_blocks: int


def paging_demo(lens: Sequence[int] = (37, 21, 45), block_size: int = 16, spare: int = 3,
                fork_extra: int = 5) -> PoolPicture:
    """Decode the sequences token by token in turn (blocks interleave in the pool), then
    fork sequence 0 into a new sequence that appends ``fork_extra`` tokens (copy-on-write of
    the shared last block). Returns the pool's state as a :class:`PoolPicture`.

    Args:
        lens: each sequence's length, tokens.
        block_size: tokens per block.
        spare: free blocks left in the pool beyond what the sequences and the fork need.
        fork_extra: tokens the fork appends.

    Raises:
        InvalidArgumentError: a negative length or count, or ``block_size`` < 1.
    """
    need = sum(-(-n // block_size) for n in lens) + 2 + spare
    pool = BlockPool(need, block_size)
    ids = list(range(len(lens)))
    for i in ids:
        pool.add_sequence(i, 0)
    left = list(lens)
    while any(left):
        live = [i for i in ids if left[i]]
        pool.step(np.asarray(live), 1)
        for i in live:
            left[i] -= 1
    child = len(lens)
    pool.fork(0, child)
    pool.append(child, fork_extra)
    seqs = ids + [child]
    tables = [pool.block_table(s).tolist() for s in seqs]
    seq_lens = [pool.seq_len(s) for s in seqs]
    fill = [0] * pool.num_blocks
    owner = [-1] * pool.num_blocks
    for s, (table, n) in enumerate(zip(tables, seq_lens)):
        for j, b in enumerate(table):
            fill[b] = max(fill[b], min(block_size, n - j * block_size))
            if owner[b] < 0:
                owner[b] = s
    refcounts = [pool.refcount(b) for b in range(pool.num_blocks)]
    pool.check_invariants()
    return PoolPicture(block_size, pool.num_blocks, seqs, seq_lens, tables, refcounts, fill,
                       owner, pool.stats().shared_blocks)


def fig_paging(path: str | os.PathLike[str], picture: PoolPicture,
               comparisons: Sequence[Sequence[SweepResult]]) -> dict[str, Any]:
    """Figure 3. Left: logical blocks of live sequences mapped into the physical pool, drawn
    from ``picture`` (shared blocks outlined in black, with their refcount). Right:
    admitted requests per policy for each workload; ``comparisons`` holds, per workload,
    the results of each policy (same order for every workload).

    Returns:
        The plotted data (the picture's tables and the admitted counts).

    Raises:
        OSError: ``path`` cannot be written.
        ValueError: matplotlib cannot write the format of ``path``'s suffix.
    """
    fig = new_figure((14.5, 5.6))
    gs = fig.add_gridspec(1, 2, width_ratios=[1.5, 1.0])
    ax = fig.add_subplot(gs[0, 0])
    bs, n_seq = picture.block_size, len(picture.seq_ids)
    w, h, gap = 0.86, 0.62, 0.08
    ax.set_xlim(-2.0, picture.num_blocks * (w + gap) + 0.3)
    ax.set_ylim(-0.9, n_seq + 2.4)
    ax.axis("off")
    ax.set_title(f"Logical blocks -> physical pool (block size {bs}; live BlockPool state)",
                 fontsize=10, loc="left")
    y_pool = 0.0
    for s, table in enumerate(picture.tables):
        y = n_seq - s + 1.0
        c = SEQ_COLORS[s % len(SEQ_COLORS)]
        label = f"seq {picture.seq_ids[s]}" + (" (fork of 0)" if s == n_seq - 1 else "")
        ax.text(-0.2, y + h / 2, f"{label}\n{picture.seq_lens[s]} tok", ha="right",
                va="center", fontsize=8.5)
        for j, b in enumerate(table):
            x = j * (w + gap)
            used = min(bs, picture.seq_lens[s] - j * bs)
            ax.add_patch(mpatches.Rectangle((x, y), w, h, fc=c, alpha=0.25, ec=c))
            ax.add_patch(mpatches.Rectangle((x, y), w * used / bs, h, fc=c, alpha=0.8))
            ax.text(x + w / 2, y + h / 2, str(used), ha="center", va="center", fontsize=9,
                    color="black", fontweight="bold", path_effects=HALO)
            ax.annotate("", xy=(b * (w + gap) + w / 2, y_pool + h), xytext=(x + w / 2, y),
                        arrowprops={"arrowstyle": "-", "color": c, "lw": 0.7, "alpha": 0.6})
    ax.text(-0.2, y_pool + h / 2, "physical\npool", ha="right", va="center", fontsize=8.5)
    for b in range(picture.num_blocks):
        x = b * (w + gap)
        rc = picture.refcounts[b]
        if rc == 0:
            ax.add_patch(mpatches.Rectangle((x, y_pool), w, h, fc="white", ec=GRAY, hatch="//"))
        else:
            c = SEQ_COLORS[picture.owner[b] % len(SEQ_COLORS)]
            ax.add_patch(mpatches.Rectangle((x, y_pool), w, h, fc=c, alpha=0.25,
                                            ec="black" if rc > 1 else c, lw=2 if rc > 1 else 1))
            ax.add_patch(mpatches.Rectangle((x, y_pool), w * picture.fill[b] / bs, h, fc=c,
                                            alpha=0.8))
            if rc > 1:
                ax.text(x + w / 2, y_pool + h + 0.08, f"x{rc}", ha="center", fontsize=8.5,
                        fontweight="bold", path_effects=HALO)
        ax.text(x + w / 2, y_pool - 0.35, str(b), ha="center", fontsize=8.5, color="#444444")
    ax.text(0, n_seq + 2.0, f"number in a block: tokens stored (of {bs}); black outline = block shared "
            "by a fork (refcount shown); hatched = free", fontsize=8.5, color="#444444")

    ax2 = fig.add_subplot(gs[0, 1])
    policies = [r.policy + ("" if r.policy == "contiguous" else f" (b={r.block_size})")
                for r in comparisons[0]]
    width = 0.8 / len(policies)
    admitted = [[r.admitted for r in comp] for comp in comparisons]
    utils = [[r.utilization for r in comp] for comp in comparisons]
    for p, (label, c) in enumerate(zip(policies, (GRAY, BLUE, GREEN, ORANGE))):
        xs = np.arange(len(comparisons)) + (p - (len(policies) - 1) / 2) * width
        vals = [a[p] for a in admitted]
        ax2.bar(xs, vals, width, color=c, label=label)
        for x, v, u in zip(xs, vals, (u[p] for u in utils)):
            ax2.text(x, v + 4, f"{v}\n{u:.1%}", ha="center", fontsize=8)
    ax2.set_xticks(np.arange(len(comparisons)), [c[0].workload for c in comparisons], fontsize=8)
    ax2.set_ylabel("requests admitted (greedy, same KV budget)")
    ax2.set_title("Admitted requests and utilization per policy", fontsize=10)
    ax2.set_ylim(0, max(max(a) for a in admitted) * 1.3)
    ax2.legend(fontsize=8, loc="upper left", title="bar label: admitted, utilization",
               title_fontsize=8)
    ax2.grid(alpha=0.2, axis="y")
    hidden = save_figure(fig, path)
    return {"picture": picture, "policies": policies,
            "workloads": [c[0].workload for c in comparisons], "admitted": admitted,
            "utilization": utils, **hidden}


def fig_video(path: str | os.PathLike[str], videos: Sequence[VideoSpec], bytes_per_token: int,
              device_gib: float, kv_budget_gib: float, mask_chunks: int = 5,
              mask_tokens: int = 12) -> dict[str, Any]:
    """Figure 4. Left: a block-causal mask (bidirectional within a chunk, causal across
    chunks). Right: KV per video (GiB) against the device and KV budget lines; each bar's
    GiB and tokens are written under it, the budgets in the legend, so no line crosses a
    label.

    Returns:
        The plotted data: the mask, tokens and GiB per video, and the two budget lines.

    Raises:
        InvalidArgumentError: ``mask_chunks`` or ``mask_tokens`` < 1.
        OSError: ``path`` cannot be written.
        ValueError: matplotlib cannot write the format of ``path``'s suffix.
    """
    mask = block_causal_mask(mask_chunks, mask_tokens)
    kv = [v.kv_bytes(bytes_per_token) / GIB for v in videos]
    fig = new_figure((12.5, 4.8))
    a1, a2 = fig.subplots(1, 2)
    a1.imshow(mask, cmap="Blues", vmin=0, vmax=1.4, interpolation="nearest")
    for f in range(mask_chunks + 1):
        a1.axhline(f * mask_tokens - 0.5, color=ORANGE, lw=0.8)
        a1.axvline(f * mask_tokens - 0.5, color=ORANGE, lw=0.8)
    ticks = [f * mask_tokens + mask_tokens / 2 - 0.5 for f in range(mask_chunks)]
    a1.set_xticks(ticks, [f"chunk {f + 1}" for f in range(mask_chunks)], fontsize=8)
    a1.set_yticks(ticks, [f"chunk {f + 1}" for f in range(mask_chunks)], fontsize=8)
    a1.set_xlabel("key / value position")
    a1.set_ylabel("query position")
    a1.set_title("Block-causal mask: bidirectional within a chunk, causal across chunks",
                 fontsize=10)
    names = [f"{v.name}\n{k:.2f} GiB\n{v.tokens:,} tokens" for v, k in zip(videos, kv)]
    a2.bar(np.arange(len(kv)), kv, color=[GREEN, ORANGE, RED][: len(videos)] or BLUE, width=0.55)
    a2.set_xticks(np.arange(len(kv)), names, fontsize=8.5)
    a2.axhline(device_gib, color=RED, ls="--", lw=1.5, label=f"device budget {device_gib:.0f} GiB")
    a2.axhline(kv_budget_gib, color=GRAY, ls=":", lw=1.5, label=f"KV budget {kv_budget_gib:.1f} GiB")
    a2.legend(fontsize=8, loc="upper left")
    a2.set_ylim(0, max(kv + [device_gib]) * 1.25)
    a2.set_ylabel("KV cache per video (GiB)")
    a2.set_title(f"{bytes_per_token // 1024} KiB/token, whole history cached", fontsize=10)
    a2.grid(alpha=0.2, axis="y")
    hidden = save_figure(fig, path)
    return {"mask": mask, "videos": [v.name for v in videos], "tokens": [v.tokens for v in videos],
            "kv_gib": kv, "device_gib": device_gib, "kv_budget_gib": kv_budget_gib,
            **hidden}


def fig_block_size_and_traces(path: str | os.PathLike[str], rows: Sequence[BlockSizeRow],
                              workload: str, traces: Sequence[Sequence[SweepResult]],
                              trace_lengths: Sequence[tuple[str, npt.NDArray[np.int64]]]
                              ) -> dict[str, Any]:
    """Figure 5 (beyond the article). Left: block-size sweep, empty slots per request vs
    block-table entries per request. Middle: request-length CDFs of the trace workloads.
    Right: admitted requests per policy on the traces (``traces`` as in
    :func:`fig_paging`).

    Returns:
        The plotted data (per block size, per trace and per policy).

    Raises:
        OSError: ``path`` cannot be written.
        ValueError: matplotlib cannot write the format of ``path``'s suffix.
    """
    fig = new_figure((15.5, 4.6))
    a1, a2, a3 = fig.subplots(1, 3)
    bsz = [r.block_size for r in rows]
    empty = [r.empty_slots_per_request for r in rows]
    entries = [r.table_entries_per_request for r in rows]
    a1.plot(bsz, empty, "-o", color=ORANGE, label="empty slots / request (tokens)")
    a1.plot(bsz, [(b - 1) / 2 for b in bsz], ":", color="black", marker="D", ms=8, mfc="none",
            zorder=4, label="(b-1)/2, expected (drawn on top: it coincides)")
    a1.plot(bsz, entries, "-s", color=BLUE, mfc="none", mew=1.5,
            label="table entries / request (hollow: the curves cross)")
    a1.set_xscale("log", base=2)
    a1.set_yscale("symlog", linthresh=1.0)
    a1.set_xticks(bsz, [str(b) for b in bsz])
    a1.set_ylim(bottom=0)
    a1.set_xlabel("block size b (tokens)")
    a1.set_ylabel("per request (symlog)")
    a1.set_title(f"Block size: waste vs table length\n({workload})", fontsize=10)
    a1.grid(alpha=0.25, which="both")
    a1.legend(fontsize=8)
    for (name, lens), c in zip(trace_lengths, (BLUE, ORANGE, GREEN, PURPLE)):
        srt = np.sort(lens)
        a2.plot(srt, np.arange(1, srt.size + 1) / srt.size, color=c, label=f"{name} (n={srt.size})")
    a2.set_xscale("log")
    a2.set_xlabel("request length, prompt + output (tokens)")
    a2.set_ylabel("fraction of requests")
    a2.set_title("Trace request lengths (CDF)", fontsize=10)
    a2.grid(alpha=0.25, which="both")
    a2.legend(fontsize=8)
    policies = [r.policy + ("" if r.policy == "contiguous" else f" (b={r.block_size})")
                for r in traces[0]]
    width = 0.8 / len(policies)
    admitted = [[r.admitted for r in t] for t in traces]
    for p, (label, c) in enumerate(zip(policies, (GRAY, BLUE, GREEN, ORANGE))):
        xs = np.arange(len(traces)) + (p - (len(policies) - 1) / 2) * width
        a3.bar(xs, [a[p] for a in admitted], width, color=c, label=label)
        for x, v in zip(xs, (a[p] for a in admitted)):
            a3.text(x, v + 3, str(v), ha="center", fontsize=7.5)
    a3.set_xticks(np.arange(len(traces)), [t[0].workload for t in traces], fontsize=8)
    a3.set_ylabel("requests admitted (same KV budget)")
    a3.set_title(f"Traces: contiguous at {traces[0][0].block_size} tokens vs paged", fontsize=10)
    a3.set_ylim(0, max(max(a) for a in admitted) * 1.25)
    a3.legend(fontsize=8, loc="upper left")
    a3.grid(alpha=0.2, axis="y")
    hidden = save_figure(fig, path)
    return {"block_sizes": bsz, "empty_slots_per_request": empty,
            "table_entries_per_request": entries,
            "trace_workloads": [t[0].workload for t in traces], "policies": policies,
            "admitted": admitted, **hidden}
