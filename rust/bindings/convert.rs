//! Argument conversion: integer arrays of any integer dtype (numpy, any strides) or
//! Python sequences of ints, into the core's typed vectors. Every failure is an
//! `InvalidArgumentError` naming the argument.

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PyString};

use super::errors::invalid;
use crate::types::SeqId;

macro_rules! try_dtype {
    ($arr:expr, $name:expr, $($t:ty),*) => {
        $(
            if let Ok(a) = $arr.cast::<PyArray1<$t>>() {
                let ro = a.try_readonly().map_err(|e| invalid($arr.py(), format!("{}: {e}", $name)))?;
                let mut out = Vec::with_capacity(ro.len());
                for &v in ro.as_array().iter() {
                    out.push(i64::try_from(v).map_err(|_| {
                        invalid($arr.py(), format!("{}: value {v} does not fit in int64", $name))
                    })?);
                }
                return Ok(out);
            }
        )*
    };
}

/// A 1-D integer array or a sequence of ints as `Vec<i64>`.
pub fn int_vec(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<i64>> {
    let py = obj.py();
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        if arr.ndim() != 1 {
            return Err(invalid(py, format!("{name} must be 1-D, got shape {:?}", arr.shape())));
        }
        let kind = arr.dtype().kind();
        if kind != b'i' && kind != b'u' {
            return Err(invalid(
                py,
                format!("{name} must have an integer dtype, got {}", arr.dtype().str()?.to_cow()?),
            ));
        }
        // Fast path first: int64 is what schedulers usually hold.
        try_dtype!(obj, name, i64, i32, u32, u64, i16, u16, i8, u8);
        return Err(invalid(py, format!("{name}: unsupported integer dtype")));
    }
    if let Ok(list) = obj.cast::<PyList>() {
        // Schedulers hand over lists of Python ints: exact ints convert directly, without
        // the generic iterator protocol and the per-item type checks of `int_scalar`.
        let mut out = Vec::with_capacity(list.len());
        for item in list.iter() {
            let v = if item.is_exact_instance_of::<PyInt>() { item.extract::<i64>().ok() } else { None };
            out.push(match v {
                Some(v) => v,
                None => int_scalar(&item, name)?,
            });
        }
        return Ok(out);
    }
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(invalid(py, format!("{name} must be a sequence of ints, got a string")));
    }
    let seq = obj
        .try_iter()
        .map_err(|_| invalid(py, format!("{name} must be an integer array or a sequence of ints")))?;
    let mut out = Vec::new();
    for item in seq {
        let item = item?;
        out.push(int_scalar(&item, name)?);
    }
    Ok(out)
}

/// A Python int (or numpy integer) as i64. Floats and bools are refused.
pub fn int_scalar(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    let py = obj.py();
    if obj.is_instance_of::<pyo3::types::PyBool>() || obj.is_instance_of::<pyo3::types::PyFloat>() {
        return Err(invalid(py, format!("{name} must be an int, got {}", obj.get_type().name()?)));
    }
    obj.extract::<i64>()
        .map_err(|_| invalid(py, format!("{name} must be an int in int64 range, got {}", repr(obj))))
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into())
}

/// A non-negative count (tokens, blocks).
pub fn count(py: Python<'_>, v: i64, name: &str) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| invalid(py, format!("{name} must be >= 0, got {v}")))
}

/// A sequence id: a non-negative int64.
pub fn seq_id(py: Python<'_>, v: i64, name: &str) -> PyResult<SeqId> {
    if v < 0 {
        return Err(invalid(py, format!("{name} must be a non-negative int, got {v}")));
    }
    Ok(SeqId(v as u64))
}

pub fn seq_ids(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<SeqId>> {
    let py = obj.py();
    int_vec(obj, name)?.into_iter().map(|v| seq_id(py, v, name)).collect()
}

/// Token counts: an int broadcast to `n` entries, or an array of `n` counts.
pub fn counts(obj: &Bound<'_, PyAny>, n: usize, name: &str) -> PyResult<Vec<usize>> {
    let py = obj.py();
    // A plain int (decode's `1`) is tested first: probing it for iteration would raise and
    // discard a TypeError on every call.
    if obj.is_instance_of::<PyInt>() || (obj.cast::<PyUntypedArray>().is_err() && obj.try_iter().is_err()) {
        let c = count(py, int_scalar(obj, name)?, name)?;
        return Ok(vec![c; n]);
    }
    let v = int_vec(obj, name)?;
    if v.len() != n {
        return Err(invalid(py, format!("{name} has {} entries for {n} sequences", v.len())));
    }
    v.into_iter().map(|c| count(py, c, name)).collect()
}
