"""pykvpool: a Rust-accelerated KV-cache block pool for LLM and video-model serving.

The compiled core lives in the private module ``pykvpool._native``; everything public is
re-exported here. Units: sizes in *blocks* and *tokens* unless a name says *bytes*.

Errors all derive from :class:`KvPoolError`; each also derives from the builtin a caller
would catch without knowing pykvpool:

- :class:`PoolExhaustedError` (also ``MemoryError``): not enough free blocks;
- :class:`UnknownSequenceError` (also ``KeyError``): a sequence id that is not live;
- :class:`InvalidArgumentError` (also ``ValueError``) and its subclass
  :class:`DuplicateSequenceError`: a rejected argument;
- :class:`InvariantError` (also ``AssertionError``): an internal check failed (a bug).

A failed call never changes the pool.
"""

from pykvpool._native import (
    BlockPool,
    BlockTableBuffer,
    CacheStats,
    DuplicateSequenceError,
    InvalidArgumentError,
    InvariantError,
    KvPoolError,
    PoolExhaustedError,
    PoolStats,
    UnknownSequenceError,
    __version__,
)
from pykvpool import simulate

__all__ = [
    "BlockPool",
    "BlockTableBuffer",
    "CacheStats",
    "DuplicateSequenceError",
    "InvalidArgumentError",
    "InvariantError",
    "KvPoolError",
    "PoolExhaustedError",
    "PoolStats",
    "UnknownSequenceError",
    "__version__",
    "simulate",
]
