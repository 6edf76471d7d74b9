"""pykvpool.hf.serve on a tight pool (about 1.08x the blocks of its longest sequence):
the batcher admits a prompt only with room for every running sequence's known tokens and
one block of growth each, admits nothing in a pass that preempted, and readmits a preempted
sequence only once another finished; its tokens stay those of an unconstrained run and of
transformers' greedy ``generate`` (random-weight models from small configs, nothing
downloaded)."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import pykvpool.hf as phf  # noqa: E402
from test_hf_continuous import prompts, reference_generate  # noqa: E402
from tiny import build  # noqa: E402

#: benches/hf_preemption.py's workload at a quarter of its scale: blocks of 4 (16 there),
#: chunks of 16 (64), prompts of a quarter of its lengths, in the same order.
LENS = (35, 5, 78, 14, 24, 58, 10, 44)
BLOCK, CHUNK = 4, 16


def tight_blocks(new: int) -> int:
    """1.08x the blocks of the longest sequence (its prompt and ``new - 1`` fed tokens),
    rounded up."""
    longest = -(-(max(LENS) + new - 1) // BLOCK)
    return -(-longest * 108 // 100)


class Trace:
    """What a run did, pass by pass: sequences joining, preempted, finished."""

    def __init__(self, b: phf.ContinuousBatcher) -> None:
        self.events: list[tuple[str, int]] = []
        cache, preempt, schedule, free = b.cache, b._preempt, b.cache.schedule, b.cache.free_sequence
        self.preempting = False

        def traced_preempt(running: Any, waiting: Any) -> None:
            self.preempting = True
            preempt(running, waiting)
            self.preempting = False

        def traced_schedule(ids: list[int], counts: list[int]) -> None:
            joining = [s for s in ids if s not in cache.ragged]
            schedule(ids, counts)
            self.events += [("join", s) for s in joining] + [("pass", -1)]

        def traced_free(seq: int) -> None:
            free(seq)
            self.events.append(("preempt" if self.preempting else "finish", seq))

        b._preempt, cache.schedule, cache.free_sequence = traced_preempt, traced_schedule, traced_free

    def check_policy(self) -> None:
        """No pass that preempted admits; a preempted sequence rejoins only after a finish."""
        preempted_here, waiting_finish = False, set()
        for kind, s in self.events:
            if kind == "preempt":
                preempted_here = True
                waiting_finish.add(s)
            elif kind == "finish":
                waiting_finish.clear()
            elif kind == "join":
                assert not preempted_here, "a pass that preempted admitted a sequence"
                assert s not in waiting_finish, f"sequence {s} rejoined before any sequence finished"
            else:
                preempted_here = False


def serve(model: Any, ps: list[list[int]], new: int, num_blocks: int) -> tuple[list[list[int]], Any, Trace]:
    b = phf.ContinuousBatcher(model, num_blocks=num_blocks, block_size=BLOCK, chunk_size=CHUNK)
    trace = Trace(b)
    out = b.run(ps, new)
    assert b.cache.pool.num_used_blocks == 0
    b.cache.pool.check_invariants()
    return out, b.stats, trace


@pytest.fixture(scope="module")
def llama() -> tuple[Any, list[list[int]]]:
    torch.set_num_threads(1)
    return build("llama", phf.ATTN_IMPLEMENTATION), prompts(LENS)


def test_growth_within_a_block_never_preempts(llama: tuple[Any, list[list[int]]]) -> None:
    """With every sequence generating at most ``BLOCK + 1`` tokens (so storing at most
    ``BLOCK`` tokens past its prompt), the headroom kept at each admission covers all the
    growth there is: no preemption, every token fed once (the former policy preempted 16
    times and fed 632 tokens here)."""
    model, ps = llama
    new = BLOCK + 1
    out, st, trace = serve(model, ps, new, tight_blocks(new))
    assert st.preemptions == 0 and st.recomputed_tokens == 0
    assert st.forward_tokens == sum(LENS) + len(LENS) * (new - 1)
    assert out == serve(model, ps, new, 1024)[0] == reference_generate(build("llama", "sdpa"), ps, new)
    trace.check_policy()


def test_longer_generations_preempt_without_thrash(llama: tuple[Any, list[list[int]]]) -> None:
    """Generations of ``6 * BLOCK`` tokens outgrow the headroom: preemptions happen, but a
    pass that preempts admits nothing and a preempted sequence waits for a finish (the
    former policy readmitted it at once: 73 preemptions, 1,975 tokens fed here)."""
    model, ps = llama
    new = 6 * BLOCK
    out, st, trace = serve(model, ps, new, tight_blocks(new))
    trace.check_policy()
    assert out == serve(model, ps, new, 1024)[0] == reference_generate(build("llama", "sdpa"), ps, new)
    # Fed = every prompt and generated token once, plus what preemption dropped.
    assert st.forward_tokens == sum(LENS) + len(LENS) * (new - 1) + st.recomputed_tokens
    assert st.preemptions > 0
    assert st.recomputed_tokens <= st.preemptions * (max(LENS) + new - 2)


@pytest.mark.parametrize("model_type", ["mistral", "gemma2"])
def test_windowed_models_on_a_tight_pool(model_type: str) -> None:
    """Window groups hold fewer blocks than the admission estimate counts (it counts each
    group as holding every token): still the tokens of per-prompt generate."""
    ps = prompts(LENS)
    model = build(model_type, phf.ATTN_IMPLEMENTATION)
    groups = 2 if model_type == "gemma2" else 1
    out, st, trace = serve(model, ps, 3 * BLOCK, groups * tight_blocks(3 * BLOCK))
    trace.check_policy()
    ref = reference_generate(build(model_type, "eager" if model_type == "gemma2" else "sdpa"), ps, 3 * BLOCK)
    assert out == ref
