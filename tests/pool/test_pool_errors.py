"""Every rejected input kind: the exact exception class, its builtin base, a message that
gives the numbers, and a pool (and table buffer) left exactly as it was.

Kinds covered: zero, negative and absurd pool sizes; ids and counts that are negative,
floats, bools, strings, None or past int64 (scalars and array elements, uint64 included);
float, bool and 2-D arrays; unknown, duplicate and freed ids; exhaustion (add, append,
fork copy-on-write, batched step, atomically); more than 2**27 new tokens in one call;
truncation beyond the length; mismatched step lengths; tables wider than ``max_blocks``
or absurdly wide; out-of-range block ids; ``BlockTableBuffer`` misuse (bad shapes, too
many rows, narrow rows, unknown ids, a read-only array, a non-pool argument).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from reference.poolcheck import snapshot

import pykvpool as kv

Call = Callable[[kv.BlockPool], Any]
E_INVALID = (kv.InvalidArgumentError, ValueError)
E_UNKNOWN = (kv.UnknownSequenceError, KeyError)
E_DUPLICATE = (kv.DuplicateSequenceError, ValueError)
E_EXHAUSTED = (kv.PoolExhaustedError, MemoryError)


@pytest.fixture
def pool() -> kv.BlockPool:
    """8 blocks of 4 slots: sequence 1 (5 tokens, 2 blocks) forked into 2 (sharing both
    blocks, the last one partly filled), 3 empty, 4 freed. 6 blocks free."""
    p = kv.BlockPool(8, 4)
    p.add_sequence(1, 5)
    p.fork(1, 2)
    p.add_sequence(3)
    p.add_sequence(4, 16)
    p.free(4)
    assert p.num_free_blocks == 6
    return p


def expect_error(pool: kv.BlockPool, call: Call, err: tuple[type[Exception], type[Exception]], match: str) -> Any:
    """``call(pool)`` raises exactly ``err[0]`` (also a ``err[1]`` and a ``KvPoolError``)
    with a message matching ``match``, and the pool is unchanged."""
    cls, builtin = err
    before = snapshot(pool)
    with pytest.raises(cls, match=match) as info:
        call(pool)
    assert type(info.value) is cls
    assert isinstance(info.value, builtin) and isinstance(info.value, kv.KvPoolError)
    assert snapshot(pool) == before
    pool.check_invariants()
    return info.value


# ------------------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    ("num_blocks", "block_size", "match"),
    [
        (0, 16, r"num_blocks must be in 1\.\.=1073741824, got 0"),
        (2**30 + 1, 16, r"num_blocks must be in 1\.\.=1073741824, got 1073741825"),
        (2**62, 16, r"num_blocks must be in 1\.\.=1073741824, got 4611686018427387904"),
        (-1, 16, r"num_blocks must be >= 0, got -1"),
        (16, 0, r"block_size must be in 1\.\.=65536 tokens, got 0"),
        (16, 65537, r"block_size must be in 1\.\.=65536 tokens, got 65537"),
        (16, -4, r"block_size must be >= 0, got -4"),
        (16.0, 16, r"num_blocks must be an int, got float"),
        (True, 16, r"num_blocks must be an int, got bool"),
        ("16", 16, r"num_blocks must be an int, got str"),
        (None, 16, r"num_blocks must be an int, got NoneType"),
        (2**64, 16, r"num_blocks must be an int in int64 range, got 18446744073709551616"),
        (16, np.float32(16), r"block_size must be an int, got float32"),
    ],
)
def test_bad_pool_sizes(num_blocks: Any, block_size: Any, match: str) -> None:
    with pytest.raises(kv.InvalidArgumentError, match=match) as info:
        kv.BlockPool(num_blocks, block_size)
    assert type(info.value) is kv.InvalidArgumentError and isinstance(info.value, ValueError)


def test_numpy_integer_sizes_accepted() -> None:
    p = kv.BlockPool(np.uint16(8), np.int8(4))
    assert (p.num_blocks, p.block_size) == (8, 4)


# ------------------------------------------------------------------ pool operations

CASES: list[tuple[str, Call, tuple[type[Exception], type[Exception]], str]] = [
    # add_sequence
    ("add duplicate", lambda p: p.add_sequence(1, 3), E_DUPLICATE, r"sequence id 1 already exists"),
    ("add negative id", lambda p: p.add_sequence(-5), E_INVALID, r"seq_id must be a non-negative int, got -5"),
    ("add negative len", lambda p: p.add_sequence(5, -1), E_INVALID, r"prompt_len must be >= 0, got -1"),
    ("add float len", lambda p: p.add_sequence(5, 2.0), E_INVALID, r"prompt_len must be an int, got float"),
    ("add bool id", lambda p: p.add_sequence(True), E_INVALID, r"seq_id must be an int, got bool"),
    ("add numpy bool", lambda p: p.add_sequence(5, np.True_), E_INVALID, r"prompt_len must be an int, got bool"),
    ("add string id", lambda p: p.add_sequence("5"), E_INVALID, r"seq_id must be an int, got str"),
    ("add id > int64", lambda p: p.add_sequence(2**63), E_INVALID, r"int64 range, got 9223372036854775808"),
    (
        "add uint64 id > int64",
        lambda p: p.add_sequence(np.uint64(2**63 + 1)),
        E_INVALID,
        r"int64 range, got np.uint64\(9223372036854775809\)",
    ),
    ("add exhausted", lambda p: p.add_sequence(5, 25), E_EXHAUSTED, r"requested 7 blocks, 6 free"),
    # One call adds at most 2**27 tokens (its slot mapping alone is 1 GiB): an absurd
    # count raises instead of running the process out of memory on a pool that has room.
    (
        "add too many tokens at once",
        lambda p: p.add_sequence(5, 2**27 + 1),
        E_INVALID,
        r"prompt_len: 134217729 new tokens in one call exceed the limit of 134217728",
    ),
    # append
    ("append unknown", lambda p: p.append(9), E_UNKNOWN, r"unknown sequence id 9"),
    ("append freed", lambda p: p.append(4), E_UNKNOWN, r"unknown sequence id 4"),
    ("append negative", lambda p: p.append(1, -2), E_INVALID, r"num_tokens must be >= 0, got -2"),
    ("append float", lambda p: p.append(1, 1.5), E_INVALID, r"num_tokens must be an int, got float"),
    ("append None", lambda p: p.append(1, None), E_INVALID, r"num_tokens must be an int, got NoneType"),
    # 24 more tokens: 6 new blocks plus the copy of the shared partial block 7 > 6 free.
    ("append exhausted (copy counted)", lambda p: p.append(1, 24), E_EXHAUSTED, r"requested 7 blocks, 6 free"),
    ("append too many at once", lambda p: p.append(1, 2**31), E_INVALID, r"num_tokens: 2147483648 new tokens in one call"),
    # step
    ("step unknown", lambda p: p.step([1, 9]), E_UNKNOWN, r"unknown sequence id 9"),
    ("step freed", lambda p: p.step(np.array([4], dtype=np.int32)), E_UNKNOWN, r"unknown sequence id 4"),
    ("step duplicate", lambda p: p.step([1, 3, 1]), E_INVALID, r"sequence id 1 appears twice in one step"),
    ("step mismatched", lambda p: p.step([1, 2], [1, 2, 3]), E_INVALID, r"num_tokens has 3 entries for 2 sequences"),
    ("step too few counts", lambda p: p.step([1, 2, 3], np.array([1])), E_INVALID, r"has 1 entries for 3 sequences"),
    ("step negative count", lambda p: p.step([1, 3], [1, -1]), E_INVALID, r"num_tokens must be >= 0, got -1"),
    ("step negative scalar", lambda p: p.step([1], -3), E_INVALID, r"num_tokens must be >= 0, got -3"),
    ("step negative id", lambda p: p.step([1, -2]), E_INVALID, r"seq_ids must be a non-negative int, got -2"),
    ("step float ids", lambda p: p.step(np.array([1.0, 3.0])), E_INVALID, r"seq_ids must have an integer dtype, got float64"),
    ("step bool ids", lambda p: p.step(np.array([True])), E_INVALID, r"seq_ids must have an integer dtype, got bool"),
    ("step float counts", lambda p: p.step([1], np.array([1.0])), E_INVALID, r"num_tokens must have an integer dtype"),
    ("step bool counts", lambda p: p.step([1], [True]), E_INVALID, r"num_tokens must be an int, got bool"),
    ("step float scalar count", lambda p: p.step([1], 1.0), E_INVALID, r"num_tokens must be an int, got float"),
    ("step 2-D ids", lambda p: p.step(np.array([[1, 3]])), E_INVALID, r"seq_ids must be 1-D, got shape \[1, 2\]"),
    ("step 2-D counts", lambda p: p.step([1, 3], np.ones((2, 1), np.int64)), E_INVALID, r"num_tokens must be 1-D"),
    ("step 0-D ids", lambda p: p.step(np.array(1)), E_INVALID, r"seq_ids must be 1-D, got shape \[\]"),
    ("step scalar ids", lambda p: p.step(1), E_INVALID, r"seq_ids must be an integer array or a sequence of ints"),
    ("step string ids", lambda p: p.step("13"), E_INVALID, r"seq_ids must be a sequence of ints, got a string"),
    ("step list of strings", lambda p: p.step(["1"]), E_INVALID, r"seq_ids must be an int, got str"),
    (
        "step uint64 id > int64",
        lambda p: p.step(np.array([1, 2**63], dtype=np.uint64)),
        E_INVALID,
        r"seq_ids: value 9223372036854775808 does not fit in int64",
    ),
    ("step python id > int64", lambda p: p.step([2**64]), E_INVALID, r"int64 range, got 18446744073709551616"),
    # Sequence 1 alone would fit (1 copy); with sequence 3's 10 blocks the step needs 11.
    ("step exhausted atomically", lambda p: p.step([1, 3], [3, 40]), E_EXHAUSTED, r"requested 11 blocks, 6 free"),
    (
        "step too many at once",
        lambda p: p.step([3, 1], [2**26, 2**26 + 1]),
        E_INVALID,
        r"num_tokens: 134217729 new tokens in one call exceed the limit",
    ),
    ("step broadcast too many", lambda p: p.step([3, 1], 2**26 + 1), E_INVALID, r"134217730 new tokens in one call"),
    # fork
    ("fork unknown parent", lambda p: p.fork(9, 10), E_UNKNOWN, r"unknown sequence id 9"),
    ("fork freed parent", lambda p: p.fork(4, 10), E_UNKNOWN, r"unknown sequence id 4"),
    ("fork duplicate child", lambda p: p.fork(1, 3), E_DUPLICATE, r"sequence id 3 already exists"),
    ("fork onto itself", lambda p: p.fork(1, 1), E_DUPLICATE, r"sequence id 1 already exists"),
    ("fork negative child", lambda p: p.fork(1, -1), E_INVALID, r"child must be a non-negative int, got -1"),
    ("fork float parent", lambda p: p.fork(1.0, 7), E_INVALID, r"parent must be an int, got float"),
    # truncate
    ("truncate beyond length", lambda p: p.truncate(1, 6), E_INVALID, r"cannot truncate 6 tokens from sequence 1 of 5"),
    ("truncate empty", lambda p: p.truncate(3, 1), E_INVALID, r"cannot truncate 1 tokens from sequence 3 of 0"),
    ("truncate absurd", lambda p: p.truncate(1, 2**40), E_INVALID, r"cannot truncate 1099511627776 tokens from sequence 1"),
    ("truncate unknown", lambda p: p.truncate(9, 0), E_UNKNOWN, r"unknown sequence id 9"),
    ("truncate negative", lambda p: p.truncate(1, -1), E_INVALID, r"num_tokens must be >= 0, got -1"),
    # free
    ("free unknown", lambda p: p.free(9), E_UNKNOWN, r"unknown sequence id 9"),
    ("free freed", lambda p: p.free(4), E_UNKNOWN, r"unknown sequence id 4"),
    ("free negative", lambda p: p.free(-1), E_INVALID, r"seq_id must be a non-negative int, got -1"),
    ("free_batch duplicate", lambda p: p.free_batch([1, 2, 1]), E_INVALID, r"sequence id 1 appears twice"),
    ("free_batch one unknown", lambda p: p.free_batch([1, 2, 9]), E_UNKNOWN, r"unknown sequence id 9"),
    ("free_batch float", lambda p: p.free_batch(np.array([1.0])), E_INVALID, r"must have an integer dtype"),
    # queries
    ("seq_len unknown", lambda p: p.seq_len(4), E_UNKNOWN, r"unknown sequence id 4"),
    ("block_table unknown", lambda p: p.block_table(9), E_UNKNOWN, r"unknown sequence id 9"),
    ("blocks_needed unknown", lambda p: p.blocks_needed(9), E_UNKNOWN, r"unknown sequence id 9"),
    ("blocks_needed negative", lambda p: p.blocks_needed(1, -1), E_INVALID, r"num_tokens must be >= 0, got -1"),
    ("refcount out of range", lambda p: p.refcount(8), E_INVALID, r"block 8 is outside the pool of 8 blocks"),
    ("refcount negative", lambda p: p.refcount(-1), E_INVALID, r"block_id -1 is out of range"),
    ("refcount float", lambda p: p.refcount(0.0), E_INVALID, r"block_id must be an int, got float"),
    # exports
    ("block_tables too narrow", lambda p: p.block_tables([3, 1], 1), E_INVALID, r"a table of 2 blocks does not fit in 1 columns"),
    ("block_tables zero width", lambda p: p.block_tables([1], 0), E_INVALID, r"a table of 2 blocks does not fit in 0 columns"),
    ("block_tables negative width", lambda p: p.block_tables([1], -1), E_INVALID, r"max_blocks must be >= 0, got -1"),
    ("block_tables unknown", lambda p: p.block_tables([1, 9], 2**27), E_UNKNOWN, r"unknown sequence id 9"),
    (
        "block_tables absurd width",
        lambda p: p.block_tables([1, 2], 2**40),
        E_INVALID,
        r"a 2 x 1099511627776 table exceeds the limit of 268435456 entries",
    ),
    ("block_tables pad > int32", lambda p: p.block_tables([1], pad=2**31), E_INVALID, r"pad must fit in int32, got 2147483648"),
    ("block_tables float width", lambda p: p.block_tables([1], 2.0), E_INVALID, r"max_blocks must be an int, got float"),
    ("flashinfer unknown", lambda p: p.flashinfer_tables([1, 4]), E_UNKNOWN, r"unknown sequence id 4"),
    ("flashinfer 2-D", lambda p: p.flashinfer_tables(np.array([[1]])), E_INVALID, r"seq_ids must be 1-D"),
]


@pytest.mark.parametrize(("call", "err", "match"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejected_call_changes_nothing(
    pool: kv.BlockPool, call: Call, err: tuple[type[Exception], type[Exception]], match: str
) -> None:
    expect_error(pool, call, err, match)


def test_error_attributes(pool: kv.BlockPool) -> None:
    e = expect_error(pool, lambda p: p.step([1, 3], [3, 40]), E_EXHAUSTED, r"requested 11 blocks, 6 free")
    assert (e.requested, e.free) == (11, 6)
    e = expect_error(pool, lambda p: p.free(4), E_UNKNOWN, r"4")
    assert e.seq_id == 4
    e = expect_error(pool, lambda p: p.fork(1, 2), E_DUPLICATE, r"2")
    assert e.seq_id == 2


def test_exhaustion_by_copy_on_write_alone() -> None:
    """A full pool cannot give a forked sequence its private copy of a shared partial block."""
    p = kv.BlockPool(2, 4)
    p.add_sequence(0, 5)
    p.fork(0, 1)
    e = expect_error(p, lambda q: q.append(1), E_EXHAUSTED, r"requested 1 blocks, 0 free")
    assert (e.requested, e.free) == (1, 0)
    # The parent is in the same position: its last block is shared and partly filled, so
    # even a token that fits in it needs the copy first.
    expect_error(p, lambda q: q.step([0], 1), E_EXHAUSTED, r"requested 1 blocks, 0 free")
    p.free(1)
    slots, cow = p.append(0, 3)  # private again: no copy, no new block
    assert slots.tolist() == [5, 6, 7] and cow.shape == (0, 2)


def test_failed_calls_keep_pool_usable(pool: kv.BlockPool) -> None:
    """After a burst of rejected calls the pool still serves a normal step."""
    for _, call, err, match in CASES:
        expect_error(pool, call, err, match)
    slots, cow, lens = pool.step([1, 2, 3], [1, 1, 4])
    assert lens.tolist() == [6, 6, 4] and cow.shape == (1, 2)
    pool.check_invariants()


# ------------------------------------------------------------- BlockTableBuffer misuse


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 4), r"a 0 x 4 table buffer must be non-empty"),
        ((4, 0), r"a 4 x 0 table buffer must be non-empty"),
        ((2**15, 2**14), r"a 32768 x 16384 table buffer must be non-empty and hold at most 268435456 entries"),
        ((-1, 4), r"max_seqs must be >= 0, got -1"),
        ((4, -1), r"max_blocks must be >= 0, got -1"),
        ((4.0, 4), r"max_seqs must be an int, got float"),
        ((4, 4, 2**31), r"pad must fit in int32, got 2147483648"),
        ((4, 4, 0.5), r"pad must be an int, got float"),
    ],
)
def test_bad_table_buffer_shapes(args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(kv.InvalidArgumentError, match=match) as info:
        kv.BlockTableBuffer(*args)
    assert type(info.value) is kv.InvalidArgumentError and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("ids", "err", "match"),
    [
        ([1, 2, 3], E_INVALID, r"3 sequences do not fit in 2 rows"),
        ([1, 9], E_UNKNOWN, r"unknown sequence id 9"),
        ([3, 4], E_UNKNOWN, r"unknown sequence id 4"),
        (np.array([1.0]), E_INVALID, r"seq_ids must have an integer dtype"),
        ([-1], E_INVALID, r"seq_ids must be a non-negative int, got -1"),
    ],
)
def test_table_buffer_sync_rejects_without_writing(
    pool: kv.BlockPool, ids: Any, err: tuple[type[Exception], type[Exception]], match: str
) -> None:
    buf = kv.BlockTableBuffer(2, 3, pad=-9)
    assert buf.sync(pool, [2, 3]) == 6
    before = buf.array.copy()
    expect_error(pool, lambda p: buf.sync(p, ids), err, match)
    np.testing.assert_array_equal(buf.array, before)
    # The buffer's memory of its rows was not disturbed: nothing left to write.
    assert buf.sync(pool, [2, 3]) == 0
    np.testing.assert_array_equal(buf.array, pool.block_tables([2, 3], 3, pad=-9))


def test_table_buffer_too_narrow(pool: kv.BlockPool) -> None:
    buf = kv.BlockTableBuffer(4, 1)
    before = buf.array.copy()
    expect_error(pool, lambda p: buf.sync(p, [3, 1]), E_INVALID, r"a table of 2 blocks does not fit in 1 columns")
    np.testing.assert_array_equal(buf.array, before)


def test_table_buffer_read_only_array(pool: kv.BlockPool) -> None:
    buf = kv.BlockTableBuffer(2, 4)
    buf.array.flags.writeable = False
    expect_error(pool, lambda p: buf.sync(p, [1]), E_INVALID, r"table buffer array is not writable")
    buf.array.flags.writeable = True
    assert buf.sync(pool, [1]) == 4
    np.testing.assert_array_equal(buf.array[0], pool.block_tables([1], 4)[0])


def test_table_buffer_needs_a_pool(pool: kv.BlockPool) -> None:
    buf = kv.BlockTableBuffer(2, 4)
    with pytest.raises(kv.InvalidArgumentError, match=r"pool must be a BlockPool, got dict"):
        buf.sync({}, [1])  # type: ignore[arg-type]
    with pytest.raises(kv.InvalidArgumentError, match=r"group must be in 0..1 \(this pool has 1 groups\), got 1"):
        buf.sync(pool, [1], group=1)
    hybrid = kv.BlockPool(16, 4, [kv.FullAttention(), kv.SlidingWindow(8)])
    hybrid.add_sequence(1, 5)
    before = buf.array.copy()
    with pytest.raises(kv.InvalidArgumentError, match=r"group must be in 0..2 \(this pool has 2 groups\), got 2"):
        buf.sync(hybrid, [1], group=2)
    with pytest.raises(kv.InvalidArgumentError, match=r"group: this pool has layer groups; pass group="):
        buf.sync(hybrid, [1])
    with pytest.raises(kv.InvalidArgumentError, match=r"group must be"):
        buf.sync(hybrid, [1], group=-1)
    with pytest.raises(kv.InvalidArgumentError, match=r"group must be an int, got str"):
        buf.sync(hybrid, [1], group="0")  # type: ignore[arg-type]
    np.testing.assert_array_equal(buf.array, before)
