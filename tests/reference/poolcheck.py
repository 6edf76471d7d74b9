"""Helpers shared by the pool tests (not a test module): snapshots, storage digests, and the
comparison of a pool with the spec model of ``reference/hybrid_model.py``."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from reference.hybrid_model import Model

import pykvpool as kv


def snapshot(pool: kv.BlockPool) -> tuple[Any, ...]:
    """Everything observable about a pool (with or without groups): statistics, live ids,
    every group's table (holes as -1), stored ranges, lengths, frontiers and every block's
    refcount. Two equal snapshots mean an unchanged pool."""
    ids = [int(s) for s in pool.seq_ids()]
    groups = range(pool.num_groups)
    return (
        pool.stats().as_dict(),
        ids,
        [[pool.block_table(s, group=g).tolist() for g in groups] for s in ids],
        [[pool.stored_ranges(s, group=g) for g in groups] for s in ids],
        [(pool.seq_len(s), pool.frontier(s)) for s in ids],
        [pool.refcount(b) for b in range(pool.num_blocks)],
    )



def checksum(cache: kv.KvCache) -> str:
    """A digest of every K and V byte of ``cache``: equal digests mean unchanged storage."""
    h = hashlib.sha256()
    for layer in range(cache.num_layers):
        for view in (cache.key(layer), cache.value(layer)):
            h.update(np.ascontiguousarray(view).view(np.uint8).tobytes())
    return h.hexdigest()


def table_slots(pool: kv.BlockPool, seq: int) -> list[int]:
    """The slot of every token of ``seq``, computed from its block table."""
    bs = pool.block_size
    table = pool.block_table(seq).tolist()
    return [table[t // bs] * bs + t % bs for t in range(pool.seq_len(seq))]


Tables = dict[tuple[int, int], list[int]]


def check_against(model: Model, pool: kv.BlockPool) -> Tables:
    """Everything observable about ``pool`` equals the model, through the per-group queries as
    the pool's layout takes them (``group=`` with groups, without it otherwise); returns the
    pool's tables by ``(seq, group)``."""
    groups = range(len(model.groups))
    kw = [{"group": g} if model.grouped else {} for g in groups]
    ids = sorted(model.seqs)
    assert pool.seq_ids().tolist() == ids
    assert pool.num_seqs == len(ids) == len(pool)
    tables: Tables = {}
    for seq in ids:
        s = model.seqs[seq]
        assert (pool.seq_len(seq), pool.frontier(seq)) == (s.length, s.frontier), seq
        for g in groups:
            tables[seq, g] = pool.block_table(seq, **kw[g]).tolist()
            assert tables[seq, g] == model.table(seq, g), (seq, g)
            assert pool.stored_ranges(seq, **kw[g]) == model.stored_ranges(seq, g), (seq, g)
    refs = model.refs()
    by_phys = {model.phys[m]: c for m, c in refs.items()}
    assert [pool.refcount(b) for b in range(model.num_blocks)] == [by_phys.get(b, 0) for b in range(model.num_blocks)]
    assert (pool.num_used_blocks, pool.num_free_blocks) == (len(refs), model.num_blocks - len(refs))
    assert pool.stats().as_dict() == model.stats()
    for g in groups:
        width = max((len(tables[s, g]) for s in ids), default=0)
        want = [tables[s, g] + [-1] * (width - len(tables[s, g])) for s in ids]
        assert pool.block_tables(ids, **kw[g]).tolist() == (want if ids else [])
        if ids:
            padded = [[-9 if b == -1 else b for b in row] + [-9] for row in want]
            assert pool.block_tables(ids, width + 1, pad=-9, **kw[g]).tolist() == padded
            check_flashinfer(model, pool, ids, g, tables)
    pool.check_invariants()
    return tables


def check_flashinfer(model: Model, pool: kv.BlockPool, ids: list[int], g: int, tables: Tables) -> None:
    """The FlashInfer export of group ``g``, rebuilt page by page from the spec's formula and
    ``tables`` (the model's, by ``(seq, group)``)."""
    bs, kind = model.bs, model.groups[g]
    if model.grouped:
        indptr, indices, last, start = (a.tolist() for a in pool.flashinfer_tables(ids, group=g))
    else:  # three arrays, without kv_page_start (a full group's is 0)
        indptr, indices, last = (a.tolist() for a in pool.flashinfer_tables(ids))
        start = [0] * len(ids)
    assert indptr[0] == 0 and len(indptr) == len(ids) + 1
    for r, seq in enumerate(ids):
        table = tables[seq, g]
        pages = indices[indptr[r] : indptr[r + 1]]
        stored = [b for b in table if b != -1]
        assert pages == stored, (seq, g)  # stored pages in logical order
        sink_pages = min(-(-kind.sink_tokens // bs), start[r])
        logical = [j if j < sink_pages else start[r] + (j - sink_pages) for j in range(len(pages))]
        assert [table[i] for i in logical] == pages, (seq, g, start[r])
        length = model.seqs[seq].length
        # FlashInfer's last page length: the tokens of the last page. That page is the last
        # logical block except when a table ends in holes (a window of one token or a chunk
        # boundary, after a truncation).
        assert last[r] == (0 if not pages else min(bs, length - logical[-1] * bs)), (seq, g)
        if isinstance(kind, kv.FullAttention):
            assert start[r] == 0
