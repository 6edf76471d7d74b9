"""pykvpool as a Hugging Face transformers KV cache and attention backend.

``import pykvpool.hf`` imports torch and transformers (``pip install 'pykvpool[hf]'``) and
registers ``attn_implementation="pykvpool"``; ``import pykvpool`` never does. Usage::

    import pykvpool.hf
    model = AutoModelForCausalLM.from_config(config, attn_implementation="pykvpool")
    cache = pykvpool.hf.PagedKvCache(model.config, num_blocks=1024)
    model.generate(input_ids, attention_mask=mask, cache=cache, max_new_tokens=64)

or serve many prompts with continuous batching (:mod:`pykvpool.hf.serve`)::

    outputs, stats = pykvpool.hf.generate_continuous(model, prompts, 64, num_blocks=1024)
"""

from __future__ import annotations

from pykvpool.hf.attention import ATTN_IMPLEMENTATION, paged_attention, padding_mask, register
from pykvpool.hf.cache import PagedKvCache
from pykvpool.hf.layout import ModelLayout, model_layout
from pykvpool.hf.serve import BatcherStats, ContinuousBatcher, generate_continuous

__all__ = ["ATTN_IMPLEMENTATION", "BatcherStats", "ContinuousBatcher", "ModelLayout", "PagedKvCache",
           "generate_continuous", "model_layout", "paged_attention", "padding_mask", "register"]

register()
