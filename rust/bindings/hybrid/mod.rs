//! `HybridPool`, its attention kinds and its statistics for Python.
//!
//! [`specs`] holds the attention-kind classes (`FullAttention`, `SlidingWindow`,
//! `ChunkedAttention`) and the reading of `groups`/`group` arguments, [`class`] the
//! `HybridPool` state and call helpers (the same lock and GIL rule as `BlockPool`),
//! [`methods`] its one `#[pymethods]` block and [`stats`] the two snapshot classes.

use pyo3::prelude::*;

pub mod class;
mod methods;
pub mod specs;
pub mod stats;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<specs::PyFullAttention>()?;
    m.add_class::<specs::PySlidingWindow>()?;
    m.add_class::<specs::PyChunkedAttention>()?;
    m.add_class::<class::PyHybridPool>()?;
    m.add_class::<stats::PyHybridPoolStats>()?;
    Ok(())
}
