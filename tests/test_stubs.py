"""The hand-written stubs must describe the built module exactly."""

from __future__ import annotations

import subprocess
import sys


def test_stubtest_passes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "pykvpool._native"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_package_is_typed_and_mypy_clean() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "-p", "pykvpool"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
