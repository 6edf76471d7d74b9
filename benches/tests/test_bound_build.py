"""The bound-build script refuses bad arguments before it builds anything (the build
itself, a release compile of a library with wrong outputs, is for timing runs only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benches" / "bound_build.py"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, env=env, check=False)


def test_a_file_as_the_output_directory_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    proc = run(str(f))
    assert proc.returncode == 2, proc.stderr
    assert "is not a directory" in proc.stderr
    assert f.read_text() == "x"


def test_without_maturin_it_says_so_and_creates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "free"
    env = {**os.environ, "PATH": str(tmp_path)}
    proc = run(str(out), env=env)
    assert proc.returncode == 2, proc.stderr
    assert "maturin is not on the PATH" in proc.stderr
    assert not out.exists()
