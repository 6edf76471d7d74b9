"""Joining at a hit and caching once computed (``BlockPool.add_sequence_hit`` then
``store_tokens``): the scheduler's order, where no block is cached before its K/V exists."""

from __future__ import annotations

import numpy as np
import pytest

import pykvpool as kv

BS = 4


def pool(groups: list[object] | None = None) -> kv.BlockPool:
    return kv.BlockPool(64, BS, groups, prefix_caching=True)


def computed(p: kv.BlockPool, seq: int, prompt: list[int], cached: int) -> None:
    """Grow ``seq`` by the rest of its prompt, then hand over the ids (the KV is 'computed')."""
    p.step([seq], [len(prompt) - cached])
    p.store_tokens(seq, prompt[cached:])


def test_blocks_are_cached_only_when_their_ids_are_stored() -> None:
    p = pool()
    prompt = list(range(100, 111))  # 11 tokens: 2 full blocks
    assert p.add_sequence_hit(0, prompt) == 0
    assert p.seq_len(0) == 0
    p.step([0], [len(prompt)])
    assert p.cached_prefix_len(prompt) == 0, "grown, not computed: nothing is cached yet"
    p.store_tokens(0, prompt[:5])
    assert p.cached_prefix_len(prompt) == 4
    p.store_tokens(0, prompt[5:])
    assert p.cached_prefix_len(prompt) == 8
    p.check_invariants()
    # A second prompt sharing 9 tokens joins at its 2 cached blocks.
    other = prompt[:9] + [7, 7, 7]
    assert p.add_sequence_hit(1, other) == 8
    assert p.seq_len(1) == 8 and p.block_table(1)[:2].tolist() == p.block_table(0)[:2].tolist()
    computed(p, 1, other, 8)
    s = p.cache_stats()
    assert (s.queries, s.query_tokens, s.hit_tokens) == (2, 11 + 12, 8)
    p.check_invariants()


def test_the_last_prompt_token_is_always_computed() -> None:
    p = pool()
    prompt = list(range(8))
    p.add_sequence_hit(0, prompt)
    computed(p, 0, prompt, 0)
    p.free(0)
    assert p.add_sequence_hit(1, prompt) == 4, "the second block holds the last token"


def test_generated_tokens_are_cached_too_and_forks_keep_the_record() -> None:
    p = pool()
    prompt = [5, 6, 7]
    p.add_sequence_hit(0, prompt)
    computed(p, 0, prompt, 0)
    p.fork(0, 1)
    for seq, tok in ((0, 8), (1, 9)):
        p.step([seq], [1])
        p.store_tokens(seq, [tok])
    # The fork shared the partly filled block; each copied it and filled its own copy.
    assert p.cached_prefix_len([5, 6, 7, 8]) == p.cached_prefix_len([5, 6, 7, 9]) == 4
    assert p.block_table(0)[0] != p.block_table(1)[0]
    p.check_invariants()


def test_windowed_groups_join_at_their_window() -> None:
    p = pool([kv.FullAttention(), kv.SlidingWindow(4)])
    prompt = list(range(30, 50))  # 20 tokens, 5 blocks
    p.add_sequence_hit(0, prompt)
    computed(p, 0, prompt, 0)
    p.free(0)
    assert p.add_sequence_hit(1, prompt + [1]) == 20
    t = p.block_table(1, group=1)
    # A query at 20 sees keys 17..20: of the blocks before it, only block 4.
    assert t.shape[0] == 5 and (t[:4] < 0).all() and t[4] >= 0, "holes before the window"
    p.step([1], [1])
    p.store_tokens(1, [1])
    p.check_invariants()


def test_failures_change_nothing() -> None:
    p = pool()
    prompt = list(range(10))
    p.add_sequence_hit(0, prompt)
    p.step([0], [4])
    def state() -> tuple[object, ...]:
        c = p.cache_stats()
        return repr(p.stats()), c.queries, c.query_tokens, c.stored_blocks, c.clock, p.seq_len(0), p.num_seqs

    before = state()
    with pytest.raises(kv.InvalidArgumentError, match="token_ids"):
        p.store_tokens(0, prompt[:5])  # 5 ids for 4 stored tokens
    with pytest.raises(kv.UnknownSequenceError):
        p.store_tokens(9, [1])
    with pytest.raises(kv.DuplicateSequenceError):
        p.add_sequence_hit(0, prompt)
    with pytest.raises(kv.InvalidArgumentError):
        p.add_sequence_hit(1, [-1, 2])
    with pytest.raises(kv.InvalidArgumentError, match="string"):
        p.add_sequence_hit(1, "abc")  # type: ignore[arg-type]
    assert state() == before
    p.add_sequence(2, 4)
    with pytest.raises(kv.InvalidArgumentError, match="no token record"):
        p.store_tokens(2, [1])
    with pytest.raises(kv.InvalidArgumentError, match="prefix caching"):
        kv.BlockPool(8, BS).add_sequence_hit(0, [1, 2])
    p.check_invariants()


def test_append_tokens_on_a_record_behind_drops_the_record() -> None:
    """Mixing the orders: a joined sequence grown without ids, then append_tokens, goes on
    unrecorded (its ids cannot be placed), never caching KV under the wrong tokens."""
    p = pool()
    p.add_sequence_hit(0, [1, 2, 3, 4, 5])
    p.step([0], [5])
    p.append_tokens(0, np.array([6, 7, 8], dtype=np.int64))
    assert p.cache_stats().stored_blocks == 0
    with pytest.raises(kv.InvalidArgumentError, match="no token record"):
        p.store_tokens(0, [1])


def test_blocks_computed_twice_are_kept_once() -> None:
    """Two sequences compute the same prompt in one pass: the second one's stored blocks
    become the first one's cached blocks (its own go back to the free list), and its
    chain goes on past them."""
    p = pool()
    shared = list(range(100, 112))  # 3 full blocks
    a, b = shared + [1, 2, 3, 4, 5], shared + [6, 7, 8, 9, 10]
    for seq, prompt in ((0, a), (1, b)):
        assert p.add_sequence_hit(seq, prompt) == 0
    p.step([0, 1], [len(a), len(b)])
    free = p.num_free_blocks
    p.store_tokens(0, a)
    p.store_tokens(1, b)
    assert p.num_free_blocks == free + 3, "the duplicates of the shared blocks are freed"
    assert p.block_table(1)[:3].tolist() == p.block_table(0)[:3].tolist()
    assert p.cached_prefix_len(b) == 16 and p.cached_prefix_len(a) == 16
    p.check_invariants()
    p.free(0)
    p.free(1)
    assert p.add_sequence_hit(2, b + [0]) == 16
    p.check_invariants()
