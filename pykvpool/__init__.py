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
    ChunkedAttention,
    EVENT_ALL_CLEARED,
    EVENT_REMOVED,
    EVENT_STORED,
    EVICTION_POLICIES,
    KV_DTYPES,
    TIER_EVICTION_POLICIES,
    DuplicateSequenceError,
    FullAttention,
    InvalidArgumentError,
    InvariantError,
    KernelTuning,
    KvCache,
    KvPoolError,
    PoolExhaustedError,
    PoolStats,
    SlidingWindow,
    UnknownSequenceError,
    __version__,
    cpu_features,
    decode_attention,
    decode_attention_paged,
    get_num_threads,
    kernel_paths,
    peak_flops,
    prefill_attention,
    prefill_attention_paged,
    read_bandwidth,
    set_num_threads,
)
from pykvpool import simulate

# Capacity planning (pure Python; figures, report and CLI stay in their submodules so that
# importing pykvpool does not import matplotlib).
from pykvpool.errors import (
    BudgetError,
    TraceFormatError,
    UnknownPresetError,
)
from pykvpool.planning.hardware import Hardware, hardware_preset
from pykvpool.planning.ledger import Budget, MemoryLedger
from pykvpool.planning.models import ModelConfig, StorageDtype, model_preset, storage_dtype
from pykvpool.planning.video import VideoSpec
from pykvpool.planning.workloads import Workload

__all__ = [
    "BlockPool",
    "BlockTableBuffer",
    "CacheStats",
    "ChunkedAttention",
    "DuplicateSequenceError",
    "EVENT_ALL_CLEARED",
    "EVENT_REMOVED",
    "EVENT_STORED",
    "EVICTION_POLICIES",
    "TIER_EVICTION_POLICIES",
    "FullAttention",
    "InvalidArgumentError",
    "InvariantError",
    "KV_DTYPES",
    "KernelTuning",
    "KvCache",
    "KvPoolError",
    "PoolExhaustedError",
    "PoolStats",
    "SlidingWindow",
    "UnknownSequenceError",
    "__version__",
    "cpu_features",
    "decode_attention",
    "decode_attention_paged",
    "get_num_threads",
    "kernel_paths",
    "peak_flops",
    "prefill_attention",
    "prefill_attention_paged",
    "read_bandwidth",
    "set_num_threads",
    # capacity planning
    "Budget",
    "BudgetError",
    "Hardware",
    "MemoryLedger",
    "ModelConfig",
    "StorageDtype",
    "TraceFormatError",
    "UnknownPresetError",
    "VideoSpec",
    "Workload",
    "hardware_preset",
    "model_preset",
    "storage_dtype",
    "simulate",
]

#: Names kept for one release after they were merged into another: name -> (object, why).
_DEPRECATED = {
    "HybridCacheStats": (CacheStats, "BlockPool.cache_stats() returns CacheStats, the one prefix cache's "
                                     "metrics (per group in CacheStats.group_hit_blocks)"),
    "HybridPool": (BlockPool, "BlockPool(num_blocks, block_size, groups) is the one pool; per-group "
                              "queries take group= as a keyword"),
    "HybridPoolStats": (PoolStats, "BlockPool.stats() returns PoolStats, with the per-group lists"),
}


def __getattr__(name: str) -> object:
    """A deprecated name (:data:`_DEPRECATED`): its object, with a ``DeprecationWarning``.

    Raises:
        AttributeError: any other missing name.
    """
    if name in _DEPRECATED:
        import warnings

        obj, why = _DEPRECATED[name]
        warnings.warn(f"pykvpool.{name} is deprecated and goes in the next release: {why}", DeprecationWarning,
                      stacklevel=2)
        return obj
    raise AttributeError(f"module 'pykvpool' has no attribute {name!r}")
