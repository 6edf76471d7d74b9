"""The hand-written stubs must describe the built module exactly."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


def test_stubtest_passes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "pykvpool._native"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _mypy_strict(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", *args], capture_output=True, text=True, check=False)


def test_package_is_typed_and_mypy_clean() -> None:
    """Every module but ``pykvpool.hf`` (the one subpackage that imports the ``hf``
    extra's torch and transformers, checked below where they are installed)."""
    proc = _mypy_strict("-p", "pykvpool", "--exclude", "pykvpool/hf/")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hf_subpackage_is_mypy_clean() -> None:
    """``pykvpool.hf`` against torch's and transformers' own types (``tests/run.sh``
    installs them; a venv without the ``hf`` extra skips this)."""
    if not all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers")):
        pytest.skip("pykvpool.hf needs the hf extra (torch, transformers) to be type-checked")
    proc = _mypy_strict("-p", "pykvpool.hf")
    assert proc.returncode == 0, proc.stdout + proc.stderr
