"""Figures without pyplot: every plot of the package (report, simulator, prefix replay) is a
:class:`matplotlib.figure.Figure` on its own Agg canvas, saved with :func:`save`. Nothing
selects a global backend, so a user's matplotlib setup is left alone; matplotlib is
imported when a figure is first made, not when pykvpool is."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["new_figure", "save", "subplots"]


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
