"""The groups of one hybrid pool for a model (vLLM's hybrid allocator rule), the bytes of
one block, and the simulator's pool size from them; every expected value is worked out by
hand here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pykvpool
from pykvpool import simulate as sim
from pykvpool.planning.hardware import hardware_preset
from pykvpool.planning.ledger import GIB, Budget, MemoryLedger, article_budget
from pykvpool.planning.models import MODELS, LayerGroup, ModelConfig, model_preset
from pykvpool.planning.pool_groups import PoolGroup, layers_per_group, pool_layout

ROOT = Path(__file__).resolve().parents[2]
GEMMA_LAYER = 2 * 8 * 256 * 2  # K+V bytes of one token in one Gemma layer (bf16)


def _hybrid(*groups: LayerGroup) -> ModelConfig:
    return ModelConfig("x", sum(g.layers for g in groups), 8, 8, 64, 1e9, layer_groups=groups)


def test_presets_group_like_vllm() -> None:
    g3 = pool_layout(model_preset("gemma-3-12b"))
    assert g3.layers_per_group == 8 and g3.padding_layers == 0
    assert [(g.kind, g.layers, g.window) for g in g3.groups] == [("sliding", 8, 1024)] * 5 + [("full", 8, None)]
    assert g3.block_bytes == 16 * 8 * GEMMA_LAYER == 2**20
    g2 = pool_layout(model_preset("gemma-2-9b"))
    assert [(g.kind, g.layers) for g in g2.groups] == [("sliding", 21), ("full", 21)]
    assert g2.block_bytes == 16 * 21 * GEMMA_LAYER
    oss = pool_layout(model_preset("gpt-oss-20b"), block_size=32)
    assert [(g.kind, g.layers) for g in oss.groups] == [("sliding", 12), ("full", 12)]
    assert oss.block_bytes == 32 * 12 * (2 * 8 * 64 * 2)
    mistral = pool_layout(model_preset("mistral-7b"))
    assert [(g.kind, g.layers, g.window) for g in mistral.groups] == [("sliding", 32, 4096)]
    dsv2 = pool_layout(model_preset("deepseek-v2-lite"), "fp8")  # MLA: one latent per layer + a scale
    assert dsv2.layers_per_group == 27 and dsv2.block_bytes == 16 * 27 * (576 + 4)
    for key, m in MODELS.items():  # one kind: one group of every layer, the ledger's block
        if len({(g.kind, g.window) for g in m.groups}) == 1:
            lay = pool_layout(m, "fp8", 8)
            assert len(lay.groups) == 1 and lay.block_bytes == 8 * m.kv_bytes_per_token("fp8"), key


def test_group_size_rule_and_padding() -> None:
    assert layers_per_group([8, 40]) == 8  # n:1 patterns: the "1"
    assert layers_per_group([20, 30]) == 20  # vLLM's FIXME: 10 would not pad
    assert layers_per_group([12, 13]) == 13  # 13 < 1.25 x 12: pad the 12
    assert layers_per_group([4, 5]) == 4  # 5 == 1.25 x 4 is not below it
    assert layers_per_group([7]) == 7
    # 5 + 7 share no divisor but 1: group size 5, the 7 dealt round-robin into 4 + 3
    lay = pool_layout(_hybrid(LayerGroup("full", 5), LayerGroup("sliding", 7, 5000)))
    assert lay.layers_per_group == 5
    assert [(g.kind, g.layers, g.padding) for g in lay.groups] == [
        ("full", 5, 0), ("sliding", 4, 1), ("sliding", 3, 2)]
    assert lay.padding_layers == 3 and lay.block_bytes == 16 * 5 * (2 * 8 * 64 * 2)
    assert "3 padding layer slots" in lay.describe()
    # 5 + 6: 6 < 6.25, one group each, one padding slot
    lay = pool_layout(_hybrid(LayerGroup("sliding", 5, 512), LayerGroup("full", 6)))
    assert [(g.layers, g.padding) for g in lay.groups] == [(5, 1), (6, 0)]
    # groups of equal kind, window and sinks merge; another window is another kind
    lay = pool_layout(_hybrid(LayerGroup("sliding", 4, 512), LayerGroup("full", 4),
                              LayerGroup("sliding", 4, 512), LayerGroup("sliding", 4, 512, 4)))
    assert [(g.kind, g.layers, g.sink_tokens) for g in lay.groups] == [
        ("sliding", 4, 0), ("sliding", 4, 0), ("full", 4, 0), ("sliding", 4, 4)]


def test_blocks_of_a_budget_and_per_sequence() -> None:
    budget = article_budget()
    m = model_preset("gemma-3-12b")
    led = MemoryLedger(m, budget)
    lay = pool_layout(m)
    n = int(led.kv_budget_bytes // (8 * GEMMA_LAYER)) // 16  # layer-token slots of 8 layers, then blocks
    assert lay.num_blocks(led.kv_budget_bytes) == n == 54_554
    assert lay.num_blocks(-1.0) == 0
    # 8k: 5 sliding groups of ceil(1024/16) blocks + one full of 8192/16
    assert lay.blocks_per_sequence(8192) == 5 * 64 + 512
    assert lay.blocks_per_sequence(1000) == 6 * 63
    assert lay.max_sequences(8192, n) == n // 832
    for length in (1000, 8192, 32768, 131072):  # no padding: the ledger's count exactly
        assert lay.max_sequences(length, n) == led.max_batch(seq_len=length, block_size=16)
    sinks = PoolGroup("sliding", 32, 0, 4096, 4)
    assert sinks.blocks_held(10**6, 16) == 257  # 4100 tokens
    with pytest.raises(pykvpool.InvalidArgumentError, match="block_size"):
        sinks.blocks_held(10, 0)
    with pytest.raises(pykvpool.InvalidArgumentError, match="seq_len"):
        lay.max_sequences(0, n)
    with pytest.raises(pykvpool.InvalidArgumentError, match="num_blocks"):
        lay.max_sequences(8, -1)
    with pytest.raises(pykvpool.InvalidArgumentError, match="kv_budget_bytes"):
        lay.num_blocks(float("nan"))


def test_bad_arguments_name_themselves() -> None:
    m = model_preset("gemma-2-9b")
    for bad in (0, -1, True, 2.0):
        with pytest.raises(pykvpool.InvalidArgumentError, match="block_size"):
            pool_layout(m, block_size=bad)  # type: ignore[arg-type]
    with pytest.raises(pykvpool.InvalidArgumentError, match="model"):
        pool_layout("gemma-2-9b")  # type: ignore[arg-type]
    with pytest.raises(pykvpool.UnknownPresetError):
        pool_layout(m, "fp4")
    for counts in ([], [3, 0], [True]):
        with pytest.raises(pykvpool.InvalidArgumentError, match="counts"):
            layers_per_group(counts)


def test_simulator_pool_is_the_grouped_pool() -> None:
    hw = hardware_preset("a100-80gb-sxm")
    budget = Budget(80 * GIB, 0.9, 2 * GIB)
    for key in ("gemma-3-12b", "gemma-2-9b", "gpt-oss-20b"):
        m = model_preset(key)
        led = MemoryLedger(m, budget)
        per_layer = m.kv_layer_bytes("bf16")
        size = {"gemma-3-12b": 8, "gemma-2-9b": 21, "gpt-oss-20b": 12}[key]
        blocks = sim.kv_blocks_for_memory(m, hw, 16, budget=budget)
        assert blocks == int(led.kv_budget_bytes // (size * per_layer)) // 16
        assert blocks > led.token_capacity // 16  # not sized by full history any more
    # every model of one kind keeps the ledger's token capacity
    for key in ("llama-3-8b", "mistral-7b", "deepseek-v2-lite", "qwen3-30b-a3b"):
        led = MemoryLedger(model_preset(key), budget)
        assert sim.kv_blocks_for_memory(model_preset(key), hw, 16, budget=budget) == led.token_capacity // 16


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True,
                          check=False, timeout=120, env=env)


def test_cli_ledger_groups(tmp_path: Path) -> None:
    cfg = {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "num_hidden_layers": 48, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "hidden_size": 3840, "intermediate_size": 15360,
        "vocab_size": 262208, "sliding_window": 1024, "sliding_window_pattern": 6,
        "max_position_embeddings": 131072}}
    f = tmp_path / "gemma3.json"
    f.write_text(json.dumps(cfg))
    r = cli("ledger", "--hf-config", str(f), "--groups", "--block-size", "32", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # 8 layers x 32 tokens x 8,192 B = 2 MiB per block
    assert "pool groups      6 groups of 8 layers: 5 x 8 sliding (1,024) + 1 x 8 full; " \
           "block 32 tokens = 2.00 MiB" in lines
    pool = json.loads((tmp_path / "ledger.json").read_text())["pool"]
    kv_budget = json.loads((tmp_path / "ledger.json").read_text())["kv_budget_bytes"]
    blocks = int(kv_budget // (8 * GEMMA_LAYER)) // 32
    assert pool["num_blocks"] == blocks and pool["block_bytes"] == 2**21
    per_seq = 5 * 32 + 32768 // 32  # 32k: five windows of 1024 / 32 blocks, the full group 1024
    assert pool["blocks_per_sequence_at"]["32768"] == per_seq
    assert pool["sequences_at"]["32768"] == blocks // per_seq
    row = next(line for line in lines if line.strip().startswith("32,768") and len(line.split()) == 3)
    assert row.split() == ["32,768", f"{per_seq:,}", f"{blocks // per_seq:,}"]
    bad = cli("ledger", "--block-size", "16")
    assert bad.returncode == 2 and bad.stderr.startswith("pykvpool: error: ")
    assert "--block-size applies to --groups only" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("ledger", "--groups", "--block-size", "0")
    assert bad.returncode == 2 and bad.stderr.startswith("pykvpool: error: ") and "--block-size" in bad.stderr
