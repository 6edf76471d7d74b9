"""Helpers shared by the pool tests (not a test module)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

import pykvpool as kv


def snapshot(pool: kv.BlockPool) -> tuple[Any, ...]:
    """Everything observable about a pool: statistics, live ids, every table, every
    length and every block's refcount. Two equal snapshots mean an unchanged pool."""
    ids = [int(s) for s in pool.seq_ids()]
    return (
        pool.stats().as_dict(),
        ids,
        [pool.block_table(s).tolist() for s in ids],
        [pool.seq_len(s) for s in ids],
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


def hybrid_snapshot(pool: kv.BlockPool) -> tuple[Any, ...]:
    """:func:`snapshot` for a :class:`BlockPool`: statistics, live ids, every group's table
    (holes as -1), stored ranges, lengths, frontiers and every block's refcount."""
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
