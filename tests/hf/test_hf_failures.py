"""pykvpool.hf: a forward pass the cache refuses (the pool lacks the blocks) leaves the
``PagedKvCache`` as it was, so the cache serves the next prompt as a fresh one would
(random-weight models from small configs, nothing downloaded)."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pykvpool  # noqa: E402
import pykvpool.hf as phf  # noqa: E402
from tiny import build  # noqa: E402

#: Full attention (Llama, Qwen2), one window group (Mistral), windows beside full layers (Gemma-2).
ARCHS = ["llama", "mistral", "gemma2", "qwen2"]


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(2, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def greedy(model: Any, cache: phf.PagedKvCache, ids: torch.Tensor, new: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=new,
                             min_new_tokens=new, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("model_type", ARCHS)
def test_a_refused_prompt_leaves_the_cache_unchanged(model_type: str) -> None:
    model = build(model_type, phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=8, block_size=4)  # 32 slots; the prompt needs 40 per group
    with pytest.raises(pykvpool.PoolExhaustedError):
        greedy(model, cache, tokens(40, 1), 4)
    assert cache.get_seq_length() == 0 and cache.seqs == [] and cache.pool.num_used_blocks == 0
    short = tokens(5, 2)
    fresh = greedy(model, phf.PagedKvCache(model.config, num_blocks=8, block_size=4), short, 6)
    assert greedy(model, cache, short, 6) == fresh
    cache.pool.check_invariants()


@pytest.mark.parametrize("model_type", [a for a in ARCHS if a != "mistral"])  # Mistral's window never runs out
def test_a_refused_decode_pass_counts_no_token(model_type: str) -> None:
    model = build(model_type, phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=8, block_size=4)
    with pytest.raises(pykvpool.PoolExhaustedError):
        greedy(model, cache, tokens(14, 3), 40)  # full layers run out of blocks while decoding
    # The rows hold what every pass that succeeded stored; the refused pass added nothing.
    [seq] = cache.seqs
    assert cache.get_seq_length() == cache.pool.seq_len(seq)
    for layer in cache.layers:
        assert layer.get_seq_length() == cache.pool.seq_len(seq)
    cache.crop(-1)  # the cache still works: the last pass that succeeded can be rolled back
    assert cache.get_seq_length() == cache.pool.seq_len(seq)
    cache.pool.check_invariants()
