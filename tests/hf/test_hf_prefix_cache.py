"""pykvpool.hf.serve with prefix caching: prompts sharing a prefix reuse its computed K/V
and the greedy tokens stay those of per-prompt ``generate`` (random weights from small
configs, nothing downloaded), for full-attention and windowed models, with chunked
prefill, preemption and every eviction policy."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import pykvpool  # noqa: E402
import pykvpool.hf as phf  # noqa: E402
from test_hf_continuous import NEW, reference_generate  # noqa: E402
from tiny import build  # noqa: E402

#: Full attention; sliding windows beside full layers; windows only.
MODELS = ("llama", "gemma3_text", "mistral")


def shared_prompts() -> list[list[int]]:
    """A 23-token system prompt under five tails (one empty: the bare system prompt), and
    one prompt repeated."""
    g = torch.Generator().manual_seed(3)
    system = torch.randint(2, 97, (23,), generator=g).tolist()
    tails = [torch.randint(2, 97, (n,), generator=g).tolist() for n in (6, 1, 13, 0, 9)]
    ps = [system + t for t in tails]
    return ps + [list(ps[0])]


@pytest.fixture(scope="module", params=MODELS)
def case(request: Any) -> tuple[str, Any, list[list[int]], list[list[int]]]:
    torch.set_num_threads(1)
    ps = shared_prompts()
    ref = reference_generate(build(request.param, "sdpa"), ps)
    return request.param, build(request.param, phf.ATTN_IMPLEMENTATION), ps, ref


def run(model: Any, ps: list[list[int]], **kw: Any) -> tuple[list[list[int]], phf.ContinuousBatcher]:
    opts: dict[str, Any] = dict(num_blocks=256, block_size=4, prefix_caching=True)
    opts.update(kw)
    b = phf.ContinuousBatcher(model, **opts)
    out = b.run(ps, NEW)
    pool = b.cache.pool
    assert pool.num_used_blocks == 0 and pool.num_seqs == 0
    pool.check_invariants()
    return out, b


def fed(ps: list[list[int]], st: phf.BatcherStats) -> int:
    return sum(map(len, ps)) + len(ps) * (NEW - 1) + st.recomputed_tokens - st.cached_tokens


def test_later_admissions_reuse_the_shared_prefix(case: tuple[str, Any, list[list[int]], list[list[int]]]) -> None:
    _, model, ps, ref = case
    # One sequence at a time: each later prompt finds the blocks the earlier ones computed.
    out, b = run(model, ps, max_running=1)
    assert out == ref
    st = b.stats
    assert st.forward_tokens == fed(ps, st)
    # The system prompt's 5 full blocks for each later prompt (the bare one recomputes its
    # last block: its last token), and the repeated prompt its own prompt and more.
    assert st.cached_tokens >= 4 * 20 + 16
    s = b.cache.pool.cache_stats()
    assert s.hit_tokens == st.cached_tokens and s.stored_blocks > 0


def test_chunked_prefill_and_a_full_batch_match(case: tuple[str, Any, list[list[int]], list[list[int]]]) -> None:
    _, model, ps, ref = case
    out, b = run(model, ps, chunk_size=4, max_batched_tokens=12, max_running=3)
    assert out == ref
    assert b.stats.forward_tokens == fed(ps, b.stats) and b.stats.prefill_chunks > 0
    # All at once: nothing is computed before the first pass, so nothing is reused.
    out, b = run(model, ps)
    assert out == ref and b.stats.cached_tokens == 0


@pytest.mark.parametrize("policy", pykvpool.EVICTION_POLICIES)
def test_preemption_and_eviction_under_pressure(policy: str) -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    ps = shared_prompts()
    out, b = run(model, ps, num_blocks=24, chunk_size=8, max_running=3, eviction=policy)
    assert out == reference_generate(build("llama", "sdpa"), ps)
    st = b.stats
    assert st.forward_tokens == fed(ps, st)
    assert b.cache.pool.cache_stats().evictions > 0 and st.cached_tokens > 0


def test_a_second_run_reuses_the_first_runs_blocks() -> None:
    model = build("qwen3", phf.ATTN_IMPLEMENTATION)
    ps = shared_prompts()[:3]
    b = phf.ContinuousBatcher(model, num_blocks=256, block_size=4, prefix_caching=True)
    # All three at once: their shared blocks are computed three times in the first pass;
    # the later sequences adopt the cached twins and cache their own tails after them.
    first = b.run(ps, NEW)
    assert b.stats.cached_tokens == 0
    second = b.run(ps, NEW)
    assert first == second == reference_generate(build("qwen3", "sdpa"), ps)
    # Every prompt hits all its full blocks but the one holding its last token.
    assert b.stats.cached_tokens == sum((len(p) - 1) // 4 * 4 for p in ps)


def test_join_and_arguments_are_checked() -> None:
    model = build("llama", phf.ATTN_IMPLEMENTATION)
    with pytest.raises(pykvpool.InvalidArgumentError, match="eviction"):
        phf.ContinuousBatcher(model, num_blocks=8, prefix_caching=True, eviction="mru")
    plain = phf.PagedKvCache(model.config, num_blocks=8)
    with pytest.raises(pykvpool.InvalidArgumentError, match="prefix_caching"):
        plain.join(0, [1, 2, 3])
    cache = phf.PagedKvCache(model.config, num_blocks=8, prefix_caching=True)
    with pytest.raises(pykvpool.InvalidArgumentError, match="empty"):
        cache.join(0, [])
    assert cache.join(0, [1, 2, 3]) == 0 and cache.pool.num_seqs == 1
    with pytest.raises(pykvpool.DuplicateSequenceError):
        cache.join(0, [1, 2, 3])
    cache.free_sequence(0)
    assert cache.pool.num_seqs == 0
