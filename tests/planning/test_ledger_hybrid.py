"""The ledger on sliding windows, chunked attention, sinks, MLA and experts: KV per
sequence as a function of the length, computed by hand here from config.json dicts written
in this file (the published values of each model), the presets, and ``pykvpool ledger``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pykvpool
from pykvpool.planning.hardware import hardware_preset
from pykvpool.planning.ledger import GIB, MAX_SEQ_LEN, MemoryLedger, article_budget
from pykvpool.planning.models import MODELS, LayerGroup, ModelConfig, model_preset

ROOT = Path(__file__).resolve().parents[2]
K = 1024

GEMMA2: dict[str, Any] = {
    "model_type": "gemma2", "num_hidden_layers": 42, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "hidden_size": 3584, "intermediate_size": 14336,
    "vocab_size": 256000, "sliding_window": 4096, "max_position_embeddings": 8192,
    "tie_word_embeddings": True}
GEMMA3: dict[str, Any] = {"model_type": "gemma3", "text_config": {
    "model_type": "gemma3_text", "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "hidden_size": 3840, "intermediate_size": 15360,
    "vocab_size": 262208, "sliding_window": 1024, "sliding_window_pattern": 6,
    "max_position_embeddings": 131072}}
MISTRAL: dict[str, Any] = {
    "model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 32000,
    "sliding_window": 4096, "max_position_embeddings": 32768}
DSV2_LITE: dict[str, Any] = {
    "model_type": "deepseek_v2", "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "hidden_size": 2048, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128, "v_head_dim": 128, "q_lora_rank": None, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
    "intermediate_size": 10944, "first_k_dense_replace": 1, "vocab_size": 102400,
    "max_position_embeddings": 163840, "tie_word_embeddings": False}
GPT_OSS: dict[str, Any] = {
    "model_type": "gpt_oss", "num_hidden_layers": 24, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880,
    "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "vocab_size": 201088,
    "max_position_embeddings": 131072, "tie_word_embeddings": False}
QWEN3_MOE: dict[str, Any] = {
    "model_type": "qwen3_moe", "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "sliding_window": None,
    "use_sliding_window": False, "max_window_layers": 48, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": False}
LLAMA4_CHUNKED: dict[str, Any] = {  # Llama-4-Scout-like text model: 3 chunked (RoPE) : 1 global (NoPE)
    "model_type": "llama4_text", "num_hidden_layers": 48, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120, "intermediate_size": 8192,
    "attention_chunk_size": 8192, "no_rope_layers": [1, 1, 1, 0] * 12,
    "max_position_embeddings": 10485760}


def hand_kv(seq_len: int, per_layer: int, groups: list[tuple[int, int | None]]) -> int:
    """sum over (layers, window or None) of layers x min(seq_len, window) x per-layer bytes."""
    return sum(n * (seq_len if w is None else min(seq_len, w)) * per_layer for n, w in groups)


LENGTHS = [1, 127, 128, 129, 1000, 1024, 4096, 4097, 8192, 32 * K, 128 * K]
CASES = [  # (config, preset, per-layer bytes per token in bf16, layer groups)
    (GEMMA2, "gemma-2-9b", 2 * 8 * 256 * 2, [(21, 4096), (21, None)]),
    (GEMMA3, "gemma-3-12b", 2 * 8 * 256 * 2, [(40, 1024), (8, None)]),
    (MISTRAL, "mistral-7b", 2 * 8 * 128 * 2, [(32, 4096)]),
    (DSV2_LITE, "deepseek-v2-lite", (512 + 64) * 2, [(27, None)]),
    (GPT_OSS, "gpt-oss-20b", 2 * 8 * 64 * 2, [(12, 128), (12, None)]),
    (QWEN3_MOE, "qwen3-30b-a3b", 2 * 4 * 128 * 2, [(48, None)]),
    (LLAMA4_CHUNKED, None, 2 * 8 * 128 * 2, [(36, 8192), (12, None)]),
]


@pytest.mark.parametrize(("config", "preset", "per_layer", "groups"), CASES,
                         ids=[str(c[1] or "llama4-chunked") for c in CASES])
def test_kv_per_sequence_by_hand(config: dict[str, Any], preset: str | None, per_layer: int,
                                 groups: list[tuple[int, int | None]]) -> None:
    m = ModelConfig.from_hf_config(config, num_params=1e9)
    for n in LENGTHS:
        assert m.kv_bytes(n) == hand_kv(n, per_layer, groups), n
        assert m.kv_bytes(n, "fp8:tensor") == hand_kv(n, per_layer // 2, groups), n
    assert m.kv_bytes_per_token() == sum(n for n, _ in groups) * per_layer  # the full history
    if preset is not None:  # the preset carries the same published values
        p = model_preset(preset)
        assert [p.kv_bytes(n) for n in LENGTHS] == [m.kv_bytes(n) for n in LENGTHS]
        assert (p.num_layers, p.num_q_heads, p.max_context) == (m.num_layers, m.num_q_heads, m.max_context)


def test_mla_caches_one_latent_of_rank_plus_rope_per_layer() -> None:
    m = ModelConfig.from_hf_config(DSV2_LITE)
    assert m.kv_bytes_per_token("bf16") == (512 + 64) * 27 * 2 == 31_104
    assert MODELS["deepseek-v2-lite"].kv_bytes_per_token("bf16") == 31_104
    assert m.kv_latent_dim == 576 and m.num_kv_heads == 1 and not m.windowed
    # fp8 with one fp32 scale per cached vector: one latent vector per layer, not 2 x heads
    assert m.kv_bytes_per_token("fp8") == (576 + 4) * 27


def test_layer_types_chunked_equals_no_rope_layers() -> None:
    types = ["chunked_attention"] * 3 + ["full_attention"]
    cfg = {k: v for k, v in LLAMA4_CHUNKED.items() if k != "no_rope_layers"}
    a = ModelConfig.from_hf_config({**cfg, "layer_types": types * 12}, num_params=1e9)
    b = ModelConfig.from_hf_config(LLAMA4_CHUNKED, num_params=1e9)
    assert a.groups == b.groups == (LayerGroup("chunked", 36, 8192), LayerGroup("full", 12))


def test_window_switches() -> None:
    """use_sliding_window false (Qwen2.5) and a window as long as the context are full
    attention; max_window_layers windows the layers from that index on (Qwen2)."""
    off = ModelConfig.from_hf_config({**MISTRAL, "use_sliding_window": False})
    whole = ModelConfig.from_hf_config({**MISTRAL, "sliding_window": 32768})
    assert not off.windowed and not whole.windowed and off.kv_bytes(10_000) == 10_000 * 131072
    qwen2 = ModelConfig.from_hf_config({**MISTRAL, "use_sliding_window": True, "max_window_layers": 28})
    assert qwen2.groups == (LayerGroup("full", 28), LayerGroup("sliding", 4, 4096))
    assert qwen2.kv_bytes(10_000) == (28 * 10_000 + 4 * 4096) * 4096


def test_a_window_caps_kv_per_sequence_and_global_layers_keep_growing() -> None:
    mistral, gemma2 = model_preset("mistral-7b"), model_preset("gemma-2-9b")
    flat = {mistral.kv_bytes(n) for n in (4096, 4097, 8192, 100_000, 10**7)}
    assert flat == {32 * 4096 * 4096}
    per_layer = 8192
    for n in (1, 100, 4095):  # below the window every layer grows
        assert gemma2.kv_bytes(n + 1) - gemma2.kv_bytes(n) == 42 * per_layer
    for n in (4096, 8192, 10**6):  # beyond it only the 21 global layers do
        assert gemma2.kv_bytes(n + 1) - gemma2.kv_bytes(n) == 21 * per_layer
    assert gemma2.all_global().kv_bytes(10**6) == 42 * 10**6 * per_layer


def test_sinks_add_to_the_window_and_blocks_round_each_group() -> None:
    g = LayerGroup("sliding", 4, 1024, sink_tokens=4)
    assert [g.tokens_held(n) for n in (0, 1000, 1028, 1029, 10**9)] == [0, 1000, 1028, 1028, 1028]
    m = ModelConfig("sinks", 6, 8, 8, 64, 1e9, layer_groups=(g, LayerGroup("full", 2)))
    per_layer = 2 * 8 * 64 * 2
    assert m.kv_bytes(5000) == (4 * 1028 + 2 * 5000) * per_layer
    # block_size 16: the sliding group holds 1028 -> 1040 tokens, the full one 5000 -> 5008
    assert m.kv_bytes(5000, block_size=16) == (4 * 1040 + 2 * 5008) * per_layer
    with pytest.raises(pykvpool.InvalidArgumentError, match="sink_tokens"):
        LayerGroup("chunked", 1, 8192, sink_tokens=4)
    with pytest.raises(pykvpool.InvalidArgumentError, match="window"):
        LayerGroup("sliding", 1)
    with pytest.raises(pykvpool.InvalidArgumentError, match="layer_groups have 3 layers"):
        ModelConfig("bad", 6, 8, 8, 64, 1e9, layer_groups=(LayerGroup("full", 3),))


def test_ledger_capacity_is_in_sequences_at_a_length() -> None:
    budget = article_budget()
    led = MemoryLedger(model_preset("gemma-2-9b"), budget)
    for n in (8192, 32 * K, 128 * K):
        per_seq = 21 * (min(n, 4096) + n) * 8192
        assert led.kv_bytes(seq_len=n, batch=3) == 3 * per_seq
        b = led.max_batch(seq_len=n)
        assert b * per_seq <= led.kv_budget_bytes < (b + 1) * per_seq
        assert led.tokens_at(seq_len=n) == b * n
    # windows make long sequences cheaper per token than the full-history figure says
    assert led.tokens_at(seq_len=128 * K) > led.token_capacity
    s = led.max_seq_len(batch=2, block_size=16)
    assert s % 16 == 0
    assert 2 * led.model.kv_bytes(s, block_size=16) <= led.kv_budget_bytes
    assert 2 * led.model.kv_bytes(s + 16, block_size=16) > led.kv_budget_bytes
    mistral = MemoryLedger(model_preset("mistral-7b"), budget)
    assert mistral.max_seq_len(batch=100) == MAX_SEQ_LEN  # all layers windowed: length is free
    assert mistral.max_batch(seq_len=8192) == mistral.max_batch(seq_len=10**6)


def test_moe_total_and_active_parameters() -> None:
    q = ModelConfig.from_hf_config(QWEN3_MOE)
    attn = 2048 * 32 * 128 * 2 + 2048 * 4 * 128 * 2
    expert, router = 3 * 2048 * 768, 2048 * 128
    common = 48 * (attn + 2 * 2048) + 2048 + 151936 * 2048 * 2
    assert q.num_params == common + 48 * (128 * expert + router)
    assert q.active_params == common + 48 * (8 * expert + router)
    assert abs(q.num_params / 30.5e9 - 1) < 0.01 and abs(q.active_params / 3.3e9 - 1) < 0.03
    d = ModelConfig.from_hf_config(DSV2_LITE)
    mla = 2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048
    expert = 3 * 2048 * 1408
    common = 27 * (mla + 2 * 2048) + 2048 + 102400 * 2048 * 2 + 3 * 2048 * 10944  # 1 dense layer
    assert d.num_params == common + 26 * (66 * expert + 2048 * 64)
    assert d.active_params == common + 26 * (8 * expert + 2048 * 64)  # 6 routed + 2 shared
    assert abs(d.num_params / 15.7e9 - 1) < 0.01
    g = ModelConfig.from_hf_config(GPT_OSS)
    assert abs(g.num_params / 20.9e9 - 1) < 0.01 and g.active_params is not None
    assert ModelConfig.from_hf_config(GEMMA2).active_params is None  # dense
    assert abs(ModelConfig.from_hf_config(GEMMA2).num_params / 9.24e9 - 1) < 0.01


def test_decode_bound_uses_active_parameters_and_windows() -> None:
    hw = hardware_preset("a100-80gb-sxm")
    q = MemoryLedger(model_preset("qwen3-30b-a3b"), article_budget())
    b = q.decode_bound(hw, seq_len=8192, batch=4)
    assert b.flops == 2.0 * 3.3e9 * 4 + 4.0 * 32 * 128 * 8192 * 48 * 4
    assert b.bytes_moved == q.weight_bytes + 4 * 8192 * 98304
    g = MemoryLedger(model_preset("gpt-oss-20b"), article_budget())
    b = g.decode_bound(hw, seq_len=8192, batch=1)
    assert b.flops == 2.0 * 3.6e9 + 4.0 * 64 * 64 * (12 * 128 + 12 * 8192)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pykvpool.cli", *args], capture_output=True, text=True,
                          check=False, timeout=120, env=env)


def test_cli_ledger_prints_kv_per_length_for_an_hf_config_and_the_preset(tmp_path: Path) -> None:
    f = tmp_path / "gemma2.json"
    f.write_text(json.dumps(GEMMA2))
    outs = []
    for args in (["--hf-config", str(f)], ["--model", "gemma-2-9b"]):
        r = cli("ledger", *args, "--out", str(tmp_path / args[0][2:]))
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
        data = json.loads((tmp_path / args[0][2:] / "ledger.json").read_text())
        for n in (8192, 32 * K, 128 * K):
            assert data["kv_bytes_at"][str(n)] == 21 * (4096 + n) * 8192
        assert data["layer_groups"][0] == {"kind": "sliding", "layers": 21, "window": 4096, "sink_tokens": 0}
    for out in outs:
        lines = out.splitlines()
        assert "layers           21 sliding (4,096) + 21 full" in lines
        assert "KV per token     344064 B (336.00 KiB) if every layer kept every token (full history)" in lines
        row = next(line for line in lines if line.strip().startswith("32,768"))
        # 21 x (4096 + 32768) x 8192 B = 5.906 GiB, 193,536 B/token; all global 10.5 GiB
        assert row.split()[:7] == ["32,768", "5.906", "GiB", "193,536", "10.500", "GiB", "1.78x"]
        assert "beyond max_position_embeddings" in row
    mla = cli("ledger", "--model", "deepseek-v2-lite")
    assert mla.returncode == 0 and "KV per token     31104 B" in mla.stdout
    assert "2.40e9 of 15.70e9 params active" in mla.stdout


@pytest.mark.parametrize(("extra", "key"), [
    ({"layer_types": ["linear_attention", "full_attention"] * 16}, "layer_types"),
    ({"attention_chunk_size": 8192}, "attention_chunk_size"),
    ({"layers_block_type": ["mamba", "attention"] * 16}, "layers_block_type"),
    ({"num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 2}, "decoder_sparse_step"),
])
def test_remaining_refusals_name_their_key(extra: dict[str, Any], key: str) -> None:
    with pytest.raises(pykvpool.InvalidArgumentError, match=f"'{key}' = .* not modelled"):
        ModelConfig.from_hf_config({**MISTRAL, "sliding_window": None, **extra})
