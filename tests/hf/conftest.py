"""One torch thread for every `pykvpool.hf` test: torch's OpenMP threads spin beside
pykvpool's on a shared machine (tests/hf/test_hf.py once took 14 minutes on a loaded one at
torch's default threads); the tiny models stay fast and results do not depend on it."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    torch = sys.modules.get("torch")  # imported by the test module, or absent (it skipped)
    before = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(1)
    yield
    if torch is not None and before is not None:
        torch.set_num_threads(before)
