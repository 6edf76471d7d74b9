"""The readability check (:func:`pykvpool.plotting.collisions`) on small figures made to
hide something, and on the report's own figures drawn from data like the report's: none
hides a marker, a line or a label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pykvpool import InvalidArgumentError
from pykvpool.plotting import Collision, collisions, new_figure, overlapping_labels
from pykvpool.planning.hardware import Hardware, hardware_preset
from pykvpool.planning.ledger import GIB
from pykvpool.planning.roofline import REPORT_PREFILL_SHAPES, KernelPoint, PrefillPoint, decode_intensity
from pykvpool.planning.video import article_videos
from pykvpool.report.figures import fig_roofline, fig_video


def _axes() -> tuple[Any, Any]:
    fig = new_figure((4, 3))
    return fig, fig.subplots()


def _kinds(fig: Any) -> list[str]:
    return [c.kind for c in collisions(fig)]


def test_a_clean_figure_hides_nothing() -> None:
    fig, ax = _axes()
    ax.plot([0, 1], [0, 1], "-o", label="rising")
    ax.text(0.05, 0.85, "a label away from the data", transform=ax.transAxes, fontsize=7)
    ax.set(xlim=(-0.1, 1.1), ylim=(-0.1, 1.6), title="title", xlabel="x", ylabel="y")
    assert collisions(fig) == []


def test_text_over_text() -> None:
    fig, ax = _axes()
    ax.text(0.5, 0.5, "first label", transform=ax.transAxes)
    ax.text(0.52, 0.5, "second label", transform=ax.transAxes)
    assert collisions(fig) == [Collision("text/text", "first label", "second label")]
    assert overlapping_labels(fig) == [("first label", "second label")]


def test_filled_marker_over_another_but_not_a_hollow_one() -> None:
    fig, ax = _axes()
    ax.plot([1.0], [1.0], "o", ms=9, label="under")
    ax.plot([1.02], [1.0], "D", ms=9, label="over")
    ax.set(xlim=(0, 2), ylim=(0, 2))
    found = collisions(fig)
    assert [c.kind for c in found] == ["marker/marker"]
    assert found[0].first == "under at (1, 1)" and found[0].second == "over at (1.02, 1)"
    ax.get_lines()[1].set_markerfacecolor("none")  # the upper one hollow: both show
    assert collisions(fig) == []
    ax.get_lines()[1].set_markerfacecolor("red")
    ax.get_lines()[1].set_zorder(1)  # now the hollow-free one is under; the other is filled
    assert _kinds(fig) == ["marker/marker"]


def test_markers_far_apart_and_on_log_axes() -> None:
    fig, ax = _axes()
    ax.plot([10.0, 1000.0], [1.0, 1.0], "o", ms=9)
    ax.plot([11.0], [1.0], "s", ms=4)  # close to 10 on a log axis: overlaps
    ax.set_xscale("log")
    ax.set(xlim=(1, 1e4))
    assert _kinds(fig) == ["marker/marker"]
    ax.get_lines()[1].set_xdata([100.0])
    assert collisions(fig) == []


def test_scatter_points_stacked_on_each_other() -> None:
    fig, ax = _axes()
    ax.scatter([1, 2, 2], [5, 5, 5], s=25, label="configurations")
    ax.set(xlim=(0, 3), ylim=(0, 10))
    found = collisions(fig)
    assert found == [Collision("marker/marker", "configurations at (2, 5)", "configurations at (2, 5)")]
    ax.collections[0].set_offsets([[1, 5], [2, 5], [2, 8]])
    assert collisions(fig) == []


def test_line_through_a_label_steps_and_horizontal_lines_included() -> None:
    fig, ax = _axes()
    ax.axhline(0.5, label="budget")
    ax.text(0.3, 0.48, "bar value", transform=ax.transAxes)
    assert collisions(fig) == [Collision("line/text", "budget", "bar value")]
    ax.texts[0].set_y(0.7)
    assert collisions(fig) == []
    ax.step([0, 0.5, 1], [0.1, 0.9, 0.9], where="post", label="steps")
    ax.set(xlim=(0, 1), ylim=(0, 1))
    ax.text(0.45, 0.7, "on the riser", transform=ax.transAxes)
    assert Collision("line/text", "steps", "on the riser") in collisions(fig)


def test_line_under_a_legend_and_a_marker_under_a_label() -> None:
    fig, ax = _axes()
    ax.plot([0, 1], [0.95, 0.95], label="high line")
    ax.legend(loc="upper left")
    ax.set(xlim=(0, 1), ylim=(0, 1))
    assert collisions(fig) == [Collision("line/text", "high line", "legend")]
    fig, ax = _axes()
    ax.plot([0.5], [0.5], "o", ms=8, label="point")
    ax.text(0.5, 0.5, "covering text", ha="center", va="center")
    assert collisions(fig) == [Collision("marker/text", "point at (0.5, 0.5)", "covering text")]


def test_a_line_outside_its_axes_is_clipped_away() -> None:
    fig, ax = _axes()
    ax.plot([0, 10], [5, 5], label="off the top")
    ax.set(ylim=(0, 1), title="a title above the axes")
    ax.set_title("a title above the axes")
    assert collisions(fig) == []


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_tolerance_is_named(bad: float) -> None:
    fig, _ = _axes()
    with pytest.raises(InvalidArgumentError, match="tolerance_px"):
        collisions(fig, tolerance_px=bad)
    with pytest.raises(InvalidArgumentError, match="tolerance_px"):
        overlapping_labels(fig, tolerance_px=bad)


# ---- the report's figures -------------------------------------------------------------------


def _report_like_measurements() -> tuple[Hardware, list[KernelPoint], list[PrefillPoint]]:
    """A machine and kernel measured as on a small 2-core CPU: the two prefill shapes at
    nearly one intensity, 174 and 109 GFLOP/s (both under the 234 GFLOP/s roof)."""
    machine = Hardware("this machine (CPU)", 16 * GIB, 58.17e9, {"fp32": 234e9}, "measured (synthetic)")
    kernel = []
    for g, gbs in ((1, 36.0e9), (4, 37.9e9), (8, 28.6e9)):
        nbytes = 2.0 * 2 * 128 * 2048 * 8 * 4
        kernel.append(KernelPoint(g, 8, 2048, 2, 128, 4.0 * 2 * g * 128 * 2048 * 8, nbytes,
                                  nbytes / gbs, 58.17e9))
    prefill = [PrefillPoint(sh, sh.flops(), sh.bytes_moved(), sh.flops() / rate)
               for sh, rate in zip(REPORT_PREFILL_SHAPES, (173.8e9, 108.6e9))]
    return machine, kernel, prefill


def test_roofline_hides_no_point_and_no_ridge_label(tmp_path: Path) -> None:
    from pykvpool.planning.models import model_preset
    from pykvpool.planning.roofline import prefill_intensity

    machine, kernel, prefill = _report_like_measurements()
    ideal = [(f"decode g={g}", decode_intensity(g, 2)) for g in (1, 4, 8)]
    ideal.append(("prefill S=8192", prefill_intensity(model_preset("llama-3-8b"), 8192)))
    d = fig_roofline(tmp_path / "f2.png", hardware_preset("a100-80gb-sxm"), ideal, machine, kernel,
                     prefill=prefill)
    assert [p["intensity"] for p in d["prefill"]] == [p.intensity for p in prefill]
    assert d["collisions"] == []


def test_roofline_prefill_markers_stay_apart_when_measured_alike(tmp_path: Path) -> None:
    machine, kernel, prefill = _report_like_measurements()
    same = [PrefillPoint(p.shape, p.flops, p.bytes_moved, p.flops / 150e9) for p in prefill]
    d = fig_roofline(tmp_path / "f2.png", hardware_preset("h100-sxm"), [("decode g=1", 1.0)],
                     machine, kernel, prefill=same)
    assert d["collisions"] == []  # distinct shapes, hollow: a coincident pair stays visible


def test_video_budget_lines_cross_no_bar_label(tmp_path: Path) -> None:
    d = fig_video(tmp_path / "f4.png", article_videos(), 131072, 80.0, 61.04)
    assert d["collisions"] == []
    assert [f"{v:.2f}" for v in d["kv_gib"]] == ["52.73", "105.47", "316.41"]


def test_block_size_panel_keeps_both_curves_visible_where_they_cross(tmp_path: Path) -> None:
    from pykvpool.planning.sweeps import block_size_sweep, contiguous, paged
    from pykvpool.planning.workloads import Workload, article_uniform
    from pykvpool.report.figures import fig_block_size_and_traces

    wl = article_uniform()
    rows = block_size_sweep(wl, (1, 4, 8, 16, 32, 64, 128, 256), 500063)
    crossing = [r for r in rows if r.block_size == 64][0]
    assert abs(crossing.empty_slots_per_request - crossing.table_entries_per_request) < 6
    small = Workload.from_lengths(np.arange(1, 400), "ramp")
    traces = [[contiguous(small, 4096, 512), paged(small, 4096, 16)]]
    d = fig_block_size_and_traces(tmp_path / "f5.png", rows, wl.name, traces, [("ramp", small.lengths)])
    assert d["collisions"] == []
