"""``BlockPool.rewind``: a rollback past the window, which ``truncate`` refuses, allocates
again the blocks a query at the new length needs (the model of every case is in
``tests/rust/pool_model.rs``; here the Python surface)."""

from __future__ import annotations

import numpy as np
import pytest

from pykvpool import BlockPool, FullAttention, InvalidArgumentError, PoolExhaustedError, SlidingWindow

BS = 4


def windowed(num_blocks: int = 64) -> BlockPool:
    """One group: a window of 9 tokens after 4 sink tokens (one sink block)."""
    pool = BlockPool(num_blocks, BS, [SlidingWindow(9, sink_tokens=4), FullAttention()])
    pool.add_sequence(1, 40)
    pool.mark_computed([1])  # the window releases blocks 1..7 of group 0
    return pool


def test_a_rewind_past_the_window_allocates_the_released_blocks_again() -> None:
    pool = windowed()
    before = pool.block_table(1, group=0)
    with pytest.raises(InvalidArgumentError):
        pool.truncate(1, 20)  # a query at 20 sees blocks 3 and 4, released
    fresh = pool.rewind(1, 20)
    assert isinstance(fresh, list) and len(fresh) == 2
    np.testing.assert_array_equal(fresh[0], [3, 4])  # refilled: the caller writes them
    assert fresh[1].size == 0  # the full group kept blocks 0..4
    after = pool.block_table(1, group=0)
    assert after[0] == before[0]  # the sink block is kept
    assert (after[1:3] == -1).all() and (after[3:] >= 0).all()
    assert (pool.seq_len(1), pool.frontier(1)) == (20, 20)
    pool.check_invariants()
    pool.append(1, 30)  # grows on as usual
    pool.check_invariants()


def test_a_rewind_within_the_window_keeps_every_block() -> None:
    pool = BlockPool(8, BS)
    pool.add_sequence(1, 10)
    table = pool.block_table(1)
    fresh = pool.rewind(1, 5)
    assert isinstance(fresh, np.ndarray) and fresh.size == 0
    np.testing.assert_array_equal(pool.block_table(1), table[:2])
    assert pool.num_free_blocks == 6


def test_a_rewind_without_room_changes_nothing() -> None:
    pool = BlockPool(16, BS, [SlidingWindow(9, sink_tokens=4)])
    pool.add_sequence(1, 40)
    pool.mark_computed([1])  # holds blocks 0, 8 and 9
    pool.fork(1, 3)  # shared: the rewind frees none of them
    pool.add_sequence(2, 4 * pool.num_free_blocks)
    table = pool.block_table(1, group=0).copy()
    with pytest.raises(PoolExhaustedError, match="requested 2 blocks, 0 free"):
        pool.rewind(1, 24)
    np.testing.assert_array_equal(pool.block_table(1, group=0), table)
    assert (pool.seq_len(1), pool.frontier(1)) == (40, 40)
    pool.free(2)
    np.testing.assert_array_equal(pool.rewind(1, 24)[0], [4, 5])
    pool.check_invariants()
