//! `PoolStats` and `CacheStats`: frozen snapshots of a pool's occupancy and of its
//! prefix cache's metrics.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::pool::PoolStats;
use crate::prefix_cache::CacheStats;


/// Occupancy snapshot of a :class:`BlockPool`, taken by :meth:`BlockPool.stats`.
///
/// Counts are in blocks and tokens; the snapshot does not follow later changes of the pool.
#[pyclass(name = "PoolStats", module = "pykvpool", frozen)]
pub struct PyPoolStats(pub PoolStats);

#[pymethods]
impl PyPoolStats {
    /// Token slots per block (tokens).
    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size
    }
    /// Blocks in the pool.
    #[getter]
    fn total_blocks(&self) -> usize {
        self.0.total_blocks
    }
    /// Blocks an allocation can take now.
    #[getter]
    fn free_blocks(&self) -> usize {
        self.0.free_blocks
    }
    /// Blocks referenced by at least one sequence.
    #[getter]
    fn used_blocks(&self) -> usize {
        self.0.used_blocks
    }
    /// Live sequences.
    #[getter]
    fn num_seqs(&self) -> usize {
        self.0.num_seqs
    }
    /// Sum of sequence lengths, in tokens (a forked token counts once per sequence).
    #[getter]
    fn logical_tokens(&self) -> u64 {
        self.0.logical_tokens
    }
    /// Distinct filled token slots in used blocks, in tokens (a shared token counts once).
    #[getter]
    fn stored_tokens(&self) -> u64 {
        self.0.stored_tokens
    }
    /// Used blocks referenced by more than one sequence.
    #[getter]
    fn shared_blocks(&self) -> usize {
        self.0.shared_blocks
    }
    /// Copy-on-write block copies since the pool was created (blocks).
    #[getter]
    fn cow_copies(&self) -> u64 {
        self.0.cow_copies
    }
    /// Unfilled token slots in used blocks, in tokens: ``used_blocks * block_size -
    /// stored_tokens``.
    #[getter]
    fn empty_slots(&self) -> u64 {
        self.0.empty_slots
    }
    /// ``stored_tokens / (used_blocks * block_size)``, a fraction in 0..1; 1.0 when no block is
    /// used.
    #[getter]
    fn utilization(&self) -> f64 {
        self.0.utilization
    }

    /// All fields as a dict.
    ///
    /// Returns:
    ///     ``{name: value}`` for every property of this class: ints, and ``utilization`` a float.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        let s = &self.0;
        d.set_item("block_size", s.block_size)?;
        d.set_item("total_blocks", s.total_blocks)?;
        d.set_item("free_blocks", s.free_blocks)?;
        d.set_item("used_blocks", s.used_blocks)?;
        d.set_item("num_seqs", s.num_seqs)?;
        d.set_item("logical_tokens", s.logical_tokens)?;
        d.set_item("stored_tokens", s.stored_tokens)?;
        d.set_item("shared_blocks", s.shared_blocks)?;
        d.set_item("cow_copies", s.cow_copies)?;
        d.set_item("empty_slots", s.empty_slots)?;
        d.set_item("utilization", s.utilization)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let s = &self.0;
        format!(
            "PoolStats(used_blocks={}/{}, seqs={}, stored_tokens={}, shared_blocks={}, cow_copies={}, utilization={:.4})",
            s.used_blocks, s.total_blocks, s.num_seqs, s.stored_tokens, s.shared_blocks, s.cow_copies, s.utilization
        )
    }
}


/// Prefix-cache metrics of a :class:`BlockPool`, taken by :meth:`BlockPool.cache_stats`
/// (hits count successful admissions). Counts are in blocks, tokens and admissions.
#[pyclass(name = "CacheStats", module = "pykvpool", frozen)]
pub struct PyCacheStats(pub CacheStats);

/// The `CacheStats` getters of plain fields: `field: type`, each after its `///` doc lines.
macro_rules! stat_getters {
    ($($(#[doc = $doc:tt])* $field:ident: $t:ty),* $(,)?) => {
        #[pymethods]
        impl PyCacheStats {
            $( $(#[doc = $doc])* #[getter] fn $field(&self) -> $t { self.0.$field } )*

            /// Eviction policy name.
            #[getter]
            fn policy(&self) -> &'static str {
                self.0.policy.name()
            }
            /// ``hit_tokens / query_tokens`` (0.0 before any query).
            #[getter]
            fn hit_rate(&self) -> f64 {
                self.0.hit_rate()
            }
            /// ``hit_blocks / query_blocks`` (0.0 before any query).
            #[getter]
            fn block_hit_rate(&self) -> f64 {
                self.0.block_hit_rate()
            }

            /// All fields as a dict.
            ///
            /// Returns:
            ///     ``{name: value}`` for every property of this class: ints, the rates floats,
            ///     ``policy`` a str.
            fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let d = PyDict::new(py);
                d.set_item("policy", self.0.policy.name())?;
                $( d.set_item(stringify!($field), self.0.$field)?; )*
                d.set_item("hit_rate", self.0.hit_rate())?;
                d.set_item("block_hit_rate", self.0.block_hit_rate())?;
                Ok(d)
            }

            fn __repr__(&self) -> String {
                let s = &self.0;
                format!(
                    "CacheStats(policy={}, hit_rate={:.4}, block_hit_rate={:.4}, cached_blocks={}, evictable_blocks={}, evictions={})",
                    s.policy, s.hit_rate(), s.block_hit_rate(), s.cached_blocks, s.evictable_blocks, s.evictions
                )
            }
        }
    };
}

stat_getters!(
    /// Admissions that looked the cache up.
    queries: u64,
    /// Prompt blocks looked up (full blocks for token ids; every key for block keys).
    query_blocks: u64,
    /// Leading prompt blocks found cached, before the last-token rule.
    hit_blocks: u64,
    /// Prompt tokens admitted.
    query_tokens: u64,
    /// Prompt tokens returned as cached (after the last-token rule).
    hit_tokens: u64,
    /// Blocks registered in the cache so far.
    stored_blocks: u64,
    /// Idle cached blocks reclaimed by allocations so far.
    evictions: u64,
    /// Lookups that found a key whose block failed verification: parent, extra key,
    /// token ids or fill (a miss).
    collisions: u64,
    /// Admissions that took a copy-on-write partial hit.
    cow_hits: u64,
    /// Blocks in the cache now (live or idle).
    cached_blocks: usize,
    /// Cached blocks with refcount 0.
    idle_blocks: usize,
    /// Idle blocks that are not hard-pinned (counted in ``num_free_blocks``).
    evictable_blocks: usize,
    /// Cached blocks under at least one hard pin.
    pinned_blocks: usize,
    /// Live pins.
    num_pins: usize,
    /// Current logical time (see :meth:`BlockPool.set_clock`).
    clock: u64,
    /// Events recorded and not drained yet (at most ``max_events``).
    pending_events: usize,
    /// Events dropped so far, oldest first, because the queue was full.
    dropped_events: u64,
);
