"""Allocations sized by a caller fail with a typed error, never an abort.

Each case runs in a child process whose address space is capped (``RLIMIT_AS``), so the
host cannot hold what the call asks for: the call must raise ``InvalidArgumentError`` or
``MemoryError`` (the CLI: exit 2 with one ``pykvpool: error:`` line), and a process that
aborts or is killed fails the test instead of the run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# 6 GiB of address space: enough for Python, numpy and the package, far under what the
# calls below ask for (tens of GiB of bookkeeping at 2**30 blocks).
LIMIT = 6 << 30

_PRELUDE = f"""
import resource
resource.setrlimit(resource.RLIMIT_AS, ({LIMIT}, {LIMIT}))
import pykvpool
from pykvpool import InvalidArgumentError
"""


def _child(body: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    code = _PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def _refused(expr: str) -> None:
    proc = _child(
        f"""
        try:
            {expr}
        except (InvalidArgumentError, MemoryError) as e:
            print("refused:", type(e).__name__, e)
        else:
            print("built")
        """
    )
    assert proc.returncode == 0, f"child exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert "refused:" in proc.stdout or "built" in proc.stdout, proc.stdout


WINDOWED = "[pykvpool.FullAttention(), pykvpool.SlidingWindow(4096)]"


@pytest.mark.parametrize(
    "expr",
    [
        f"pykvpool.BlockPool(2**30, 16, {WINDOWED}, prefix_caching=True)",
        f"pykvpool.BlockPool(2**27 + 1, 16, {WINDOWED}, prefix_caching=True)",
        f"pykvpool.BlockPool(2**30, 16, {WINDOWED})",
        "pykvpool.BlockPool(2**30, 16, prefix_caching=True)",
        "pykvpool.BlockPool(2**30, 16, prefix_caching=True, verify_tokens=False)",
        "pykvpool.BlockTableBuffer(2**28, 1)",
    ],
)
def test_large_structures_refuse_instead_of_aborting(expr: str) -> None:
    _refused(expr)


def test_prefix_caching_hybrid_pool_refused_under_the_cap() -> None:
    # The allocator's 2 GiB fit; the cache's token ids and per-block records of 2**28 blocks do not.
    proc = _child(
        f"""
        try:
            pykvpool.BlockPool(2**28, 16, {WINDOWED}, prefix_caching=True)
        except InvalidArgumentError as e:
            assert "cannot allocate" in str(e) or "cannot hold token ids" in str(e), e
            print("ok")
        """
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", f"exit {proc.returncode}\n{proc.stderr[-2000:]}"


def test_replay_of_a_huge_capacity_exits_2() -> None:
    proc = _child(
        """
        import sys
        from pykvpool.cli.main import main
        sys.exit(main(["replay", "--model", "gemma-2-9b", "--capacities", "2147483647"]))
        """,
        timeout=300,
    )
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-2000:]}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pykvpool: error: "), proc.stderr[-2000:]
