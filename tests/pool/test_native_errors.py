"""Every argument of the native API against the usual wrong inputs, table-driven.

The rule (the stub's module docstring): an argument that is an int, a float or an array
of ints or floats raises :class:`InvalidArgumentError` naming the argument for anything
wrong, type or value (a bool, a float where an int is meant, ``2**64``, ``-1``, an absurd
count, a wrong-dimension or ragged array, a string); a flag, a name or an object argument
(``prefix_caching``, ``eviction``, ``dtype``, ``q_dtype``, ``tuning``, ``return_lse``, ``cache``)
raises ``TypeError`` for a wrong type, as PyO3 does, and InvalidArgumentError for a bad
value. Either way nothing changes: two pools (one with a prefix cache), a KV cache (K/V
checksum) and a table buffer are compared before and after every call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
from reference.poolcheck import checksum, snapshot

import pykvpool as kv


@dataclass
class World:
    pool: kv.BlockPool
    ppool: kv.BlockPool
    cache: kv.KvCache
    fcache: kv.KvCache
    buf: kv.BlockTableBuffer
    q: np.ndarray
    hpool: kv.BlockPool
    hppool: kv.BlockPool


def world() -> World:
    pool = kv.BlockPool(16, 4)
    pool.add_sequence(1, 5)
    pool.fork(1, 2)
    pool.add_sequence(3)
    ppool = kv.BlockPool(16, 4, prefix_caching=True, record_events=True)
    ppool.add_sequence_tokens(1, list(range(10)))
    ppool.pin_prefix(list(range(8)))
    cache = kv.KvCache(2, 8, 4, 2, 8)
    rng = np.random.default_rng(0)
    for layer in range(2):
        x = rng.standard_normal((32, 2, 8)).astype(np.float32)
        cache.write(layer, x, -x, np.arange(32))
    fcache = kv.KvCache(2, 8, 4, 2, 8, "fp8_e4m3")
    fcache.write(0, np.ones((3, 2, 8), np.float32), -np.ones((3, 2, 8), np.float32), [0, 1, 5])
    buf = kv.BlockTableBuffer(4, 8)
    buf.sync(pool, [1, 2])
    # Seq 3 has released blocks in its sliding-window group: truncating it back is refused.
    hpool = kv.BlockPool(64, 4, [kv.FullAttention(), kv.SlidingWindow(4, sink_tokens=2), kv.ChunkedAttention(8)])
    hpool.add_sequence(1, 5)
    hpool.fork(1, 2)
    hpool.add_sequence(3, 19)
    hpool.append(3)
    hppool = kv.BlockPool(16, 4, GROUPS, prefix_caching=True)
    hppool.add_sequence_tokens(1, list(range(10)))
    return World(pool, ppool, cache, fcache, buf, np.ones((1, 4, 8), np.float32), hpool, hppool)


def state(w: World) -> tuple[Any, ...]:
    fp8 = [a.tobytes() for layer in range(2) for a in (*w.fcache.dequantized(layer), w.fcache.key_scales(layer))]
    return (snapshot(w.pool), snapshot(w.ppool), w.ppool.cache_stats().as_dict(), checksum(w.cache), fp8,
            w.buf.array.tolist(), w.q.tolist(), snapshot(w.hpool),
            snapshot(w.hppool), w.hppool.cache_stats().as_dict())


Call = Callable[[World, Any], Any]


def block_rows(w: World, kind: str) -> np.ndarray:
    """Bytes for ``import_blocks`` of ``w.cache``: one right row (``"ok"``: the call fails
    on its other argument), or rows for two blocks wrong in one way."""
    row = w.cache.export_blocks([0]).shape[1]
    arrays = {"ok": np.zeros((1, row), np.uint8), "short": np.zeros((2, row - 1), np.uint8),
              "long": np.zeros((3, row), np.uint8), "strided": np.zeros((2, 2 * row), np.uint8)[:, ::2],
              "flat": np.zeros(2 * row, np.uint8)}
    return arrays[kind]

# Wrong for every int argument; None too where the argument is required.
NOT_INT: list[Any] = [True, np.bool_(False), 1.5, np.float64(2.0), "3", b"3", 2**64, -(2**64)]
INT_BAD = NOT_INT + [[1]]
REQUIRED = [None]
NEG = [-1]
# Wrong for every 1-D int array argument.
ARRAY_BAD: list[Any] = [np.zeros((2, 2), np.int64), [[1, 2], [3]], "12", 1.5, [1.5], [True], [None],
                        np.array([1.5, 2.0]), np.array([True]), [2**64]]
# Wrong for every 2-D int array argument.
MATRIX_BAD: list[Any] = [[[1, 2], [3]], np.zeros((1, 1, 1), np.int64), "ab", 5, [[1.5, 2]], [[True, 1]],
                         np.array([[1.5, 2.0]]), [[2**64, 0]], [[None, 1]]]
# Wrong for every float32 array argument shaped like q [1, 4, 8].
F32_BAD: list[Any] = [np.ones((1, 4, 8), np.float64), np.ones((1, 4, 8), np.float16), np.ones((4, 8), np.float32),
                      np.ones((1, 4, 8, 1), np.float32), np.ones((1, 4, 8)).tolist(), "q", 1.5, None]
KV_BAD: list[Any] = [np.ones((2, 2, 8), np.float64), np.ones((2, 3, 8), np.float32), np.ones((2, 2, 8)).tolist(),
                     "k", np.ones((2, 16, 1), np.float32)]

K = np.ones((2, 2, 8), np.float32)
S = np.ones(2, np.float32)
# Wrong for every fp8 scale argument ([num_kv_heads] = [2] float32, finite, >= 0).
SCALE_BAD: list[Any] = [np.ones(2, np.float64), np.ones(3, np.float32), np.ones((2, 1), np.float32), [1.0, 1.0], "s",
                        None, np.array([1, -1], np.float32), np.array([np.nan, 1], np.float32),
                        np.array([1, np.inf], np.float32)]
GROUPS = [kv.FullAttention(), kv.SlidingWindow(8)]
Q_ARGS = ([[0, 1]], [5])
P_ARGS = ([0, 1], [[0, 1]], [5])

INVALID: list[tuple[str, str, Call, list[Any]]] = [
    # (row, argument name, call, bad values)
    ("BlockPool", "num_blocks", lambda w, x: kv.BlockPool(x, 4), INT_BAD + REQUIRED + NEG + [0, 2**40]),
    ("BlockPool", "block_size", lambda w, x: kv.BlockPool(16, x), INT_BAD + REQUIRED + NEG + [0, 2**40]),
    ("BlockPool", "hash_bits", lambda w, x: kv.BlockPool(16, 4, prefix_caching=True, hash_bits=x),
     INT_BAD + NEG + [0, 129, 2**40]),
    ("BlockPool", "eviction", lambda w, x: kv.BlockPool(16, 4, prefix_caching=True, eviction=x), ["nope", ""]),
    ("BlockPool", "eviction", lambda w, x: kv.BlockPool(16, 4, GROUPS, prefix_caching=True, eviction=x),
     ["nope", ""]),
    ("add_sequence", "seq_id", lambda w, x: w.pool.add_sequence(x, 1), INT_BAD + REQUIRED + NEG),
    ("add_sequence", "prompt_len", lambda w, x: w.pool.add_sequence(9, x), INT_BAD + NEG + [2**40]),
    ("append", "seq_id", lambda w, x: w.pool.append(x), INT_BAD + REQUIRED + NEG),
    ("append", "num_tokens", lambda w, x: w.pool.append(1, x), INT_BAD + NEG + [2**40]),
    ("step", "seq_ids", lambda w, x: w.pool.step(x), ARRAY_BAD + [[-1], None]),
    ("step", "num_tokens", lambda w, x: w.pool.step([1], x), NOT_INT + NEG + [2**40, [1.5], [1, 1]]),
    ("fork", "parent", lambda w, x: w.pool.fork(x, 9), INT_BAD + REQUIRED + NEG),
    ("fork", "child", lambda w, x: w.pool.fork(1, x), INT_BAD + REQUIRED + NEG),
    ("truncate", "num_tokens", lambda w, x: w.pool.truncate(1, x), INT_BAD + REQUIRED + NEG + [6, 2**62]),
    ("rewind", "seq_id", lambda w, x: w.pool.rewind(x, 1), INT_BAD + REQUIRED + NEG),
    ("rewind", "num_tokens", lambda w, x: w.pool.rewind(1, x), INT_BAD + REQUIRED + NEG + [6, 2**62]),
    ("free", "seq_id", lambda w, x: w.pool.free(x), INT_BAD + REQUIRED + NEG),
    ("free_batch", "seq_ids", lambda w, x: w.pool.free_batch(x), ARRAY_BAD + [[-1], None]),
    ("blocks_needed", "num_tokens", lambda w, x: w.pool.blocks_needed(1, x), INT_BAD + REQUIRED + NEG + [2**62]),
    ("blocks_for_tokens", "num_tokens", lambda w, x: w.pool.blocks_for_tokens(x), INT_BAD + REQUIRED + NEG),
    ("seq_len", "seq_id", lambda w, x: w.pool.seq_len(x), INT_BAD + REQUIRED + NEG),
    ("block_table", "seq_id", lambda w, x: w.pool.block_table(x), INT_BAD + REQUIRED + NEG),
    ("refcount", "block_id", lambda w, x: w.pool.refcount(x), INT_BAD + REQUIRED + NEG + [16, 2**40]),
    ("block_tables", "seq_ids", lambda w, x: w.pool.block_tables(x), ARRAY_BAD + [[-1], None]),
    ("block_tables", "max_blocks", lambda w, x: w.pool.block_tables([1], x), INT_BAD + NEG + [1, 2**40]),
    ("block_tables", "pad", lambda w, x: w.pool.block_tables([1], 4, x), INT_BAD + REQUIRED + [2**31]),
    ("flashinfer_tables", "seq_ids", lambda w, x: w.pool.flashinfer_tables(x), ARRAY_BAD + [[-1], None]),
    ("BlockTableBuffer", "max_seqs", lambda w, x: kv.BlockTableBuffer(x, 4), INT_BAD + REQUIRED + NEG + [0, 2**40]),
    ("BlockTableBuffer", "max_blocks", lambda w, x: kv.BlockTableBuffer(4, x), INT_BAD + REQUIRED + NEG + [2**40]),
    ("BlockTableBuffer", "pad", lambda w, x: kv.BlockTableBuffer(4, 4, x), INT_BAD + REQUIRED + [2**31]),
    ("BlockTableBuffer.sync", "pool", lambda w, x: w.buf.sync(x, [1]), [1, None, "pool"]),
    ("BlockTableBuffer.sync", "seq_ids", lambda w, x: w.buf.sync(w.pool, x), ARRAY_BAD + [[-1], None]),
    ("add_sequence_tokens", "token_ids", lambda w, x: w.ppool.add_sequence_tokens(9, x),
     ARRAY_BAD + [[-1], [2**32], None]),
    ("add_sequence_tokens", "extra_key", lambda w, x: w.ppool.add_sequence_tokens(9, [1], x), INT_BAD + NEG),
    ("add_sequence_block_keys", "block_keys", lambda w, x: w.ppool.add_sequence_block_keys(9, x, 4),
     ARRAY_BAD + [[-1], np.zeros((1, 3), np.uint64), None]),
    ("add_sequence_block_keys", "prompt_len", lambda w, x: w.ppool.add_sequence_block_keys(9, [1], x),
     INT_BAD + REQUIRED + NEG + [2**40]),
    ("append_tokens", "token_ids", lambda w, x: w.ppool.append_tokens(1, x), ARRAY_BAD + [[-1], [2**32], None]),
    ("add_sequence_hit", "token_ids", lambda w, x: w.ppool.add_sequence_hit(9, x), ARRAY_BAD + [[-1], [2**32], None]),
    ("add_sequence_hit", "extra_key", lambda w, x: w.ppool.add_sequence_hit(9, [1], x), INT_BAD + NEG),
    ("store_tokens", "token_ids", lambda w, x: w.ppool.store_tokens(1, x), ARRAY_BAD + [[-1], [2**32], None]),
    ("block_keys", "token_ids", lambda w, x: w.ppool.block_keys(x), ARRAY_BAD + [[-1], None]),
    ("cached_prefix_len", "token_ids", lambda w, x: w.ppool.cached_prefix_len(x), ARRAY_BAD + [[-1], None]),
    ("pin_prefix", "token_ids", lambda w, x: w.ppool.pin_prefix(x), ARRAY_BAD + [[-1], None]),
    ("pin_prefix", "priority", lambda w, x: w.ppool.pin_prefix([1, 2, 3, 4], priority=x), INT_BAD + NEG + [2**32]),
    ("pin_prefix", "expires_at", lambda w, x: w.ppool.pin_prefix([1, 2, 3, 4], expires_at=x), INT_BAD + NEG),
    ("pin_block_keys", "block_keys", lambda w, x: w.ppool.pin_block_keys(x), ARRAY_BAD + [[-1], None]),
    ("unpin", "pin_id", lambda w, x: w.ppool.unpin(x), INT_BAD + REQUIRED + NEG),
    ("set_tier_costs", "load_ns_per_block", lambda w, x: w.ppool.set_tier_costs(x, 1), ARRAY_BAD + [[-1], None]),
    ("set_tier_costs", "recompute_ns_per_token", lambda w, x: w.ppool.set_tier_costs([1], x),
     INT_BAD + REQUIRED + NEG),
    ("set_clock", "t", lambda w, x: w.ppool.set_clock(x), INT_BAD + REQUIRED + NEG),
    ("probe_tier_loads", "blocks", lambda w, x: w.ppool.probe_tier_loads(x), INT_BAD + REQUIRED + NEG + [0]),
    ("attach_tier_storage", "transfer_threads",
     lambda w, x: w.ppool.attach_tier_storage(w.cache, transfer_threads=x), INT_BAD + REQUIRED + NEG),
    ("SlidingWindow", "window", lambda w, x: kv.SlidingWindow(x), INT_BAD + REQUIRED + NEG + [0, 2**31]),
    ("SlidingWindow", "sink_tokens", lambda w, x: kv.SlidingWindow(4, x), INT_BAD + NEG + [2**31]),
    ("ChunkedAttention", "chunk_size", lambda w, x: kv.ChunkedAttention(x), INT_BAD + REQUIRED + NEG + [0, 2**31]),
    ("BlockPool", "num_blocks", lambda w, x: kv.BlockPool(x, 4, GROUPS), INT_BAD + REQUIRED + NEG + [0, 2**40]),
    ("BlockPool", "block_size", lambda w, x: kv.BlockPool(16, x, GROUPS), INT_BAD + REQUIRED + NEG + [0, 2**40]),
    ("BlockPool", "groups", lambda w, x: kv.BlockPool(16, 4, x), [[], (), [kv.FullAttention()] * 65]),
    ("BlockPool.add_sequence", "seq_id", lambda w, x: w.hpool.add_sequence(x, 1), INT_BAD + REQUIRED + NEG),
    ("BlockPool.add_sequence", "prompt_len", lambda w, x: w.hpool.add_sequence(9, x), INT_BAD + NEG + [2**40]),
    ("BlockPool.append", "seq_id", lambda w, x: w.hpool.append(x), INT_BAD + REQUIRED + NEG),
    ("BlockPool.append", "num_tokens", lambda w, x: w.hpool.append(1, x), INT_BAD + NEG + [2**40]),
    ("BlockPool.step", "seq_ids", lambda w, x: w.hpool.step(x), ARRAY_BAD + [[-1], [1, 1], None]),
    ("BlockPool.step", "num_tokens", lambda w, x: w.hpool.step([1], x), NOT_INT + NEG + [2**40, [1.5], [1, 1]]),
    ("BlockPool.fork", "parent", lambda w, x: w.hpool.fork(x, 9), INT_BAD + REQUIRED + NEG),
    ("BlockPool.fork", "child", lambda w, x: w.hpool.fork(1, x), INT_BAD + REQUIRED + NEG),
    ("BlockPool.truncate", "seq_id", lambda w, x: w.hpool.truncate(x, 1), INT_BAD + REQUIRED + NEG),
    ("BlockPool.truncate", "num_tokens", lambda w, x: w.hpool.truncate(1, x), INT_BAD + REQUIRED + NEG + [6, 2**62]),
    # Past the window: group 1 released logical block 1, which a query at 20 - 15 = 5 sees.
    ("BlockPool.truncate", "num_tokens", lambda w, x: w.hpool.truncate(3, x), [15, 19]),
    ("BlockPool.rewind", "num_tokens", lambda w, x: w.hpool.rewind(1, x), INT_BAD + REQUIRED + NEG + [6, 2**62]),
    ("BlockPool.free", "seq_id", lambda w, x: w.hpool.free(x), INT_BAD + REQUIRED + NEG),
    ("BlockPool.free_batch", "seq_ids", lambda w, x: w.hpool.free_batch(x), ARRAY_BAD + [[-1], [1, 1], None]),
    ("BlockPool.mark_computed", "seq_ids", lambda w, x: w.hpool.mark_computed(x), ARRAY_BAD + [[-1], None]),
    ("BlockPool.blocks_needed", "seq_id", lambda w, x: w.hpool.blocks_needed(x, 1), INT_BAD + REQUIRED + NEG),
    ("BlockPool.blocks_needed", "num_tokens", lambda w, x: w.hpool.blocks_needed(1, x),
     INT_BAD + REQUIRED + NEG + [2**62]),
    ("BlockPool.seq_len", "seq_id", lambda w, x: w.hpool.seq_len(x), INT_BAD + REQUIRED + NEG),
    ("BlockPool.frontier", "seq_id", lambda w, x: w.hpool.frontier(x), INT_BAD + REQUIRED + NEG),
    ("BlockPool.block_table", "seq_id", lambda w, x: w.hpool.block_table(x, group=0), INT_BAD + REQUIRED + NEG),
    ("BlockPool.block_table", "group", lambda w, x: w.hpool.block_table(1, group=x), INT_BAD + REQUIRED + NEG + [3, 2**40]),
    ("BlockPool.block_tables", "seq_ids", lambda w, x: w.hpool.block_tables(x, group=0), ARRAY_BAD + [[-1], None]),
    ("BlockPool.block_tables", "group", lambda w, x: w.hpool.block_tables([1], group=x), INT_BAD + REQUIRED + NEG + [3]),
    ("BlockPool.block_tables", "max_blocks", lambda w, x: w.hpool.block_tables([1], x, group=0),
     INT_BAD + NEG + [1, 2**40]),
    ("BlockPool.block_tables", "pad", lambda w, x: w.hpool.block_tables([1], 4, x, group=0), INT_BAD + REQUIRED + [2**31]),
    ("BlockPool.flashinfer_tables", "seq_ids", lambda w, x: w.hpool.flashinfer_tables(x, group=0),
     ARRAY_BAD + [[-1], None]),
    ("BlockPool.flashinfer_tables", "group", lambda w, x: w.hpool.flashinfer_tables([1], group=x),
     INT_BAD + REQUIRED + NEG + [3]),
    ("BlockPool.stored_ranges", "seq_id", lambda w, x: w.hpool.stored_ranges(x, group=0), INT_BAD + REQUIRED + NEG),
    ("BlockPool.stored_ranges", "group", lambda w, x: w.hpool.stored_ranges(1, group=x), INT_BAD + REQUIRED + NEG + [3]),
    ("BlockPool.refcount", "block_id", lambda w, x: w.hpool.refcount(x), INT_BAD + REQUIRED + NEG + [64, 2**40]),
    ("BlockPool.add_sequence_tokens", "token_ids", lambda w, x: w.hppool.add_sequence_tokens(9, x),
     ARRAY_BAD + [[-1], [2**32], None]),
    ("BlockPool.add_sequence_tokens", "extra_key", lambda w, x: w.hppool.add_sequence_tokens(9, [1], x),
     INT_BAD + NEG),
    ("BlockPool.add_sequence_block_keys", "block_keys", lambda w, x: w.hppool.add_sequence_block_keys(9, x, 4),
     ARRAY_BAD + [[-1], np.zeros((1, 3), np.uint64), None]),
    ("BlockPool.add_sequence_block_keys", "prompt_len", lambda w, x: w.hppool.add_sequence_block_keys(9, [1], x),
     INT_BAD + REQUIRED + NEG + [2**40]),
    ("BlockPool.append_tokens", "token_ids", lambda w, x: w.hppool.append_tokens(1, x),
     ARRAY_BAD + [[-1], [2**32], None]),
    ("BlockPool.cached_prefix_len", "token_ids", lambda w, x: w.hppool.cached_prefix_len(x), ARRAY_BAD + [[-1], None]),
    ("BlockPool.cached_prefix_len", "extra_key", lambda w, x: w.hppool.cached_prefix_len([1], x), INT_BAD + NEG),
    ("KvCache", "num_layers", lambda w, x: kv.KvCache(x, 8, 4, 2, 8), INT_BAD + REQUIRED + NEG + [0, 2**62]),
    ("KvCache", "num_blocks", lambda w, x: kv.KvCache(1, x, 4, 2, 8), INT_BAD + REQUIRED + NEG + [0, 2**62]),
    ("KvCache", "block_size", lambda w, x: kv.KvCache(1, 8, x, 2, 8), INT_BAD + REQUIRED + NEG + [0, 2**17]),
    ("KvCache", "num_kv_heads", lambda w, x: kv.KvCache(1, 8, 4, x, 8), INT_BAD + REQUIRED + NEG + [0, 2**62]),
    ("KvCache", "head_dim", lambda w, x: kv.KvCache(1, 8, 4, 2, x), INT_BAD + REQUIRED + NEG + [0, 2**62]),
    ("KvCache", "dtype", lambda w, x: kv.KvCache(1, 8, 4, 2, 8, x), ["int4", "", "float64", "fp8"]),
    ("key_scales", "layer", lambda w, x: w.fcache.key_scales(x), INT_BAD + REQUIRED + NEG + [2, 2**62]),
    ("value_scales", "layer", lambda w, x: w.fcache.value_scales(x), INT_BAD + REQUIRED + NEG + [2]),
    ("set_fp8_scales", "layer", lambda w, x: w.fcache.set_fp8_scales(x, S, S), INT_BAD + REQUIRED + NEG + [2]),
    ("set_fp8_scales", "k_scales", lambda w, x: w.fcache.set_fp8_scales(0, x, S), SCALE_BAD),
    ("set_fp8_scales", "v_scales", lambda w, x: w.fcache.set_fp8_scales(0, S, x), SCALE_BAD),
    ("dequantized", "layer", lambda w, x: w.fcache.dequantized(x), INT_BAD + REQUIRED + NEG + [2]),
    ("bytes_per_token", "num_kv_heads", lambda w, x: kv.KvCache.bytes_per_token(x, 8, "int8"),
     INT_BAD + REQUIRED + NEG + [0, 2**17]),
    ("bytes_per_token", "head_dim", lambda w, x: kv.KvCache.bytes_per_token(2, x, "int8"),
     INT_BAD + REQUIRED + NEG + [0, 2**17]),
    ("bytes_per_token", "dtype", lambda w, x: kv.KvCache.bytes_per_token(2, 8, x), ["int4", "", "fp8"]),
    ("key", "layer", lambda w, x: w.cache.key(x), INT_BAD + REQUIRED + NEG + [2, 2**62]),
    ("value", "layer", lambda w, x: w.cache.value(x), INT_BAD + REQUIRED + NEG + [2, 2**62]),
    ("write", "layer", lambda w, x: w.cache.write(x, K, K, [0, 1]), INT_BAD + REQUIRED + NEG + [2]),
    ("write", "k", lambda w, x: w.cache.write(0, x, K, [0, 1]), KV_BAD),
    ("write", "v", lambda w, x: w.cache.write(0, K, x, [0, 1]), KV_BAD),
    ("write", "k", lambda w, x: w.fcache.write(0, x, K, [0, 1]),
     KV_BAD + [np.full((2, 2, 8), np.nan, np.float32), np.full((2, 2, 8), -np.inf, np.float32)]),
    ("write", "v", lambda w, x: w.fcache.write(1, K, x, [0, -1]), [np.full((2, 2, 8), np.inf, np.float32)]),
    ("write", "slot", lambda w, x: w.cache.write(0, K, K, x), ARRAY_BAD[1:] + [[0, 32], [0, -2]]),
    ("export_blocks", "blocks", lambda w, x: w.cache.export_blocks(x), ARRAY_BAD + [[8], [-1], [0, 8]]),
    ("import_blocks", "blocks", lambda w, x: w.cache.import_blocks(x, block_rows(w, "ok")), ARRAY_BAD + [[8], [-1]]),
    ("import_blocks", "data", lambda w, x: w.cache.import_blocks([0, 1], block_rows(w, x)),
     ["short", "long", "strided", "flat"]),
    ("copy_blocks", "pairs", lambda w, x: w.cache.copy_blocks(x),
     MATRIX_BAD + [[[1, 2, 3]], np.zeros((2, 3), np.int64), [1, 2], [[0, 8]], [[-1, 0]]]),
    ("decode_attention", "layer", lambda w, x: kv.decode_attention(w.cache, x, w.q, *Q_ARGS),
     INT_BAD + REQUIRED + NEG + [2]),
    ("decode_attention", "q", lambda w, x: kv.decode_attention(w.cache, 0, x, *Q_ARGS),
     F32_BAD + [np.ones((1, 3, 8), np.float32), np.ones((1, 4, 16), np.float32), np.ones((2, 4, 8), np.float32)]),
    ("decode_attention", "block_tables", lambda w, x: kv.decode_attention(w.cache, 0, w.q, x, [5]),
     MATRIX_BAD + [[[0], [1]], [[8, 9]], [[0, -1]]]),
    ("decode_attention", "seq_lens", lambda w, x: kv.decode_attention(w.cache, 0, w.q, [[0, 1]], x),
     ARRAY_BAD + [[-1], [9], [5, 5], None]),
    ("decode_attention", "scale", lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, scale=x),
     [float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e-50, 1e300, True, "0.1", [0.1], np.array([1.0]),
      np.array(1.0)]),
    ("decode_attention", "out", lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, out=x),
     F32_BAD[:-1] + [np.asfortranarray(np.ones((1, 4, 8), np.float32).reshape(1, 8, 4).swapaxes(1, 2))]),
    ("KernelTuning", "split_size", lambda w, x: kv.KernelTuning(split_size=x), INT_BAD + NEG + [2**70]),
    ("KernelTuning", "kv_heads_per_item", lambda w, x: kv.KernelTuning(kv_heads_per_item=x), INT_BAD + NEG + [0, 2**63]),
    ("KernelTuning", "isa", lambda w, x: kv.KernelTuning(isa=x),
     ["sve", "", "AVX2"] + [p for p in ("neon", "avx2", "avx512") if p not in kv.kernel_paths()]),
    ("decode_attention", "kv_heads_per_item",
     lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, tuning=kv.KernelTuning(kv_heads_per_item=x)), [3]),
    ("decode_attention", "logits_soft_cap",
     lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, logits_soft_cap=x),
     [float("nan"), float("inf"), 0.0, -1.0, 1e300, True, "30", [30.0], np.array([30.0])]),
    ("decode_attention", "q_dtype", lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, q_dtype=x),
     ["", "f64", "fp8_e4m3", "bf16", "int8", "f16"]),
    ("decode_attention", "pv_dtype", lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, pv_dtype=x),
     ["", "f64", "bf16", "f16"]),
    ("decode_attention", "window_left", lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, window_left=x),
     INT_BAD + NEG),
    ("decode_attention", "sink_tokens", lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, sink_tokens=x),
     INT_BAD + REQUIRED + NEG),
    # A window over keys 3..5 and one sink of 5 tokens: block 0 is needed, a pad there is wrong.
    ("decode_attention", "block_tables",
     lambda w, x: kv.decode_attention(w.cache, 0, w.q, x, [5], window_left=1, sink_tokens=1), [[[-1, 1]], [[8, 1]]]),
    ("decode_attention_paged", "kv_indptr", lambda w, x: kv.decode_attention_paged(w.cache, 0, w.q, x, [0], [1]),
     ARRAY_BAD + [[0, 2], [1, 0], None]),
    ("decode_attention_paged", "kv_indices", lambda w, x: kv.decode_attention_paged(w.cache, 0, w.q, [0, 1], x, [1]),
     ARRAY_BAD + [[8], [-1], None]),
    ("decode_attention_paged", "kv_last_page_len",
     lambda w, x: kv.decode_attention_paged(w.cache, 0, w.q, [0, 1], [0], x), ARRAY_BAD + [[0], [5], None]),
    ("decode_attention_paged", "window_left",
     lambda w, x: kv.decode_attention_paged(w.cache, 0, w.q, [0, 1], [0], [1], window_left=x), INT_BAD + NEG),
    ("decode_attention_paged", "sink_tokens",
     lambda w, x: kv.decode_attention_paged(w.cache, 0, w.q, [0, 1], [0], [1], sink_tokens=x),
     INT_BAD + REQUIRED + NEG),
    # One page at logical block kv_page_start: every block before it is a hole the
    # (absent) window needs; a huge start overflows the logical length.
    ("decode_attention_paged", "kv_page_start",
     lambda w, x: kv.decode_attention_paged(w.cache, 0, w.q, [0, 1], [0], [1], kv_page_start=x),
     ARRAY_BAD + [[-1], [0, 0], [], [1], [2**62]]),
    ("prefill_attention", "layer", lambda w, x: kv.prefill_attention(w.cache, x, w.q, *P_ARGS),
     INT_BAD + REQUIRED + NEG + [2]),
    ("prefill_attention", "q", lambda w, x: kv.prefill_attention(w.cache, 0, x, *P_ARGS),
     F32_BAD + [np.ones((1, 3, 8), np.float32), np.ones((1, 4, 16), np.float32), np.ones((2, 4, 8), np.float32)]),
    ("prefill_attention", "qo_indptr", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, x, *P_ARGS[1:]),
     ARRAY_BAD + [[0], [1, 1], [0, 2], [0, -1], None]),
    ("prefill_attention", "block_tables", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, [0, 1], x, [5]),
     MATRIX_BAD + [[[0], [1]], [[8, 9]], [[0, -1]]]),
    ("prefill_attention", "seq_lens", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, [0, 1], [[0, 1]], x),
     ARRAY_BAD + [[-1], [9], [5, 5], [0], None]),
    ("prefill_attention", "q_positions", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, q_positions=x),
     ARRAY_BAD + [[-1], [0, 1]]),
    ("prefill_attention", "chunk_size", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, chunk_size=x),
     INT_BAD + NEG + [0]),
    ("prefill_attention", "window_left", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, window_left=x),
     INT_BAD + NEG),
    ("prefill_attention", "sink_tokens", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, sink_tokens=x),
     INT_BAD + NEG),
    ("prefill_attention", "scale", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, scale=x),
     [float("nan"), float("inf"), 0.0, -1.0, 1e-50, True, "0.1", [0.1], np.array([1.0])]),
    ("prefill_attention", "logits_soft_cap",
     lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, logits_soft_cap=x),
     [float("nan"), float("inf"), 0.0, -1.0, 1e300, True, "30", [30.0], np.array([30.0])]),
    ("prefill_attention", "out", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, out=x),
     F32_BAD[:-1] + [np.asfortranarray(np.ones((1, 4, 8), np.float32).reshape(1, 8, 4).swapaxes(1, 2))]),
    ("prefill_attention", "kv_heads_per_item",
     lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, tuning=kv.KernelTuning(kv_heads_per_item=x)), [1]),
    ("prefill_attention", "q_dtype", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, q_dtype=x),
     ["", "f64", "bf16", "int8", "f16"]),
    ("prefill_attention", "pv_dtype", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, pv_dtype=x),
     ["", "bf16", "f16"]),
    ("prefill_attention", "pv_dtype", lambda w, x: kv.prefill_attention(w.fcache, 0, w.q, *P_ARGS, pv_dtype=x),
     ["bf16"]),
    ("prefill_attention", "q_dtype", lambda w, x: kv.prefill_attention(w.fcache, 0, w.q, *P_ARGS, q_dtype=x),
     ["int8", "f16"]),
    ("decode_attention", "q_dtype", lambda w, x: kv.decode_attention(w.fcache, 0, w.q, *Q_ARGS, q_dtype=x),
     ["int8"]),
    ("decode_attention_paged", "q_dtype",
     lambda w, x: kv.decode_attention_paged(w.fcache, 0, w.q, [0, 1], [0], [1], q_dtype=x), ["int8"]),
    ("prefill_attention_paged", "kv_indptr",
     lambda w, x: kv.prefill_attention_paged(w.cache, 0, w.q, [0, 1], x, [0], [1]), ARRAY_BAD + [[0], [1, 0], None]),
    ("prefill_attention_paged", "kv_indices",
     lambda w, x: kv.prefill_attention_paged(w.cache, 0, w.q, [0, 1], [0, 1], x, [1]), ARRAY_BAD + [[8], [-1], None]),
    ("prefill_attention_paged", "kv_last_page_len",
     lambda w, x: kv.prefill_attention_paged(w.cache, 0, w.q, [0, 1], [0, 1], [0], x), ARRAY_BAD + [[0], [5], None]),
    ("prefill_attention_paged", "kv_page_start",
     lambda w, x: kv.prefill_attention_paged(w.cache, 0, w.q, [0, 1], [0, 1], [0], [1], kv_page_start=x),
     ARRAY_BAD + [[-1], [0, 0], [], [1], [2**62]]),
    ("read_bandwidth", "nbytes", lambda w, x: kv.read_bandwidth(x), INT_BAD + NEG + [2.0**20, 1000, 2**62]),
    ("read_bandwidth", "threads", lambda w, x: kv.read_bandwidth(1 << 20, x), INT_BAD + NEG + [0, 2**40]),
    ("read_bandwidth", "passes", lambda w, x: kv.read_bandwidth(1 << 20, passes=x), INT_BAD + NEG + [0, 2**40]),
    ("read_bandwidth", "layer",
     lambda w, x: kv.read_bandwidth(cache=w.cache, block_tables=[[0]], seq_lens=[1], layer=x),
     INT_BAD + NEG + [2, 2**40]),
    ("read_bandwidth", "block_tables",
     lambda w, x: kv.read_bandwidth(cache=w.cache, block_tables=x, seq_lens=[1]), MATRIX_BAD + [[[99]], [[-1]]]),
    ("read_bandwidth", "seq_lens",
     lambda w, x: kv.read_bandwidth(cache=w.cache, block_tables=[[0]], seq_lens=x), ARRAY_BAD + [[-1], [99], [1, 1]]),
    ("peak_flops", "threads", lambda w, x: kv.peak_flops(x), INT_BAD + NEG + [0, 2**40]),
    ("peak_flops", "clock", lambda w, x: kv.peak_flops(1, clock=x), ["", "Wall", "thread", "cpu "]),
    ("read_bandwidth", "clock", lambda w, x: kv.read_bandwidth(1 << 20, clock=x), ["", "CPU", "steal"]),
    ("set_num_threads", "n", lambda w, x: kv.set_num_threads(x), INT_BAD + REQUIRED + NEG + [0, 2**40]),
]

TYPE_ERRORS: list[tuple[str, str, Call, list[Any]]] = [
    ("attach_tier_storage", "cache", lambda w, x: w.ppool.attach_tier_storage(x), [1, None, "cache"]),
    ("wait_tiers", "disk_writes", lambda w, x: w.ppool.wait_tiers(disk_writes=x), [1, "yes", None]),
    ("attach_tier_storage", "fsync", lambda w, x: w.ppool.attach_tier_storage(w.cache, fsync=x), [1, "yes", None]),
    ("BlockPool", "prefix_caching", lambda w, x: kv.BlockPool(16, 4, prefix_caching=x), [1, "yes", None]),
    ("BlockPool", "eviction", lambda w, x: kv.BlockPool(16, 4, prefix_caching=True, eviction=x), [1, b"lru"]),
    ("BlockPool", "verify_tokens", lambda w, x: kv.BlockPool(16, 4, prefix_caching=True, verify_tokens=x), [1, "no"]),
    ("BlockPool", "groups", lambda w, x: kv.BlockPool(16, 4, x),
     [1, "ab", b"ab", kv.FullAttention(), [1], [None], [kv.FullAttention(), "full"], [GROUPS]]),
    ("BlockPool", "prefix_caching", lambda w, x: kv.BlockPool(16, 4, GROUPS, prefix_caching=x), [1, "yes", None]),
    ("BlockPool", "eviction", lambda w, x: kv.BlockPool(16, 4, GROUPS, prefix_caching=True, eviction=x), [1, b"lru"]),
    ("KvCache", "dtype", lambda w, x: kv.KvCache(1, 8, 4, 2, 8, x), [1, None, np.float32]),
    ("key", "writable", lambda w, x: w.cache.key(0, writable=x), [1, "no", None]),
    ("import_blocks", "data", lambda w, x: w.cache.import_blocks([0], x), [None, [[0, 1]], np.zeros((1, 4), np.float32)]),
    ("key_scales", "writable", lambda w, x: w.fcache.key_scales(0, writable=x), [1, "no", None]),
    ("bytes_per_token", "dtype", lambda w, x: kv.KvCache.bytes_per_token(2, 8, x), [1, None, np.int8]),
    ("decode_attention", "cache", lambda w, x: kv.decode_attention(x, 0, w.q, *Q_ARGS), [None, 1, "cache"]),
    ("decode_attention", "return_lse", lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, return_lse=x),
     [1, "yes", None]),
    ("decode_attention", "q_dtype", lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, q_dtype=x),
     [1, None, b"bf16", np.float32]),
    ("decode_attention", "pv_dtype", lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, pv_dtype=x),
     [1, None]),
    ("decode_attention_paged", "q_dtype",
     lambda w, x: kv.decode_attention_paged(w.cache, 0, w.q, [0, 1], [0], [1], q_dtype=x), [1, True]),
    ("decode_attention", "tuning", lambda w, x: kv.decode_attention(w.cache, 0, w.q, *Q_ARGS, tuning=x),
     [1, "avx2", {"isa": "avx2"}]),
    ("KernelTuning", "isa", lambda w, x: kv.KernelTuning(isa=x), [1, b"avx2"]),
    ("prefill_attention", "cache", lambda w, x: kv.prefill_attention(x, 0, w.q, *P_ARGS), [None, 1, "cache"]),
    ("prefill_attention", "causal", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, causal=x),
     [1, "yes", None]),
    ("prefill_attention", "return_lse", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, return_lse=x),
     [1, "yes", None]),
    ("prefill_attention", "q_dtype", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, q_dtype=x),
     [1, None]),
    ("prefill_attention", "pv_dtype", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, pv_dtype=x),
     [1, None]),
    ("prefill_attention", "tuning", lambda w, x: kv.prefill_attention(w.cache, 0, w.q, *P_ARGS, tuning=x),
     [1, "avx2"]),
    ("read_bandwidth", "cache", lambda w, x: kv.read_bandwidth(cache=x), [1, "cache"]),
    ("read_bandwidth", "clock", lambda w, x: kv.read_bandwidth(1 << 20, clock=x), [1, None, b"cpu"]),
    ("peak_flops", "clock", lambda w, x: kv.peak_flops(1, clock=x), [0, None, b"wall", ["cpu"]]),
]


def cases(table: list[tuple[str, str, Call, list[Any]]]) -> list[Any]:
    return [pytest.param(name, call, bad, id=f"{row}.{name}[{i}:{bad!r:.20}]")
            for row, name, call, values in table for i, bad in enumerate(values)]


@pytest.mark.parametrize(("name", "call", "bad"), cases(INVALID))
def test_bad_value_raises_invalid_argument_naming_it(name: str, call: Call, bad: Any) -> None:
    w = world()
    before = state(w)
    with pytest.raises(kv.InvalidArgumentError) as info:
        call(w, bad)
    assert name in str(info.value), str(info.value)
    assert state(w) == before


@pytest.mark.parametrize(("name", "call", "bad"), cases(TYPE_ERRORS))
def test_wrong_type_of_flag_name_or_object_raises_type_error(name: str, call: Call, bad: Any) -> None:
    w = world()
    before = state(w)
    with pytest.raises(TypeError) as info:
        call(w, bad)
    assert not isinstance(info.value, kv.KvPoolError)
    # PyO3 names the argument in a note ("while processing 'dtype'").
    text = " ".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert name in text, text
    assert state(w) == before


def test_every_native_callable_is_in_a_table() -> None:
    """A new native function or method must get rows here (or be listed as taking no
    argument that can be wrong)."""
    no_args = {"get_num_threads", "cpu_features", "kernel_paths", "seq_ids", "stats", "check_invariants",
               "cache_stats", "tier_stats", "tier_transfer_stats", "drain_events", "reset_prefix_cache", "invalidate", "as_dict",
               "run_simulation", "synthesize_workload"}  # the simulator's own tests cover these two
    covered = {row.split(".")[-1] for row, *_ in INVALID + TYPE_ERRORS} | no_args
    native = {n for n in dir(kv._native) if callable(getattr(kv._native, n)) and not n[0].isupper()}
    for cls in (kv.BlockPool, kv.KvCache, kv.BlockTableBuffer, kv.BlockPool, kv.PoolStats,
                kv.FullAttention, kv.SlidingWindow, kv.ChunkedAttention):
        native |= {n for n in vars(cls) if not n.startswith("_") and callable(getattr(cls, n))}
    assert native - covered == set()
