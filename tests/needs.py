"""What a test needs from the machine (a program, an optional package): without it the test
skips on a developer's machine and fails under CI (``CI=true``), where `tests/run.sh` installs
everything, so a missing piece there is a broken set-up, never a silent skip. Imported as
``from needs import missing``."""

from __future__ import annotations

import os

import pytest


def missing(what: str) -> None:
    """Skip the calling test because ``what`` is missing, or fail it under CI.

    Raises:
        pytest.fail.Exception: under ``CI=true``.
        pytest.skip.Exception: otherwise.
    """
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} (CI installs it: a broken set-up)")
    pytest.skip(what)
