//! The attention kinds of layer groups for Python: `FullAttention`, `SlidingWindow` and
//! `ChunkedAttention`, frozen value objects wrapping a [`GroupSpec`], and the reading of a
//! `groups` argument into specs.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use crate::bindings::convert::count_arg;
use crate::bindings::errors::{invalid, IntoPyResult};
use crate::pool::{GroupSpec, MAX_GROUPS};

fn window_of(s: &GroupSpec) -> Option<usize> {
    match *s {
        GroupSpec::SlidingWindow { window, .. } => Some(window),
        _ => None,
    }
}

fn chunk_of(s: &GroupSpec) -> Option<usize> {
    match *s {
        GroupSpec::Chunked { chunk } => Some(chunk),
        _ => None,
    }
}

/// Full (global) attention: a query at position ``p`` sees every key ``0..=p``.
///
/// Its blocks are never released: the group's table grows with the sequence.
///
/// Raises:
///     TypeError: any argument (it takes none).
#[pyclass(name = "FullAttention", module = "pykvpool", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyFullAttention(pub(crate) GroupSpec);

/// Sliding-window attention with optional attention sinks: a query at position ``p`` sees
/// the keys ``k`` with ``p - k < window`` (the ``window`` most recent positions, its own
/// included; Hugging Face's ``sliding_window``), plus the sinks ``k < sink_tokens``.
///
/// A pool releases the group's blocks that no later query sees, so a sequence holds about
/// ``ceil(sink_tokens / block_size) + ceil((window - 1) / block_size) + 1`` blocks of this
/// group whatever its length.
///
/// Args:
///     window: visible positions, the query's own included, ``1..=2**31 - 1`` tokens
///         (a kernel's ``window_left`` is ``window - 1``).
///     sink_tokens: leading positions every query sees, ``0..=2**31 - 1`` tokens
///         (default 0).
///
/// Raises:
///     InvalidArgumentError: ``window`` or ``sink_tokens`` out of range, a bool or a
///         non-integer.
#[pyclass(name = "SlidingWindow", module = "pykvpool", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PySlidingWindow(pub(crate) GroupSpec);

/// Chunked (block-local) attention, Llama 4's ``attention_chunk_size``: a query at
/// position ``p`` sees the keys of its own chunk, ``k // chunk_size == p // chunk_size``.
///
/// A pool releases the group's blocks of finished chunks.
///
/// Args:
///     chunk_size: positions per chunk, ``1..=2**31 - 1`` tokens.
///
/// Raises:
///     InvalidArgumentError: ``chunk_size`` out of range, a bool or a non-integer.
#[pyclass(name = "ChunkedAttention", module = "pykvpool", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyChunkedAttention(pub(crate) GroupSpec);

#[pymethods]
impl PyFullAttention {
    #[new]
    fn new() -> Self {
        Self(GroupSpec::Full)
    }

    /// None: full attention has no window (tokens).
    #[getter]
    fn window(&self) -> Option<usize> {
        window_of(&self.0)
    }

    /// 0: full attention has no sinks (tokens).
    #[getter]
    fn sink_tokens(&self) -> usize {
        self.0.sink_tokens()
    }

    /// None: full attention is not chunked (tokens).
    #[getter]
    fn chunk_size(&self) -> Option<usize> {
        chunk_of(&self.0)
    }

    /// None: the kernels' ``window_left`` for full attention (no window).
    #[getter]
    fn window_left(&self) -> Option<usize> {
        self.0.window_left()
    }

    fn __repr__(&self) -> String {
        self.0.to_string()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        Ok((slf.get_type().into_any(), PyTuple::empty(slf.py())))
    }
}

#[pymethods]
impl PySlidingWindow {
    #[new]
    #[pyo3(signature = (window, sink_tokens = None))]
    fn new(py: Python<'_>, window: &Bound<'_, PyAny>, sink_tokens: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let w = count_arg(window, "window")?;
        let s = match sink_tokens {
            Some(o) => count_arg(o, "sink_tokens")?,
            None => 0,
        };
        GroupSpec::sliding_window(w, s).py_err(py).map(Self)
    }

    /// Visible positions, the query's own included (tokens).
    #[getter]
    fn window(&self) -> Option<usize> {
        window_of(&self.0)
    }

    /// Leading positions every query sees (tokens).
    #[getter]
    fn sink_tokens(&self) -> usize {
        self.0.sink_tokens()
    }

    /// None: a sliding window is not chunked (tokens).
    #[getter]
    fn chunk_size(&self) -> Option<usize> {
        chunk_of(&self.0)
    }

    /// ``window - 1``: the kernels' ``window_left`` (keys with ``p - k <= window_left`` are
    /// visible), in tokens.
    #[getter]
    fn window_left(&self) -> Option<usize> {
        self.0.window_left()
    }

    fn __repr__(&self) -> String {
        self.0.to_string()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (usize, usize))> {
        let s = &slf.get().0;
        Ok((slf.get_type().into_any(), (window_of(s).unwrap_or(1), s.sink_tokens())))
    }
}

#[pymethods]
impl PyChunkedAttention {
    #[new]
    fn new(py: Python<'_>, chunk_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        GroupSpec::chunked(count_arg(chunk_size, "chunk_size")?).py_err(py).map(Self)
    }

    /// None: chunked attention has no sliding window (tokens).
    #[getter]
    fn window(&self) -> Option<usize> {
        window_of(&self.0)
    }

    /// 0: chunked attention has no sinks (tokens).
    #[getter]
    fn sink_tokens(&self) -> usize {
        self.0.sink_tokens()
    }

    /// Positions per chunk (tokens).
    #[getter]
    fn chunk_size(&self) -> Option<usize> {
        chunk_of(&self.0)
    }

    /// None: chunked attention is not a sliding window (the kernels take ``chunk_size``).
    #[getter]
    fn window_left(&self) -> Option<usize> {
        self.0.window_left()
    }

    fn __repr__(&self) -> String {
        self.0.to_string()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (usize,))> {
        Ok((slf.get_type().into_any(), (chunk_of(&slf.get().0).unwrap_or(1),)))
    }
}

/// The spec of one attention-kind object, `None` for anything else.
fn spec_of(obj: &Bound<'_, PyAny>) -> Option<GroupSpec> {
    if let Ok(k) = obj.cast::<PyFullAttention>() {
        return Some(k.get().0);
    }
    if let Ok(k) = obj.cast::<PySlidingWindow>() {
        return Some(k.get().0);
    }
    obj.cast::<PyChunkedAttention>().ok().map(|k| k.get().0)
}

/// The Python object of a spec.
pub fn kind_object<'py>(py: Python<'py>, s: GroupSpec) -> PyResult<Bound<'py, PyAny>> {
    Ok(match s {
        GroupSpec::Full => Bound::new(py, PyFullAttention(s))?.into_any(),
        GroupSpec::SlidingWindow { .. } => Bound::new(py, PySlidingWindow(s))?.into_any(),
        GroupSpec::Chunked { .. } => Bound::new(py, PyChunkedAttention(s))?.into_any(),
    })
}

/// A `groups` argument: an iterable (not a string) of attention-kind objects, 1 to
/// [`MAX_GROUPS`] of them. A wrong type is a `TypeError` naming `groups`; a wrong count an
/// `InvalidArgumentError` naming it (read no further than one past the limit).
pub fn groups_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<GroupSpec>> {
    let py = obj.py();
    let kinds = "FullAttention, SlidingWindow or ChunkedAttention";
    let not_iterable = || PyTypeError::new_err(format!("groups must be a sequence of {kinds} objects"));
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() || spec_of(obj).is_some() {
        return Err(not_iterable());
    }
    let mut out = Vec::new();
    for (i, item) in obj.try_iter().map_err(|_| not_iterable())?.enumerate() {
        let item = item?;
        let spec = spec_of(&item).ok_or_else(|| {
            let ty = item.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
            PyTypeError::new_err(format!("groups[{i}] must be {kinds}, got {ty}"))
        })?;
        if out.len() == MAX_GROUPS {
            return Err(invalid(py, format!("groups: expected 1..={MAX_GROUPS} layer groups, got more")));
        }
        out.push(spec);
    }
    if out.is_empty() {
        return Err(invalid(py, format!("groups: expected 1..={MAX_GROUPS} layer groups, got none")));
    }
    Ok(out)
}

/// A `group` argument: a group index, range-checked against the pool by the caller.
pub fn group_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    count_arg(obj, "group")
}
