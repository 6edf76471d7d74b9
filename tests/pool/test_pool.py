"""Behaviour of ``pykvpool.BlockPool`` and ``BlockTableBuffer``: slot mapping, fork and
copy-on-write, truncation, exports (padded, FlashInfer, incremental buffer), statistics,
argument forms (every integer dtype, byte orders, strides, Python sequences), and two
Python threads working one pool."""

from __future__ import annotations

import random
import threading
from typing import Any

import numpy as np
import pytest
from reference.poolcheck import table_slots

import pykvpool as kv
from isolation import isolated

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def private_pool() -> kv.BlockPool:
    """Sequences 0 (9 tokens: 3 blocks, last page 1), 1 (8 tokens: 2 full blocks), 2 (empty)."""
    p = kv.BlockPool(32, 4)
    p.add_sequence(0, 9)
    p.add_sequence(1, 8)
    p.add_sequence(2)
    return p


# ------------------------------------------------------------------- slot mapping


def test_slots_follow_the_block_table() -> None:
    p = kv.BlockPool(16, 4)
    prompt = p.add_sequence(7, 6)
    assert prompt.dtype == np.int64 and prompt.tolist() == table_slots(p, 7)
    slots, cow = p.append(7, 3)
    assert cow.shape == (0, 2) and cow.dtype == np.int64
    assert slots.tolist() == table_slots(p, 7)[6:]
    table = p.block_table(7)
    assert table.dtype == np.int32 and len(table) == 3 and p.seq_len(7) == 9
    assert sorted(set(table.tolist())) == sorted(table.tolist())  # distinct blocks
    assert all(p.refcount(int(b)) == 1 for b in table)
    p.check_invariants()


def test_step_is_batch_ordered() -> None:
    p = private_pool()
    slots, cow, lens = p.step(np.array([2, 0, 1]), np.array([2, 0, 5]))
    assert slots.dtype == np.int64 and lens.dtype == np.int32 and cow.shape == (0, 2)
    assert lens.tolist() == [2, 9, 13]
    assert slots.tolist() == table_slots(p, 2) + table_slots(p, 1)[8:]
    # Default: one decode token each; an int applies to all.
    assert p.step([0, 1])[2].tolist() == [10, 14]
    assert p.step([0, 1], 3)[2].tolist() == [13, 17]
    empty = p.step([])
    assert [a.shape for a in empty] == [(0,), (0, 2), (0,)]
    p.check_invariants()


def test_running_list_fast_path_falls_back_for_anything_but_plain_ints() -> None:
    import enum

    class Rid(enum.IntEnum):
        ZERO = 0
        ONE = 1

    p = private_pool()
    before = (p.seq_len(0), p.seq_len(1), p.num_free_blocks)
    for bad, err in [([0, -1], kv.InvalidArgumentError), ([0, True], kv.InvalidArgumentError),
                     ([0, 1.0], kv.InvalidArgumentError), ([0, 2**63], kv.InvalidArgumentError),
                     ([0, 2**64 + 1], kv.InvalidArgumentError), ([0, 9], kv.UnknownSequenceError),
                     ([1, 0, 1], kv.InvalidArgumentError)]:
        with pytest.raises(err):
            p.step(bad, 1)
        assert (p.seq_len(0), p.seq_len(1), p.num_free_blocks) == before
    # int subclasses (an IntEnum of request ids) are ints: the checked path takes them.
    assert p.step([Rid.ZERO, Rid.ONE], 1)[2].tolist() == [10, 9]
    p.check_invariants()


def test_blocks_needed_predicts_allocation() -> None:
    p = kv.BlockPool(16, 4)
    p.add_sequence(0, 6)
    assert [p.blocks_needed(0, n) for n in (0, 1, 2, 3, 6, 7)] == [0, 0, 0, 1, 1, 2]
    p.fork(0, 1)
    # Shared and partly filled: one more block for the copy.
    assert [p.blocks_needed(1, n) for n in (0, 1, 2, 3)] == [0, 1, 1, 2]
    free = p.num_free_blocks
    p.append(1, 3)
    assert free - p.num_free_blocks == 2


# ---------------------------------------------------------- fork and copy-on-write


def test_fork_shares_every_block() -> None:
    p = kv.BlockPool(16, 4)
    p.add_sequence(0, 10)
    free = p.num_free_blocks
    p.fork(0, 1)
    assert p.num_free_blocks == free
    assert p.block_table(1).tolist() == p.block_table(0).tolist() and p.seq_len(1) == 10
    assert all(p.refcount(int(b)) == 2 for b in p.block_table(0))
    assert p.stats().shared_blocks == 3


def test_copy_on_write_of_shared_partial_block() -> None:
    p = kv.BlockPool(16, 4)
    p.add_sequence(0, 10)  # last block holds 2 of 4 tokens
    p.fork(0, 1)
    parent = p.block_table(0).tolist()
    slots, cow = p.append(1, 1)
    child = p.block_table(1).tolist()
    src, dst = parent[-1], child[-1]
    assert cow.tolist() == [[src, dst]] and src != dst
    assert child[:2] == parent[:2], "full shared blocks are never copied"
    assert slots.tolist() == [dst * 4 + 2]
    assert p.block_table(0).tolist() == parent, "the parent keeps its blocks"
    assert (p.refcount(src), p.refcount(dst), p.refcount(parent[0])) == (1, 1, 2)
    # The parent is now the only holder of src: no second copy.
    slots, cow = p.append(0, 2)
    assert cow.shape == (0, 2) and slots.tolist() == [src * 4 + 2, src * 4 + 3]
    assert p.stats().cow_copies == 1
    p.check_invariants()


def test_full_shared_blocks_are_never_copied() -> None:
    p = kv.BlockPool(16, 4)
    p.add_sequence(0, 8)
    p.fork(0, 1)
    slots, cow = p.append(1, 5)
    assert cow.shape == (0, 2)
    assert p.block_table(1).tolist()[:2] == p.block_table(0).tolist()
    assert p.stats().cow_copies == 0 and p.stats().shared_blocks == 2


def test_one_copy_when_both_holders_step_together() -> None:
    p = kv.BlockPool(16, 4)
    p.add_sequence(0, 5)
    p.fork(0, 1)
    p.fork(0, 2)
    before = p.block_table(0).tolist()
    free = p.num_free_blocks
    slots, cow, lens = p.step([0, 1, 2])
    # Three holders of one partial block: the first two copy, the last keeps it.
    assert cow.shape == (2, 2) and set(cow[:, 0].tolist()) == {before[-1]}
    assert free - p.num_free_blocks == 2
    assert p.block_table(2).tolist() == before and lens.tolist() == [6, 6, 6]
    lasts = {int(p.block_table(s)[-1]) for s in (0, 1, 2)}
    assert len(lasts) == 3 and {int(d) for d in cow[:, 1]} | {before[-1]} == lasts
    p.check_invariants()


def test_fork_of_truncated_child_copies_block_full_for_parent() -> None:
    """A block full for the parent but partly filled for a truncated child is copied
    before the child writes into it."""
    p = kv.BlockPool(16, 4)
    parent_slots = p.add_sequence(0, 8).tolist()
    p.fork(0, 1)
    p.truncate(1, 2)
    slots, cow = p.append(1, 1)
    assert cow.shape == (1, 2) and cow[0, 0] == p.block_table(0)[1]
    assert slots[0] not in parent_slots
    assert table_slots(p, 0) == parent_slots


def test_free_and_truncate_drop_only_their_references() -> None:
    p = kv.BlockPool(16, 4)
    p.add_sequence(0, 10)
    p.fork(0, 1)
    p.truncate(0, 6)  # 4 tokens left: block 2 and 3 lose the parent's reference
    table = p.block_table(1).tolist()
    assert [p.refcount(b) for b in table] == [2, 1, 1]
    p.free(1)
    assert [p.refcount(b) for b in table] == [1, 0, 0]
    assert p.num_free_blocks == 15
    p.free(0)
    assert p.num_free_blocks == 16 and p.stats().used_blocks == 0


def test_truncate_rolls_back_speculative_tokens() -> None:
    p = kv.BlockPool(16, 4)
    p.add_sequence(0, 6)
    draft, _ = p.append(0, 5)  # 11 tokens, 3 blocks
    p.truncate(0, 4)  # keep one draft token: 7 tokens, 2 blocks
    assert p.seq_len(0) == 7 and len(p.block_table(0)) == 2 and p.num_free_blocks == 14
    again, _ = p.append(0, 1)
    assert again.tolist() == draft[1:2].tolist(), "a private block's slots are reused in place"
    p.truncate(0, 0)
    p.truncate(0, 8)
    assert p.seq_len(0) == 0 and len(p.block_table(0)) == 0 and p.num_free_blocks == 16
    p.check_invariants()


def test_freed_id_can_be_reused() -> None:
    p = kv.BlockPool(4, 4)
    p.add_sequence(3, 16)
    p.free(3)
    assert 3 not in p
    p.add_sequence(3, 2)
    assert 3 in p and p.seq_len(3) == 2 and len(p) == 1


def test_free_batch() -> None:
    p = private_pool()
    p.free_batch(np.array([2, 0], dtype=np.uint8))
    assert p.seq_ids().tolist() == [1] and p.num_free_blocks == 30
    p.free_batch([])
    assert len(p) == 1


# ------------------------------------------------------------------------ exports


def test_padded_tables() -> None:
    p = private_pool()
    t0, t1 = p.block_table(0).tolist(), p.block_table(1).tolist()
    tables = p.block_tables([0, 1, 2])
    assert tables.dtype == np.int32 and tables.shape == (3, 3) and tables.flags.c_contiguous
    assert tables.tolist() == [t0, t1 + [-1], [-1, -1, -1]]
    assert p.block_tables([2, 1], max_blocks=4, pad=0).tolist() == [[0] * 4, t1 + [0, 0]]
    assert p.block_tables([]).shape == (0, 0)
    assert p.block_tables([], max_blocks=5).shape == (0, 5)
    assert p.block_tables([2]).shape == (1, 0)
    assert p.block_tables([1], max_blocks=2).tolist() == [t1]


def test_flashinfer_tables() -> None:
    p = private_pool()
    p.add_sequence(3, 1)
    ids = [0, 2, 1, 3]
    indptr, indices, last = p.flashinfer_tables(ids)
    assert indptr.dtype == indices.dtype == last.dtype == np.int32
    assert indptr.tolist() == [0, 3, 3, 5, 6]
    assert last.tolist() == [1, 0, 4, 1], "1..=block_size, 0 for an empty sequence"
    for i, s in enumerate(ids):
        assert indices[indptr[i] : indptr[i + 1]].tolist() == p.block_table(s).tolist()
    padded = p.block_tables(ids)
    assert indices.tolist() == padded[padded >= 0].tolist()
    empty = p.flashinfer_tables([])
    assert [a.tolist() for a in empty] == [[0], [], []]


def test_table_buffer_syncs_incrementally() -> None:
    p = kv.BlockPool(64, 4)
    p.add_sequence(0, 5)
    p.add_sequence(1, 3)
    buf = kv.BlockTableBuffer(4, 6, pad=-2)
    assert buf.array.shape == (4, 6) and buf.array.dtype == np.int32 and buf.pad == -2
    assert np.shares_memory(buf.array, buf.array) and (buf.array == -2).all()

    def full(ids: list[int]) -> Any:
        return p.block_tables(ids, max_blocks=6, pad=-2)

    # First sync writes both rows whole; rows 2..3 are left alone.
    assert buf.sync(p, [0, 1]) == 12
    np.testing.assert_array_equal(buf.array[:2], full([0, 1]))
    assert (buf.array[2:] == -2).all()
    assert buf.sync(p, [0, 1]) == 0, "unchanged tables: nothing written"
    p.step([0, 1], [1, 1])  # 6 and 4 tokens: no new block
    assert buf.sync(p, [0, 1]) == 0
    # Poison a table entry the buffer believes correct: an append must not touch it.
    good = int(buf.array[0, 0])
    buf.array[0, 0] = 999
    p.append(0, 4)  # one new block
    assert buf.sync(p, [0, 1]) == 1, "only the new entry is written"
    assert buf.array[0, 0] == 999 and buf.array[0, 2] == p.block_table(0)[2]
    buf.invalidate()
    assert buf.sync(p, [0, 1]) == 12
    assert buf.array[0, 0] == good
    np.testing.assert_array_equal(buf.array[:2], full([0, 1]))
    # Copy-on-write replaces an entry: the row is rewritten.
    p.fork(1, 2)
    p.append(1, 1)
    assert buf.sync(p, [0, 1]) >= 1
    np.testing.assert_array_equal(buf.array[:2], full([0, 1]))
    # Truncation shortens a row: the dropped entries become padding.
    p.truncate(0, 6)
    buf.sync(p, [0, 1])
    np.testing.assert_array_equal(buf.array[:2], full([0, 1]))
    # Different sequences in the rows, and a pool switch, rewrite rows.
    buf.sync(p, [2, 0, 1])
    np.testing.assert_array_equal(buf.array[:3], full([2, 0, 1]))
    q = kv.BlockPool(64, 4)
    q.add_sequence(2, 1)
    buf.sync(q, [2])
    np.testing.assert_array_equal(buf.array[:1], q.block_tables([2], max_blocks=6, pad=-2))


def test_table_buffer_matches_full_export_under_random_ops() -> None:
    rng = random.Random(1234)
    p = kv.BlockPool(48, 3)
    buf = kv.BlockTableBuffer(8, 48)
    live: list[int] = []
    next_id = 0
    for _ in range(600):
        r = rng.random()
        try:
            if r < 0.15 or not live:
                p.add_sequence(next_id, rng.randint(0, 10))
                live.append(next_id)
                next_id += 1
            elif r < 0.6:
                p.step(live, [rng.randint(0, 4) for _ in live])
            elif r < 0.7 and len(live) < 8:
                p.fork(rng.choice(live), next_id)
                live.append(next_id)
                next_id += 1
            elif r < 0.85:
                s = rng.choice(live)
                p.truncate(s, rng.randint(0, p.seq_len(s)))
            else:
                s = rng.choice(live)
                p.free(s)
                live.remove(s)
        except kv.PoolExhaustedError:
            s = live.pop(0)
            p.free(s)
        live = live[:8]
        rows = sorted(live, key=lambda _: rng.random())
        written = buf.sync(p, rows)
        np.testing.assert_array_equal(buf.array[: len(rows)], p.block_tables(rows, max_blocks=48))
        assert buf.sync(p, rows) == 0 and written <= len(rows) * 48
    p.free_batch(p.seq_ids())
    assert p.num_free_blocks == 48


@pytest.mark.parametrize("caching", [False, True])
def test_table_buffers_mirror_every_group_of_a_hybrid_pool(caching: bool) -> None:
    # One buffer per group; random growth, window releases, forks (copy-on-write),
    # truncations within the window, frees and prefix hits with holes.
    rng = random.Random(99)
    groups = [kv.FullAttention(), kv.SlidingWindow(6, sink_tokens=2), kv.ChunkedAttention(8)]
    p = kv.BlockPool(200, 2, groups, prefix_caching=caching)
    bufs = [kv.BlockTableBuffer(6, 512, pad=-3) for _ in groups]
    live: list[int] = []
    next_id = 0
    prompts = [[7] * 10, [7] * 10 + [8] * 6]
    for _ in range(300):
        r = rng.random()
        try:
            if r < 0.2 or not live:
                if caching and rng.random() < 0.5:
                    p.add_sequence_tokens(next_id, rng.choice(prompts) + [next_id])
                else:
                    p.add_sequence(next_id, rng.randint(0, 9))
                live.append(next_id)
                next_id += 1
            elif r < 0.65:
                p.step(live, [rng.randint(0, 3) for _ in live])
            elif r < 0.75 and len(live) < 6:
                p.fork(rng.choice(live), next_id)
                live.append(next_id)
                next_id += 1
            elif r < 0.85:
                p.truncate(rng.choice(live), rng.randint(0, 2))
            else:
                s = rng.choice(live)
                p.free(s)
                live.remove(s)
        except kv.InvalidArgumentError:
            pass  # a truncation past a released block
        except kv.PoolExhaustedError:
            p.free(live.pop(0))
        for s in live[6:]:
            p.free(s)
        live = live[:6]
        rows = sorted(live, key=lambda _: rng.random())
        for g, buf in enumerate(bufs):
            buf.sync(p, rows, group=g)
            np.testing.assert_array_equal(buf.array[: len(rows)], p.block_tables(rows, max_blocks=512, pad=-3, group=g))
            assert buf.sync(p, rows, group=g) == 0
    p.check_invariants()


# ---------------------------------------------------------------------- statistics


def test_stats() -> None:
    p = kv.BlockPool(16, 4)
    s = p.stats()
    assert (s.used_blocks, s.free_blocks, s.total_blocks, s.utilization, s.empty_slots) == (0, 16, 16, 1.0, 0)
    p.add_sequence(0, 10)
    p.fork(0, 1)
    s = p.stats()
    assert (s.used_blocks, s.shared_blocks, s.logical_tokens, s.stored_tokens) == (3, 3, 20, 10)
    assert (s.empty_slots, s.cow_copies, s.num_seqs, s.block_size) == (2, 0, 2, 4)
    assert s.utilization == pytest.approx(10 / 12)
    p.append(1, 1)  # copy-on-write of the partial block
    p.add_sequence(2)
    s = p.stats()
    assert (s.used_blocks, s.shared_blocks, s.logical_tokens, s.stored_tokens) == (4, 2, 21, 13)
    assert (s.empty_slots, s.cow_copies, s.num_seqs, s.free_blocks) == (3, 1, 3, 12)
    assert s.utilization == pytest.approx(13 / 16)
    p.truncate(0, 2)  # the parent's partial block goes back to the free list
    d = p.stats().as_dict()
    assert d["used_blocks"] == 3 and d["stored_tokens"] == 11 and d["empty_slots"] == 1
    assert d["logical_tokens"] == 19 and d["cow_copies"] == 1
    assert d["utilization"] == pytest.approx(11 / 12)
    assert set(d) == {
        "block_size",
        "total_blocks",
        "free_blocks",
        "used_blocks",
        "num_seqs",
        "logical_tokens",
        "stored_tokens",
        "shared_blocks",
        "cow_copies",
        "empty_slots",
        "utilization",
        "idle_cached_blocks",
        "group_blocks",
        "group_stored_tokens",
        "group_holes",
    }
    assert d["group_blocks"] == [3] and d["group_stored_tokens"] == [11] and d["group_holes"] == [0]
    assert "cow_copies=1" in repr(p.stats())


def test_pool_properties() -> None:
    p = private_pool()
    assert (p.num_blocks, p.block_size, p.num_seqs, len(p)) == (32, 4, 3, 3)
    assert p.num_free_blocks + p.num_used_blocks == 32 and p.num_used_blocks == 5
    assert 0 in p and 5 not in p and -1 not in p and "0" not in p and 1.0 not in p
    assert p.seq_ids().tolist() == [0, 1, 2] and p.seq_ids().dtype == np.int64
    assert "free=27" in repr(p)


# ---------------------------------------------------------------- argument forms


@pytest.mark.parametrize("dtype", [*INT_DTYPES, np.intc, np.longlong, np.uintp, ">i8", ">u2", "<i4"])
def test_every_integer_dtype_is_accepted(dtype: Any) -> None:
    p = private_pool()
    ids = np.array([2, 0], dtype=dtype)
    counts = np.array([3, 1], dtype=dtype)
    slots, _, lens = p.step(ids, counts)
    assert lens.tolist() == [3, 10] and len(slots) == 4
    assert p.block_tables(ids).tolist() == p.block_tables([2, 0]).tolist()
    assert p.flashinfer_tables(ids)[2].tolist() == [3, 2]
    buf = kv.BlockTableBuffer(2, 4)
    buf.sync(p, ids)
    np.testing.assert_array_equal(buf.array, p.block_tables([2, 0], max_blocks=4))
    p.free_batch(ids)
    assert p.seq_ids().tolist() == [1]


@pytest.mark.parametrize(
    ("ids", "counts"),
    [
        ([2, 0], [3, 1]),
        ((2, 0), (3, 1)),
        (range(2, -1, -2), range(3, 0, -2)),
        ([np.int16(2), np.uint64(0)], [np.int8(3), 1]),
        (np.array([9, 2, 7, 0])[1::2], np.array([[3, 5], [1, 5]])[:, 0]),  # strided views
        (np.array([0, 2])[::-1], np.array([1, 3], dtype=np.uint8)[::-1]),  # negative strides
    ],
)
def test_sequences_and_strided_arrays_are_accepted(ids: Any, counts: Any) -> None:
    p = private_pool()
    assert p.step(ids, counts)[2].tolist() == [3, 10]


def test_numpy_scalars_are_accepted() -> None:
    p = kv.BlockPool(np.int64(8), np.uint8(4))
    p.add_sequence(np.uint32(5), np.int16(6))
    p.append(np.int8(5), np.uint64(2))
    p.fork(np.intc(5), np.longlong(6))
    p.truncate(np.uint16(6), np.int32(1))
    assert (p.seq_len(5), p.seq_len(np.int64(6))) == (8, 7)
    assert p.step([5], np.int64(2))[2].tolist() == [10]
    p.free(np.uint8(6))
    assert p.refcount(np.int32(p.block_table(5)[0])) == 1


# ------------------------------------------------------------------------- threads


@isolated(timeout=180)
def test_two_threads_share_one_pool() -> None:
    """Two threads, each on its own sequences, thousands of operations each (the GIL is
    released inside the pool, so calls interleave). Afterwards the invariants hold, each
    thread's view of its sequences is the pool's, totals add up, and the two threads'
    blocks never overlap."""
    pool = kv.BlockPool(192, 8)
    steps = 10_000
    errors: list[BaseException] = []
    lens: list[dict[int, int]] = [{}, {}]
    exhausted = [0, 0]
    barrier = threading.Barrier(2)

    def worker(t: int) -> None:
        rng = random.Random(t)
        mine = lens[t]
        next_id = t * 1_000_000
        try:
            barrier.wait()
            for _ in range(steps):
                r = rng.random()
                try:
                    if r < 0.1 or len(mine) < 2:
                        n = rng.randint(0, 60)
                        assert len(pool.add_sequence(next_id, n)) == n
                        mine[next_id] = n
                        next_id += 1
                    elif r < 0.75:
                        ids = rng.sample(sorted(mine), min(len(mine), 6))
                        counts = [rng.choice([1, 1, 1, 4, 16]) for _ in ids]
                        slots, _, got = pool.step(np.array(ids, dtype=np.int64), counts)
                        assert len(slots) == sum(counts)
                        for s, n, g in zip(ids, counts, got.tolist()):
                            mine[s] += n
                            assert g == mine[s]
                    elif r < 0.82:
                        parent = rng.choice(sorted(mine))
                        pool.fork(parent, next_id)
                        mine[next_id] = mine[parent]
                        next_id += 1
                    elif r < 0.9:
                        s = rng.choice(sorted(mine))
                        n = rng.randint(0, mine[s])
                        pool.truncate(s, n)
                        mine[s] -= n
                    else:
                        s = rng.choice(sorted(mine))
                        pool.free(s)
                        del mine[s]
                except kv.PoolExhaustedError:
                    # The other thread may hold the blocks: make room from our own side
                    # (with nothing of our own, wait for the other thread to free).
                    exhausted[t] += 1
                    if mine:
                        longest = max(mine, key=lambda s: mine[s])
                        pool.free(longest)
                        del mine[longest]
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    pool.check_invariants()
    everything = {**lens[0], **lens[1]}
    assert len(everything) == len(lens[0]) + len(lens[1])
    assert sorted(pool.seq_ids().tolist()) == sorted(everything)
    for s, n in everything.items():
        assert pool.seq_len(s) == n
    stats = pool.stats()
    assert stats.num_seqs == len(everything)
    assert stats.logical_tokens == sum(everything.values())
    blocks = [{int(b) for s in mine for b in pool.block_table(s)} for mine in lens]
    assert not blocks[0] & blocks[1], "the threads' sequences share a block"
    assert stats.used_blocks == len(blocks[0]) + len(blocks[1])
    pool.free_batch(pool.seq_ids())
    assert pool.num_free_blocks == pool.num_blocks
    pool.check_invariants()
