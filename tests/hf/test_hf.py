"""pykvpool.hf: transformers models (random weights from small configs, nothing
downloaded) generating through PagedKvCache and attn_implementation="pykvpool" give the
tokens and logits of DynamicCache + sdpa (eager for Gemma-2, which has no sdpa)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pykvpool  # noqa: E402
import pykvpool.hf as phf  # noqa: E402
from tiny import MODELS, build  # noqa: E402

PROMPT_LENS = (5, 11, 3, 17)
#: The reference attention: sdpa, or eager where transformers has no sdpa (Gemma-2's soft cap).
REFERENCE = {"gemma2": "eager"}


def batch(lens: tuple[int, ...] = PROMPT_LENS) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of random tokens (2..96) and their mask."""
    g = torch.Generator().manual_seed(1)
    width = max(lens)
    ids = torch.zeros((len(lens), width), dtype=torch.long)
    mask = torch.zeros((len(lens), width), dtype=torch.long)
    for i, n in enumerate(lens):
        ids[i, width - n:] = torch.randint(2, 97, (n,), generator=g)
        mask[i, width - n:] = 1
    return ids, mask


def generate(model: torch.nn.Module, cache: object | None, new: int = 64, **kw: object) -> object:
    ids, mask = batch()
    extra = {} if cache is None else {"cache": cache}
    opts = {"do_sample": False, **kw}
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                              return_dict_in_generate=True, output_logits=True, **extra, **opts)


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_greedy_matches_dynamic_cache_sdpa(model_type: str) -> None:
    ref = generate(build(model_type, REFERENCE.get(model_type, "sdpa")), None)
    model = build(model_type, phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=256, block_size=4)
    got = generate(model, cache)
    assert torch.equal(got.sequences, ref.sequences)
    assert len(got.logits) == len(ref.logits) == 64
    diff = max(float((a - b).abs().max()) for a, b in zip(got.logits, ref.logits))
    assert diff < 1e-4, diff
    # Every row is a sequence of the pool holding its real tokens only (no padding).
    lens = [cache.pool.seq_len(s) for s in cache.seqs]
    assert lens == [n + 64 - 1 for n in PROMPT_LENS]
    cache.pool.check_invariants()


def test_gemma2_decodes_through_the_decode_kernel_with_its_soft_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    import pykvpool.hf.attention as attn

    calls: list[tuple[str, object]] = []
    for name in ("decode_attention", "prefill_attention"):
        kernel = getattr(attn, name)

        def counted(*a: object, _k: object = kernel, _n: str = name, **kw: object) -> object:
            calls.append((_n, kw.get("logits_soft_cap")))
            return _k(*a, **kw)  # type: ignore[operator]
        monkeypatch.setattr(attn, name, counted)
    model = build("gemma2", phf.ATTN_IMPLEMENTATION)
    cap = model.config.attn_logit_softcapping
    assert cap is not None
    generate(model, phf.PagedKvCache(model.config, num_blocks=256, block_size=4), new=5)
    layers = model.config.num_hidden_layers
    # The prompt pass is prefill; each of the 4 further tokens is one decode call per layer.
    assert calls == [("prefill_attention", cap)] * layers + [("decode_attention", cap)] * (4 * layers)


def test_windowed_layers_free_their_blocks() -> None:
    model = build("gemma2", phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=256, block_size=4)
    generate(model, cache)
    stats = cache.pool.stats()
    window, full = stats.group_blocks  # layer 0 is local: group 0 is the window
    # A window of 8 tokens holds at most ceil(7/4) + 1 + 1 blocks per row; the full group every block.
    assert window <= 4 * 4
    assert full == sum(-(-(n + 63) // 4) for n in PROMPT_LENS)
    assert cache.nbytes_held() == stats.used_blocks * cache.kv.nbytes // cache.kv.num_blocks


def test_attention_without_paged_cache_is_refused() -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    ids, mask = batch()
    with pytest.raises(pykvpool.InvalidArgumentError, match="PagedKvCache"):
        with torch.no_grad():
            model(ids, attention_mask=mask)


def test_right_padding_is_refused() -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=64)
    ids, mask = batch((3, 5))
    with pytest.raises(pykvpool.InvalidArgumentError, match="left padding"):
        with torch.no_grad():
            model(ids, attention_mask=mask.flip(1), cache=cache)


def test_four_d_mask_is_refused() -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=64)
    ids, _ = batch((3, 5))
    mask = torch.ones((2, 1, 5, 5), dtype=torch.bool).tril()
    with pytest.raises(pykvpool.InvalidArgumentError, match="padding mask"), torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)


def test_layout_of_gemma2_shares_cache_layers() -> None:
    model = build("gemma2", phf.ATTN_IMPLEMENTATION)
    lay = phf.model_layout(model.config)
    assert lay.groups == (pykvpool.SlidingWindow(8), pykvpool.FullAttention())
    assert lay.group_of == (0, 1, 0, 1) and lay.cache_layer == (0, 0, 1, 1) and lay.cache_layers == 2
    assert lay.window == (8, None, 8, None)


def test_bad_arguments() -> None:
    cfg = build("llama", "sdpa").config
    with pytest.raises(pykvpool.InvalidArgumentError, match="num_blocks"):
        phf.PagedKvCache(cfg, num_blocks=0)
    with pytest.raises(pykvpool.InvalidArgumentError, match="block_size"):
        phf.PagedKvCache(cfg, num_blocks=4, block_size=True)
    assert np.asarray(phf.PagedKvCache(cfg, num_blocks=4).kv.key(0)).shape == (4, 16, 2, 16)


def test_exhausted_pool_adds_no_row() -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=8, block_size=4)  # 8 blocks: not 4 rows of up to 17 tokens
    ids, mask = batch()
    with pytest.raises(pykvpool.PoolExhaustedError), torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
    assert cache.pool.num_used_blocks == 0 and cache.seqs == []


def test_beam_search_matches_dynamic_cache_and_forks_share_blocks() -> None:
    ref = generate(build("llama", "sdpa"), None, new=16, num_beams=3)
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=512, block_size=4)
    got = generate(model, cache, new=16, num_beams=3)
    assert torch.equal(got.sequences, ref.sequences)
    # 4 prompts x 3 beams: the beams of a prompt share its prompt's full blocks.
    assert len(cache.seqs) == 12
    blocks = {int(b) for s in cache.seqs for b in cache.pool.block_table(s, group=0)}
    held = sum(-(-cache.pool.seq_len(s) // 4) for s in cache.seqs)
    assert len(blocks) < held
    cache.pool.check_invariants()


def test_crop_truncates_every_row() -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=256, block_size=4)
    generate(model, cache, new=8)
    lens = [cache.pool.seq_len(s) for s in cache.seqs]
    seen = cache.get_seq_length()
    cache.crop(-3)
    assert [cache.pool.seq_len(s) for s in cache.seqs] == [n - 3 for n in lens]
    assert cache.get_seq_length() == seen - 3
    with pytest.raises(pykvpool.InvalidArgumentError, match="tokens_to_remove"):
        cache.crop(-(seen + 1))


def test_num_return_sequences_share_the_prompt_blocks() -> None:
    def sample(model: torch.nn.Module, cache: object | None) -> object:
        torch.manual_seed(3)
        return generate(model, cache, new=16, do_sample=True, num_return_sequences=3, top_k=0, top_p=1.0)

    ref = sample(build("qwen2", "sdpa"), None)
    model = build("qwen2", phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=512, block_size=4)
    got = sample(model, cache)
    assert torch.equal(got.sequences, ref.sequences)
    assert len(cache.seqs) == 12
    # The 3 samples of a prompt hold its full prompt blocks once (refcount 3), not 3 copies.
    shared = {int(b) for s in cache.seqs for b in cache.pool.block_table(s, group=0) if cache.pool.refcount(int(b)) == 3}
    assert len(shared) == sum(n // 4 for n in PROMPT_LENS)
    cache.pool.check_invariants()
