"""pykvpool.hf.serve: continuous batching on transformers models (random weights from small
configs, nothing downloaded) gives the greedy tokens of transformers' own continuous
batching (``generate_batch``) and of per-prompt ``generate`` with DynamicCache, with
admissions, chunked prefill mixed with decodes, and preemption by recompute."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pykvpool  # noqa: E402
import pykvpool.hf as phf  # noqa: E402
from tiny import build  # noqa: E402

#: The models served in every configuration (Gemma-2, soft-capped logits and no sdpa, in fewer).
MODELS = ("gemma3_text", "llama", "mistral", "qwen3")

PROMPT_LENS = (5, 11, 3, 17, 30, 2, 9, 14, 21)
NEW = 24


def prompts(lens: tuple[int, ...] = PROMPT_LENS) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(2, 97, (n,), generator=g).tolist() for n in lens]


def reference_generate(model: Any, ps: list[list[int]], new: int = NEW) -> list[list[int]]:
    """Per-prompt greedy ``generate`` with DynamicCache."""
    out = []
    with torch.no_grad():
        for p in ps:
            seq = model.generate(torch.tensor([p]), max_new_tokens=new, min_new_tokens=new, do_sample=False)
            out.append(seq[0, len(p):].tolist())
    return out


def reference_generate_batch(model: Any, ps: list[list[int]], new: int = NEW) -> list[list[int]]:
    """transformers' continuous batching (its PagedAttentionCache; transformers 5.x runs
    ``"sdpa"`` paged in ``generate_batch``, the former ``"sdpa_paged"``)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    gc = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    cb = ContinuousBatchingConfig(page_size=16, num_blocks=64, max_batch_tokens=64, use_cuda_graph=False)
    res = model.generate_batch(ps, generation_config=gc, continuous_batching_config=cb, warmup=False)
    outs = [res[f"req_{i}"] for i in range(len(ps))]
    assert [o.prompt_ids for o in outs] == ps
    return [list(o.generated_tokens) for o in outs]


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request: Any) -> tuple[str, Any, list[list[int]], list[list[int]]]:
    """(model type, the pykvpool model, prompts, reference tokens), the reference checked
    equal between generate_batch and per-prompt generate."""
    ps = prompts()
    torch.set_num_threads(1)
    ref_model = build(request.param, "sdpa")
    ref = reference_generate(ref_model, ps)
    assert reference_generate_batch(ref_model, ps) == ref
    return request.param, build(request.param, phf.ATTN_IMPLEMENTATION), ps, ref


def serve(model: Any, ps: list[list[int]], **kw: Any) -> tuple[list[list[int]], phf.ContinuousBatcher]:
    opts: dict[str, Any] = dict(num_blocks=256, block_size=4)
    opts.update(kw)
    batcher = phf.ContinuousBatcher(model, **opts)
    out = batcher.run(ps, NEW)
    pool = batcher.cache.pool
    assert pool.num_used_blocks == 0 and pool.num_seqs == 0  # every sequence freed on finish
    pool.check_invariants()
    return out, batcher


def test_all_prompts_in_one_pass_match(case: tuple[str, Any, list[list[int]], list[list[int]]]) -> None:
    _, model, ps, ref = case
    out, b = serve(model, ps)
    assert out == ref
    assert b.stats.max_running == len(ps) and b.stats.preemptions == 0
    assert b.stats.generated_tokens == len(ps) * NEW
    # Prompts once, then one token per step per sequence (the last token is never fed).
    assert b.stats.forward_tokens == sum(PROMPT_LENS) + len(ps) * (NEW - 1)


def test_chunked_prefill_mixed_with_decodes_matches(case: tuple[str, Any, list[list[int]], list[list[int]]]) -> None:
    _, model, ps, ref = case
    out, b = serve(model, ps, chunk_size=4, max_batched_tokens=16, max_running=5)
    assert out == ref
    st = b.stats
    assert st.prefill_chunks >= sum(-(-n // 4) - 1 for n in PROMPT_LENS)  # each prompt split into 4-token chunks
    assert st.mixed_steps > 0 and st.max_running == 5 and st.preemptions == 0


def test_preemption_by_recompute_matches(case: tuple[str, Any, list[list[int]], list[list[int]]]) -> None:
    name, model, ps, ref = case
    # 16 blocks of 4 tokens: the longest sequence (30 + 24 tokens) needs 14 per full group.
    out, b = serve(model, ps, num_blocks=28 if name == "gemma3_text" else 16, chunk_size=8)
    assert out == ref
    st = b.stats
    assert st.forward_tokens == sum(PROMPT_LENS) + len(ps) * (NEW - 1) + st.recomputed_tokens
    if name == "mistral":  # windows bound every sequence's blocks and admission counts the bound
        assert st.preemptions == 0
    else:
        assert st.preemptions > 0 and st.recomputed_tokens > 0
    assert st.peak_used_blocks <= b.cache.pool.num_blocks


def test_windowed_model_holds_only_its_window() -> None:
    model = build("mistral", phf.ATTN_IMPLEMENTATION)
    ps = prompts((30, 25, 28))
    # Whole sequences of 54 tokens would need 14 blocks each in a full-attention pool (42);
    # the window of 8 keeps at most ceil(7/4) + 2 blocks per sequence, with chunks of 4.
    out, b = serve(model, ps, num_blocks=12, chunk_size=4)
    assert b.stats.preemptions == 0 and b.stats.peak_used_blocks <= 12
    assert out == reference_generate(build("mistral", "sdpa"), ps)


def test_eos_ends_a_sequence_and_frees_it(case: tuple[str, Any, list[list[int]], list[list[int]]]) -> None:
    _, model, ps, ref = case
    eos = ref[0][3]
    b = phf.ContinuousBatcher(model, num_blocks=256, block_size=4)
    out = b.run(ps, NEW, eos_token_id=[eos])
    want = [r[:r.index(eos) + 1] if eos in r else r for r in ref]
    assert out == want and len(out[0]) == 4
    assert b.cache.pool.num_used_blocks == 0


def test_sampling_at_a_tiny_temperature_is_greedy() -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    ps = prompts((5, 11, 3))
    b = phf.ContinuousBatcher(model, num_blocks=64, block_size=4)
    greedy = b.run(ps, NEW)
    g = torch.Generator().manual_seed(0)
    assert b.run(ps, NEW, temperature=1e-6, generator=g) == greedy
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    hot = b.run(ps, NEW, temperature=5.0, generator=g1)
    assert hot == b.run(ps, NEW, temperature=5.0, generator=g2) and hot != greedy


def test_a_sequence_larger_than_the_pool_is_refused() -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    b = phf.ContinuousBatcher(model, num_blocks=4, block_size=4)
    with pytest.raises(pykvpool.PoolExhaustedError):
        b.run(prompts((30,)), 4)
    assert b.cache.pool.num_seqs == 0 and b.cache.pool.num_used_blocks == 0  # nothing allocated


@pytest.mark.parametrize("kw, match", [
    (dict(max_running=0), "max_running"), (dict(max_batched_tokens=True), "max_batched_tokens"),
    (dict(chunk_size=-1), "chunk_size"), (dict(num_blocks=0), "num_blocks"),
])
def test_bad_batcher_arguments_are_refused(kw: dict[str, Any], match: str) -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    with pytest.raises(pykvpool.InvalidArgumentError, match=match):
        phf.ContinuousBatcher(model, **{"num_blocks": 8, **kw})


def test_bad_run_arguments_are_refused() -> None:
    b = phf.ContinuousBatcher(build("llama", phf.ATTN_IMPLEMENTATION), num_blocks=8)
    with pytest.raises(pykvpool.InvalidArgumentError, match="prompts"):
        b.run([[3, 4], []], 4)
    for bad in (97, -1, True):
        with pytest.raises(pykvpool.InvalidArgumentError, match="prompt 1"):
            b.run([[3, 4], [5, bad]], 4)
    with pytest.raises(TypeError, match="prompt 1"):
        b.run([[3, 4], [5, 2.0]], 4)
    with pytest.raises(pykvpool.InvalidArgumentError, match="max_new_tokens"):
        b.run([[3, 4]], 0)
    with pytest.raises(pykvpool.InvalidArgumentError, match="eos_token_id"):
        b.run([[3, 4]], 2, eos_token_id=[5, -2])
    with pytest.raises(pykvpool.InvalidArgumentError, match="temperature"):
        b.run([[3, 4]], 2, temperature=-1.0)
    with pytest.raises(pykvpool.InvalidArgumentError, match="pykvpool"):
        phf.ContinuousBatcher(build("llama", "sdpa"), num_blocks=8)


def test_schedule_is_atomic_and_checked() -> None:
    model = build("mistral", phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=4, block_size=4)
    cache.schedule([7], [6])
    with pytest.raises(pykvpool.PoolExhaustedError):
        cache.schedule([7, 8], [1, 12])  # 8 joins, but the pool lacks its blocks
    assert 8 not in cache.pool and cache.pool.seq_len(7) == 6 and cache.ragged == {7}
    for ids, counts, match in (([7], [0], "num_tokens"), ([7, 7], [1, 1], "twice"), ([9], [1, 2], "num_tokens"),
                               ([-1], [1], "seq_ids")):
        with pytest.raises(pykvpool.InvalidArgumentError, match=match):
            cache.schedule(ids, counts)
    cache.schedule([7], [2])
    with pytest.raises(pykvpool.InvalidArgumentError, match="input_ids"), torch.no_grad():
        model(input_ids=torch.tensor([[3, 4, 5]]), cache=cache)  # 3 tokens where 2 were scheduled
    with pytest.raises(pykvpool.UnknownSequenceError):
        cache.free_sequence(8)
    cache.free_sequence(7)
    assert cache.pool.num_used_blocks == 0
    with pytest.raises(pykvpool.InvalidArgumentError, match="schedule"):
        cache.positions()


def test_a_generate_batch_and_scheduled_sequences_do_not_mix() -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    cache = phf.PagedKvCache(model.config, num_blocks=32, block_size=4)
    with torch.no_grad():
        model.generate(torch.tensor([[3, 4, 5]]), cache=cache, max_new_tokens=2, do_sample=False)
    with pytest.raises(pykvpool.InvalidArgumentError, match="reset"):
        cache.schedule([0], [1])
    cache.reset()
    cache.schedule([0], [1])
    assert cache.ragged == {0}


def _ulp_bf16(x: float) -> float:
    """The spacing of bf16 numbers at ``x`` (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0 ** -133


def _first_divergence_is_a_tie(got: list[int], ref: Any, prompt_len: int) -> int | None:
    """The first step where ``got`` leaves the reference's greedy tokens, asserting the
    reference's own choice there was within 2 bf16 ulps of the token we picked (a near-tie
    that a different summation order may flip); after it the contexts differ, so nothing
    later is compared."""
    want = ref.sequences[0, prompt_len:].tolist()
    assert got and len(got) <= len(want)
    for step, (a, b) in enumerate(zip(got, want)):
        if a != b:
            logits = ref.logits[step][0].float()
            margin = float(logits[b] - logits[a])
            assert 0 <= margin <= 2 * _ulp_bf16(float(logits[b])), (step, margin)
            return step
    assert len(got) == len(want)
    return None


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_bf16_model_stores_bf16_and_agrees_where_margins_allow(model_type: str) -> None:
    ps = prompts()
    ref_model = build(model_type, "sdpa", torch.bfloat16)
    with torch.no_grad():
        refs = [ref_model.generate(torch.tensor([p]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                   return_dict_in_generate=True, output_logits=True) for p in ps]
    model = build(model_type, phf.ATTN_IMPLEMENTATION, torch.bfloat16)
    # The driver: the cache stores bf16 (2 bytes per element: half of f32's blocks).
    out, b = serve(model, ps, chunk_size=8, max_batched_tokens=32)
    assert b.cache.kv.dtype == "bf16"
    f32 = pykvpool.KvCache.bytes_per_token(2, 16, "f32")
    assert pykvpool.KvCache.bytes_per_token(2, 16, "bf16") * 2 == f32
    served = [_first_divergence_is_a_tie(o, r, len(p)) for o, r, p in zip(out, refs, ps)]
    # generate() through a PagedKvCache in bf16: the prompts as one left-padded batch.
    width = max(PROMPT_LENS)
    ids = torch.zeros((len(ps), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(ps):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    cache = phf.PagedKvCache(model.config, num_blocks=256, block_size=4, dtype="bf16")
    with torch.no_grad():
        seqs = model.generate(ids, attention_mask=mask, cache=cache, max_new_tokens=NEW, min_new_tokens=NEW,
                              do_sample=False)
    paged = [_first_divergence_is_a_tie(seqs[i, width:].tolist(), r, len(p)) for i, (p, r) in enumerate(zip(ps, refs))]
    # Most prompts never meet a near-tie: their whole generation is the reference's.
    assert served.count(None) >= len(ps) // 2 and paged.count(None) >= len(ps) // 2, (served, paged)


def test_gemma2_soft_cap_through_chunks_and_preemption() -> None:
    """Gemma-2 caps its attention logits: its one-token passes take the multi-query kernel;
    tokens equal per-prompt generate with eager attention (transformers has no sdpa for it)."""
    ps = prompts(PROMPT_LENS[:6])
    ref = reference_generate(build("gemma2", "eager"), ps)
    out, b = serve(build("gemma2", phf.ATTN_IMPLEMENTATION), ps, num_blocks=24, chunk_size=8)
    assert out == ref and b.stats.preemptions > 0 and b.stats.prefill_chunks > 0
