"""``pykvpool.BlockPool``: layer groups (full, sliding window with sinks, chunked) in one
block space, from Python.

Expected tables, holes and exports come from the layer-group contract through
``tests/reference/hybrid_model.py`` (release rule, logical positions, FlashInfer layout), never from
the implementation; decode attention per group runs over one :class:`KvCache` shared by the
groups (tensor sharing) and is checked against numpy.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from reference.hybrid_model import Model, needed_blocks, releasable, sees
from reference.poolcheck import check_against, snapshot

import pykvpool as kv

FULL = kv.FullAttention()
Kind = kv.FullAttention | kv.SlidingWindow | kv.ChunkedAttention


def gemma(window: int = 8, sinks: int = 0) -> list[Kind]:
    return [FULL, kv.SlidingWindow(window, sink_tokens=sinks)]


def slot_of(pool: kv.BlockPool, seq: int, g: int, p: int) -> int:
    bs = pool.block_size
    b = int(pool.block_table(seq, group=g)[p // bs])
    assert b >= 0, f"position {p} of seq {seq} is in a hole of group {g}"
    return b * bs + p % bs


# ----------------------------------------------------------------------- attention kinds


def test_kinds_are_frozen_values() -> None:
    sw = kv.SlidingWindow(4096, sink_tokens=4)
    assert (sw.window, sw.sink_tokens, sw.window_left, sw.chunk_size) == (4096, 4, 4095, None)
    ch = kv.ChunkedAttention(8192)
    assert (ch.window, ch.sink_tokens, ch.window_left, ch.chunk_size) == (None, 0, None, 8192)
    assert (FULL.window, FULL.sink_tokens, FULL.window_left, FULL.chunk_size) == (None, 0, None, None)
    assert sw == kv.SlidingWindow(4096, 4) and sw != kv.SlidingWindow(4096) and FULL == kv.FullAttention()
    assert FULL != kv.SlidingWindow(1) and kv.ChunkedAttention(4) != kv.SlidingWindow(4)
    assert len({sw, kv.SlidingWindow(4096, sink_tokens=4), FULL, kv.FullAttention(), ch}) == 3
    assert [repr(k) for k in (FULL, kv.SlidingWindow(8), sw, ch)] == [
        "FullAttention()", "SlidingWindow(8)", "SlidingWindow(4096, sink_tokens=4)", "ChunkedAttention(8192)"]
    assert pickle.loads(pickle.dumps([FULL, sw, ch])) == [FULL, sw, ch]
    with pytest.raises(AttributeError):
        sw.window = 3  # type: ignore[misc]


def test_pool_reports_its_groups() -> None:
    groups: list[Kind] = [FULL, kv.SlidingWindow(8, sink_tokens=2), kv.ChunkedAttention(16)]
    pool = kv.BlockPool(32, 4, groups)
    assert pool.groups == tuple(groups) and pool.num_groups == 3
    assert (pool.num_blocks, pool.block_size, pool.num_free_blocks, pool.num_used_blocks) == (32, 4, 32, 0)
    assert not pool.prefix_caching and len(pool) == 0 and 0 not in pool
    assert "SlidingWindow(8, sink_tokens=2)" in repr(pool)


def test_one_class_shapes_follow_the_groups_argument() -> None:
    # Without groups: one full group, results without a group axis, group 0 by default.
    flat = kv.BlockPool(32, 4)
    assert flat.groups == (FULL,) and flat.num_groups == 1 and "groups" not in repr(flat)
    assert flat.add_sequence(1, 6).shape == (6,)
    assert flat.step([1])[0].shape == (1,)
    assert len(flat.flashinfer_tables([1])) == 3
    assert flat.block_table(1).tolist() == flat.block_table(1, group=0).tolist()
    assert flat.stored_ranges(1) == [(0, 7)]
    with pytest.raises(kv.InvalidArgumentError, match=r"group must be in 0..1"):
        flat.block_table(1, group=1)
    # With groups, even one: the group axis, and per-group queries name their group.
    one = kv.BlockPool(32, 4, [FULL])
    assert one.add_sequence(1, 6).shape == (1, 6) and "groups=[FullAttention()]" in repr(one)
    assert len(one.flashinfer_tables([1], group=0)) == 4
    for call in (lambda: one.block_table(1), lambda: one.block_tables([1]), lambda: one.flashinfer_tables([1]),
                 lambda: one.stored_ranges(1)):
        with pytest.raises(kv.InvalidArgumentError, match=r"group: this pool has layer groups; pass group="):
            call()
    with pytest.raises(TypeError):
        one.block_table(1, 0)  # type: ignore[misc]  # group is keyword-only: no silent misreading
    assert one.block_table(1, group=0).tolist() == flat.block_table(1).tolist()
    assert one.stats().group_blocks == flat.stats().group_blocks == [2]


def test_the_old_pool_names_are_deprecated_aliases() -> None:
    with pytest.warns(DeprecationWarning, match="HybridPool is deprecated"):
        old = kv.HybridPool  # type: ignore[attr-defined]
    assert old is kv.BlockPool
    assert old(8, 4, [FULL]).num_groups == 1
    with pytest.warns(DeprecationWarning, match="HybridPoolStats is deprecated"):
        assert kv.HybridPoolStats is kv.PoolStats  # type: ignore[attr-defined]
    assert "HybridPool" not in kv.__all__


# ------------------------------------------------------------------- slots, holes, positions


def test_slots_per_group_follow_each_groups_table() -> None:
    pool = kv.BlockPool(64, 4, [FULL, kv.SlidingWindow(6), kv.ChunkedAttention(8)])
    slots = pool.add_sequence(1, 10)
    assert slots.shape == (3, 10) and slots.dtype == np.int64
    for g in range(3):
        assert slots[g].tolist() == [slot_of(pool, 1, g, p) for p in range(10)]
    # A block belongs to one group: the groups' slots never meet.
    blocks = [set((slots[g] // 4).tolist()) for g in range(3)]
    assert not (blocks[0] & blocks[1] or blocks[0] & blocks[2] or blocks[1] & blocks[2])
    new, cow = pool.append(1, 3)
    assert new.shape == (3, 3) and cow.shape == (0, 2)
    for g in range(3):
        assert new[g].tolist() == [slot_of(pool, 1, g, p) for p in range(10, 13)]


def test_holes_are_exactly_the_released_blocks_and_pad_in_tables() -> None:
    bs, window, sinks = 4, 8, 3
    kind = kv.SlidingWindow(window, sink_tokens=sinks)
    pool = kv.BlockPool(64, bs, [FULL, kind])
    pool.add_sequence(7, 5)
    for _ in range(30):
        pool.step([7])
    length, front = pool.seq_len(7), pool.frontier(7)
    assert (length, front) == (35, 34)
    table = pool.block_table(7, group=1).tolist()
    holes = [i for i, b in enumerate(table) if b == -1]
    assert holes == [i for i in range(len(table)) if releasable(kind, i, bs, front)] == [1, 2, 3, 4, 5]
    assert -1 not in pool.block_table(7, group=0).tolist()
    padded = pool.block_tables([7], max_blocks=12, pad=-5, group=1)[0].tolist()
    assert padded == [-5 if b == -1 else b for b in table] + [-5] * (12 - len(table))
    # What is stored covers every key the next query (at 35) sees: sinks + window.
    assert pool.stored_ranges(7, group=1) == [(0, 4), (24, 35)]
    assert needed_blocks(kind, 35, bs) <= {i for i, b in enumerate(table) if b >= 0}
    assert pool.stored_ranges(7, group=0) == [(0, 35)]


def test_positions_stay_logical_after_release() -> None:
    pool = kv.BlockPool(64, 4, [kv.SlidingWindow(4)])
    pool.add_sequence(1, 3)
    for n in [5, 7, 1, 9]:
        before = pool.seq_len(1)
        slots, _ = pool.append(1, n)
        assert pool.seq_len(1) == before + n and pool.frontier(1) == before
        table = pool.block_table(1, group=0).tolist()
        assert len(table) == -(-(before + n) // 4)
        # Token p of the growth is at logical block p // 4, offset p % 4, whatever was released.
        assert slots[0].tolist() == [table[p // 4] * 4 + p % 4 for p in range(before, before + n)]
    st = pool.stats()
    assert st.logical_tokens == 25 and st.group_stored_tokens[0] < 25 and st.group_holes[0] > 0


def test_memory_of_a_windowed_group_stays_flat() -> None:
    bs, window, sinks = 16, 64, 4
    pool = kv.BlockPool(256, bs, [kv.SlidingWindow(window, sink_tokens=sinks), kv.ChunkedAttention(32)])
    pool.add_sequence(0, 10)
    bound = -(-sinks // bs) + -(-(window - 1) // bs) + 1 + 1  # the spec's bound for n = 1
    held = []
    for _ in range(100 * window):
        pool.step([0])
        held.append(pool.stats().group_blocks[0])
    assert max(held) <= bound and pool.seq_len(0) == 10 + 100 * window
    assert pool.stats().group_blocks[1] <= 32 // bs + 1
    assert pool.num_used_blocks == sum(pool.stats().group_blocks)


# -------------------------------------------------------------------- fork, truncate, CoW


def test_fork_shares_every_group_and_copies_on_write_per_group() -> None:
    pool = kv.BlockPool(64, 4, [FULL, kv.SlidingWindow(5, sink_tokens=1)])
    pool.add_sequence(1, 10)
    for _ in range(8):
        pool.step([1])
    pool.fork(1, 2)
    for g in range(2):
        assert pool.block_table(2, group=g).tolist() == pool.block_table(1, group=g).tolist()
    assert (pool.seq_len(2), pool.frontier(2)) == (pool.seq_len(1), pool.frontier(1)) == (18, 17)
    assert [pool.refcount(b) for b in pool.block_table(1, group=1).tolist() if b >= 0] == [2, 2, 2]
    last = [int(pool.block_table(1, group=g)[-1]) for g in range(2)]  # partly filled (18 % 4 = 2)
    slots, cow, lens = pool.step([2], [1])
    # One copy per group: that group's shared last block to a new block the child now holds.
    assert sorted(map(tuple, cow.tolist())) == sorted(
        (last[g], int(pool.block_table(2, group=g)[-1])) for g in range(2))
    assert lens.tolist() == [19] and pool.stats().cow_copies == 2
    assert [int(pool.block_table(1, group=g)[-1]) for g in range(2)] == last
    assert [pool.refcount(b) for b in last] == [1, 1]
    for g in range(2):
        assert slots[g, 0] == slot_of(pool, 2, g, 18)
    pool.check_invariants()


def test_truncate_rolls_back_within_the_window_only() -> None:
    bs = 4
    kind = kv.SlidingWindow(6, sink_tokens=2)
    pool = kv.BlockPool(64, bs, [FULL, kind])
    pool.add_sequence(1, 4)
    pool.append(1, 20)
    pool.append(1, 1)  # releases blocks the query at 24 no longer sees
    assert pool.frontier(1) == 24
    before = snapshot(pool)
    with pytest.raises(kv.InvalidArgumentError, match="num_tokens"):
        pool.truncate(1, 15)  # the query at 10 needs blocks 1 and 2: released
    assert snapshot(pool) == before
    # Rolling back 3 tokens keeps every block the query at 22 sees.
    assert needed_blocks(kind, 22, bs) <= {i for i, b in enumerate(pool.block_table(1, group=1).tolist()) if b >= 0}
    pool.truncate(1, 3)
    assert (pool.seq_len(1), pool.frontier(1)) == (22, 22)
    assert len(pool.block_table(1, group=0)) == len(pool.block_table(1, group=1)) == 6
    slots, _ = pool.append(1, 2)
    assert slots[1].tolist() == [slot_of(pool, 1, 1, p) for p in (22, 23)]
    pool.check_invariants()


def test_truncate_does_not_roll_back_into_a_block_taken_at_a_hole() -> None:
    """The state machine's shrunk counterexample: ``mark_computed`` at 10 releases positions
    0..7 (chunks of 2, blocks of 4); truncating to 6 is fine (the query at 6 sees only 6), and
    position 6 goes into a fresh block at logical block 1. Truncating to 5 would make the
    query at 5 see position 4, whose KV was released (that block never held it): refused."""
    pool = kv.BlockPool(8, 4, [kv.ChunkedAttention(2)])
    pool.add_sequence(0, 10)
    pool.mark_computed([0])
    pool.truncate(0, 4)
    pool.append(0, 1)
    assert pool.block_table(0, group=0)[1] >= 0
    before = snapshot(pool)
    with pytest.raises(kv.InvalidArgumentError, match="num_tokens"):
        pool.truncate(0, 2)
    assert snapshot(pool) == before


def test_a_block_taken_at_a_hole_is_never_cached() -> None:
    """The same history with prefix caching and token ids: logical block 1, taken at the
    hole when position 6 is written, fills up with 6 and 7 but never held 4 and 5, so it
    is not registered (a hit that needs 4 would read released KV); the same growth
    without the truncation registers its full block."""
    for truncated in (False, True):
        pool = kv.BlockPool(16, 4, [kv.ChunkedAttention(2)], prefix_caching=True, record_events=True)
        toks = list(range(100, 112))
        pool.add_sequence_tokens(0, toks[:10])
        pool.mark_computed([0])
        pool.drain_events()
        if truncated:
            pool.truncate(0, 4)
            pool.append_tokens(0, toks[6:8])
        else:
            pool.append_tokens(0, toks[10:12])
        stored = pool.drain_events()["block"].tolist()
        last = int(pool.block_table(0, group=0)[-1])
        assert stored == ([] if truncated else [last]), truncated


# ------------------------------------------------------------------------------- exports


@pytest.mark.parametrize("kind", [FULL, kv.SlidingWindow(7), kv.SlidingWindow(9, sink_tokens=6),
                                  kv.ChunkedAttention(8), kv.SlidingWindow(1)])
def test_exports_follow_the_spec(kind: Kind) -> None:
    bs = 4
    pool = kv.BlockPool(128, bs, [kind, FULL])
    model = Model([kind, FULL], bs, 128)
    for seq, prompt in [(1, 3), (2, 17), (3, 0)]:
        growth = model.add(seq, prompt)
        model.learn(growth, pool.add_sequence(seq, prompt).tolist(), [])
    for counts in ([1, 1, 1], [5, 0, 2], [1, 9, 4], [3, 3, 3], [1, 1, 1]):
        growth = model.grow(list(zip([1, 2, 3], counts)))
        slots, cow, _ = pool.step([1, 2, 3], counts)
        model.learn(growth, slots.tolist(), [(a, b) for a, b in cow.tolist()])
    check_against(model, pool)  # tables, pad, stored ranges, FlashInfer pages, stats
    if isinstance(kind, kv.FullAttention):
        # A full group's FlashInfer export is BlockPool's: whole tables, page start 0.
        indptr, indices, last, start = pool.flashinfer_tables([1, 2, 3], group=0)
        assert indices.tolist() == sum((pool.block_table(s, group=0).tolist() for s in (1, 2, 3)), [])
        assert start.tolist() == [0, 0, 0]


def test_full_group_export_equals_block_pool() -> None:
    pool, ref = kv.BlockPool(64, 4, [FULL]), kv.BlockPool(64, 4)
    for seq, n in [(1, 5), (2, 9), (3, 0)]:
        assert pool.add_sequence(seq, n)[0].tolist() == ref.add_sequence(seq, n).tolist()
    for counts in ([1, 2, 3], None, [4, 0, 1]):
        a, b = pool.step([1, 2, 3], counts), ref.step([1, 2, 3], counts)
        assert a[0][0].tolist() == b[0].tolist() and a[2].tolist() == b[2].tolist()
    got = pool.flashinfer_tables([3, 1, 2], group=0)
    want = ref.flashinfer_tables([3, 1, 2])
    assert [x.tolist() for x in got[:3]] == [x.tolist() for x in want] and got[3].tolist() == [0, 0, 0]
    assert pool.block_tables([1, 2, 3], group=0).tolist() == ref.block_tables([1, 2, 3]).tolist()


# ------------------------------------------------------------------------ atomic failures


def test_exhaustion_is_atomic_and_counts_released_blocks() -> None:
    pool = kv.BlockPool(10, 4, gemma(window=4))
    pool.add_sequence(1, 8)  # 2 + 2 blocks
    pool.add_sequence(2, 8)
    before = snapshot(pool)
    with pytest.raises(kv.PoolExhaustedError) as info:
        pool.step([1, 2], [4, 5])  # 3 full + 3 window blocks > 2 free + 2 released
    assert info.value.free <= 4 and info.value.requested > info.value.free
    assert snapshot(pool) == before
    with pytest.raises(kv.PoolExhaustedError):
        pool.add_sequence(3, 12)
    with pytest.raises(kv.UnknownSequenceError):
        pool.step([1, 99])
    with pytest.raises(kv.InvalidArgumentError):
        pool.step([1, 1])
    assert snapshot(pool) == before
    # 2 free blocks: each sequence's window group releases block 0 (the query at 8 sees 5..8)
    # and the step reuses it, so 1 full + 1 window block per sequence fit in 2 + 2.
    slots, _, lens = pool.step([1, 2])
    assert lens.tolist() == [9, 9] and pool.num_free_blocks == 0
    assert [pool.block_table(s, group=1).tolist()[0] for s in (1, 2)] == [-1, -1]
    pool.check_invariants()


def test_free_batch_is_atomic() -> None:
    pool = kv.BlockPool(32, 4, gemma())
    pool.add_sequence(1, 5)
    pool.add_sequence(2, 5)
    before = snapshot(pool)
    with pytest.raises(kv.UnknownSequenceError):
        pool.free_batch([1, 7])
    with pytest.raises(kv.InvalidArgumentError, match="seq_ids"):
        pool.free_batch([1, 1])
    assert snapshot(pool) == before
    pool.free_batch([2, 1])
    assert pool.num_free_blocks == 32 and len(pool) == 0


def test_mark_computed_releases_now_atomically_and_idempotently() -> None:
    pool = kv.BlockPool(64, 2, [kv.FullAttention(), kv.SlidingWindow(5, sink_tokens=2)])
    pool.add_sequence(1, 4)
    pool.add_sequence(2, 3)
    pool.append(1, 8)  # length 12, frontier 4: nothing released yet
    assert pool.stored_ranges(1, group=1) == [(0, 12)]
    before = snapshot(pool)
    with pytest.raises(kv.UnknownSequenceError):
        pool.mark_computed([1, 2, 9])
    assert snapshot(pool) == before
    free = pool.num_free_blocks
    pool.mark_computed(np.array([1, 1]))
    # A next query at 12 needs 8..12 and the sinks 0..2: blocks 1, 2, 3 go at once.
    assert pool.stored_ranges(1, group=1) == [(0, 2), (8, 12)]
    assert (pool.frontier(1), pool.num_free_blocks) == (12, free + 3)
    after = snapshot(pool)
    pool.mark_computed([1])
    pool.mark_computed([])
    assert snapshot(pool) == after
    pool.check_invariants()


def test_blocks_needed_counts_all_groups() -> None:
    pool = kv.BlockPool(32, 4, [FULL, kv.SlidingWindow(4), kv.ChunkedAttention(8)])
    pool.add_sequence(1, 6)
    assert pool.blocks_needed(1, 0) == 0
    assert pool.blocks_needed(1, 2) == 0  # fills block 1 in every group
    assert pool.blocks_needed(1, 3) == 3  # one new block per group
    pool.fork(1, 2)
    assert pool.blocks_needed(2, 1) == 3  # the shared partial block, copied in each group
    assert pool.blocks_needed(1, 3) == 6  # the copies and one new block per group
    free = pool.num_free_blocks
    pool.append(1, 3)
    assert free - pool.num_free_blocks == 6


# ----------------------------------------------------------- one KvCache shared by groups


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Reference attention of one query [Hq, D] over keys [n, Hkv, D] in float64."""
    group = q.shape[0] // k.shape[1]
    out = np.empty(q.shape, np.float64)
    for h in range(q.shape[0]):
        s = scale * (k[:, h // group].astype(np.float64) @ q[h].astype(np.float64))
        w = np.exp(s - s.max())
        out[h] = (w / w.sum()) @ v[:, h // group].astype(np.float64)
    return out


def test_tensor_sharing_two_global_two_local_layers_in_one_cache() -> None:
    """Model layers 0-1 are global (group 0), 2-3 local (group 1, window 6 with 2 sinks):
    both groups' layer j live in cache layer j, at their own blocks. Sequences grow past the
    window; each decode step writes every model layer through its group's slots, then decode
    attention per group, over the padded tables and over the FlashInfer tables, must equal
    numpy over the keys the layer's kind sees, taken from the K/V written (not the cache)."""
    bs, hkv, hq, dim, window, sinks = 4, 2, 4, 8, 6, 2
    layers = [(0, 0), (0, 1), (1, 0), (1, 1)]  # model layer -> (group, cache layer)
    kinds: list[Kind] = [FULL, kv.SlidingWindow(window, sink_tokens=sinks)]
    pool = kv.BlockPool(64, bs, kinds)
    cache = kv.KvCache(2, 64, bs, hkv, dim)
    rng = np.random.default_rng(5)
    written: dict[tuple[int, int], tuple[list[np.ndarray], list[np.ndarray]]] = {}
    seqs = {1: 3, 2: 9, 3: 1}

    def write(slots: np.ndarray, seq_pos: list[tuple[int, int]]) -> None:
        for layer, (g, j) in enumerate(layers):
            k = rng.standard_normal((len(seq_pos), hkv, dim)).astype(np.float32)
            v = rng.standard_normal((len(seq_pos), hkv, dim)).astype(np.float32)
            cache.write(j, k, v, slots[g])
            for t, (seq, p) in enumerate(seq_pos):
                ks, vs = written.setdefault((layer, seq), ([], []))
                assert len(ks) == p
                ks.append(k[t])
                vs.append(v[t])

    for seq, n in seqs.items():
        write(pool.add_sequence(seq, n), [(seq, p) for p in range(n)])
    ids = list(seqs)
    scale = dim ** -0.5
    for _ in range(3 * window):
        before = [pool.seq_len(s) for s in ids]
        slots, cow, lens = pool.step(ids)
        assert len(cow) == 0
        write(slots, [(s, p) for s, p in zip(ids, before)])
        q = rng.standard_normal((len(ids), hq, dim)).astype(np.float32)
        for layer, (g, j) in enumerate(layers):
            kind = kinds[g]
            rows = []
            for r, s in enumerate(ids):
                seen = [k for k in range(lens[r]) if sees(kind, lens[r] - 1, k)]
                ks, vs = (np.stack(x)[seen] for x in written[(layer, s)])
                rows.append(_attend(q[r], ks, vs, scale))
            want = np.stack(rows)
            # The cache read through the group's slots holds exactly what was written.
            kc, vc = cache.key(j, writable=False), cache.value(j, writable=False)
            for r, s in enumerate(ids):
                for p in range(lens[r]):
                    if sees(kind, lens[r] - 1, p):
                        b = slot_of(pool, s, g, p)
                        np.testing.assert_array_equal(kc[b // bs, b % bs], written[(layer, s)][0][p])
                        np.testing.assert_array_equal(vc[b // bs, b % bs], written[(layer, s)][1][p])
            got = kv.decode_attention(cache, j, q, pool.block_tables(ids, group=g), lens, scale=scale,
                                      window_left=kind.window_left, sink_tokens=kind.sink_tokens)
            np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
            indptr, indices, last, start = pool.flashinfer_tables(ids, group=g)
            paged = kv.decode_attention_paged(cache, j, q, indptr, indices, last, scale=scale, kv_page_start=start,
                                              window_left=kind.window_left, sink_tokens=kind.sink_tokens)
            np.testing.assert_allclose(paged, want, atol=2e-5, rtol=1e-4)
    held = pool.stats().group_blocks
    assert held[1] <= len(ids) * (-(-sinks // bs) + -(-(window - 1) // bs) + 1) < held[0]
    pool.check_invariants()



# ------------------------------------------------------------------------ prefix caching


def test_a_hit_holds_the_window_before_it_and_holes_elsewhere() -> None:
    bs, window = 4, 8
    pool = kv.BlockPool(64, bs, [FULL, kv.SlidingWindow(window)], prefix_caching=True)
    tokens = list(range(40))
    assert pool.add_sequence_tokens(1, tokens)[0] == 0
    pool.free(1)
    assert pool.cached_prefix_len(tokens) == 40  # every full block is cached
    cached, slots, _ = pool.add_sequence_tokens(2, tokens)  # <= 39 tokens: one prompt token computed
    assert cached == 36 and slots.shape == (2, 4) and pool.frontier(2) == 36 and pool.seq_len(2) == 40
    # Full attention needs the whole prefix, the window group only blocks 29 // 4 .. 9.
    assert -1 not in pool.block_table(2, group=0).tolist()
    assert [i for i, b in enumerate(pool.block_table(2, group=1).tolist()) if b >= 0] == [7, 8, 9]
    for g in range(2):
        assert slots[g].tolist() == [slot_of(pool, 2, g, p) for p in range(36, 40)]
    st = pool.cache_stats()
    assert (st.queries, st.query_tokens, st.hit_tokens, st.group_hit_blocks) == (2, 80, 36, [9, 2])
    assert st.hit_rate == pytest.approx(36 / 80) and st.as_dict()["group_hit_blocks"] == [9, 2]
    pool.check_invariants()


def test_blocks_released_by_the_window_stay_cached_for_a_later_hit() -> None:
    pool = kv.BlockPool(64, 4, [kv.SlidingWindow(8)], prefix_caching=True)
    tokens = list(range(40))
    pool.add_sequence_tokens(1, tokens)
    pool.append_tokens(1, list(range(100, 120)))
    table = pool.block_table(1, group=0).tolist()
    assert table[:8] == [-1] * 8  # released by the window rule ...
    assert pool.cache_stats().idle_blocks == 8  # ... kept cached, idle
    free = pool.num_free_blocks
    cached, _, _ = pool.add_sequence_tokens(2, tokens)
    assert cached == 36 and pool.cache_stats().group_hit_blocks == [2]
    assert pool.num_free_blocks == free - 2  # revived block 7, one new block for 36..40
    pool.check_invariants()


@pytest.mark.parametrize("policy,survivor", [("lru", "B"), ("fifo", "B"), ("lfu", "A"), (None, "B")])
def test_eviction_policy_decides_which_idle_block_goes(policy: str | None, survivor: str) -> None:
    # Full blocks A and B stored in that order; A then taken by two hits, B by one after
    # them, each released in turn. One allocation then evicts one of them: least recently
    # used (A), earliest stored (A) or least often hit (B); the default is LRU.
    extra = {} if policy is None else {"eviction": policy}
    pool = kv.BlockPool(3, 4, [FULL], prefix_caching=True, **extra)
    prompts = {"A": [1, 2, 3, 4, 9], "B": [5, 6, 7, 8, 9]}
    sid = iter(range(100))
    for name in ("A", "B", "A", "A", "B"):
        seq = next(sid)
        pool.add_sequence_tokens(seq, prompts[name])
        pool.free(seq)
    assert pool.cache_stats().idle_blocks == 2 and pool.num_free_blocks == 3
    pool.add_sequence(next(sid), 8)  # two blocks: the never-cached one, then one eviction
    cached = {name: pool.cached_prefix_len(p) for name, p in prompts.items()}
    assert cached == {n: 4 if n == survivor else 0 for n in prompts}
    assert pool.cache_stats().evictions == 1
    pool.check_invariants()


def test_reset_prefix_cache_forgets_every_group_and_keeps_live_sequences() -> None:
    pool = kv.BlockPool(64, 4, gemma(window=8), prefix_caching=True)
    tokens = list(range(40))
    pool.add_sequence_tokens(1, tokens)
    pool.add_sequence_tokens(2, tokens[:20] + [99] * 4)
    pool.free(2)
    before = pool.cache_stats()
    assert before.idle_blocks > 0 and before.cached_blocks > before.idle_blocks
    free, table = pool.num_free_blocks, pool.block_table(1, group=0).tolist()
    assert pool.reset_prefix_cache() == before.cached_blocks
    after = pool.cache_stats()
    assert (after.cached_blocks, after.idle_blocks, after.evictions) == (0, 0, before.evictions)
    assert pool.num_free_blocks == free  # idle blocks counted as free before, free now
    assert pool.block_table(1, group=0).tolist() == table and pool.cached_prefix_len(tokens) == 0
    cached, _, _ = pool.add_sequence_tokens(3, tokens)
    assert cached == 0
    pool.check_invariants()
    with pytest.raises(kv.InvalidArgumentError):
        kv.BlockPool(8, 4, [FULL]).reset_prefix_cache()


def test_cache_options_need_prefix_caching() -> None:
    for opts in ({"eviction": "lru"}, {"verify_tokens": True}, {"record_events": True}, {"hash_bits": 64}):
        with pytest.raises(kv.InvalidArgumentError, match="need prefix_caching=True"):
            kv.BlockPool(8, 4, [FULL], **opts)
    assert kv.BlockPool(8, 4, [FULL], prefix_caching=True, eviction="priority").cache_stats().policy == "priority"


def test_prefix_methods_need_caching() -> None:
    pool = kv.BlockPool(16, 4, gemma())
    for call in (lambda: pool.add_sequence_tokens(1, [1, 2]), lambda: pool.cached_prefix_len([1]),
                 lambda: pool.cache_stats(), lambda: pool.add_sequence_block_keys(1, [5], 3)):
        with pytest.raises(kv.InvalidArgumentError):
            call()
    assert len(pool) == 0 and pool.num_free_blocks == 16


def test_cached_prefix_len_means_the_same_number_as_block_pools() -> None:
    # Both pools report the cached full blocks before admission's last-token rule.
    bs = 4
    hybrid = kv.BlockPool(64, bs, [FULL], prefix_caching=True)
    plain = kv.BlockPool(64, bs, prefix_caching=True)
    tokens = list(range(16))
    for pool in (hybrid, plain):
        pool.add_sequence_tokens(1, tokens)
        pool.free(1)
    for probe in (tokens, tokens[:15], tokens[:8], tokens + [99], [7] * 16):
        assert hybrid.cached_prefix_len(probe) == plain.cached_prefix_len(probe), probe
    assert hybrid.cached_prefix_len(tokens) == 16
    assert hybrid.add_sequence_tokens(2, tokens)[0] == plain.add_sequence_tokens(2, tokens)[0] == 12
