"""Figures of a search: the cost vs sustained-rate frontier, the sustained rate of every
configuration, and the cost vs latency frontiers (:mod:`pykvpool.search.latency`), per
SLO. Drawn with :mod:`pykvpool.plotting` (Agg, no pyplot)."""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from pykvpool.plotting import collisions, new_figure
from pykvpool.search.latency import LATENCY_METRICS, candidates, latency_frontier
from pykvpool.search.output import best_points, frontier
from pykvpool.search.scaling import SCALING_MODEL, rate_text
from pykvpool.search.slo import SLO

__all__ = ["DPI", "MAX_BARS", "draw_figures", "draw_latency_figure", "frontier_figure", "latency_figure",
           "rates_figure", "short_names"]

Row = dict[str, Any]


#: Pixels per inch of the written figures (each figure is laid out at it).
DPI = 120
#: Most bars per SLO in the sustained-rate figure (the highest rates; all are in points.csv).
MAX_BARS = 50
_GAP_PT = 5.0  # points between spread markers (collisions() wants 4)
_FRONT_HALF = 3.5  # half width of a frontier line's marker (6 points, its edge included), points
_CHARS_PER_IN = 18  # characters of the 7-point footnote per inch of figure width


def _new(size: tuple[float, float], ncols: int) -> tuple[Any, list[Any]]:
    """A figure of ``size`` inches at :data:`DPI` (so it is laid out as it is saved) and
    its one row of ``ncols`` axes."""
    fig = new_figure(size)
    fig.set_dpi(DPI)
    return fig, list(fig.subplots(1, ncols, squeeze=False)[0])


def _devices_ticks(ax: Any, costs: Sequence[float]) -> None:
    """On a device-count axis, ticks at the counts drawn (at most 12), else whole numbers."""
    from matplotlib.ticker import MaxNLocator

    counts = sorted(set(costs))
    if len(counts) <= 12:
        ax.set_xticks(counts, [f"{c:g}" for c in counts])
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def short_names(rows: Sequence[Row]) -> dict[str, str]:
    """Each row's key cut to the fields that differ between ``rows`` (e.g.
    ``h100-sxm|x2|fp8|r256``; the whole key when there is one row).

    Raises:
        KeyError: a row without ``key``.
    """
    parts = [str(r["key"]).split("|") for r in rows]
    if len(parts) < 2:
        return {str(r["key"]): str(r["key"]) for r in rows}
    keep = [i for i in range(len(parts[0])) if len({tuple(p[i:i + 1]) for p in parts}) > 1]
    return {str(r["key"]): "|".join(p[i] for i in keep) or str(r["key"]) for r, p in zip(rows, parts)}


def _foot(fig: Any, note: str, above: float = 0.0) -> float:
    """Write ``note`` at the bottom of ``fig`` (one line, wrapped only when the figure is
    too narrow for it); returns the inches it takes. ``above``: inches kept free above it."""
    width, height = fig.get_size_inches()
    lines = textwrap.wrap(note, max(40, int(width * _CHARS_PER_IN)))
    fig.text(0.01, 0.06 / height, "\n".join(lines), fontsize=7, color="#444444", ha="left", va="bottom")
    return 0.12 + 0.13 * len(lines) + above


def _finish(fig: Any, note: str) -> Any:
    """``fig`` laid out with the scaling model's line under its axes."""
    foot = _foot(fig, note)
    fig.tight_layout(rect=(0.0, foot / fig.get_size_inches()[1], 1.0, 1.0))
    return fig


def _flags(rows: Sequence[Row], slo: str) -> tuple[list[Row], list[Row]]:
    """The rows that sustain a rate for ``slo``: ranked ones, and the superlinear ones."""
    ok = [r for r in rows if r.get(f"{slo}_state") == "ok"]
    return [r for r in ok if not r.get(f"{slo}_superlinear")], [r for r in ok if r.get(f"{slo}_superlinear")]


class _Swarm(NamedTuple):
    """Markers of one axes to spread sideways once the figure is laid out: every point of
    the ``free`` scatters moves, the ``fixed`` points (x, y, half width in points) stay."""

    ax: Any
    free: list[Any]
    fixed: list[tuple[float, float, float]]


def _half(size: float, edge: float = 1.0) -> float:
    """Half the width (points) of a scatter marker of ``size`` points squared, edge included."""
    return 0.5 * math.sqrt(size) + edge / 2


def _spread(ax: Any, raw: list[np.ndarray], halves: list[float], fixed: list[tuple[float, float, float]]
            ) -> list[np.ndarray]:
    """``raw`` points (data) moved sideways in whole steps, the nearest slot first, until
    each is :data:`_GAP_PT` clear of the fixed points and of those placed before it."""
    to_px, pt = ax.transData.transform, ax.figure.dpi / 72.0
    placed = np.array([[*to_px((x, y)), h * pt] for x, y, h in fixed]).reshape(-1, 3)
    out = []
    for pts, h in zip(raw, halves):
        px, half = to_px(pts), h * pt
        step = 2 * half + (_GAP_PT + 0.5) * pt  # a little over the reach: a neighbour's slot is free
        for i in range(len(px)):
            reach = placed[:, 2] + half + _GAP_PT * pt
            near = placed[np.abs(placed[:, 1] - px[i, 1]) < reach]
            reach = near[:, 2] + half + _GAP_PT * pt
            for k in range(4 * len(placed) + 1):  # 0, 1, -1, 2, -2, ...: one of them is free
                x = px[i, 0] + step * ((k + 1) // 2) * (1 if k % 2 else -1)
                if not np.any(np.abs(near[:, 0] - x) < reach):
                    break
            px[i, 0] = x
            placed = np.vstack([placed, [x, px[i, 1], half]])
        out.append(ax.transData.inverted().transform(px))
    return out


def _dodge(sw: _Swarm) -> None:
    """Spread ``sw``'s free points (:func:`_spread`) on its laid-out axes, widening the x
    range until every point is inside it (the y range is kept)."""
    ax = sw.ax
    ax.set_ylim(ax.get_ylim())
    ax.set_xlim(ax.get_xlim())
    raw = [np.asarray(c.get_offsets(), dtype=np.float64).reshape(-1, 2) for c in sw.free]
    halves = [_half(float(np.max(c.get_sizes(), initial=1.0))) for c in sw.free]
    for _ in range(6):
        moved = _spread(ax, raw, halves, sw.fixed)
        xs = np.concatenate([m[:, 0] for m in moved] + [np.array([x for x, _, _ in sw.fixed])])
        lo, hi = ax.get_xlim()
        if xs.size == 0 or (xs.min() > lo and xs.max() < hi):
            break
        pad = 0.04 * (max(hi, xs.max()) - min(lo, xs.min()))
        ax.set_xlim(min(lo, xs.min() - pad), max(hi, xs.max() + pad))
    for c, m in zip(sw.free, moved):
        c.set_offsets(m)


#: Where a frontier point's name goes (offset in points, alignment), tried in turn until
#: the name covers no point, line or other label.
_SPOTS = (((4, -9), "left", "baseline"), ((4, 4), "left", "bottom"), ((-4, 4), "right", "bottom"),
          ((-4, -9), "right", "baseline"))


def _place_names(fig: Any, notes: list[tuple[Any, int]]) -> None:
    """Move each name of ``notes`` (annotation, index of its spot in :data:`_SPOTS`) that
    hides something to its next spot, a round at a time, until none does (or every spot
    was tried)."""
    spots = {id(a): i for a, i in notes}
    for _ in range(len(_SPOTS)):
        hit = {name for c in collisions(fig) for name in (c.first, c.second)}
        bad = [a for a, _ in notes if a.get_text() in hit]
        if not bad:
            return
        for a in bad:
            spots[id(a)] = (spots[id(a)] + 1) % len(_SPOTS)
            (dx, dy), ha, va = _SPOTS[spots[id(a)]]
            a.xyann = (dx, dy)
            a.set_ha(ha)
            a.set_va(va)


def _scatter(ax: Any, rows: list[Row], s: str, color: str, what: str, marker: str, count: int) -> list[Any]:
    """``rows``' points for SLO ``s`` (rates at the ladder's top as ``^``), labelled with
    ``count`` configurations; returns the scatters drawn."""
    drawn = []
    for bound, mk in ((False, marker), (True, "^")):
        sel = [r for r in rows if bool(r.get(f"{s}_rate_is_lower_bound")) == bound]
        if sel:
            label = f"{what} ({count})" if not bound or len(sel) == len(rows) else None
            drawn.append(ax.scatter([r["cost"] for r in sel], [r[f"{s}_rate"] for r in sel], s=14, color=color,
                                    marker=mk, label=label, zorder=3))
    if count and not drawn:  # every one of them is on the frontier: still counted in the legend
        ax.scatter([], [], s=14, color=color, marker=marker, label=f"{what} ({count})")
    return drawn


def _frontier_panel(ax: Any, rows: Sequence[Row], s: str, cost_unit: str, names: dict[str, str]
                    ) -> tuple[_Swarm, list[tuple[Any, int]]]:
    """One SLO's panel; returns its points to spread and the frontier's names to place
    (:func:`_place_names`)."""
    ranked, flagged = _flags(rows, s)
    front = frontier(rows, s)
    on_front = {r["key"] for r in front}  # drawn by the frontier, not again under it
    free = _scatter(ax, [r for r in ranked if r["key"] not in on_front], s, "#9e9e9e", "configurations", "o",
                    len(ranked))
    free += _scatter(ax, [r for r in flagged if r["key"] not in on_front], s, "#d62728",
                     "superlinear: not ranked", "x", len(flagged))
    ax.step([r["cost"] for r in front], [r[f"{s}_rate"] for r in front], where="post", color="#c1440e",
            label=f"frontier ({len(front)})", zorder=4)
    for bound, mk in ((False, "o"), (True, "^")):
        sel = [r for r in front if bool(r.get(f"{s}_rate_is_lower_bound")) == bound]
        ax.scatter([r["cost"] for r in sel], [r[f"{s}_rate"] for r in sel], s=30, color="#c1440e", marker=mk,
                   zorder=5)
    right = max([r["cost"] for r in rows] or [1.0])
    notes = []
    for r in front:
        spot = 3 if r["cost"] >= right else 0  # the last point's name to its left, inside the axes
        (dx, dy), ha, va = _SPOTS[spot]
        notes.append((ax.annotate(names[r["key"]], (r["cost"], r[f"{s}_rate"]), xytext=(dx, dy),
                                  textcoords="offset points", fontsize=6, color="#c1440e", ha=ha, va=va), spot))
    tops = [r[f"{s}_rate"] for r in rows if r.get(f"{s}_rate_is_lower_bound")]
    if tops:
        ax.axhline(max(tops), color="#555555", linestyle=":", linewidth=1,
                   label=f"ladder top {max(tops):.3g} req/s: rates there are at least (^)")
    ax.set_xlabel(cost_unit)
    if cost_unit == "devices":
        _devices_ticks(ax, [r["cost"] for r in ranked + flagged])
    _log_rates(ax)
    ax.set_title(f"SLO {s}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=7, frameon=False)
    fixed = [(r["cost"], r[f"{s}_rate"], _half(30)) for r in front]
    return _Swarm(ax, free, fixed), notes


def _log_rates(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
    ax.set_ylabel("sustained rate (req/s, log scale)")


def frontier_figure(rows: Sequence[Row], slos: Sequence[str], cost_unit: str) -> Any:
    """The cost vs sustained rate figure of :func:`draw_figures` (a matplotlib Figure).

    Raises:
        KeyError: a row without the columns of a search's row.
    """
    fig, axes = _new((max(5.5 * len(slos), 8.5), 5.0), len(slos))
    names = short_names(rows)
    drawn = [_frontier_panel(ax, rows, s, cost_unit, names) for ax, s in zip(axes, slos)]
    _finish(fig, _note(rows, slos))
    for swarm, _ in drawn:
        _dodge(swarm)
    _place_names(fig, [a for _, notes in drawn for a in notes])
    return fig


def _note(rows: Sequence[Row], slos: Sequence[str]) -> str:
    """The figures' footnote: the scaling model (the legends count the flagged points)."""
    return SCALING_MODEL


def _rates_panel(ax: Any, rows: Sequence[Row], s: str, names: dict[str, str]) -> None:
    sim = sorted((r for r in rows if r.get(f"{s}_state") in ("ok", "none")), key=lambda r: -r[f"{s}_rate"])
    shown = sim[:MAX_BARS]
    ys = list(range(len(shown)))
    colors = ["#d62728" if r.get(f"{s}_superlinear") else "#1f4e79" for r in shown]
    ax.barh(ys, [r[f"{s}_rate"] for r in shown], height=0.8, color=colors)
    top = max([r[f"{s}_rate"] for r in shown] or [1.0])
    for y, r in zip(ys, shown):
        text = rate_text(r[f"{s}_rate"], r.get(f"{s}_rate_is_lower_bound")) if r[f"{s}_state"] == "ok" else "none"
        ax.text(r[f"{s}_rate"] + top * 0.01, y, text, va="center", fontsize=6)
    ax.set_yticks(ys, [names[r["key"]] for r in shown], fontsize=6)
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xlim(0, top * 1.18)
    ax.set_xlabel("sustained rate (req/s)")
    more = f", the {len(shown)} highest of {len(sim)} shown" if len(sim) > len(shown) else ""
    skipped = sum(r.get(f"{s}_state") == "dominated" for r in rows)
    why = f"\n{skipped} not simulated: fewer devices already sustain the top rate" if skipped else ""
    ax.set_title(f"SLO {s}: {len(sim)} simulated configuration{'s' * (len(sim) != 1)}{more}{why}", fontsize=9)
    if any(r.get(f"{s}_superlinear") for r in shown):
        from matplotlib.patches import Patch

        ax.legend([Patch(color="#1f4e79"), Patch(color="#d62728")], ["ranked", "superlinear: not ranked"],
                  loc="lower right", fontsize=7)


def rates_figure(rows: Sequence[Row], slos: Sequence[str]) -> Any:
    """The sustained rate per configuration figure of :func:`draw_figures` (a matplotlib
    Figure: one panel per SLO, one named bar per simulated configuration).

    Raises:
        KeyError: a row without the columns of a search's row.
    """
    bars = max([sum(r.get(f"{s}_state") in ("ok", "none") for r in rows) for s in slos] or [1])
    fig, axes = _new((max(6.0 * len(slos), 8.5), 1.6 + 0.16 * max(min(bars, MAX_BARS), 4)), len(slos))
    names = short_names(rows)
    for ax, s in zip(axes, slos):
        _rates_panel(ax, rows, s, names)
    return _finish(fig, _note(rows, slos))


def draw_figures(directory: str | os.PathLike[str], rows: Sequence[Row], slos: Sequence[str],
                 cost_unit: str, names: tuple[str, str] = ("frontier.png", "sustained_rate.png")) -> list[Path]:
    """Write ``names[0]`` (cost in ``cost_unit`` against sustained rate, log scale: every
    point, superlinear ones marked and not ranked, rates at the ladder's top drawn as
    lower bounds, points of one cost spread sideways until none touches another, and the
    frontier, its points named where the name covers nothing) and ``names[1]`` (each simulated
    configuration's sustained rate, sorted, each bar named and labelled, ``>=`` at the
    ladder's top; at most :data:`MAX_BARS` per SLO) into ``directory``, each with the
    scaling model's line (:func:`pykvpool.search.scaling.scaling_note`); returns their paths.

    Raises:
        OSError: a file cannot be written.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / names[0], d / names[1]]
    frontier_figure(rows, slos, cost_unit).savefig(paths[0], dpi=DPI)
    rates_figure(rows, slos).savefig(paths[1], dpi=DPI)
    return paths


_LABELS = {"ttft_p99": "p99 TTFT", "tpot_p99": "p99 TPOT"}


def _latency_panel(ax: Any, rows: Sequence[Row], entries: dict[str, Row], slo: SLO, rate: Optional[float],
                   n: int, metric: str, best: Optional[Row], cost_unit: str) -> Optional[_Swarm]:
    """One (SLO, latency) panel; returns its points to spread (None: no reference runs)."""
    ref = candidates(rows, entries, slo, "reference", rate, n)
    front = latency_frontier(ref, metric)
    sub = ("no runs at a reference rate" if rate is None else
           f"at {rate:.3g} req/s: {len(ref)} configurations meet the SLO, {len(front)} on the frontier")
    ax.set_title(f"SLO {slo.name}: {_LABELS[metric]}\n{sub}", fontsize=9)
    ax.set_ylabel(f"{_LABELS[metric]} (s)")
    own = latency_frontier(candidates(rows, entries, slo, "sustained", None, n), metric)
    if own:  # hollow and on top: the points under it show through
        ax.step([c["cost"] for c in own], [c[metric] for c in own], where="post", color="#1f4e79",
                linestyle="--", marker="o", ms=4, mfc="none", alpha=0.8, zorder=6,
                label="frontier at each point's own sustained rate")
    swarm = None
    if not ref:
        why = "no run at a reference rate" if rate is None else "no configuration meets the SLO there"
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="#555555")
    else:
        swarm = _reference(ax, ref, front, metric, best)
    bound = getattr(slo, metric)
    if bound is not None:
        ax.axhline(bound, color="#555555", linestyle=":", linewidth=1, label="SLO bound")
    if own or ref:
        ax.set_yscale("log")
    ax.set_xlabel(cost_unit)
    if cost_unit == "devices":
        _devices_ticks(ax, [c["cost"] for c in ref + own])
    return swarm


def _reference(ax: Any, ref: list[Row], front: list[Row], metric: str, best: Optional[Row]) -> _Swarm:
    """The runs at the reference rate: each configuration once (the frontier's own marker,
    the best point's star, or a grey dot); returns the dots and the star to spread."""
    b = next((c for c in ref if best is not None and c["key"] == best["key"]), None)
    shown = {c["key"] for c in front} | ({b["key"]} if b is not None else set())
    others = [c for c in ref if c["key"] not in shown]
    free = [ax.scatter([c["cost"] for c in others], [c[metric] for c in others], s=12, color="#9e9e9e",
                       label="configurations meeting the SLO at the reference rate")]
    marks = [i for i, c in enumerate(front) if b is None or c["key"] != b["key"]]
    ax.step([c["cost"] for c in front], [c[metric] for c in front], where="post", color="#c1440e",
            marker="o" if marks else None, markevery=marks or None, label="frontier at the reference rate")
    if b is not None:  # placed first: it moves aside only for a frontier point
        free.insert(0, ax.scatter([b["cost"]], [b[metric]], s=140, marker="*", color="#e0a100", zorder=5,
                                  edgecolors="black", linewidths=0.5, label="best point (objective)"))
    return _Swarm(ax, free, [(front[i]["cost"], front[i][metric], _FRONT_HALF) for i in marks])


def latency_figure(rows: Sequence[Row], entries: dict[str, Row], slos: Sequence[SLO],
                   rates: dict[str, Optional[float]], n: int, cost_unit: str) -> Any:
    """The cost vs latency figure of :func:`draw_latency_figure` (a matplotlib Figure, laid
    out at the resolution it is saved at).

    Raises:
        KeyError: a row without the columns of a search's row.
    """
    height = 0.9 + 3.8 * len(slos)
    fig = new_figure((11.0, height))
    fig.set_dpi(DPI)
    axes = fig.subplots(len(slos), len(LATENCY_METRICS), squeeze=False)
    best = best_points(rows, [s.name for s in slos])
    handles: dict[str, Any] = {}
    swarms: list[Optional[_Swarm]] = []
    for row_axes, slo in zip(axes, slos):
        for ax, metric in zip(row_axes, LATENCY_METRICS):
            swarms.append(_latency_panel(ax, rows, entries, slo, rates.get(slo.name), n, metric, best[slo.name],
                                         cost_unit))
            for h, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, h)
    foot = _foot(fig, _note(rows, [s.name for s in slos]))
    fig.tight_layout(rect=(0.0, (0.6 + foot) / height, 1.0, 1.0))
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=8, frameon=False,
                   bbox_to_anchor=(0.5, foot / height))
    for swarm in swarms:
        if swarm is not None:
            _dodge(swarm)
    return fig


def draw_latency_figure(directory: str | os.PathLike[str], rows: Sequence[Row], entries: dict[str, Row],
                        slos: Sequence[SLO], rates: dict[str, Optional[float]], n: int, cost_unit: str,
                        name: str = "frontier_latency.png") -> Path:
    """Write ``name`` into ``directory``: per SLO (one row of panels) and latency (p99
    TTFT, p99 TPOT: one column each, log scale), the points meeting the SLO at its
    reference rate ``rates[slo]`` (requests/s; from ``entries``, see
    :func:`pykvpool.search.latency.candidates`, for a workload of ``n`` requests), their
    cost (``cost_unit``) vs latency frontier, the frontier at each point's own sustained
    rate (hollow markers, on top), the best point and the SLO's bound (the points of one
    cost spread sideways until none touches another), and the scaling model's line
    (:func:`latency_figure`); returns the path.

    Raises:
        OSError: the file cannot be written.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / name
    latency_figure(rows, entries, slos, rates, n, cost_unit).savefig(path, dpi=DPI)
    return path
