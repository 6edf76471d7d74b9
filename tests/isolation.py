"""Run a test in a child process with a timeout (not a test module).

Concurrency and crash tests must not be able to freeze or kill the test run: a test
decorated with :func:`isolated` re-runs itself as ``python -m pytest <its node id>`` in a
subprocess. A deadlock there ends in a timeout and a crash in a non-zero exit, both of
which fail the test in the parent instead of hanging or aborting it.
"""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys
from typing import Any, Callable, TypeVar

import pytest

F = TypeVar("F", bound=Callable[..., Any])

_CHILD = "PYKVPOOL_ISOLATED_TEST"


def isolated(timeout: float) -> Callable[[F], F]:
    """Decorate a test without fixtures so that it runs in a subprocess within ``timeout`` s."""

    def decorate(test: F) -> F:
        node = f"{inspect.getfile(test)}::{test.__name__}"

        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> Any:
            if os.environ.get(_CHILD) == node:
                return test(*args, **kwargs)
            env = {**os.environ, _CHILD: node}
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node]
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{test.__name__} did not finish within {timeout} s (a deadlock?)")
            assert proc.returncode == 0, f"child exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            return None

        return run  # type: ignore[return-value]

    return decorate
