"""Figures of a search: the cost vs sustained-rate frontier and the sustained rate of every
configuration, per SLO. Drawn with :mod:`pykvpool.plotting` (Agg, no pyplot)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from pykvpool.plotting import save, subplots
from pykvpool.search.output import frontier

__all__ = ["draw_figures"]

Row = dict[str, Any]


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
                 cost_unit: str) -> list[Path]:
    """Write ``frontier.png`` (cost in ``cost_unit`` against sustained rate, every point
    and the frontier) and ``sustained_rate.png`` (each simulated configuration's
    sustained rate, sorted) into ``directory``; returns their paths.

    Raises:
        OSError: a file cannot be written.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / "frontier.png", d / "sustained_rate.png"]
    _frontier_figure(rows, slos, cost_unit, paths[0])
    _rates_figure(rows, slos, paths[1])
    return paths
