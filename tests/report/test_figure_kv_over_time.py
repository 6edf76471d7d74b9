"""``pykvpool video``'s ``kv_over_time.png`` hides nothing (:func:`pykvpool.plotting.collisions`)
for the curves the CLI draws: short videos, where every curve is marked and the windowed
curves equal the full history, and long ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pykvpool.cli import main
from pykvpool.cli import video as cli_video
from pykvpool.plotting import collisions
from pykvpool.simulate.video_plots import DPI, kv_over_time_figure


@pytest.mark.parametrize("extra", [[], ["--seconds", "1"], ["--seconds", "5"], ["--seconds", "240"],
                                   ["--models", "longlive,self-forcing", "--seconds", "1", "--window", "18"]])
def test_the_cli_figure_hides_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str]) -> None:
    drawn: list[tuple[Any, Any]] = []
    real = cli_video.plot_kv_over_time

    def keep(panels: Any, path: Any, budgets: Any = None) -> None:
        drawn.append((panels, budgets))
        real(panels, path, budgets)

    monkeypatch.setattr(cli_video, "plot_kv_over_time", keep)
    assert main(["video", "--quiet", "--out", str(tmp_path), *extra]) == 0
    assert (tmp_path / "kv_over_time.png").stat().st_size > 0
    (panels, budgets), = drawn
    fig = kv_over_time_figure(panels, budgets)
    assert fig.dpi == DPI
    assert collisions(fig) == []
