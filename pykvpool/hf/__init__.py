"""pykvpool as a Hugging Face transformers KV cache and attention backend (issue 16).

``import pykvpool.hf`` imports torch and transformers (``pip install 'pykvpool[hf]'``) and
registers ``attn_implementation="pykvpool"``; ``import pykvpool`` never does. Usage::

    import pykvpool.hf
    model = AutoModelForCausalLM.from_config(config, attn_implementation="pykvpool")
    cache = pykvpool.hf.PagedKvCache(model.config, num_blocks=1024)
    model.generate(input_ids, attention_mask=mask, cache=cache, max_new_tokens=64)
"""

from __future__ import annotations

from pykvpool.hf.attention import ATTN_IMPLEMENTATION, paged_attention, padding_mask, register
from pykvpool.hf.cache import PagedKvCache
from pykvpool.hf.layout import ModelLayout, model_layout

__all__ = ["ATTN_IMPLEMENTATION", "ModelLayout", "PagedKvCache", "model_layout", "paged_attention",
           "padding_mask", "register"]

register()
