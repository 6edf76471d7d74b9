"""Generate with a Hugging Face transformers model whose KV cache lives in pykvpool's pages.

A small Gemma-2-style model (alternating sliding-window and global layers; random weights
from a config: nothing is downloaded) generates greedily for a batch of left-padded
prompts twice: with transformers' own `DynamicCache` and with `pykvpool.hf.PagedKvCache`
(one `BlockPool` + one `KvCache` shared by every layer and row; the sliding-window layers
release their pages as they leave the window) through `attn_implementation="pykvpool"`.
The tokens must be identical.

Run: `python examples/hf_generate.py` (needs `pip install 'pykvpool[hf]'`).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import pykvpool.hf as phf  # noqa: E402

CONFIG = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
              max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=None)
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24]]
NEW_TOKENS = 48


def build(impl: str) -> torch.nn.Module:
    """The model with fixed random weights and the given attention implementation."""
    cfg = transformers.AutoConfig.for_model("gemma2", **CONFIG)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()


def left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of PROMPTS, padded on the left with id 0."""
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    return ids, mask


def run() -> dict[str, object]:
    """Generate both ways; return both token tensors and the paged cache."""
    ids, mask = left_padded()
    kw = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.no_grad():
        ref = build("eager").generate(ids, **kw)  # Gemma-2's soft cap has no sdpa path
        model = build(phf.ATTN_IMPLEMENTATION)
        cache = phf.PagedKvCache(model.config, num_blocks=128, block_size=4)
        got = model.generate(ids, cache=cache, **kw)
    return {"reference": ref, "paged": got, "cache": cache}


if __name__ == "__main__":
    out = run()
    same = torch.equal(out["reference"], out["paged"])  # type: ignore[arg-type]
    cache = out["cache"]
    stats = cache.pool.stats()  # type: ignore[attr-defined]
    print(f"{len(PROMPTS)} prompts, {NEW_TOKENS} new tokens each: identical tokens: {same}")
    for spec, blocks in zip(cache.pool.groups, stats.group_blocks):  # type: ignore[attr-defined]
        print(f"{spec!r}: {blocks} blocks held")
