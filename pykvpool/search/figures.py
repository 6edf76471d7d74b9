"""Figures of a search: the cost vs sustained-rate frontier, the sustained rate of every
configuration, and the cost vs latency frontiers (:mod:`pykvpool.search.latency`), per
SLO. Drawn with :mod:`pykvpool.plotting` (Agg, no pyplot)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

from pykvpool.plotting import new_figure, save, subplots
from pykvpool.search.latency import LATENCY_METRICS, candidates, latency_frontier
from pykvpool.search.output import best_points, frontier
from pykvpool.search.slo import SLO

__all__ = ["draw_figures", "draw_latency_figure"]

Row = dict[str, Any]


def _integer_devices(ax: Any, cost_unit: str) -> None:
    if cost_unit == "devices":
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _frontier_figure(rows: Sequence[Row], slos: Sequence[str], cost_unit: str, path: Path) -> None:
    fig, axes = subplots(len(slos), (5.0 * len(slos), 4.0))
    for ax, s in zip(axes, slos):
        ok = [r for r in rows if r.get(f"{s}_state") == "ok"]
        ax.scatter([r["cost"] for r in ok], [r[f"{s}_rate"] for r in ok], s=10, color="#9e9e9e",
                   label=f"{len(ok)} configurations")
        front = frontier(rows, s)
        ax.step([r["cost"] for r in front], [r[f"{s}_rate"] for r in front], where="post", color="#c1440e",
                marker="o", label=f"frontier ({len(front)})")
        ax.set_xlabel(cost_unit)
        _integer_devices(ax, cost_unit)
        ax.set_ylabel("sustained rate (req/s)")
        ax.set_title(f"SLO {s}")
        ax.legend(loc="best", fontsize=8)
    save(fig, path)


def _rates_figure(rows: Sequence[Row], slos: Sequence[str], path: Path) -> None:
    fig, axes = subplots(len(slos), (5.0 * len(slos), 4.0))
    for ax, s in zip(axes, slos):
        rates = sorted((r[f"{s}_rate"] for r in rows if r.get(f"{s}_state") in ("ok", "none")), reverse=True)
        ax.bar(range(len(rates)), rates, width=0.9 if len(rates) <= 100 else 1.0, color="#1f4e79")
        ax.set_xlabel("configurations, by sustained rate")
        ax.set_ylabel("sustained rate (req/s)")
        ax.set_title(f"SLO {s}: {len(rates)} simulated configurations")
    save(fig, path)


def draw_figures(directory: str | os.PathLike[str], rows: Sequence[Row], slos: Sequence[str],
                 cost_unit: str, names: tuple[str, str] = ("frontier.png", "sustained_rate.png")) -> list[Path]:
    """Write ``names[0]`` (cost in ``cost_unit`` against sustained rate, every point and
    the frontier) and ``names[1]`` (each simulated configuration's sustained rate,
    sorted) into ``directory``; returns their paths.

    Raises:
        OSError: a file cannot be written.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / names[0], d / names[1]]
    _frontier_figure(rows, slos, cost_unit, paths[0])
    _rates_figure(rows, slos, paths[1])
    return paths


_LABELS = {"ttft_p99": "p99 TTFT", "tpot_p99": "p99 TPOT"}


def _latency_panel(ax: Any, rows: Sequence[Row], entries: dict[str, Row], slo: SLO, rate: Optional[float],
                   n: int, metric: str, best: Optional[Row]) -> None:
    ref = candidates(rows, entries, slo, "reference", rate, n)
    front = latency_frontier(ref, metric)
    sub = ("no runs at a reference rate" if rate is None else
           f"at {rate:.3g} req/s: {len(ref)} configurations meet the SLO, {len(front)} on the frontier")
    ax.set_title(f"SLO {slo.name}: {_LABELS[metric]}\n{sub}", fontsize=9)
    ax.set_ylabel(f"{_LABELS[metric]} (s)")
    own = latency_frontier(candidates(rows, entries, slo, "sustained", None, n), metric)
    if own:
        ax.step([c["cost"] for c in own], [c[metric] for c in own], where="post", color="#1f4e79",
                linestyle="--", marker=".", alpha=0.8, label="frontier at each point's own sustained rate")
    if not ref:
        why = "no run at a reference rate" if rate is None else "no configuration meets the SLO there"
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="#555555")
    else:
        _reference(ax, ref, front, metric, best)
    bound = getattr(slo, metric)
    if bound is not None:
        ax.axhline(bound, color="#555555", linestyle=":", linewidth=1, label="SLO bound")
    if own or ref:
        ax.set_yscale("log")


def _reference(ax: Any, ref: list[Row], front: list[Row], metric: str, best: Optional[Row]) -> None:
    ax.scatter([c["cost"] for c in ref], [c[metric] for c in ref], s=12, color="#9e9e9e",
               label="configurations meeting the SLO at the reference rate")
    ax.step([c["cost"] for c in front], [c[metric] for c in front], where="post", color="#c1440e", marker="o",
            label="frontier at the reference rate")
    b = next((c for c in ref if best is not None and c["key"] == best["key"]), None)
    if b is not None:
        ax.scatter([b["cost"]], [b[metric]], s=140, marker="*", color="#e0a100", zorder=5, edgecolors="black",
                   linewidths=0.5, label="best point (objective)")


def draw_latency_figure(directory: str | os.PathLike[str], rows: Sequence[Row], entries: dict[str, Row],
                        slos: Sequence[SLO], rates: dict[str, Optional[float]], n: int, cost_unit: str,
                        name: str = "frontier_latency.png") -> Path:
    """Write ``name`` into ``directory``: per SLO (one row of panels) and latency (p99
    TTFT, p99 TPOT: one column each, log scale), the points meeting the SLO at its
    reference rate ``rates[slo]`` (requests/s; from ``entries``, see
    :func:`pykvpool.search.latency.candidates`, for a workload of ``n`` requests), their
    cost (``cost_unit``) vs latency frontier, the frontier at each point's own sustained
    rate, the best point and the SLO's bound; returns the path.

    Raises:
        OSError: the file cannot be written.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    fig = new_figure((11.0, 0.6 + 3.8 * len(slos)))
    axes = fig.subplots(len(slos), len(LATENCY_METRICS), squeeze=False)
    best = best_points(rows, [s.name for s in slos])
    handles: dict[str, Any] = {}
    for row_axes, slo in zip(axes, slos):
        for ax, metric in zip(row_axes, LATENCY_METRICS):
            _latency_panel(ax, rows, entries, slo, rates.get(slo.name), n, metric, best[slo.name])
            ax.set_xlabel(cost_unit)
            _integer_devices(ax, cost_unit)
            for h, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, h)
    fig.tight_layout(rect=(0.0, 0.6 / (0.6 + 3.8 * len(slos)), 1.0, 1.0))
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=3, fontsize=8, frameon=False)
    path = d / name
    fig.savefig(path, dpi=120)
    return path
