"""The tiny transformers models the `pykvpool.hf` tests build from configs with random weights
(nothing is downloaded), and the one builder; imported as ``from tiny import ...`` (the
tests of this folder run with it on the path). torch and transformers are imported by the
tests first (``pytest.importorskip``)."""

from __future__ import annotations

from typing import Any

#: What every tiny model shares: 4 query heads over 2 KV heads of 16, 97 tokens.
SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=None)
#: model type -> config overrides; windows of 8 tokens so that prompts and generations leave them.
MODELS: dict[str, dict[str, Any]] = {
    "llama": dict(num_hidden_layers=2),
    "qwen2": dict(num_hidden_layers=2),
    "mistral": dict(num_hidden_layers=2, sliding_window=8),
    "gemma2": dict(num_hidden_layers=4, sliding_window=8, query_pre_attn_scalar=16),
    "qwen3": dict(num_hidden_layers=2),
    "gemma3_text": dict(num_hidden_layers=6, sliding_window=8, query_pre_attn_scalar=16),
}


def build(model_type: str, impl: str, dtype: Any = None) -> Any:
    """The tiny ``model_type`` (seeded weights, eval mode) with attention ``impl``."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type, **{**SMALL, **MODELS[model_type]})
    torch.manual_seed(0)
    extra = {} if dtype is None else {"dtype": dtype}
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, **extra).eval()
