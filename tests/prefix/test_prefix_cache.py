"""Prefix caching from Python: the documented key encoding, admission, events, pins,
stats, and every rejected input kind (typed error, state unchanged)."""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import xxhash

import pykvpool as kv
from pykvpool import _native
from isolation import isolated

BS = 4


def cached_pool(num_blocks: int = 16, **kw: Any) -> kv.BlockPool:
    return kv.BlockPool(num_blocks, BS, prefix_caching=True, **kw)


def state(pool: kv.BlockPool) -> Any:
    seqs = [int(s) for s in pool.seq_ids()]
    cache = pool.cache_stats().as_dict() if pool.prefix_caching else None
    return (pool.stats().as_dict(), cache, [(s, pool.block_table(s).tolist(), pool.seq_len(s)) for s in seqs])


def reference_keys(tokens: list[int], extra: int | None = None, bs: int = BS) -> list[int]:
    """The encoding documented in block_hash.rs, written independently (the reference C
    xxHash through the ``xxhash`` package)."""
    seed = int.from_bytes(b"pkvpool1", "little")
    parent, out = 0, []
    for i in range(len(tokens) // bs):
        data = parent.to_bytes(16, "little")
        data += b"\x00" if extra is None else b"\x01" + struct.pack("<Q", extra)
        data += struct.pack(f"<{bs}I", *tokens[i * bs : (i + 1) * bs])
        parent = xxhash.xxh3_128_intdigest(data, seed=seed)
        out.append(parent)
    return out


def as_int(keys: np.ndarray[Any, Any]) -> list[int]:
    return [(int(hi) << 64) | int(lo) for hi, lo in keys.tolist()]


def test_keys_follow_the_documented_encoding_and_are_stable_across_processes() -> None:
    pool = cached_pool()
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    for extra in (None, 0, 2**40 + 7):
        keys = pool.block_keys(np.array(tokens, dtype=np.int32), extra)
        assert keys.dtype == np.uint64 and keys.shape == (2, 2)
        assert as_int(keys) == reference_keys(tokens, extra)
    code = "import pykvpool as kv; print(kv.BlockPool(4, 4, prefix_caching=True).block_keys([3,1,4,1]).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(out) == pool.block_keys([3, 1, 4, 1]).tolist()  # noqa: S307 - our own output


@pytest.mark.parametrize("bs", [1, 16, 64, 100])
def test_keys_match_the_independent_encoding_on_the_long_input_path(bs: int) -> None:
    """Blocks of 17 + 4 * bs bytes: up to 417 bytes, past XXH3's 240-byte short path."""
    pool = kv.BlockPool(4, bs, prefix_caching=True)
    rng = np.random.default_rng(bs)
    tokens = rng.integers(0, 2**32, size=3 * bs + 1, dtype=np.uint64)
    tokens[:2] = [0, 2**32 - 1]
    for extra in (None, 2**63 - 1):
        assert as_int(pool.block_keys(tokens, extra)) == reference_keys(tokens.tolist(), extra, bs)


def test_admission_hits_stats_and_events() -> None:
    pool = cached_pool(record_events=True)
    prompt = np.arange(10, dtype=np.int64)
    cached, slots, cow = pool.add_sequence_tokens(1, prompt)
    assert (cached, len(slots), cow.shape) == (0, 10, (0, 2))
    pool.free(1)
    assert pool.num_free_blocks == 16 and pool.num_used_blocks == 0
    cached, slots, cow = pool.add_sequence_tokens(2, prompt)
    assert cached == 8 and slots.dtype == np.int64 and len(slots) == 2
    table = pool.block_table(2)
    assert slots.tolist() == [table[2] * BS, table[2] * BS + 1]
    s = pool.cache_stats()
    assert (s.queries, s.query_blocks, s.hit_blocks, s.query_tokens, s.hit_tokens) == (2, 4, 2, 20, 8)
    assert s.hit_rate == pytest.approx(0.4) and s.block_hit_rate == pytest.approx(0.5)
    assert s.policy == "lru" and s.as_dict()["hit_tokens"] == 8
    ev = pool.drain_events()
    assert ev["kind"].tolist() == [kv.EVENT_STORED] * 2
    assert ev["kind"].dtype == np.uint8 and ev["key"].dtype == np.uint64 and ev["key"].shape == (2, 2)
    assert as_int(ev["key"]) == reference_keys(list(range(10)))
    assert ev["has_parent"].tolist() == [False, True]
    assert as_int(ev["parent_key"])[1] == as_int(ev["key"])[0]
    assert pool.drain_events()["kind"].size == 0
    pool.free(2)
    assert pool.reset_prefix_cache() == 2
    ev = pool.drain_events()
    assert ev["kind"].tolist() == [kv.EVENT_ALL_CLEARED] and ev["block"].tolist() == [-1]
    pool.check_invariants()


def test_extra_key_separates_tenants() -> None:
    pool = cached_pool()
    pool.add_sequence_tokens(1, list(range(9)), extra_key=5)
    assert pool.add_sequence_tokens(2, list(range(9)))[0] == 0
    assert pool.add_sequence_tokens(3, list(range(9)), extra_key=5)[0] == 8


def test_cow_partial_hit_from_python() -> None:
    pool = cached_pool(cow_partial_hit=True)
    pool.add_sequence_tokens(1, list(range(8)))
    src = int(pool.block_table(1)[1])
    cached, slots, cow = pool.add_sequence_tokens(2, list(range(8)))
    dst = int(pool.block_table(2)[1])
    assert cached == 7 and cow.tolist() == [[src, dst]] and slots.tolist() == [dst * BS + 3]


def test_block_key_forms() -> None:
    pool = kv.BlockPool(16, 512, prefix_caching=True, verify_tokens=False)
    assert pool.add_sequence_block_keys(1, np.array([1, 2, 3], dtype=np.int64), 1100)[0] == 0
    wide = np.array([[0, 1], [0, 2], [0, 9]], dtype=np.uint64)  # the same 64-bit keys as 128-bit
    cached, slots = pool.add_sequence_block_keys(2, wide, 1200)
    assert cached == 1024 and len(slots) == 1200 - 1024
    big = np.array([2**64 - 1], dtype=np.uint64)
    assert pool.add_sequence_block_keys(3, big, 1)[0] == 0
    pool.check_invariants()


def test_pins_expiry_and_clock() -> None:
    pool = cached_pool(num_blocks=3)
    sys_prompt = list(range(8))
    pool.add_sequence_tokens(1, sys_prompt)
    pool.free(1)
    pid = pool.pin_prefix(sys_prompt)
    assert pool.cache_stats().pinned_blocks == 2 and pool.num_free_blocks == 1
    with pytest.raises(kv.PoolExhaustedError) as e:
        pool.add_sequence_tokens(2, list(range(100, 108)))
    assert (e.value.requested, e.value.free) == (2, 1)
    pool.unpin(pid)
    pool.set_clock(10)
    pool.pin_prefix(sys_prompt, expires_at=12)
    pool.set_clock(11)
    assert pool.num_free_blocks == 1
    pool.set_clock(12)
    assert pool.num_free_blocks == 3 and pool.cache_stats().num_pins == 0
    keys = pool.block_keys(sys_prompt)
    pid = pool.pin_block_keys(keys, priority=3)
    assert pool.num_free_blocks == 3, "a soft pin does not reserve"
    pool.unpin(pid)


def test_plain_pool_rejects_cache_calls_and_cache_options() -> None:
    pool = kv.BlockPool(4, BS)
    assert not pool.prefix_caching
    for call in (
        lambda: pool.add_sequence_tokens(1, [1, 2]),
        lambda: pool.cache_stats(),
        lambda: pool.drain_events(),
        lambda: pool.set_clock(1),
        lambda: pool.block_keys([1, 2, 3, 4]),
    ):
        with pytest.raises(kv.InvalidArgumentError):
            call()
    with pytest.raises(kv.InvalidArgumentError, match="prefix_caching=True"):
        kv.BlockPool(4, BS, eviction="lru")
    with pytest.raises(kv.InvalidArgumentError, match="unknown eviction policy"):
        kv.BlockPool(4, BS, prefix_caching=True, eviction="mru")
    for bits in (0, 129):
        with pytest.raises(kv.InvalidArgumentError):
            kv.BlockPool(4, BS, prefix_caching=True, hash_bits=bits)


BAD_CALLS: list[tuple[str, Callable[[kv.BlockPool], object], type[Exception]]] = [
    ("negative token id", lambda p: p.add_sequence_tokens(9, np.array([1, -1], dtype=np.int64)), kv.InvalidArgumentError),
    ("token id past uint32", lambda p: p.add_sequence_tokens(9, np.array([2**32], dtype=np.int64)), kv.InvalidArgumentError),
    ("token id past uint32 (list)", lambda p: p.add_sequence_tokens(9, [1, 2**40]), kv.InvalidArgumentError),
    ("float token ids", lambda p: p.add_sequence_tokens(9, np.array([1.0, 2.0])), kv.InvalidArgumentError),
    ("bool token ids", lambda p: p.add_sequence_tokens(9, np.array([True, False])), kv.InvalidArgumentError),
    ("2-D token ids", lambda p: p.add_sequence_tokens(9, np.zeros((2, 2), dtype=np.int32)), kv.InvalidArgumentError),
    ("string token ids", lambda p: p.add_sequence_tokens(9, "1234"), kv.InvalidArgumentError),
    ("float in token list", lambda p: p.add_sequence_tokens(9, [1, 2.5]), kv.InvalidArgumentError),
    ("negative extra key", lambda p: p.add_sequence_tokens(9, [1, 2], extra_key=-1), kv.InvalidArgumentError),
    ("float extra key", lambda p: p.add_sequence_tokens(9, [1, 2], extra_key=1.5), kv.InvalidArgumentError),  # type: ignore[arg-type]
    ("negative seq id", lambda p: p.add_sequence_tokens(-1, [1, 2]), kv.InvalidArgumentError),
    ("duplicate seq id", lambda p: p.add_sequence_tokens(1, [1, 2]), kv.DuplicateSequenceError),
    ("exhausted", lambda p: p.add_sequence_tokens(9, list(range(200))), kv.PoolExhaustedError),
    ("append to unknown seq", lambda p: p.append_tokens(99, [1]), kv.UnknownSequenceError),
    ("append negative token", lambda p: p.append_tokens(1, [-3]), kv.InvalidArgumentError),
    ("append exhausts", lambda p: p.append_tokens(1, list(range(200))), kv.PoolExhaustedError),
    ("key count != blocks", lambda p: p.add_sequence_block_keys(9, [1, 2], 9), kv.InvalidArgumentError),
    ("negative key", lambda p: p.add_sequence_block_keys(9, np.array([-1], dtype=np.int64), 3), kv.InvalidArgumentError),
    ("keys of 3 columns", lambda p: p.add_sequence_block_keys(9, np.zeros((1, 3), dtype=np.uint64), 3), kv.InvalidArgumentError),
    ("2-D int64 keys", lambda p: p.add_sequence_block_keys(9, np.zeros((1, 2), dtype=np.int64), 3), kv.InvalidArgumentError),
    ("3-D keys", lambda p: p.add_sequence_block_keys(9, np.zeros((1, 2, 1), dtype=np.uint64), 3), kv.InvalidArgumentError),
    ("float keys", lambda p: p.add_sequence_block_keys(9, np.array([1.0]), 3), kv.InvalidArgumentError),
    ("pin of unknown prefix", lambda p: p.pin_prefix(list(range(100, 108))), kv.InvalidArgumentError),
    ("pin of a partly cached prefix", lambda p: p.pin_prefix(list(range(12))), kv.InvalidArgumentError),
    ("pin without a full block", lambda p: p.pin_prefix([0, 1, 2]), kv.InvalidArgumentError),
    ("pin of unknown keys", lambda p: p.pin_block_keys([12345]), kv.InvalidArgumentError),
    ("pin expiring now", lambda p: p.pin_prefix(list(range(8)), expires_at=p.cache_stats().clock), kv.InvalidArgumentError),
    ("negative priority", lambda p: p.pin_prefix(list(range(8)), priority=-1), kv.InvalidArgumentError),
    ("priority past uint32", lambda p: p.pin_prefix(list(range(8)), priority=2**32), kv.InvalidArgumentError),
    ("unpin unknown id", lambda p: p.unpin(424242), kv.InvalidArgumentError),
    ("unpin negative id", lambda p: p.unpin(-1), kv.InvalidArgumentError),
    ("clock going back", lambda p: p.set_clock(0), kv.InvalidArgumentError),
    ("negative clock", lambda p: p.set_clock(-5), kv.InvalidArgumentError),
    ("float clock", lambda p: p.set_clock(3.0), kv.InvalidArgumentError),  # type: ignore[arg-type]
    ("reset while pinned", lambda p: p.reset_prefix_cache(), kv.InvalidArgumentError),
]


@pytest.mark.parametrize("what,call,err", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises_and_changes_nothing(what: str, call: Callable[[kv.BlockPool], object], err: type[Exception]) -> None:
    pool = cached_pool(num_blocks=12)
    pool.add_sequence_tokens(1, list(range(9)))  # 2 cached blocks, live
    pool.add_sequence_tokens(2, list(range(50, 55)))
    pool.free(2)  # 1 idle cached block
    if what == "reset while pinned":
        pool.pin_prefix(list(range(4)))
    before = state(pool)
    with pytest.raises(err):
        call(pool)
    assert state(pool) == before, what
    pool.check_invariants()


def test_every_name_is_exported() -> None:
    assert kv.CacheStats is _native.CacheStats
    assert {"EVENT_STORED", "EVENT_REMOVED", "EVENT_ALL_CLEARED"} <= set(kv.__all__)


@isolated(timeout=180)
def test_two_threads_share_a_caching_pool() -> None:
    import threading

    pool = cached_pool(num_blocks=64)
    system = list(range(16))
    errors: list[BaseException] = []

    def worker(base: int) -> None:
        try:
            for i in range(300):
                seq = base + i
                try:
                    pool.add_sequence_tokens(seq, system + [base + i % 7] * 5)
                except kv.PoolExhaustedError:
                    continue
                pool.append_tokens(seq, [1, 2, 3])
                pool.free(seq)
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(b,)) for b in (0, 10_000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    pool.check_invariants()
    s = pool.cache_stats()
    assert len(pool) == 0 and s.queries <= 600 and s.hit_tokens > 0
    assert pool.num_free_blocks == 64
