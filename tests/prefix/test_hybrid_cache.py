"""The prefix cache of a pool with layer groups is the one prefix cache: pins (hard, soft,
expiring on the logical clock), the priority policy, KV events that name the group, token
verification in every group kind and the shared :class:`CacheStats`.

Expected values come from the contract: a hit of ``h`` blocks needs every block before it
in a full group and only the sinks and window before it in a windowed group
(``needed_blocks`` of the reference model); a full group stores a chain, a windowed group
each block alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from reference.hybrid_model import needed_blocks

import pykvpool as kv

BS = 4
FULL = kv.FullAttention()
WINDOW = kv.SlidingWindow(8)
GROUPS = [FULL, WINDOW]


def tokens(family: int, n: int) -> list[int]:
    return [family * 1000 + i for i in range(n)]


def pinned_blocks(pool: kv.BlockPool, n_blocks: int) -> int:
    """Blocks a hit of ``n_blocks`` needs over every group of ``pool``."""
    return sum(len(needed_blocks(g, n_blocks * pool.block_size, pool.block_size)) for g in pool.groups)


def test_events_name_the_group_and_only_full_groups_chain() -> None:
    pool = kv.BlockPool(12, BS, GROUPS, prefix_caching=True, record_events=True)
    a = tokens(1, 16)
    pool.add_sequence_tokens(1, a)
    ev = pool.drain_events()
    assert ev["kind"].tolist() == [kv.EVENT_STORED] * 8
    assert ev["group"].tolist() == [0] * 4 + [1] * 4
    assert ev["has_parent"].tolist() == [False, True, True, True] + [False] * 4
    # A full block's parent key is the key of the block before it in its chain.
    keys = [tuple(k) for k in ev["key"].tolist()]
    assert [tuple(k) for k in ev["parent_key"][1:4].tolist()] == keys[:3]
    assert keys[:4] == keys[4:], "the same chained keys in every group"
    table = [pool.block_table(1, group=g).tolist() for g in (0, 1)]
    assert ev["block"].tolist() == table[0] + table[1]
    pool.free(1)
    # 4 free blocks: a 24-token prompt (6 + 6 blocks) evicts 8 idle ones.
    pool.add_sequence_tokens(2, tokens(2, 24))
    ev = pool.drain_events()
    removed = ev["kind"] == kv.EVENT_REMOVED
    assert removed.sum() == pool.cache_stats().evictions == 8
    assert sorted(ev["group"][removed].tolist()) == [0] * 4 + [1] * 4
    pool.check_invariants()


def test_full_groups_evict_tails_first() -> None:
    # Only leaves of a full group's chain go: after one eviction the head is still there.
    pool = kv.BlockPool(8, BS, [FULL], prefix_caching=True)
    a = tokens(1, 16)
    pool.add_sequence_tokens(1, a)
    pool.free(1)
    pool.add_sequence(2, 4 * 5)  # 4 free + 1 evicted
    assert pool.cache_stats().evictions == 1
    assert pool.cached_prefix_len(a) == 12, "the tail went, the head stays"


def test_a_hard_pin_keeps_every_group_block_a_hit_needs() -> None:
    pool = kv.BlockPool(20, BS, GROUPS, prefix_caching=True)
    a = tokens(1, 16)
    pool.add_sequence_tokens(1, a)
    pool.free(1)
    assert pool.num_free_blocks == 20
    pin = pool.pin_prefix(a)
    n = pinned_blocks(pool, 4)
    assert n == 4 + 2
    s = pool.cache_stats()
    assert (s.pinned_blocks, s.num_pins, s.evictable_blocks) == (n, 1, 8 - n)
    assert pool.num_free_blocks == 20 - n
    # Take everything an allocation can: the pinned blocks survive it.
    pool.add_sequence(2, BS * (pool.num_free_blocks // 2))
    assert pool.num_free_blocks == 0 and pool.cached_prefix_len(a) == 16
    with pytest.raises(kv.PoolExhaustedError):
        pool.add_sequence(3, BS)
    with pytest.raises(kv.InvalidArgumentError, match="pins"):
        pool.reset_prefix_cache()
    pool.free(2)
    cached, _, _ = pool.add_sequence_tokens(4, a + [7])
    assert cached == 16
    pool.free(4)
    pool.unpin(pin)
    assert pool.num_free_blocks == 20
    with pytest.raises(kv.InvalidArgumentError, match="unknown pin"):
        pool.unpin(pin)
    pool.check_invariants()


def test_a_pin_needs_the_whole_hit_cached() -> None:
    pool = kv.BlockPool(20, BS, GROUPS, prefix_caching=True)
    a = tokens(1, 16)
    pool.add_sequence_tokens(1, a)
    with pytest.raises(kv.InvalidArgumentError, match="not cached"):
        pool.pin_prefix(a + tokens(2, 4))
    with pytest.raises(kv.InvalidArgumentError, match="at least one full block"):
        pool.pin_prefix(a[:3])
    assert pool.cache_stats().num_pins == 0
    with pytest.raises(kv.InvalidArgumentError, match="prefix caching is off"):
        kv.BlockPool(8, BS, GROUPS).pin_prefix(a)


def test_pins_lapse_on_the_logical_clock() -> None:
    pool = kv.BlockPool(20, BS, GROUPS, prefix_caching=True)
    a = tokens(1, 8)
    pool.add_sequence_tokens(1, a)
    now = pool.cache_stats().clock
    pool.pin_prefix(a, expires_at=now + 2)
    pool.add_sequence(2, 1)
    assert pool.cache_stats().num_pins == 1
    pool.free(2)
    assert pool.cache_stats().num_pins == 0
    pool.set_clock(100)
    with pytest.raises(kv.InvalidArgumentError, match="not after the current clock"):
        pool.pin_prefix(a, expires_at=100)
    with pytest.raises(kv.InvalidArgumentError, match="go back"):
        pool.set_clock(99)


def test_soft_pins_order_the_priority_policy() -> None:
    def survivors(pin: bool) -> tuple[int, int]:
        pool = kv.BlockPool(16, BS, GROUPS, prefix_caching=True, eviction="priority")
        a, b = tokens(1, 16), tokens(2, 16)
        pool.add_sequence_tokens(1, a)
        pool.free(1)
        pool.add_sequence_tokens(2, b)
        pool.free(2)  # b used last: under lru alone a goes first
        if pin:
            pool.pin_prefix(a, priority=5)
        pool.add_sequence(3, 4 * 4)  # 8 blocks: 8 of the 16 idle ones go
        pool.check_invariants()
        return pool.cached_prefix_len(a), pool.cached_prefix_len(b)

    # Unpinned, a was used first and goes whole. Pinned (priority 5 on the 6 blocks a hit of
    # a needs), a's two other window blocks go first, then b's least recently used leaves:
    # b keeps the head blocks a hit of one block needs.
    assert survivors(pin=False) == (0, 16)
    assert survivors(pin=True) == (16, 4)


@pytest.mark.parametrize("groups", [[FULL], [WINDOW], [kv.SlidingWindow(8, sink_tokens=4)], GROUPS,
                                    [FULL, kv.ChunkedAttention(8)]],
                         ids=["full", "window", "window+sinks", "full+window", "full+chunked"])
def test_a_key_collision_is_a_miss_in_every_group_kind(groups: list[kv.FullAttention]) -> None:
    # One-bit keys collide at every other block: verification turns each into a miss.
    def hits(verify: bool) -> tuple[list[int], int]:
        pool = kv.BlockPool(400, BS, groups, prefix_caching=True, hash_bits=1, verify_tokens=verify)
        out = []
        for f in range(12):
            t = tokens(f, 16)
            out.append(pool.cached_prefix_len(t))
            pool.add_sequence_tokens(f, t)
        return out, pool.cache_stats().collisions

    got, collisions = hits(verify=True)
    assert got == [0] * 12 and collisions > 0
    # Without verification the same keys hit KV of other tokens: the test can tell.
    wrong, _ = hits(verify=False)
    assert any(w > 0 for w in wrong)


def test_stats_count_hits_per_group() -> None:
    pool = kv.BlockPool(40, BS, GROUPS, prefix_caching=True)
    a = tokens(1, 24)
    pool.add_sequence_tokens(1, a)
    cached, _, _ = pool.add_sequence_tokens(2, a + [5])
    assert cached == 24
    s = pool.cache_stats()
    assert s.group_hit_blocks == [6, 2]  # the full chain; the window's two blocks before 24
    assert (s.queries, s.query_tokens, s.hit_tokens) == (2, 49, 24)
    assert s.as_dict()["group_hit_blocks"] == [6, 2]
    bp = kv.BlockPool(8, BS, prefix_caching=True)
    bp.add_sequence_tokens(1, a[:12])
    bp.add_sequence_tokens(2, a[:12] + [1])
    assert bp.cache_stats().group_hit_blocks == [3]
    assert np.array_equal(bp.drain_events()["group"], np.zeros(0, np.uint32))


def test_the_old_stats_name_is_a_deprecated_alias() -> None:
    with pytest.warns(DeprecationWarning, match="HybridCacheStats is deprecated"):
        assert kv.HybridCacheStats is kv.CacheStats  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        kv.NoSuchName  # type: ignore[attr-defined]  # noqa: B018


@pytest.mark.parametrize(("groups", "exact"), [([WINDOW], 0), ([kv.ChunkedAttention(12)], 12)], ids=["window", "chunked"])
def test_a_windowed_hit_checks_the_whole_prefix_not_only_its_own_blocks(groups: list, exact: int) -> None:
    # Two prompts differ in their first block only, under 8-bit keys that collide there,
    # so every later key is equal too. A hit of 4 blocks uses only the window's blocks 2
    # and 3 (the chunk's block 3), whose own ids are equal: only the prefix before them
    # tells the KV apart. (A chunked group's hit at its chunk start, 12, needs no block.)
    tail = tokens(7, 12) + [1]
    a = tokens(1, 4) + tail

    def pool_with_a(verify: bool) -> kv.BlockPool:
        pool = kv.BlockPool(40, BS, groups, prefix_caching=True, hash_bits=8, verify_tokens=verify)
        pool.add_sequence_tokens(1, a)
        return pool

    probe = pool_with_a(True)
    b = next(p for f in range(2, 3000) if (p := tokens(f, 4) + tail) and probe.block_keys(p)[0].tolist() == probe.block_keys(a)[0].tolist())
    assert probe.block_keys(b).tolist() == probe.block_keys(a).tolist()
    assert probe.cached_prefix_len(a) == 16
    assert probe.cached_prefix_len(b) == exact  # the KV was computed after other tokens
    cached, _, _ = probe.add_sequence_tokens(2, b)
    assert cached == exact and probe.cache_stats().collisions == 1
    probe.check_invariants()
    # b's blocks stand on a prefix whose keys are a's: they are not cached, a's stay.
    probe.free(1)
    probe.free(2)
    assert probe.cached_prefix_len(a) == 16 and probe.cached_prefix_len(b) == exact
    probe.reset_prefix_cache()
    probe.check_invariants()
    # Without verification the same keys hit: the test can tell.
    assert pool_with_a(False).cached_prefix_len(b) == 16


def test_the_lineage_of_windowed_blocks_holds_at_most_32_token_ids_per_pool_token() -> None:
    # A window of 8 tokens over 4 blocks of 4: the sequence grows far past the pool, each
    # block it fills is cached while its prefix fits 32 * 4 * 4 = 512 token ids.
    pool = kv.BlockPool(4, BS, [WINDOW], prefix_caching=True)
    t = list(range(8))
    pool.add_sequence_tokens(1, t)
    seen = {}
    while len(t) < 540:
        more = list(range(len(t), len(t) + BS))
        t += more
        pool.append_tokens(1, more)
        pool.check_invariants()
        seen[len(t)] = pool.cached_prefix_len(t + [1])
    assert seen[508] == 508 and seen[512] == 512
    assert seen[516] == 512 and seen[520] == 512  # blocks past 512 ids are not cached
    assert seen[540] == 0  # and the window of a later hit is no longer there
    pool.free(1)
    pool.reset_prefix_cache()
    pool.check_invariants()
