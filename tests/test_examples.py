"""The examples run and do what they say."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_serving_loop_finishes_every_request_and_matches_numpy() -> None:
    ex = _load("serving_loop")
    reqs = ex.make_requests()
    res = ex.serve(reqs)
    assert res.generated == {r.rid: r.output for r in reqs}
    assert res.preemptions >= 1  # the pool is too small for every request at once
    assert res.pool.num_seqs == 0 and res.pool.num_used_blocks == 0
    assert res.pool.num_free_blocks == ex.NUM_BLOCKS
    res.pool.check_invariants()
    assert res.max_error < 1e-4
    # A step can only decode what is running: at least the longest output, at most all.
    assert max(r.output for r in reqs) <= res.steps <= sum(r.output for r in reqs)


def test_serving_loop_detects_a_wrong_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy check can fail: prompt K written in reverse order is caught."""
    ex = _load("serving_loop")

    def bad_admit(pool: Any, cache: Any, req: Any) -> None:
        slots = pool.add_sequence(req.rid, req.length)
        cache.write(0, req.k[: req.length][::-1].copy(), req.v[: req.length], slots)

    monkeypatch.setattr(ex, "admit", bad_admit)
    assert ex.serve(ex.make_requests()).max_error > 1e-3


def test_serving_loop_runs_as_a_script() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "serving_loop.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "6 requests finished" in proc.stdout and "0 blocks still used" in proc.stdout
