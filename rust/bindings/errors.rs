//! The Python exception hierarchy and the one mapping from [`KvError`] to it.
//!
//! Every class derives from `KvPoolError` and from the builtin a caller would catch
//! without knowing pykvpool (`MemoryError`, `KeyError`, `ValueError`, `AssertionError`).
//! A tier's storage failure is the builtin `OSError` (`PermissionError`; `errno` ENOSPC
//! when the disk is full), except a folder of another model, an `InvalidArgumentError`.
//! PyO3's `create_exception!` takes a single base, so the classes are built with
//! `type(name, bases, ns)` once per interpreter.

use pyo3::exceptions::{
    PyAssertionError, PyException, PyKeyError, PyMemoryError, PyOSError, PyPermissionError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::error::{KvError, StorageFault};

pub struct Exceptions {
    pub base: Py<PyType>,
    pub exhausted: Py<PyType>,
    pub unknown: Py<PyType>,
    pub invalid: Py<PyType>,
    pub duplicate: Py<PyType>,
    pub invariant: Py<PyType>,
}

static EXCEPTIONS: PyOnceLock<Exceptions> = PyOnceLock::new();

/// The class `name` deriving from `bases`; its docstring comes from the stub through
/// [`super::exception_docs`].
fn make<'py>(py: Python<'py>, name: &str, bases: Vec<Bound<'py, PyType>>) -> PyResult<Py<PyType>> {
    let ns = PyDict::new(py);
    ns.set_item("__module__", "pykvpool")?;
    ns.set_item("__doc__", super::exception_docs::text(name))?;
    let bases = PyTuple::new(py, bases)?;
    let ty = py.get_type::<PyType>().call1((name, bases, ns))?;
    Ok(ty.cast_into::<PyType>()?.unbind())
}

fn build(py: Python<'_>) -> PyResult<Exceptions> {
    let base = make(py, "KvPoolError", vec![py.get_type::<PyException>()])?;
    let b = || base.bind(py).clone();
    let exhausted = make(py, "PoolExhaustedError", vec![b(), py.get_type::<PyMemoryError>()])?;
    let unknown = make(py, "UnknownSequenceError", vec![b(), py.get_type::<PyKeyError>()])?;
    let invalid = make(py, "InvalidArgumentError", vec![b(), py.get_type::<PyValueError>()])?;
    let duplicate = make(py, "DuplicateSequenceError", vec![invalid.bind(py).clone()])?;
    let invariant = make(py, "InvariantError", vec![b(), py.get_type::<PyAssertionError>()])?;
    Ok(Exceptions { base, exhausted, unknown, invalid, duplicate, invariant })
}

pub fn exceptions(py: Python<'_>) -> PyResult<&'static Exceptions> {
    EXCEPTIONS.get_or_try_init(py, || build(py))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let e = exceptions(m.py())?;
    for ty in [&e.base, &e.exhausted, &e.unknown, &e.invalid, &e.duplicate, &e.invariant] {
        let ty = ty.bind(m.py());
        m.add(ty.name()?, ty)?;
    }
    Ok(())
}

/// Convert a core error into the matching Python exception.
pub fn to_py(py: Python<'_>, e: KvError) -> PyErr {
    let exc = match exceptions(py) {
        Ok(x) => x,
        Err(err) => return err,
    };
    let msg = e.to_string();
    match e {
        KvError::PoolExhausted { requested, free } => {
            let err = PyErr::from_type(exc.exhausted.bind(py).clone(), msg);
            let v = err.value(py);
            // Attributes are a convenience; failing to set them must not hide the error.
            let _ = v.setattr("requested", requested);
            let _ = v.setattr("free", free);
            err
        }
        KvError::UnknownSequence(id) | KvError::DuplicateSequence(id) => {
            let ty = if matches!(e, KvError::UnknownSequence(_)) { &exc.unknown } else { &exc.duplicate };
            let err = PyErr::from_type(ty.bind(py).clone(), msg);
            let _ = err.value(py).setattr("seq_id", id);
            err
        }
        KvError::InvalidArgument(_) => PyErr::from_type(exc.invalid.bind(py).clone(), msg),
        KvError::Invariant(_) => PyErr::from_type(exc.invariant.bind(py).clone(), msg),
        KvError::Storage { fault, .. } => match fault {
            StorageFault::ForeignFolder => PyErr::from_type(exc.invalid.bind(py).clone(), msg),
            StorageFault::PermissionDenied => PyPermissionError::new_err(msg),
            StorageFault::Full => PyOSError::new_err((libc::ENOSPC, msg)),
            StorageFault::Io => PyOSError::new_err(msg),
        },
    }
}

/// `Result` adapter: `core_call().py_err(py)?`.
pub trait IntoPyResult<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for crate::error::Result<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}

/// An `InvalidArgumentError` with the given message.
pub fn invalid(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    to_py(py, KvError::InvalidArgument(msg.into()))
}
