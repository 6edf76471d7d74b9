//! PyO3 bindings: the private extension module `pykvpool._native`.
//!
//! Thin wrappers only: each Python class owns one core type behind a mutex, converts
//! arguments (any integer numpy array or Python sequence), releases the GIL around the
//! core call, and maps [`crate::KvError`] to one Python exception class. The public API
//! is re-exported by `pykvpool/__init__.py`.

use pyo3::prelude::*;

pub mod convert;
pub mod errors;
mod exception_docs;
pub mod kv;
pub mod pool;
pub mod prefill;
pub mod prefix;
pub mod sim;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    pool::register(m)?;
    prefix::register(m)?;
    sim::register(m)?;
    kv::register(m)?;
    prefill::register(m)?;
    Ok(())
}
