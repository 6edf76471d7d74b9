"""Figures without pyplot: every plot of the package (report, simulator, prefix replay) is a
:class:`matplotlib.figure.Figure` on its own Agg canvas, saved with :func:`save`. Nothing
selects a global backend, so a user's matplotlib setup is left alone; matplotlib is
imported when a figure is first made, not when pykvpool is.

:func:`collisions` is the readability check every figure owner can run on a figure before
saving it (``assert collisions(fig) == []``): labels over labels, markers over markers,
lines and markers under labels."""

from __future__ import annotations

import os
from itertools import combinations
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from pykvpool.checks import check_positive

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Collision", "collisions", "label_boxes", "new_figure", "overlapping_labels", "save",
           "subplots"]


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure of ``figsize`` (width, height) inches attached to its own Agg canvas (no
    pyplot, no global backend).

    Raises:
        ValueError: a negative, NaN or infinite size (matplotlib).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def subplots(ncols: int, figsize: tuple[float, float]) -> tuple[Figure, list[Any]]:
    """A :func:`new_figure` with one row of ``ncols`` axes.

    Raises:
        ValueError: ``ncols`` < 1, or a size :func:`new_figure` refuses.
    """
    fig = new_figure(figsize)
    axes = fig.subplots(1, ncols, squeeze=False)
    return fig, list(axes[0])


def save(fig: Figure, path: str | os.PathLike[str], dpi: int = 120, tight_bbox: bool = False) -> None:
    """Lay ``fig`` out and write it to ``path`` (format from the suffix) at ``dpi`` pixels
    per inch; ``tight_bbox`` crops the saved image to its drawn content.

    Raises:
        OSError: ``path`` cannot be written.
        ValueError: matplotlib cannot write the format of ``path``'s suffix.
    """
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, bbox_inches="tight" if tight_bbox else None)


class Collision(NamedTuple):
    """One thing of a drawn figure hiding (part of) another: ``kind`` is ``"text/text"``
    (two labels' boxes overlap), ``"marker/marker"`` (two markers overlap and the upper
    one is filled), ``"line/text"`` (a drawn line runs through a label) or
    ``"marker/text"`` (a marker lies under a label); ``first`` and ``second`` name them
    (a label's text, an artist's label with the point in data coordinates)."""

    kind: str
    first: str
    second: str


def collisions(fig: Figure, tolerance_px: float = 1.0, marker_gap_pt: float = 4.0) -> list[Collision]:
    """Everything of ``fig`` that hides data or a label, as a reader sees it once drawn:
    labels (texts, annotations, titles, axis labels, legends) overlapping each other;
    markers (of lines, and scatter points) overlapping another marker or closer to it than
    ``marker_gap_pt`` points (touching markers read as one), unless the upper one is
    hollow so the lower one shows through; drawn lines (the part inside their axes, steps
    included) running through a label; markers under a label. Marker extents are their
    shapes' bounding boxes, edges included. An empty list is a figure that hides nothing.
    Overlaps of labels and lines of at most ``tolerance_px`` pixels are let through. Lays
    the figure out by drawing it without rendering, at the figure's dpi (set it to the
    dpi it will be saved at first: a legend placed ``"best"`` moves with it); at most one
    collision is listed per pair of artists. Time grows with the number of markers squared and with the line
    points times the labels.

    Raises:
        InvalidArgumentError: ``tolerance_px`` or ``marker_gap_pt`` is negative or not
            finite.
        ValueError: a label holds mathtext (``$...$``) that matplotlib cannot parse.
        MemoryError: the figure is too large for the Agg canvas to allocate.
    """
    _check_tolerance(tolerance_px)
    gap = check_positive(marker_gap_pt, "marker_gap_pt", zero=True) * fig.dpi / 72.0
    labels = label_boxes(fig)
    found = [Collision("text/text", a, b) for a, b in _overlapping_boxes(labels, tolerance_px)]
    for ax in fig.axes:
        if ax.get_visible():
            marks = _markers(ax)
            found += _marker_overlaps(marks, gap)
            found += _lines_through(ax, labels, tolerance_px)
            found += _markers_under(marks, labels, tolerance_px)
    return found


def overlapping_labels(fig: Figure, tolerance_px: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of labels of ``fig`` (texts, annotations, titles, axis labels, legends) whose
    drawn boxes overlap by more than ``tolerance_px`` pixels both ways (the
    ``"text/text"`` part of :func:`collisions`). Lays the figure out by drawing it without
    rendering.

    Raises:
        InvalidArgumentError: ``tolerance_px`` is negative or not finite.
        ValueError: a label holds mathtext (``$...$``) that matplotlib cannot parse.
        MemoryError: the figure is too large for the Agg canvas to allocate.
    """
    _check_tolerance(tolerance_px)
    return _overlapping_boxes(label_boxes(fig), tolerance_px)


def label_boxes(fig: Figure) -> list[tuple[str, Any]]:
    """``(text, window extent in pixels)`` of every visible, non-empty label of ``fig``:
    figure texts, axes texts and annotations, titles, axis labels, and legends (named
    ``"legend"``), after laying the figure out by drawing it without rendering.

    Raises:
        ValueError: a label holds mathtext (``$...$``) that matplotlib cannot parse.
        MemoryError: the figure is too large for the Agg canvas to allocate.
    """
    fig.draw_without_rendering()  # places axis labels and legends where they will be drawn
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    texts: list[Any] = list(fig.texts)
    boxes: list[tuple[str, Any]] = []
    legends: list[Any] = list(fig.legends)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        titles = [getattr(ax, name) for name in ("title", "_left_title", "_right_title")]
        texts += list(ax.texts) + titles + [ax.xaxis.label, ax.yaxis.label]
        legends.append(ax.get_legend())
    for legend in legends:
        if legend is not None and legend.get_visible():
            boxes.append(("legend", legend.get_window_extent(renderer)))
    seen: set[int] = set()
    for t in texts:
        if id(t) not in seen and t.get_visible() and t.get_text().strip():
            seen.add(id(t))
            boxes.append((t.get_text().strip(), t.get_window_extent(renderer)))
    return boxes


def _check_tolerance(tolerance_px: float) -> None:
    check_positive(tolerance_px, "tolerance_px", zero=True)


def _overlapping_boxes(boxes: list[tuple[str, Any]], tol: float) -> list[tuple[str, str]]:
    out = []
    for (na, a), (nb, b) in combinations(boxes, 2):
        if min(a.x1, b.x1) - max(a.x0, b.x0) > tol and min(a.y1, b.y1) - max(a.y0, b.y0) > tol:
            out.append((na, nb))
    return out


class _Marks(NamedTuple):
    """The drawn markers of one artist: data and pixel positions, half widths and heights
    in pixels, whether they are hollow, and the artist's drawing rank (higher on top)."""

    name: str
    data: np.ndarray
    px: np.ndarray
    half: np.ndarray
    hollow: bool
    rank: tuple[float, int]
    scatter: bool


def _name(artist: Any, kind: str) -> str:
    label = str(artist.get_label())
    return label if label and not label.startswith("_") else f"unlabelled {kind}"


def _marked(n: int, every: Any) -> Any:
    """Indices of the points a line's ``markevery`` marks (all for a fractional spacing)."""
    if every is None or isinstance(every, float):
        return slice(None)
    if isinstance(every, int):
        return slice(0, None, max(every, 1))
    if isinstance(every, tuple) and all(isinstance(v, int) for v in every):
        return slice(every[0], None, max(every[1], 1))
    if isinstance(every, slice):
        return every
    idx = np.asarray(every)
    return idx if idx.dtype != bool or idx.size == n else slice(None)


def _reach(path: Any) -> np.ndarray:
    """Half width and half height of a marker path of size 1, centred on its point."""
    v = np.asarray(path.vertices, dtype=np.float64).reshape(-1, 2)
    return np.abs(v).max(axis=0) if v.size else np.zeros(2)


def _line_marks(line: Any) -> tuple[np.ndarray, np.ndarray, Any, bool] | None:
    from matplotlib.colors import to_rgba
    from matplotlib.markers import MarkerStyle

    if str(line.get_marker()) in ("None", "none", "", " ", ",") or line.get_markersize() <= 0:
        return None
    xy = np.asarray(line.get_xydata(), dtype=np.float64)
    xy = xy[_marked(len(xy), line.get_markevery())]
    style = MarkerStyle(line.get_marker())
    unit = _reach(style.get_path().transformed(style.get_transform()))
    half = unit * line.get_markersize() + line.get_markeredgewidth() / 2
    hollow = line.get_fillstyle() == "none" or to_rgba(line.get_markerfacecolor())[3] == 0
    return xy, np.tile(half, (len(xy), 1)), line.get_transform(), hollow


def _scatter_marks(coll: Any) -> tuple[np.ndarray, np.ndarray, Any, bool] | None:
    xy = np.asarray(coll.get_offsets(), dtype=np.float64).reshape(-1, 2)
    sizes = np.asarray(coll.get_sizes(), dtype=np.float64)
    paths = coll.get_paths()
    if xy.size == 0 or sizes.size == 0 or not paths:
        return None
    widths = np.asarray(coll.get_linewidths(), dtype=np.float64)
    edge = float(widths.max()) / 2 if widths.size else 0.0
    unit = np.array([_reach(p) for p in paths])
    half = unit[np.arange(len(xy)) % len(unit)] * np.sqrt(np.resize(sizes, len(xy)))[:, None] + edge
    faces = np.asarray(coll.get_facecolor()).reshape(-1, 4)
    return xy, half, coll.get_offset_transform(), bool(faces.size == 0 or np.all(faces[:, 3] == 0))


def _markers(ax: Any) -> list[_Marks]:
    """Every visible marker of ``ax`` (lines' markers, scatter points) drawn in the axes."""
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D

    out = []
    box = ax.bbox
    for order, art in enumerate(ax.get_children()):
        if isinstance(art, Line2D) and art.get_visible():
            got, kind = _line_marks(art), "line"
        elif isinstance(art, PathCollection) and art.get_visible():
            got, kind = _scatter_marks(art), "points"
        else:
            continue
        if got is None:
            continue
        xy, half, transform, hollow = got
        with np.errstate(all="ignore"):
            px = transform.transform(xy)
        keep = np.all(np.isfinite(px), axis=1)
        if art.get_clip_on():
            keep &= (px[:, 0] >= box.x0) & (px[:, 0] <= box.x1) & (px[:, 1] >= box.y0) & (px[:, 1] <= box.y1)
        scale = ax.figure.dpi / 72.0
        out.append(_Marks(_name(art, kind), xy[keep], px[keep], half[keep] * scale, hollow,
                          (float(art.get_zorder()), order), kind == "points"))
    return out


def _first_hit(a: _Marks, b: _Marks, gap: float, same: bool) -> tuple[int, int] | None:
    """The first pair of markers of ``a`` and ``b`` (of one scatter when ``same``: pairs
    i < j) less than ``gap`` pixels apart, in row blocks that keep memory bounded."""
    rows = max(1, 1_000_000 // max(len(b.px), 1))
    for start in range(0, len(a.px), rows):
        pa, ha = a.px[start:start + rows], a.half[start:start + rows]
        reach = ha[:, None, :] + b.half[None, :, :] + gap
        hit = np.all(np.abs(pa[:, None, :] - b.px[None, :, :]) < reach, axis=2)
        if same:
            hit &= np.arange(start, start + len(pa))[:, None] < np.arange(len(b.px))[None, :]
        i, j = np.nonzero(hit)
        if i.size:
            return start + int(i[0]), int(j[0])
    return None


def _at(m: _Marks, i: int) -> str:
    x, y = m.data[i]
    return f"{m.name} at ({x:.4g}, {y:.4g})"


def _marker_overlaps(marks: list[_Marks], gap: float) -> list[Collision]:
    """Markers of one axes hidden by, or within ``gap`` pixels of, a filled marker drawn
    over them (a hollow upper marker hides nothing); points of one scatter count too."""
    out = []
    pairs = [(m, m) for m in marks if m.scatter] + list(combinations(marks, 2))
    for a, b in pairs:
        upper = a if a.rank > b.rank else b
        if upper.hollow:
            continue
        hit = _first_hit(a, b, gap, a is b)
        if hit is not None:
            out.append(Collision("marker/marker", _at(a, hit[0]), _at(b, hit[1])))
    return out


def _markers_under(marks: list[_Marks], labels: list[tuple[str, Any]], tol: float) -> list[Collision]:
    out = []
    for m in marks:
        for text, box in labels:
            lo, hi = m.px - m.half + tol, m.px + m.half - tol
            inside = (hi[:, 0] > box.x0) & (lo[:, 0] < box.x1) & (hi[:, 1] > box.y0) & (lo[:, 1] < box.y1)
            if inside.any():
                out.append(Collision("marker/text", _at(m, int(np.argmax(inside))), text))
    return out


def _crosses(p0: np.ndarray, p1: np.ndarray, rect: tuple[float, float, float, float]) -> bool:
    """Whether any segment ``p0[k] -> p1[k]`` (pixels) meets ``rect`` (x0, y0, x1, y1):
    the segment clipped to the rectangle's four sides is not empty."""
    x0, y0 = p0[:, 0], p0[:, 1]
    dx, dy = p1[:, 0] - x0, p1[:, 1] - y0
    t0, t1 = np.zeros(len(x0)), np.ones(len(x0))
    ok = np.ones(len(x0), dtype=bool)
    for p, q in ((-dx, x0 - rect[0]), (dx, rect[2] - x0), (-dy, y0 - rect[1]), (dy, rect[3] - y0)):
        flat = p == 0
        ok &= ~(flat & (q < 0))
        with np.errstate(divide="ignore", invalid="ignore"):
            t = q / np.where(flat, 1.0, p)
        t0 = np.where(~flat & (p < 0), np.maximum(t0, t), t0)
        t1 = np.where(~flat & (p > 0), np.minimum(t1, t), t1)
    return bool(np.any(ok & (t0 <= t1)))


def _drawn_segments(line: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """A visible line's segments in pixels, its draw style's steps included."""
    from matplotlib.cbook import STEP_LOOKUP_MAP

    if str(line.get_linestyle()) in ("None", "none", "", " ") or line.get_linewidth() <= 0:
        return None
    xy = np.asarray(line.get_xydata(), dtype=np.float64)
    if len(xy) < 2:
        return None
    steps = STEP_LOOKUP_MAP[line.get_drawstyle()](xy[:, 0], xy[:, 1])
    with np.errstate(all="ignore"):
        px = line.get_transform().transform(np.column_stack(steps[:2]))
    keep = np.all(np.isfinite(px[:-1]), axis=1) & np.all(np.isfinite(px[1:]), axis=1)
    return px[:-1][keep], px[1:][keep]


def _lines_through(ax: Any, labels: list[tuple[str, Any]], tol: float) -> list[Collision]:
    """Lines of ``ax`` whose drawn part (inside the axes unless unclipped) runs through a
    label's box shrunk by ``tol`` pixels."""
    out = []
    clip = ax.bbox
    for line in ax.get_lines():
        seg = _drawn_segments(line) if line.get_visible() else None
        if seg is None:
            continue
        for text, box in labels:
            x0, y0, x1, y1 = box.x0 + tol, box.y0 + tol, box.x1 - tol, box.y1 - tol
            if line.get_clip_on():
                x0, y0, x1, y1 = max(x0, clip.x0), max(y0, clip.y0), min(x1, clip.x1), min(y1, clip.y1)
            if x0 < x1 and y0 < y1 and _crosses(seg[0], seg[1], (x0, y0, x1, y1)):
                out.append(Collision("line/text", _name(line, "line"), text))
    return out
