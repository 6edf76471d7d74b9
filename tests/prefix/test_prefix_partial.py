"""Partly filled keyed blocks from Python: a block registered under
a key records how many tokens of KV it holds, and no admission reuses more than that.

Each test tracks what was written: ``written[block]`` is the number of tokens whose KV a
caller computed (or copied) into ``block``; every reused token must lie below it.
"""

from __future__ import annotations

import numpy as np
import pytest

import pykvpool as kv

BS = 4


def keyed_pool(**kw: object) -> kv.BlockPool:
    return kv.BlockPool(16, BS, prefix_caching=True, verify_tokens=False, **kw)  # type: ignore[arg-type]


def write(written: dict[int, int], slots: np.ndarray) -> None:  # type: ignore[type-arg]
    """Record the KV a caller computes into ``slots``."""
    for s in slots.tolist():
        written[s // BS] = max(written.get(s // BS, 0), s % BS + 1)


def assert_reuse_was_written(pool: kv.BlockPool, seq: int, cached: int, written: dict[int, int]) -> None:
    table = pool.block_table(seq).tolist()
    for p in range(cached):
        assert written.get(table[p // BS], 0) > p % BS, f"token {p} reused from block {table[p // BS]} never written"


def test_issue_reproducer_serves_only_the_written_tokens() -> None:
    pool = keyed_pool()
    written: dict[int, int] = {}
    cached, slots = pool.add_sequence_block_keys(0, [1, 2], 6)
    write(written, slots)
    pool.free(0)
    cached, slots = pool.add_sequence_block_keys(1, [1, 2, 3], 12)
    assert cached == 4, "only 6 tokens of KV were ever written under keys [1, 2]"
    assert len(slots) == 8
    assert_reuse_was_written(pool, 1, cached, written)
    s = pool.cache_stats()
    # The fill is part of a block's identity: the full block keyed 2 is another entry than
    # the cached 2-token one, so its lookup is a plain miss, not a failed verification.
    assert (s.hit_blocks, s.collisions) == (1, 0)
    pool.check_invariants()


def test_partial_block_extended_by_append_is_copied() -> None:
    pool = keyed_pool()
    written: dict[int, int] = {}
    _, slots = pool.add_sequence_block_keys(0, np.array([1, 2], dtype=np.uint64), 6)
    write(written, slots)
    src = int(pool.block_table(0)[1])
    slots, cow = pool.append(0, 2)
    dst = int(pool.block_table(0)[1])
    assert cow.tolist() == [[src, dst]]
    written[dst] = written[src]
    write(written, slots)
    pool.check_invariants()
    pool.free(0)
    cached, _ = pool.add_sequence_block_keys(1, [1, 2, 3], 12)
    assert cached == 4
    assert_reuse_was_written(pool, 1, cached, written)


def test_forked_partial_block_is_copied_by_each_holder() -> None:
    pool = keyed_pool()
    pool.add_sequence_block_keys(0, [1, 2], 6)
    src = int(pool.block_table(0)[1])
    pool.fork(0, 1)
    _, cow, lens = pool.step([0, 1], 2)
    assert lens.tolist() == [8, 8]
    assert sorted(cow[:, 0].tolist()) == [src, src]
    pool.free(0)
    pool.free(1)
    assert pool.add_sequence_block_keys(2, [1, 2, 3], 12)[0] == 4
    pool.check_invariants()


@pytest.mark.parametrize("cow_partial_hit", [False, True])
def test_token_admission_never_takes_a_partial_block(cow_partial_hit: bool) -> None:
    """A keyed partial block filed under a full block's key (verification off)."""
    pool = keyed_pool(cow_partial_hit=cow_partial_hit)
    tokens = np.arange(100, 112, dtype=np.int64)
    keys = pool.block_keys(tokens)
    pool.add_sequence_block_keys(0, keys[:2], 6)
    pool.free(0)
    assert pool.cached_prefix_len(tokens) == 4
    with pytest.raises(kv.InvalidArgumentError, match="not cached"):
        pool.pin_prefix(tokens[:8])
    cached, slots, cow = pool.add_sequence_tokens(1, tokens[:8])
    assert (cached, len(slots), cow.shape[0]) == (4, 4, 0)
    pool.check_invariants()


def test_same_partial_prompt_matches_its_block_and_the_last_token_rule_recomputes_it() -> None:
    pool = keyed_pool()
    pool.add_sequence_block_keys(0, [1, 2], 6)
    pool.free(0)
    assert pool.add_sequence_block_keys(1, [1, 2], 6)[0] == 4
    assert pool.cache_stats().hit_blocks == 2
    with pytest.raises(kv.InvalidArgumentError, match="not cached"):
        pool.pin_block_keys([1, 2])
    pool.unpin(pool.pin_block_keys([1]))
    pool.check_invariants()
