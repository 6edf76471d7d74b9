"""The report's presets table compares like with like: every device row of one model stores
the weights in one precision (a 70B model in fp8 on the H200 as on the 80 GB devices), the
table stays compact (one row per model and device, both KV dtypes side by side) and every
number stays in the data."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from pykvpool.errors import BudgetError
from pykvpool.planning.hardware import HARDWARE, hardware_preset
from pykvpool.planning.ledger import GIB, default_budget
from pykvpool.planning.models import MODELS, model_preset
from pykvpool.report.presets import PRESET_LENGTH, preset_ledger, presets_table, table_weight_bytes

BUDGETS = [default_budget(hw) for hw in HARDWARE.values()]


@pytest.fixture(scope="module")
def table() -> tuple[str, list[dict[str, Any]]]:
    return presets_table()


def _rows(md: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines()
            if line.startswith("| ") and not line.startswith("| model |")]


def test_every_row_of_a_model_stores_the_same_weights(table: tuple[str, list[dict[str, Any]]]) -> None:
    md, data = table
    per_model: dict[str, set[float]] = defaultdict(set)
    for d in data:
        if "same_as" not in d:
            per_model[d["model"]].add(d["weight_bytes_per_param"])
    assert all(len(v) == 1 for v in per_model.values()), per_model
    rows = {(d["hardware"], d["model"], d["dtype"]): d for d in data if "same_as" not in d}
    for dt in ("bf16", "fp8"):  # Llama-3-70B: fp8 on the H200 too, as bf16 fits only there
        assert {rows[(hw, "llama-3-70b", dt)]["weight_bytes"] for hw in HARDWARE} == {70.6e9}
        assert rows[("h200", "llama-3-70b", dt)]["weights"] == "fp8, 1 B/param"
    cells: dict[str, set[str]] = defaultdict(set)
    for r in _rows(md):
        cells[r[0]].add(r[1])
    assert all(len(v) == 1 for v in cells.values()), cells
    assert cells["Llama-3-70B = Llama-3.1-70B = Llama-3.3-70B"] == {"fp8, 65.75 GiB"}
    assert "fp8 (bf16 weights fit the H200 SXM only) for Llama-3-70B" in md


def test_the_precision_is_the_highest_that_fits_the_most_devices() -> None:
    picks = {k: table_weight_bytes(model_preset(k), BUDGETS) for k in
             ("llama-3.1-8b", "qwen3-32b", "llama-3.1-70b", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v3")}
    assert picks == {"llama-3.1-8b": 2.0, "qwen3-32b": 2.0, "llama-3.1-70b": 1.0, "gpt-oss-120b": 0.5,
                     "qwen3-235b-a22b": 0.5, "deepseek-v3": None}
    # 4-bit Qwen3-235B-A22B (109 GiB) fits the H200 only: the one device, no other precision
    assert [hw for hw, b in zip(HARDWARE, BUDGETS) if _fits(model_preset("qwen3-235b-a22b"), 0.5, b)] == ["h200"]


def _fits(model: Any, weight_bytes: float, budget: Any) -> bool:
    try:
        preset_ledger(model, budget, "bf16", weight_bytes)
    except BudgetError:
        return False
    return True


def test_what_fits_nowhere_is_said_and_kept_in_the_data(table: tuple[str, list[dict[str, Any]]]) -> None:
    md, data = table
    names = {r[0] for r in _rows(md)}
    assert not any("DeepSeek-V3" in n for n in names)
    assert "DeepSeek-V3 (4-bit weights 312.5 GiB; KV 70,272 / 35,380 B/token" in md
    ds = [d for d in data if d["model"] == "deepseek-v3"]
    assert len(ds) == 2 * len(HARDWARE) and not any(d["fits"] for d in ds) and all("error" in d for d in ds)
    qwen = [r for r in _rows(md) if r[0] == "Qwen3-235B-A22B"]
    assert [r[3] for r in qwen] == ["H200 SXM"] and qwen[0][1] == "4-bit, 109.43 GiB"
    assert "Qwen3-235B-A22B: 4-bit weights (109.4 GiB) on the A100-80GB SXM, H100 SXM" in md
    assert "weights exceed budget" not in md  # the report's own check on its markdown


def test_the_table_is_compact_and_keeps_every_number(table: tuple[str, list[dict[str, Any]]]) -> None:
    md, data = table
    rows = _rows(md)
    shared = [d for d in data if "same_as" in d]
    assert {(d["model"], d["same_as"]) for d in shared} == {
        ("llama-3.1-8b", "llama-3-8b"), ("llama-3.1-70b", "llama-3-70b"), ("llama-3.3-70b", "llama-3-70b")}
    fits = [d for d in data if d.get("fits")]
    assert len(rows) == len(fits) // 2 == 3 * (len(MODELS) - 3 - 1) - 2  # both KV dtypes in one row
    assert len(data) == 2 * len(HARDWARE) * (len(MODELS) - 3) + 3
    assert all(d["source"] for d in data)
    assert "Sources (Hugging Face config.json)" in md and "deepseek-ai/DeepSeek-V3" in md


def test_numbers_of_a_full_and_a_windowed_model(table: tuple[str, list[dict[str, Any]]]) -> None:
    md, data = table
    rows = {(d["hardware"], d["model"], d["dtype"]): d for d in data if "same_as" not in d}
    llama = rows[("a100-80gb-sxm", "llama-3-8b", "bf16")]
    assert llama["token_capacity"] == 500_063 and not llama["windowed"]  # the article's number
    assert ("| Llama-3-8B = Llama-3.1-8B | bf16, 14.96 GiB | 131,072 / 67,584 | A100-80GB SXM | "
            f"500,063 / {rows[('a100-80gb-sxm', 'llama-3-8b', 'fp8')]['token_capacity']:,} | 61 / ") in md
    g3 = rows[("a100-80gb-sxm", "gemma-3-12b", "bf16")]
    budget = default_budget(hardware_preset("a100-80gb-sxm"))
    kv_budget = budget.available_bytes - 12.2e9 * 2
    per_seq = (40 * 1024 + 8 * 8192) * 8192  # bytes of one 8,192-token sequence
    batch = int(kv_budget // per_seq)
    assert g3["windowed"] and g3["token_capacity"] is None and batch == 65
    assert g3[f"tokens_at_{PRESET_LENGTH}"] == batch * 8192 == 532_480
    assert g3["full_history_token_capacity"] == int(kv_budget // 393216)
    assert "| Gemma-3-12B | bf16, 22.72 GiB | 393,216 / 199,680 | A100-80GB SXM | 532,480 / " in md


def test_preset_ledger_stores_weights_as_asked() -> None:
    m = model_preset("llama-3-70b")
    a100, h200 = (default_budget(hardware_preset(k)) for k in ("a100", "h200"))
    led, weights = preset_ledger(m, h200, "bf16", 1.0)
    assert weights == "fp8, 1 B/param" and led.weight_bytes == 70.6e9
    assert preset_ledger(m, a100, "bf16", 1.0)[0].token_capacity == preset_ledger(m, a100, "bf16")[0].token_capacity
    led, weights = preset_ledger(m, h200, "bf16")  # without weight_bytes: as the preset says where it fits
    assert weights == "2 B/param" and led.weight_bytes == m.weight_bytes
    with pytest.raises(BudgetError):
        preset_ledger(m, a100, "bf16", 2.0)
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="weight_bytes"):
            preset_ledger(m, h200, "bf16", bad)
    assert f"{preset_ledger(m, h200, 'fp8', 0.5)[0].weight_bytes / GIB:.2f}" == "32.88"
