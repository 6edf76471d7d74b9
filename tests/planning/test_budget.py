"""One budget everywhere: ``default_budget`` in the ledger, the simulator's pool size and
the ``ledger`` / ``sweep`` / ``simulate`` commands agree, and each prints the budget;
keyword-only ledger arguments; Hugging Face configs the ledger cannot model are refused."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pykvpool
from pykvpool import simulate as sim
from pykvpool.errors import BudgetError
from pykvpool.planning.hardware import HARDWARE, hardware_preset
from pykvpool.planning.ledger import GIB, Budget, MemoryLedger, article_budget, default_budget
from pykvpool.planning.models import ModelConfig, model_preset, storage_dtype

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True,
                          check=False, timeout=120, env=env)


def test_default_budget_is_the_articles_on_the_a100() -> None:
    a100 = hardware_preset("a100-80gb-sxm")
    b = default_budget(a100)
    assert b == article_budget()
    assert (b.device_bytes, b.fraction, b.reserve_bytes) == (80 * GIB, 1.0, 4 * GIB)
    assert b.describe() == "80.00 GiB x 1.00 - 4.00 GiB reserve = 76.00 GiB"
    assert b.available_bytes == 76 * GIB
    led = MemoryLedger(model_preset("llama-3-8b"), b)
    assert led.token_capacity == 500_063
    h200 = default_budget(hardware_preset("h200"))
    assert h200.device_bytes == HARDWARE["h200"].memory_bytes and h200.reserve_bytes == 4 * GIB


def test_describe_follows_the_fields() -> None:
    b = Budget(24 * GIB, 0.9, 2 * GIB)
    assert b.describe() == "24.00 GiB x 0.90 - 2.00 GiB reserve = 19.60 GiB"


@pytest.mark.parametrize("kw", [{"device_bytes": math.inf}, {"device_bytes": math.nan},
                                {"device_bytes": 0.0}, {"reserve_bytes": math.inf},
                                {"reserve_bytes": math.nan}, {"reserve_bytes": -1.0},
                                {"fraction": math.nan}, {"fraction": 0.0}, {"fraction": 1.01}])
def test_budget_refuses_nonsense(kw: dict[str, float]) -> None:
    args = {"device_bytes": 80 * GIB, "fraction": 1.0, "reserve_bytes": 0.0, **kw}
    with pytest.raises(pykvpool.InvalidArgumentError):
        Budget(**args)


def test_simulator_pool_is_the_ledgers_capacity() -> None:
    m, hw = model_preset("llama-3-8b"), hardware_preset("a100-80gb-sxm")
    assert sim.kv_blocks_for_memory(m, hw, 16) == 31_253 == 500_063 // 16
    for budget in (Budget(40 * GIB, 0.9, 2 * GIB), Budget(hw.memory_bytes, 0.5)):
        for bs, dt in ((16, "bf16"), (32, "fp8"), (1, "f32")):
            led = MemoryLedger(m, budget, storage_dtype(dt))
            assert sim.kv_blocks_for_memory(m, hw, bs, budget=budget, kv_dtype=dt) == led.token_capacity // bs


def test_simulator_pool_errors() -> None:
    m, hw = model_preset("llama-3-8b"), hardware_preset("a100-80gb-sxm")
    with pytest.raises(BudgetError):
        sim.kv_blocks_for_memory(model_preset("llama-3-70b"), hw)
    tiny = Budget(m.weight_bytes + 40 * 131072)  # 40 tokens of KV
    assert sim.kv_blocks_for_memory(m, hw, 16, budget=tiny) == 2
    with pytest.raises(BudgetError, match="holds no block of 64 tokens"):
        sim.kv_blocks_for_memory(m, hw, 64, budget=tiny)
    for bad in (0, -16, True):
        with pytest.raises(pykvpool.InvalidArgumentError, match="block_size"):
            sim.kv_blocks_for_memory(m, hw, bad)
    with pytest.raises(TypeError):
        sim.kv_blocks_for_memory(m, hw, 16, 0.9)  # type: ignore[misc]  # the old memory_fraction


def test_ledger_arguments_are_keyword_only() -> None:
    led = MemoryLedger(model_preset("llama-3-8b"), article_budget())
    a100 = hardware_preset("a100-80gb-sxm")
    for call in (lambda: led.row(32, 8192), lambda: led.kv_bytes(8192, 32),  # type: ignore[misc]
                 lambda: led.max_batch(8192), lambda: led.max_seq_len(32),  # type: ignore[misc]
                 lambda: led.decode_bound(a100, 8192, 1)):  # type: ignore[misc]
        with pytest.raises(TypeError):
            call()
    assert led.row(batch=32, seq_len=8192).kv_bytes == led.kv_bytes(seq_len=8192, batch=32) == 32 * GIB
    assert led.kv_bytes(seq_len=0) == 0.0
    for bad in ({"seq_len": -1}, {"seq_len": 8, "batch": -1}, {"seq_len": 1.5}):
        with pytest.raises(pykvpool.InvalidArgumentError):
            led.kv_bytes(**bad)  # type: ignore[arg-type]


def _ledger_json(tmp: Path, *args: str) -> dict[str, object]:
    r = cli("ledger", *args, "--out", str(tmp))
    assert r.returncode == 0, r.stderr
    data: dict[str, object] = json.loads((tmp / "ledger.json").read_text())
    data["stdout"] = r.stdout
    return data


@pytest.mark.parametrize("args", [
    [],
    ["--hardware", "h100-sxm", "--memory-gib", "40", "--fraction", "0.9", "--reserve-gib", "2"],
    ["--model", "mistral-7b", "--hardware", "h200", "--reserve-gib", "0"],
], ids=["default", "custom", "h200"])
def test_ledger_sweep_and_simulate_print_and_use_one_budget(tmp_path: Path, args: list[str]) -> None:
    hw = args[args.index("--hardware") + 1] if "--hardware" in args else "a100-80gb-sxm"
    model = args[args.index("--model") + 1] if "--model" in args else "llama-3-8b"
    led = _ledger_json(tmp_path, *args)
    budget_line = next(line for line in str(led["stdout"]).splitlines() if line.startswith("budget "))
    capacity = led["token_capacity"]
    assert isinstance(capacity, int)
    sim_args = [a for a in args if a not in ("--model", model, "--hardware", hw)]
    s = cli("simulate", "--model", model, "--hardware", hw, *sim_args, "--requests", "20", "--block-size", "32")
    assert s.returncode == 0, s.stderr
    assert budget_line in s.stdout  # the same text, then "on <device>"
    m = re.search(r"= ([\d,]+) tokens = ([\d,]+) blocks of 32 tokens", s.stdout)
    assert m is not None, s.stdout
    assert int(m.group(1).replace(",", "")) == capacity
    assert int(m.group(2).replace(",", "")) == capacity // 32
    assert f"20 requests, {capacity // 32} blocks of 32 tokens" in s.stdout
    w = cli("sweep", "--model", model, *(["--hardware", hw] if "--hardware" in args else []), *sim_args,
            "--quiet", "--block-sizes", "16")
    assert w.returncode == 0, w.stderr
    assert w.stdout.splitlines()[0] == budget_line
    assert f"= {capacity:,} tokens" in w.stdout


def test_ledger_json_records_the_budget(tmp_path: Path) -> None:
    data = _ledger_json(tmp_path)
    assert data["budget"] == {"device_bytes": 80 * GIB, "fraction": 1.0, "reserve_bytes": 4 * GIB,
                              "text": "80.00 GiB x 1.00 - 4.00 GiB reserve = 76.00 GiB"}
    assert data["token_capacity"] == 500_063


# ---- Hugging Face configs the ledger still cannot model ----------------------------------
# (windows, MLA and experts are modelled: tests/planning/test_ledger_hybrid.py)

LLAMA = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
         "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
         "max_position_embeddings": 8192}


@pytest.mark.parametrize(("extra", "key"), [
    ({"layer_types": ["linear_attention"] + ["full_attention"] * 31}, "layer_types"),
    ({"layer_types": ["full_attention"] * 31}, "layer_types"),
    ({"layer_types": "full_attention"}, "layer_types"),
    ({"attention_chunk_size": 8192}, "attention_chunk_size"),
    ({"attention_chunk_size": 8192, "no_rope_layers": [1, 0]}, "attention_chunk_size"),
    ({"layers_block_type": ["mamba"] * 32}, "layers_block_type"),
    ({"attn_layer_period": 8}, "attn_layer_period"),
    ({"hybrid_override_pattern": "M-M*"}, "hybrid_override_pattern"),
    ({"num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 2}, "decoder_sparse_step"),
    ({"num_experts": 128, "num_experts_per_tok": 8, "mlp_only_layers": [3]}, "mlp_only_layers"),
])
def test_from_hf_config_refuses_what_it_cannot_model(extra: dict[str, object], key: str) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match=f"'{key}' = .* not modelled"):
        ModelConfig.from_hf_config({**LLAMA, **extra})


@pytest.mark.parametrize(("extra", "message"), [
    ({"num_experts": "many"}, "'num_experts' must be an integer"),
    ({"num_local_experts": 8}, "has no 'num_experts_per_tok'"),
    ({"kv_lora_rank": 512}, "has no 'qk_rope_head_dim'"),
    ({"layer_types": ["sliding_attention"] * 32}, "has no 'sliding_window'"),
    ({"sliding_window": 0}, "'sliding_window' must be in 1 .."),
])
def test_from_hf_config_names_a_missing_or_bad_key(extra: dict[str, object], message: str) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match=re.escape(message)):
        ModelConfig.from_hf_config({**LLAMA, **extra})


@pytest.mark.parametrize("extra", [
    {"sliding_window": None},
    {"sliding_window": 131072, "use_sliding_window": False},  # Qwen2.5's config.json
    {"sliding_window": 8192},  # a window as long as the context is full attention
    {"layer_types": ["full_attention"] * 32},
    {"kv_lora_rank": None, "num_experts": None, "num_local_experts": 1, "head_dim": None},
])
def test_from_hf_config_accepts_dense_full_attention(extra: dict[str, object]) -> None:
    m = ModelConfig.from_hf_config({**LLAMA, **extra})
    assert m.kv_bytes_per_token("bf16") == 131072 and m.head_dim == 128


def test_experts_are_fine_when_the_parameter_count_is_given() -> None:
    """Experts only break the weight estimate; the KV of a MoE decoder is a dense one's."""
    m = ModelConfig.from_hf_config({**LLAMA, "num_local_experts": 8}, num_params=46.7e9)
    assert m.num_params == 46.7e9 and m.kv_bytes_per_token("bf16") == 131072


def test_from_hf_config_refuses_huge_or_non_finite_sizes() -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match="num_hidden_layers"):
        ModelConfig.from_hf_config({**LLAMA, "num_hidden_layers": 2**40})
    with pytest.raises(pykvpool.InvalidArgumentError, match="num_params"):
        ModelConfig.from_hf_config(LLAMA, num_params=math.nan)
