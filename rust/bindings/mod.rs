//! PyO3 bindings: the private extension module `pykvpool._native`.
//!
//! Thin wrappers only: each Python class owns one core type behind a mutex, converts
//! arguments (any integer numpy array or Python sequence), releases the GIL around the
//! core call, and maps [`crate::KvError`] to one Python exception class. The public API
//! is re-exported by `pykvpool/__init__.py`.

use pyo3::prelude::*;

pub mod arrays;
pub mod attention;
pub mod convert;
pub mod dlpack;
pub mod errors;
mod exception_docs;
pub mod kv;
mod kv_views;
pub mod pool;
pub mod prefill;
pub mod runtime;
pub mod sim;

// `gil_used = true`: on a free-threaded CPython, importing the module turns the GIL back
// on. The bindings are not audited for running without it: `exact_int_at` reads list
// items through borrowed references, numpy borrows and the kernels' unlocked reads of
// the cache views assume the GIL orders Python threads. Lift this only after that audit.
#[pymodule(gil_used = true)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    pool::register(m)?;
    sim::register(m)?;
    kv::register(m)?;
    attention::register(m)?;
    prefill::register(m)?;
    runtime::register(m)?;
    Ok(())
}
