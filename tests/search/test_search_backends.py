"""pykvpool.search backends and resuming: the process pool and a local Ray (started and
stopped by the test, in a child process with a timeout) give the in-process rows exactly;
the workload goes into Ray's object store once; a search killed mid-way and run again
into the same folder skips what it recorded and ends with the uninterrupted rows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from isolation import isolated
from pykvpool import search as ds
from pykvpool.planning.models import model_preset
from pykvpool.simulate import traces
from pykvpool.tracefile import named_trace_path

ROOT = Path(__file__).resolve().parents[2]
LLAMA = model_preset("llama-3-8b")
SPACE = ds.SearchSpace(hardware=("a100-80gb-sxm", "h100-sxm"), devices=(1, 2), max_running=(4, 64, 256))
SLOS = [ds.SLO("chat", ttft_p99=1.0, tpot_p99=0.05), ds.SLO("batch", ttft_p99=20.0)]
LADDER = ds.RateLadder(0.5, 32.0, 10)


def rows(backend: ds.Backend, out: str | None = None) -> list[dict[str, object]]:
    w = traces.load_file(named_trace_path("azure-conv"), limit=120)
    return ds.search(w, LLAMA, SPACE, SLOS, ladder=LADDER, backend=backend, out=out, progress=None).rows


def test_process_pool_rows_equal_in_process_rows() -> None:
    inline = rows(ds.Backend("inline"))
    assert rows(ds.Backend("process", 2)) == inline
    assert len(inline) == 18 and {r["status"] for r in inline} == {"ok"}  # 2 hardware x 3 splits x 3


@isolated(timeout=400)
def test_ray_rows_equal_in_process_rows() -> None:
    ray = pytest.importorskip("ray")
    # Ray's workers import pykvpool from the repository, as this process does.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    inline = rows(ds.Backend("inline"))
    assert rows(ds.Backend("ray", 2)) == inline
    assert not ray.is_initialized()  # the search stopped the Ray it started
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    puts, put = [], ray.put

    def counting_put(value: object, **kw: object) -> object:
        puts.append(type(value).__name__)
        return put(value, **kw)

    ray.put = counting_put
    try:
        assert rows(ds.Backend("ray")) == inline
        assert ray.is_initialized()  # a Ray the caller started stays up
    finally:
        ray.put = put
        ray.shutdown()
    assert puts == ["SearchSpec"]


def test_importing_pykvpool_imports_neither_ray_nor_pyarrow() -> None:
    code = ("import sys, pykvpool, pykvpool.search, pykvpool.cli.main; "
            "print(sorted(m for m in ('ray', 'pyarrow', 'matplotlib') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


CLI = ["-m", "pykvpool.cli", "search", "--trace", "azure-conv", "--limit", "150", "--ttft-p99", "1",
       "--slo", "batch:ttft_p99=20", "--hardware", "a100-80gb-sxm,h100-sxm", "--devices", "1,2",
       "--max-running", "4,64,256", "--block-sizes", "16,32", "--rates", "0.5,32,10", "--inline",
       "--no-figures", "--quiet"]


def cli(out: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, *CLI, "--out", str(out)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(p: subprocess.Popen[str]) -> str:
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr
    return stdout


def test_a_killed_search_resumes_where_it_stopped(tmp_path: Path) -> None:
    whole = json.loads((finish(cli(tmp_path / "whole")) and tmp_path / "whole" / "points.json").read_text())
    out = tmp_path / "cut"
    p = cli(out)
    log = out / "points.jsonl"
    deadline = time.monotonic() + 240
    while not (log.exists() and log.read_text().count("\n") >= 1):
        assert p.poll() is None and time.monotonic() < deadline, "the search ended before a row was logged"
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    done = log.read_text().count("\n")
    assert 1 <= done < len(whole)
    with open(log, "a") as f:
        f.write('{"key": "cut sho')  # a line the kill cut short is dropped
    again = finish(cli(out))
    assert f"{len(whole) - done} evaluated" in again
    assert json.loads((out / "points.json").read_text()) == whole
    assert finish(cli(out)).count(" 0 evaluated") == 1  # a third run has nothing left
