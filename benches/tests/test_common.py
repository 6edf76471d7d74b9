"""The benchmarks' shared helpers (``benches/common.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from benches.common import quartiles, spread, write_json


def test_spread_summarizes_runs() -> None:
    s = spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["min"], s["q1"], s["median"], s["q3"], s["max"], s["runs"]) == (1.0, 2.0, 3.0, 4.0, 5.0, 5)
    assert quartiles([5.0, 1.0, 3.0, 2.0, 4.0]) == (2.0, 3.0, 4.0)


def test_write_json_creates_the_folder_and_ends_with_a_newline(tmp_path: Path) -> None:
    out = write_json({"a": [1, 2]}, tmp_path / "new" / "x.json")
    text = out.read_text()
    assert text.endswith("}\n") and json.loads(text) == {"a": [1, 2]}
