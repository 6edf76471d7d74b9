"""One spelling of each KV dtype everywhere: KvCache's names (``pykvpool.KV_DTYPES``) plus the
planning-only ``fp8``. Every alias (planning's former ``fp32`` / ``fp16``, KvCache's own
``float32``, ``half``, ``e4m3``, ...) reads as its one spelling, and what the package prints,
stores and compares (the ledger's JSON, search points and their keys, a search folder read
back or resumed, the report's search section, the video plans) uses that spelling only."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import pykvpool as kv
from pykvpool.cli.main import build_parser, main
from pykvpool.planning.hardware import hardware_preset
from pykvpool.planning.ledger import Budget, MemoryLedger
from pykvpool.planning.models import DTYPE_ALIASES, DTYPES, compute_precision, model_preset, storage_dtype
from pykvpool.planning.roofline import Roofline
from pykvpool.planning.video import VIDEO_KV_8BIT, VIDEO_MODELS
from pykvpool.search import SearchSpace
from pykvpool.search.folder import read_search
from pykvpool.simulate.video import VideoRoofline
from pykvpool.video import VideoCache

#: Every alias and the one spelling it reads as (KvCache's aliases: ``rust/kv/elem.rs``).
ALIASES = {"fp32": "f32", "fp16": "f16", "float32": "f32", "float16": "f16", "half": "f16",
           "bfloat16": "bf16", "i8": "int8", "e4m3": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3",
           "e5m2": "fp8_e5m2", "float8_e5m2": "fp8_e5m2"}

SEARCH = ["search", "--trace", "azure-conv", "--limit", "60", "--rates", "0.5,16,4", "--inline", "--quiet",
          "--ttft-p99", "2", "--max-running", "64", "--no-figures"]


def test_the_base_names_are_kvcaches_then_fp8() -> None:
    assert DTYPES == (*kv.KV_DTYPES, "fp8") == ("f32", "f16", "bf16", "int8", "fp8_e4m3", "fp8_e5m2", "fp8")
    for d in kv.KV_DTYPES:
        dt = storage_dtype(d)
        assert dt.name == dt.native == d
        for head_dim in (1, 64, 128, 576):
            assert 2 * dt.vector_bytes(head_dim) == kv.KvCache.bytes_per_token(1, head_dim, d)
    assert storage_dtype("fp8").native is None and storage_dtype("fp8").vector_bytes(128) == 132


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_every_alias_reads_as_its_one_spelling(alias: str) -> None:
    one = ALIASES[alias]
    for spelled in (alias, alias.upper(), f" {alias} "):
        dt = storage_dtype(spelled)
        assert dt == storage_dtype(one) and dt.name == one
    if alias not in DTYPE_ALIASES:  # KvCache reads its own aliases as the same name
        assert kv.KvCache(1, 1, 1, 1, 8, alias).dtype == one
    assert storage_dtype(f"{alias}:head").name == one


def test_planning_aliases_and_suffixes() -> None:
    assert dict(DTYPE_ALIASES) == {"fp32": "f32", "fp16": "f16"}
    assert storage_dtype("fp32").name == "f32" and storage_dtype("fp16").name == "f16"
    assert storage_dtype("INT8:G32").name == "int8:g32" and storage_dtype("fp8:Tensor").name == "fp8:tensor"
    for bad in ("fp16:g32", "f32:tensor", "e4m3:g8"):
        with pytest.raises(kv.InvalidArgumentError, match="no per-token scales"):
            storage_dtype(bad)
    for bad in ("int8:g" + "9" * 5000, "int8:g\u00b2"):  # a huge or a non-ASCII digit group size
        with pytest.raises(kv.InvalidArgumentError, match="granularity"):
            storage_dtype(bad)
    with pytest.raises(kv.UnknownPresetError, match="choose one of: f32, f16, bf16, int8"):
        storage_dtype("fp64")


def test_compute_precision_maps_a_kv_dtype_to_the_datasheets_name() -> None:
    expected = {"f32": "fp32", "fp32": "fp32", "f16": "fp16", "fp16": "fp16", "bf16": "bf16", "int8": "int8",
                "int8:g32": "int8", "fp8": "fp8", "fp8:tensor": "fp8", "fp8_e4m3": "fp8", "e5m2": "fp8"}
    for d, precision in expected.items():
        assert compute_precision(d) == compute_precision(storage_dtype(d)) == precision
    h100 = hardware_preset("h100-sxm")
    assert h100.flops(compute_precision("fp8_e4m3")) == 1979e12  # not the fp32 fallback


def test_the_ledger_cli_prints_and_stores_the_one_spelling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["ledger", "--dtype", "fp16", "--seq-len", "128", "--batch", "256", "--quiet"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "KV dtype         f16 " in out and "fp16" not in out
    data = json.loads((tmp_path / "ledger.json").read_text())
    assert data["dtype"] == "f16"
    # f16 KV runs at the datasheet's fp16 rate, as planning's fp16 did (this batch is
    # compute bound: the fp32 rate would be 16 times slower).
    led = MemoryLedger(model_preset("llama-3-8b"), Budget(81920 * 2**20), storage_dtype("f16"))
    bound = led.decode_bound(hardware_preset("a100-80gb-sxm"), seq_len=128, batch=256, compute_dtype="fp16")
    assert not bound.memory_bound
    assert data["decode"]["step_s"] == pytest.approx(bound.step_time, rel=1e-12)


def test_search_points_and_their_keys_use_the_one_spelling() -> None:
    space = SearchSpace(kv_dtypes=("fp16", "FP32", "e4m3"))
    assert space.kv_dtypes == ("f16", "f32", "fp8_e4m3")
    keys = [p.key() for p in space.points(model_preset("llama-3-8b"), False)]
    assert [k.split("|")[2] for k in keys] == ["f16", "f32", "fp8_e4m3"]
    with pytest.raises(kv.InvalidArgumentError, match="twice"):
        SearchSpace(kv_dtypes=("fp16", "f16"))
    args = build_parser().parse_args([*SEARCH, "--kv-dtypes", "fp16,bf16,float32", "--out", "unused"])
    assert args.kv_dtypes == ["f16", "bf16", "f32"]


def test_the_time_models_keep_the_one_spelling() -> None:
    m, hw = model_preset("llama-3-8b"), hardware_preset("a100-80gb-sxm")
    assert Roofline(m, hw, kv_dtype="fp16").kv_dtype == "f16"
    assert Roofline(m, hw, kv_dtype="fp16").figures() == Roofline(m, hw, kv_dtype="bf16").figures()
    assert VideoRoofline(VIDEO_MODELS["longlive"], hw, kv_dtype="fp32").kv_dtype == "f32"


def test_the_video_plans_count_the_bytes_the_video_cache_stores() -> None:
    assert VIDEO_KV_8BIT in kv.KV_DTYPES
    for m in VIDEO_MODELS.values():
        per_layer = kv.KvCache.bytes_per_token(m.num_kv_heads, m.head_dim, VIDEO_KV_8BIT)
        assert m.kv_bytes_per_token(VIDEO_KV_8BIT) == m.num_layers * per_layer
    ll = VIDEO_MODELS["longlive"]
    cache = VideoCache(num_layers=ll.num_layers, num_kv_heads=ll.num_kv_heads, head_dim=ll.head_dim,
                                tokens_per_frame=4, grid=(2, 2), frames_per_chunk=1, num_blocks=2,
                                block_size=16, dtype=VIDEO_KV_8BIT)
    assert cache.bytes_per_block == 16 * ll.kv_bytes_per_token(VIDEO_KV_8BIT) == 16 * 2 * 30 * 12 * 128


def _old_spelling(folder: Path, dtype: str, old: str) -> None:
    """Rewrite a search folder as a search that spelled ``dtype`` as ``old`` wrote it."""
    for f in folder.iterdir():
        if f.suffix in (".json", ".jsonl", ".csv"):
            text = f.read_text().replace(f"|{dtype}|", f"|{old}|")
            f.write_text(re.sub(rf'("kv_dtype": *)"{dtype}"', rf'\1"{old}"', text).replace(f",{dtype},", f",{old},"))


def test_a_search_folder_written_with_fp16_reads_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "s"
    assert main([*SEARCH, "--kv-dtypes", "f16,bf16", "--out", str(d)]) == 0
    new = read_search(d)
    _old_spelling(d, "f16", "fp16")
    assert '"kv_dtype": "fp16"' in (d / "points.json").read_text() and "|fp16|" in (d / "points.jsonl").read_text()
    old = read_search(d)
    assert old.rows == new.rows and old.best == new.best and old.latency == new.latency
    assert {r["kv_dtype"] for r in old.rows} == {"f16", "bf16"}
    from pykvpool.report.search_section import search_section
    md, data, _ = search_section(tmp_path / "rep", old, progress=False)
    assert "fp16" not in md and "fp16" not in json.dumps(data, default=str)
    # Resuming the same search (spelled either way) evaluates nothing and writes f16.
    ran: list[Any] = []
    monkeypatch.setattr("pykvpool.search.strategies.run_chains", lambda spec, todo, *a: ran.extend(todo))
    monkeypatch.setattr("pykvpool.search.latency.run_tasks", lambda *a: ran.append(a))
    (d / "points.json").unlink()
    capsys.readouterr()
    assert main([*SEARCH, "--kv-dtypes", "fp16,bf16", "--out", str(d)]) == 0, capsys.readouterr().err
    assert ran == []
    again = read_search(d)
    assert again.rows == new.rows and again.latency == new.latency
    assert new.latency is not None and new.latency["entries"]
    for name in ("points.json", "best.json", "latency.json"):
        assert "fp16" not in (d / name).read_text(), name


def test_a_search_folder_with_an_unknown_kv_dtype_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "s"
    assert main([*SEARCH, "--no-latency", "--out", str(d)]) == 0
    shutil.copytree(d, tmp_path / "t")
    _old_spelling(tmp_path / "t", "bf16", "fp64")
    with pytest.raises(kv.InvalidArgumentError, match="kv_dtype must be a KV dtype"):
        read_search(tmp_path / "t")
