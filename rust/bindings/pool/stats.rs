//! `PoolStats` and `CacheStats`: frozen snapshots of a pool's occupancy and of its
//! prefix cache's metrics.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::pool::PoolStats;
use crate::prefix_cache::CacheStats;

/// A snapshot class's one `#[pymethods]` block: a getter per plain field of the core
/// struct it wraps (`fields { /// doc  name: type, ... }`, each reading `self.0.name`),
/// then the methods written out after the field list; plus `fields_into`, which puts
/// every plain field into a dict in that order (for `as_dict`). `PoolStats` and
/// `CacheStats` both use it.
macro_rules! stats_class {
    (
        $(#[$attr:meta])*
        impl $py:ident {
            fields { $($(#[doc = $doc:literal])* $field:ident: $t:ty),* $(,)? }
            $($methods:tt)*
        }
    ) => {
        $(#[$attr])*
        impl $py {
            $( $(#[doc = $doc])* #[getter] fn $field(&self) -> $t { self.0.$field } )*
            $($methods)*
        }

        impl $py {
            fn fields_into(&self, d: &Bound<'_, PyDict>) -> PyResult<()> {
                $( d.set_item(stringify!($field), self.0.$field)?; )*
                Ok(())
            }
        }
    };
}

/// Occupancy snapshot of a :class:`BlockPool`, taken by :meth:`BlockPool.stats`.
///
/// Counts are in blocks and tokens: totals over the pool, and per-group lists with one
/// entry per layer group in group order. The snapshot does not follow later changes of the
/// pool.
#[pyclass(name = "PoolStats", module = "pykvpool", frozen)]
pub struct PyPoolStats(pub PoolStats);

stats_class! {
    #[pymethods]
    impl PyPoolStats {
        fields {
            /// Token slots per block (tokens).
            block_size: usize,
            /// Blocks in the pool.
            total_blocks: usize,
            /// Blocks an allocation can take now.
            free_blocks: usize,
            /// Blocks referenced by at least one sequence.
            used_blocks: usize,
            /// Live sequences.
            num_seqs: usize,
            /// Sum of sequence lengths, in tokens (a forked token counts once per sequence).
            logical_tokens: u64,
            /// Distinct filled token slots in used blocks, in tokens (a shared token counts once).
            stored_tokens: u64,
            /// Used blocks referenced by more than one sequence.
            shared_blocks: usize,
            /// Copy-on-write block copies since the pool was created (blocks).
            cow_copies: u64,
            /// Unfilled token slots in used blocks, in tokens: ``used_blocks * block_size -
            /// stored_tokens``.
            empty_slots: u64,
            /// ``stored_tokens / (used_blocks * block_size)``, a fraction in 0..1; 1.0 when no block is
            /// used.
            utilization: f64,
            /// Cached blocks no sequence holds (evictable unless pinned; counted in
            /// ``free_blocks`` when evictable).
            idle_cached_blocks: usize,
        }

        /// Per group: distinct blocks its tables hold (blocks).
        #[getter]
        fn group_blocks(&self) -> Vec<usize> {
            self.0.group_blocks.clone()
        }

        /// Per group: distinct filled token slots of those blocks (tokens; a shared token
        /// counts once).
        #[getter]
        fn group_stored_tokens(&self) -> Vec<u64> {
            self.0.group_stored_tokens.clone()
        }

        /// Per group: hole entries (released or never stored logical blocks) summed over
        /// sequences (blocks).
        #[getter]
        fn group_holes(&self) -> Vec<u64> {
            self.0.group_holes.clone()
        }

        /// All fields as a dict.
        ///
        /// Returns:
        ///     ``{name: value}`` for every property of this class: ints, ``utilization`` a
        ///     float, and the per-group fields lists of ints.
        fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            let d = PyDict::new(py);
            self.fields_into(&d)?;
            d.set_item("group_blocks", &self.0.group_blocks)?;
            d.set_item("group_stored_tokens", &self.0.group_stored_tokens)?;
            d.set_item("group_holes", &self.0.group_holes)?;
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
}

/// Prefix-cache metrics of a pool, taken by :meth:`BlockPool.cache_stats`
/// (hits count successful admissions). Counts are in blocks, tokens and admissions.
#[pyclass(name = "CacheStats", module = "pykvpool", frozen)]
pub struct PyCacheStats(pub CacheStats);

stats_class! {
    #[pymethods]
    impl PyCacheStats {
        fields {
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
            /// Lookups that found a key whose block failed verification: parent, extra key or
            /// token ids (a miss).
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
        }

        /// Eviction policy name.
        #[getter]
        fn policy(&self) -> &'static str {
            self.0.policy.name()
        }
        /// Per layer group, in group order (one entry for a pool without groups): blocks
        /// the admissions took from the cache in that group (a windowed group takes only
        /// its sinks and window).
        #[getter]
        fn group_hit_blocks(&self) -> Vec<u64> {
            self.0.group_hit_blocks.clone()
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
            self.fields_into(&d)?;
            d.set_item("hit_rate", self.0.hit_rate())?;
            d.set_item("block_hit_rate", self.0.block_hit_rate())?;
            d.set_item("group_hit_blocks", &self.0.group_hit_blocks)?;
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
}
