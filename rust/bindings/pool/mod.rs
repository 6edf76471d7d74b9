//! `BlockPool`, the attention kinds of its layer groups, `PoolStats`, `CacheStats` and
//! `BlockTableBuffer` for Python.
//!
//! [`class`] holds the `BlockPool` state and call helpers, [`methods`] its one
//! `#[pymethods]` block, [`specs`] the attention-kind classes and the `groups`/`group`
//! arguments, [`cache_args`] the prefix-caching argument checks, [`stats`] the
//! two snapshot classes and [`table_buffer`] the incremental table matrix.

use pyo3::prelude::*;

pub mod cache_args;
pub mod class;
mod methods;
pub mod specs;
pub mod stats;
pub mod table_buffer;
mod tier_io;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<specs::PyFullAttention>()?;
    m.add_class::<specs::PySlidingWindow>()?;
    m.add_class::<specs::PyChunkedAttention>()?;
    m.add_class::<class::PyBlockPool>()?;
    m.add_class::<stats::PyPoolStats>()?;
    m.add_class::<stats::PyCacheStats>()?;
    m.add_class::<table_buffer::PyBlockTableBuffer>()?;
    m.add("EVENT_STORED", 0u8)?;
    m.add("EVENT_REMOVED", 1u8)?;
    m.add("EVENT_ALL_CLEARED", 2u8)?;
    // The one list of eviction policy names: the simulator, replay, search and CLI read it.
    let names: Vec<&str> = crate::prefix_cache::eviction::EvictionPolicy::ALL.iter().map(|p| p.name()).collect();
    m.add("EVICTION_POLICIES", pyo3::types::PyTuple::new(m.py(), names)?)?;
    // The one list of the tiers' orders (`tier_eviction=`): replay and the CLI read it.
    let tiers: Vec<&str> = crate::prefix_cache::tiers::TierPolicy::ALL.iter().map(|p| p.name()).collect();
    m.add("TIER_EVICTION_POLICIES", pyo3::types::PyTuple::new(m.py(), tiers)?)?;
    Ok(())
}
