"""The model presets users plan for today (Llama-3.1/3.3, Qwen3 dense and MoE, DeepSeek-V3's
MLA, gpt-oss, Gemma-3, Mistral Small): each one equals what ``ModelConfig.from_hf_config``
reads from its published config.json (the values written here), its parameter count agrees
with the estimate from that config, its KV bytes per token with a hand computation, and it
names its source."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from pykvpool.planning.models import MODELS, ModelConfig, model_preset

LLAMA31_8B: dict[str, Any] = {
    "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256,
    "max_position_embeddings": 131072, "tie_word_embeddings": False}
LLAMA31_70B: dict[str, Any] = {
    **LLAMA31_8B, "num_hidden_layers": 80, "num_attention_heads": 64, "hidden_size": 8192,
    "intermediate_size": 28672}
QWEN3_8B: dict[str, Any] = {
    "model_type": "qwen3", "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288, "vocab_size": 151936,
    "sliding_window": None, "use_sliding_window": False, "max_window_layers": 36,
    "max_position_embeddings": 40960, "tie_word_embeddings": False}
QWEN3_32B: dict[str, Any] = {
    **QWEN3_8B, "num_hidden_layers": 64, "num_attention_heads": 64, "hidden_size": 5120,
    "intermediate_size": 25600, "max_window_layers": 64}
QWEN3_235B: dict[str, Any] = {
    "model_type": "qwen3_moe", "num_hidden_layers": 94, "num_attention_heads": 64,
    "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288,
    "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "sliding_window": None,
    "use_sliding_window": False, "max_window_layers": 94, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": False}
DEEPSEEK_V3: dict[str, Any] = {
    "model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "max_position_embeddings": 163840, "tie_word_embeddings": False}
GPT_OSS_120B: dict[str, Any] = {
    "model_type": "gpt_oss", "num_hidden_layers": 36, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880,
    "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "vocab_size": 201088,
    "max_position_embeddings": 131072, "tie_word_embeddings": False}
GEMMA3_27B: dict[str, Any] = {"model_type": "gemma3", "text_config": {
    "model_type": "gemma3_text", "num_hidden_layers": 62, "num_attention_heads": 32,
    "num_key_value_heads": 16, "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
    "vocab_size": 262208, "sliding_window": 1024, "sliding_window_pattern": 6,
    "max_position_embeddings": 131072, "tie_word_embeddings": True}}
MISTRAL_SMALL_24B: dict[str, Any] = {
    "model_type": "mistral", "num_hidden_layers": 40, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120, "intermediate_size": 32768,
    "vocab_size": 131072, "sliding_window": None, "max_position_embeddings": 32768,
    "tie_word_embeddings": False}

#: (preset, its config.json values, KV bytes per token in bf16 by hand: layers x per-layer)
NEW = [
    ("llama-3.1-8b", LLAMA31_8B, 32 * 2 * 8 * 128 * 2),
    ("llama-3.1-70b", LLAMA31_70B, 80 * 2 * 8 * 128 * 2),
    ("llama-3.3-70b", LLAMA31_70B, 80 * 2 * 8 * 128 * 2),
    ("qwen3-8b", QWEN3_8B, 36 * 2 * 8 * 128 * 2),
    ("qwen3-32b", QWEN3_32B, 64 * 2 * 8 * 128 * 2),
    ("qwen3-235b-a22b", QWEN3_235B, 94 * 2 * 4 * 128 * 2),
    ("deepseek-v3", DEEPSEEK_V3, 61 * (512 + 64) * 2),
    ("gpt-oss-120b", GPT_OSS_120B, 36 * 2 * 8 * 64 * 2),
    ("gemma-3-27b", GEMMA3_27B, 62 * 2 * 16 * 128 * 2),
    ("mistral-small-24b", MISTRAL_SMALL_24B, 40 * 2 * 8 * 128 * 2),
]


def _shape(m: ModelConfig) -> tuple[Any, ...]:
    return (m.num_layers, m.num_q_heads, m.num_kv_heads, m.head_dim, m.kv_latent_dim, m.max_context, m.groups)


@pytest.mark.parametrize(("key", "config", "per_token"), NEW, ids=[n[0] for n in NEW])
def test_preset_is_its_published_config(key: str, config: dict[str, Any], per_token: int) -> None:
    preset = model_preset(key)
    parsed = ModelConfig.from_hf_config(config)
    assert _shape(preset) == _shape(parsed)
    assert preset.kv_bytes_per_token("bf16") == parsed.kv_bytes_per_token("bf16") == per_token
    # the published parameter count agrees with the count estimated from the config
    assert preset.num_params == pytest.approx(parsed.num_params, rel=0.03)
    if parsed.active_params is not None:  # a mixture of experts: all experts are resident
        # (gpt-oss's published active count leaves out the 0.58e9 unembedding the estimate counts)
        assert preset.active_params == pytest.approx(parsed.active_params, rel=0.12)
        assert preset.weight_bytes == preset.num_params * 2
    else:
        assert preset.active_params is None
    assert "config.json" in preset.source


def test_deepseek_v3_caches_one_latent_per_layer() -> None:
    m = model_preset("deepseek-v3")
    assert m.kv_bytes_per_token("bf16") == 61 * 576 * 2 == 70_272
    assert m.kv_bytes(10_000, "bf16") == 10_000 * 70_272
    assert m.kv_bytes_per_token("fp8") == 61 * (576 + 4)  # one latent vector and its scale per layer
    assert m.num_params == 671e9 and m.active_params == 37e9


def test_windowed_presets_hold_their_windows() -> None:
    g3 = model_preset("gemma-3-27b")  # 5 local (1,024) : 1 global over 62 layers: 10 global
    assert [(g.kind, g.layers, g.window) for g in g3.groups] == [("sliding", 52, 1024), ("full", 10, None)]
    oss = model_preset("gpt-oss-120b")  # alternating, sliding first; the sinks are logits, no KV
    assert [(g.kind, g.layers, g.window) for g in oss.groups] == [("sliding", 18, 128), ("full", 18, None)]
    assert oss.kv_bytes(24_000) == (18 * 128 + 18 * 24_000) * 2 * 8 * 64 * 2


def test_every_preset_names_its_source() -> None:
    assert all(m.source for m in MODELS.values())
    assert model_preset("llama-3.3-70b").source != model_preset("llama-3.1-70b").source


def test_a_24k_token_question_fits_the_128k_models() -> None:
    for key in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.3-70b", "qwen3-8b", "qwen3-32b", "gpt-oss-120b",
                "gemma-3-27b", "mistral-small-24b", "deepseek-v3"):
        assert model_preset(key).max_context >= 24_000, key
    r = subprocess.run([sys.executable, "-m", "pykvpool.cli", "ledger", "--model", "llama-3.1-8b",
                        "--seq-len", "24000"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "Llama-3.1-8B" in r.stdout
    old = subprocess.run([sys.executable, "-m", "pykvpool.cli", "ledger", "--model", "llama-3-8b",
                          "--seq-len", "24000"], capture_output=True, text=True, timeout=120)
    assert old.stderr.startswith("pykvpool: warning: --seq-len 24,000 exceeds Llama-3-8B's")
