"""Every ```python block of README.md runs as written, alone, in a fresh interpreter.

Each block is a user's first contact with the API: it defines its own imports and inputs
and finishes in seconds. A block that is deliberately not runnable uses another fence
(```text). Blocks importing torch or transformers skip when those are not installed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from needs import missing

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.M | re.S)
OPTIONAL = ("torch", "transformers")


def _blocks() -> list[tuple[int, str]]:
    """``(line, code)`` of every ```python block of the README, in order."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in FENCE.finditer(text)]


def _missing_optional(code: str) -> list[str]:
    """The optional packages a block imports that this environment lacks."""
    imported = set(re.findall(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", code, re.M))
    if "pykvpool" in imported and re.search(r"^\s*(?:import|from)\s+pykvpool\.hf\b", code, re.M):
        imported |= set(OPTIONAL)
    return [m for m in OPTIONAL if m in imported and importlib.util.find_spec(m) is None]


BLOCKS = _blocks()


def test_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_python_block_runs(line: int, code: str, tmp_path: Path) -> None:
    absent = _missing_optional(code)
    if absent:
        missing(f"needs {', '.join(absent)}")
    env = dict(os.environ)
    env.setdefault("PYKVPOOL_NUM_THREADS", "2")
    env["MPLBACKEND"] = "Agg"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, f"README.md line {line}:\n{code}\n--- stderr ---\n{r.stderr[-3000:]}"
