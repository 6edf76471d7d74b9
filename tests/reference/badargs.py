"""Malformed arguments for the pool state machine (not a test module): each must raise
``InvalidArgumentError`` and change nothing, even for live ids and a pool with room."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

import pykvpool as kv

# Ways to break a step's arguments (ids of a live sequence, one token each otherwise).
STEP_KINDS = [
    "float_ids",
    "bool_ids",
    "float_counts",
    "bool_counts",
    "ids_2d",
    "counts_2d",
    "negative_count",
    "negative_id",
    "mismatched",
    "uint64_id",
    "string_ids",
    "float_scalar_count",
]

# Wrong for every scalar int argument: negative, float, bool, past int64, str, None, an array.
BAD_SCALARS: list[Any] = [-1, 1.0, 1.5, True, 2**63, 2**70, "0", None, np.array([1.0])]


def bad_step_args(kind: str, seq: int) -> tuple[Any, Any]:
    """``(seq_ids, num_tokens)`` for :meth:`pykvpool.BlockPool.step`, broken as ``kind`` says."""
    ids: Any = np.array([seq], dtype=np.int64)
    ns: Any = np.array([1], dtype=np.int64)
    broken: dict[str, Callable[[], tuple[Any, Any]]] = {
        "float_ids": lambda: (ids.astype(np.float64), ns),
        "bool_ids": lambda: (np.array([True]), ns),
        "float_counts": lambda: (ids, ns.astype(np.float32)),
        "bool_counts": lambda: (ids, [True]),
        "ids_2d": lambda: (ids.reshape(1, 1), ns),
        "counts_2d": lambda: (ids, ns.reshape(1, 1)),
        "negative_count": lambda: (ids, np.array([-1], dtype=np.int8)),
        "negative_id": lambda: ([-1 - seq], ns),
        "mismatched": lambda: (ids, [1, 1]),
        "uint64_id": lambda: (np.array([2**63 + seq], dtype=np.uint64), ns),
        "string_ids": lambda: (str(seq), ns),
        "float_scalar_count": lambda: (ids, 1.0),
    }
    return broken[kind]()


def bad_scalar_calls(pool: kv.BlockPool, grouped: bool, seq: int, bad: Any) -> list[Callable[[], Any]]:
    """Every single-sequence call, and a step and a group query, given ``bad`` for one scalar
    (None only where the argument is required: a step's counts take None, and so does
    ``group`` of a pool built without ``groups``); then a group out of range, and a query
    without ``group=`` on a pool built with ``groups``."""
    calls: list[Callable[[], Any]] = [
        lambda: pool.add_sequence(bad),
        lambda: pool.append(seq, bad),
        lambda: pool.append(bad),
        lambda: pool.fork(seq, bad),
        lambda: pool.truncate(seq, bad),
        lambda: pool.free(bad),
    ]
    if bad is not None:
        calls.append(lambda: pool.step([seq], bad))
    if bad is not None or grouped:
        calls.append(lambda: pool.block_tables([seq], group=bad))
    calls.append(lambda: pool.block_table(seq, group=pool.num_groups))  # out of range
    if grouped:
        calls.append(lambda: pool.stored_ranges(seq))  # group= missing
    return calls

