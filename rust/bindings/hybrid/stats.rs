//! `HybridPoolStats`: a frozen snapshot of a `HybridPool`'s occupancy, totals as
//! properties and per-group lists (one entry per group, in group order). Built with
//! `BlockPool`'s `stats_class!`; its prefix cache reports through `CacheStats`.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::bindings::pool::stats::stats_class;
use crate::pool::PoolStats;

/// Occupancy snapshot of a :class:`HybridPool`, taken by :meth:`HybridPool.stats`.
///
/// Counts are in blocks and tokens: totals over the pool, and per-group lists with one
/// entry per group in group order. The snapshot does not follow later changes of the pool.
#[pyclass(name = "HybridPoolStats", module = "pykvpool", frozen)]
pub struct PyHybridPoolStats(pub PoolStats);

stats_class! {
    #[pymethods]
    impl PyHybridPoolStats {
        fields {
            /// Token slots per block (tokens).
            block_size: usize,
            /// Blocks in the pool, shared by all groups.
            total_blocks: usize,
            /// Blocks an allocation can take now (free plus idle cached).
            free_blocks: usize,
            /// Blocks held by at least one sequence, in any group.
            used_blocks: usize,
            /// Live sequences.
            num_seqs: usize,
            /// Sum of logical sequence lengths, in tokens (released tokens included; a forked
            /// token counts once per sequence).
            logical_tokens: u64,
            /// Copy-on-write block copies since the pool was created, all groups (blocks).
            cow_copies: u64,
            /// Cached blocks no sequence holds (evictable; counted in ``free_blocks``).
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
        ///     ``{name: value}`` for every property of this class: ints, and the per-group
        ///     fields lists of ints.
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
                "HybridPoolStats(used_blocks={}/{}, seqs={}, group_blocks={:?}, group_holes={:?}, cow_copies={})",
                s.used_blocks, s.total_blocks, s.num_seqs, s.group_blocks, s.group_holes, s.cow_copies
            )
        }
    }
}
