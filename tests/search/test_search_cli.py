"""``pykvpool search`` as a real process: a small search writes its tables and figures and
prints the best point per SLO; every user error exits 2 with one ``pykvpool: error:``
line and no traceback."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pykvpool.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
BASE = ["search", "--trace", "azure-conv", "--limit", "60", "--rates", "0.5,8,4", "--inline"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYKVPOOL_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True,
                          check=False, cwd=cwd, timeout=300, env=env)


def test_a_search_writes_tables_figures_and_the_best_point(tmp_path: Path) -> None:
    out = tmp_path / "s"
    r = run(*BASE, "--ttft-p99", "2", "--slo", "loose:ttft_p99=30,tpot_p50=1", "--devices", "1,2",
            "--max-running", "2,128", "--objective", "per-dollar", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "deployment search" in r.stderr
    assert "6 configurations of Llama-3-8B on 60 requests" in r.stdout
    assert "SLO slo: best a100-80gb-sxm|x1:tp1|" in r.stdout and "SLO loose: best" in r.stdout
    assert "latency at the reference rate (best point)" in r.stdout and "SLO loose at " in r.stdout
    for name in ("points.csv", "points.json", "points.jsonl", "frontier.csv", "best.json", "frontier.png",
                 "sustained_rate.png", "search.json", "frontier_latency.csv", "frontier_latency.png", "latency.json"):
        assert (out / name).stat().st_size > 0, name
    with open(out / "points.csv") as f:
        table = list(csv.DictReader(f))
    # Two devices as two replicas or as one tensor-parallel group (--tp defaults to 1,2,4,8).
    assert [(row["devices"], row["tensor_parallel"]) for row in table] == [("1", "1"), ("2", "1"), ("2", "2")] * 2
    best = json.loads((out / "best.json").read_text())
    assert best["objective"] == "per_dollar" and best["best"]["slo"]["key"] in {row["key"] for row in table}
    assert best["best"]["slo"]["cost"] == 1.30  # one A100 at the default price
    if _has("pyarrow"):
        import pyarrow.parquet as pq

        assert pq.read_table(out / "points.parquet").num_rows == 6


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def test_a_space_file_gives_the_axes_and_a_flag_overrides_one(tmp_path: Path) -> None:
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"devices": [1, 2], "tensor_parallel": [1], "kv_dtypes": ["bf16", "fp8"],
                                 "hardware": ["h100"], "chunked_prefill": [True]}))
    out = tmp_path / "s"
    r = run(*BASE, "--ttft-p99", "2", "--space", str(space), "--kv-dtypes", "fp8", "--no-latency",
            "--no-figures", "--out", str(out))
    assert r.returncode == 0, r.stderr
    with open(out / "points.csv") as f:
        got = [(row["hardware"], row["devices"], row["tensor_parallel"], row["kv_dtype"]) for row in csv.DictReader(f)]
    assert got == [("h100-sxm", "1", "1", "fp8"), ("h100-sxm", "2", "1", "fp8")]


def test_a_search_per_watt_ranks_by_the_devices_power(tmp_path: Path) -> None:
    out = tmp_path / "w"
    r = run(*BASE, "--ttft-p99", "2", "--hardware", "a100,h100", "--objective", "per-watt", "--out", str(out))
    assert r.returncode == 0, r.stderr
    best = json.loads((out / "best.json").read_text())
    assert best["objective"] == "per_watt" and best["unit"] == "req/s per kW"
    with open(out / "points.csv") as f:
        costs = {(row["hardware"], row["devices"]): float(row["cost"]) for row in csv.DictReader(f)}
    assert costs == {("a100-80gb-sxm", "1"): 0.4, ("h100-sxm", "1"): 0.7}
    assert (out / "frontier.png").stat().st_size > 0


def test_user_prices_are_read(tmp_path: Path) -> None:
    prices = tmp_path / "p.json"
    prices.write_text(json.dumps({"a100-80gb-sxm": 2.5}))
    r = run(*BASE, "--ttft-p99", "2", "--objective", "per-dollar", "--prices", str(prices), "--no-figures",
            "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "o" / "best.json").read_text())["best"]["slo"]["cost"] == 2.5


@pytest.mark.parametrize("args, message", [
    ([], "give at least one SLO bound"),
    (["--slo", "x"], "argument --slo: expected NAME:key=value"),
    (["--slo", "x:ttfb=1"], "keys are ttft_p99"),
    (["--slo", "x:attainment=0.9"], "needs a per-request bound"),
    (["--slo", "x:ttft=1,attainment=1.5"], "x.attainment"),
    (["--slo", "a b:ttft_p99=1"], "name must be"),
    (["--slo", "a:ttft_p99=1", "--slo", "a:ttft_p99=2"], "two SLOs of one name"),
    (["--ttft-p99", "0"], "argument --ttft-p99: must be > 0"),
    (["--ttft-p99", "1", "--rates", "4,2,3"], "hi (2.0) must be >= lo"),
    (["--ttft-p99", "1", "--space", "LIST"], "expected a JSON object of axes"),
    (["--ttft-p99", "1", "--space", "AXIS"], "unknown axis 'gpus'"),
    (["--ttft-p99", "1", "--space", "FLAGS"], "chunked_prefill must hold bools"),
    (["--ttft-p99", "1", "--space", "SCALAR"], "devices must be a non-empty list"),
    (["--ttft-p99", "1", "--space", "ZERO"], "devices must hold integers"),
    (["--ttft-p99", "1", "--space", "BAD"], "not valid JSON"),
    (["--ttft-p99", "1", "--space", "missing.json"], "missing.json"),
    (["--ttft-p99", "1", "--rates", "1,2"], "expected LO,HI,STEPS"),
    (["--ttft-p99", "1", "--devices", "0"], "argument --devices"),
    (["--ttft-p99", "1", "--hardware", "tpu"], "argument --hardware"),
    (["--ttft-p99", "1", "--chunked-prefill", "yes"], "argument --chunked-prefill"),
    (["--ttft-p99", "1", "--ray", "--inline"], "exclude each other"),
    (["--ttft-p99", "1", "--requests", "5"], "with --trace use --limit"),
    (["--ttft-p99", "1", "--objective", "per-dollar", "--hardware", "a100-80gb-sxm", "--prices", "PRICES"],
     "no price for hardware 'a100-80gb-sxm'"),
    (["--ttft-p99", "1", "--prices", "BAD"], "not valid JSON"),
    (["--ttft-p99", "1", "--prices", "LIST"], "expected a JSON object"),
    (["--ttft-p99", "1", "--prices", "NEG"], "prices['h100-sxm'] must be finite and > 0"),
    (["--ttft-p99", "1", "--prices", "missing.json"], "missing.json"),
    (["--ttft-p99", "1", "--prices", "DEEP"], "DEEP: not valid JSON (nested deeper than Python's parser goes)"),
    (["--ttft-p99", "1", "--prices", "HUGE"], "prices['a100-80gb-sxm'] must be finite, got an integer too large"),
])
def test_user_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                          message: str) -> None:
    """In this process (``main`` is what the ``pykvpool`` script runs), for speed."""
    files = {"PRICES": {"h100-sxm": 3.0}, "BAD": "{", "LIST": [1], "NEG": {"h100-sxm": -1},
             "DEEP": "[" * 10_000 + "]" * 10_000, "HUGE": {"a100-80gb-sxm": 10**400},
             "AXIS": {"gpus": [1]}, "FLAGS": {"chunked_prefill": [1]}, "SCALAR": {"devices": 4},
             "ZERO": {"devices": [0]}}
    for name, content in files.items():
        (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    args = [str(tmp_path / a) if a in files else a for a in args]
    try:
        status = main([*BASE, *args, "--out", str(tmp_path / "o")])
    except SystemExit as e:  # argparse's refusals
        status = e.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith("pykvpool: error:") and message in err, err
    assert "Traceback" not in err and not (tmp_path / "o" / "points.jsonl").exists()


def test_a_folder_of_another_search_is_refused(tmp_path: Path) -> None:
    out = str(tmp_path / "o")
    assert run(*BASE, "--ttft-p99", "2", "--no-figures", "--out", out).returncode == 0
    r = run(*BASE, "--ttft-p99", "3", "--no-figures", "--out", out)
    assert r.returncode == 2 and r.stderr.startswith("pykvpool: error: out: ") and "another search" in r.stderr


def test_an_unknown_trace_is_a_user_error(tmp_path: Path) -> None:
    r = run("search", "--trace", str(tmp_path / "nope.csv"), "--ttft-p99", "1", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "no such file, nor a trace shipped with pykvpool" in r.stderr


def test_an_out_folder_named_like_a_uri_is_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out a:b`` is the folder ``a:b`` for every file, the Parquet table included."""
    monkeypatch.chdir(tmp_path)
    assert main([*BASE, "--ttft-p99", "2", "--no-figures", "--quiet", "--out", "a:b"]) == 0
    assert (tmp_path / "a:b" / "points.json").is_file()
    if _has("pyarrow"):
        assert (tmp_path / "a:b" / "points.parquet").is_file()
