//! Argument conversion: integer arrays of any integer dtype (numpy, any strides) or
//! Python sequences of ints, into the core's typed vectors. Every failure is an
//! `InvalidArgumentError` naming the argument.

use numpy::{PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PyString};

use super::dlpack::numpy_view;
use super::errors::invalid;
use crate::prefix_cache::block_hash::BlockKey;
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
        if arr.len() == 0 {
            // No values to misread, whatever the dtype (numpy makes `np.array([])` float64).
            return Ok(Vec::new());
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
        // Only a non-native byte order (say '>i8' from a file) gets here: copy the array
        // into native order once (same kind and width, so no value changes) and retry.
        let native = arr.dtype().call_method1("newbyteorder", ("=",))?;
        let swapped = obj.call_method1("astype", (native,))?;
        try_dtype!(&swapped, name, i64, i32, u32, u64, i16, u16, i8, u8);
        return Err(invalid(py, format!("{name}: unsupported integer dtype {}", arr.dtype().str()?.to_cow()?)));
    }
    if let Ok(list) = obj.cast::<PyList>() {
        // Exact ints through the C API (`exact_int_at`), anything else through `int_scalar`.
        let mut out = Vec::with_capacity(list.len());
        // The length is re-read every round: `int_scalar` may run Python code.
        while out.len() < list.len() {
            let i = out.len();
            out.push(match exact_int_at(list, i) {
                Some(v) => v,
                None => int_scalar(&list.get_item(i)?, name)?,
            });
        }
        return Ok(out);
    }
    if let Some(view) = numpy_view(obj, name)? {
        return int_vec(&view, name);
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

/// Item `i` (below the list's current length) when it is an exact `int` in int64 range.
/// Schedulers hand over lists of Python ints (a decode step's running list): they are
/// read through the C API, without the reference count traffic and bounds checks of a
/// safe iterator, which cost as much as the core's whole per-sequence work. Runs no
/// Python code.
#[inline]
fn exact_int_at(list: &Bound<'_, PyList>, i: usize) -> Option<i64> {
    debug_assert!(i < list.len());
    // SAFETY: `i` is below the list's length and the GIL is held, so the borrowed item is
    // alive; it is only used before any Python code can run (PyLong_AsLongLong on an
    // exact int calls none).
    unsafe {
        let item = pyo3::ffi::PyList_GET_ITEM(list.as_ptr(), i as pyo3::ffi::Py_ssize_t);
        if pyo3::ffi::PyLong_CheckExact(item) == 0 {
            return None;
        }
        let v = pyo3::ffi::PyLong_AsLongLong(item);
        if v == -1 && !pyo3::ffi::PyErr_Occurred().is_null() {
            // Out of int64 range: drop the error, the caller's checked path reports it.
            pyo3::ffi::PyErr_Clear();
            return None;
        }
        Some(v)
    }
}

/// A Python int (or numpy integer) as i64. Floats, bools (Python's or numpy's, both of
/// which convert to 0/1 silently otherwise), strings and other non-integers are refused.
pub fn int_scalar(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    let py = obj.py();
    // A plain int (every id and count a scheduler passes) needs none of the checks below,
    // whose type-name string and attribute lookup cost more than a whole `free` call.
    if obj.is_exact_instance_of::<PyInt>() {
        return obj
            .extract::<i64>()
            .map_err(|_| invalid(py, format!("{name} must be an int in int64 range, got {}", repr(obj))));
    }
    let ty = obj.get_type().name()?.to_string();
    let is_bool = obj.is_instance_of::<pyo3::types::PyBool>() || ty == "bool" || ty == "bool_";
    if is_bool || obj.is_instance_of::<pyo3::types::PyFloat>() || !obj.hasattr("__index__")? {
        return Err(invalid(py, format!("{name} must be an int, got {ty}")));
    }
    obj.extract::<i64>()
        .map_err(|_| invalid(py, format!("{name} must be an int in int64 range, got {}", repr(obj))))
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into())
}

/// Most new tokens one call may add: 128 Mi tokens, whose int64 slot mapping alone is
/// 1 GiB. A larger count is a caller bug (a wrong variable, a missing chunking), and
/// honouring it on a pool large enough would run the process out of memory, where the
/// OS kills it instead of anything raising.
pub const MAX_CALL_TOKENS: usize = 1 << 27;

/// A count of new tokens for one call, at most [`MAX_CALL_TOKENS`].
pub fn new_tokens(py: Python<'_>, v: i64, name: &str) -> PyResult<usize> {
    let n = count(py, v, name)?;
    check_call_tokens(py, n, name)?;
    Ok(n)
}

fn check_call_tokens(py: Python<'_>, n: usize, name: &str) -> PyResult<()> {
    if n > MAX_CALL_TOKENS {
        return Err(invalid(
            py,
            format!("{name}: {n} new tokens in one call exceed the limit of {MAX_CALL_TOKENS}; add them in chunks"),
        ));
    }
    Ok(())
}

/// A non-negative count (tokens, blocks).
pub fn count(py: Python<'_>, v: i64, name: &str) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| invalid(py, format!("{name} must be >= 0, got {v}")))
}

/// A non-negative int argument ([`int_scalar`], then [`count`]).
pub fn count_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    count(obj.py(), int_scalar(obj, name)?, name)
}

/// A sequence id: a non-negative int64.
pub fn seq_id(py: Python<'_>, v: i64, name: &str) -> PyResult<SeqId> {
    if v < 0 {
        return Err(invalid(py, format!("{name} must be a non-negative int, got {v}")));
    }
    Ok(SeqId(v as u64))
}

/// [`seq_ids`] into a caller-kept buffer (replaced). A list of exact, non-negative
/// ints (a decode step's running list) is read in one pass straight into `SeqId`s; any
/// other input, or a list holding anything else, takes [`seq_ids`]' checked path.
pub fn seq_ids_into(obj: &Bound<'_, PyAny>, name: &str, buf: &mut Vec<SeqId>) -> PyResult<()> {
    buf.clear();
    if let Ok(list) = obj.cast::<PyList>() {
        let n = list.len();
        buf.reserve(n);
        for i in 0..n {
            // Nothing in this loop runs Python code, so the list keeps its length `n`.
            let v = exact_int_at(list, i).unwrap_or(-1);
            if v < 0 {
                // Not an exact int, out of range or negative: the checked path reports it
                // (or accepts an int subclass) with its usual message.
                *buf = seq_ids(obj, name)?;
                return Ok(());
            }
            buf.push(SeqId(v as u64));
        }
        return Ok(());
    }
    *buf = seq_ids(obj, name)?;
    Ok(())
}

pub fn seq_ids(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<SeqId>> {
    let v = int_vec(obj, name)?;
    // One scan for a negative id, then an infallible map that the compiler turns into a
    // reuse of the buffer: a map through `PyResult` collected a second vector, a
    // measurable share of a decode step's binding cost.
    if let Some(&bad) = v.iter().find(|&&x| x < 0) {
        seq_id(obj.py(), bad, name)?;
    }
    Ok(v.into_iter().map(|x| SeqId(x as u64)).collect())
}

/// Token counts: an int broadcast to `n` entries, or an array of `n` counts; at most
/// [`MAX_CALL_TOKENS`] in total.
/// Written into `buf` (replaced), so that a hot caller can reuse one buffer.
pub fn counts_into(obj: &Bound<'_, PyAny>, n: usize, name: &str, buf: &mut Vec<usize>) -> PyResult<()> {
    let py = obj.py();
    // A plain int (decode's `1`) is tested first: probing it for iteration would raise and
    // discard a TypeError on every call.
    if obj.is_instance_of::<PyInt>() || (obj.cast::<PyUntypedArray>().is_err() && obj.try_iter().is_err()) {
        let c = count_arg(obj, name)?;
        check_call_tokens(py, c.saturating_mul(n), name)?;
        buf.clear();
        buf.resize(n, c);
        return Ok(());
    }
    let v = int_vec(obj, name)?;
    if v.len() != n {
        return Err(invalid(py, format!("{name} has {} entries for {n} sequences", v.len())));
    }
    let v = v.into_iter().map(|c| count(py, c, name)).collect::<PyResult<Vec<usize>>>()?;
    check_call_tokens(py, v.iter().fold(0usize, |a, &c| a.saturating_add(c)), name)?;
    *buf = v;
    Ok(())
}

/// An int that must fit in int32 (padding values).
pub fn int32(py: Python<'_>, v: i64, name: &str) -> PyResult<i32> {
    i32::try_from(v).map_err(|_| invalid(py, format!("{name} must fit in int32, got {v}")))
}

/// Block keys as 64-bit ints: a 1-D uint64 array (the whole range) or any integer array
/// or sequence of non-negative ints. A negative key is an error (keys are unsigned); it is
/// never wrapped. The one rule for block keys, shared by `BlockPool` and the simulator.
pub fn u64_keys(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u64>> {
    if let Ok(a) = obj.cast::<PyArray1<u64>>() {
        let ro = a.try_readonly().map_err(|e| invalid(obj.py(), format!("{name}: {e}")))?;
        return Ok(ro.as_array().to_vec());
    }
    ints_as(obj.py(), int_vec(obj, name)?, name, " is negative: keys are unsigned")
}

/// `values` as `T`s; a value out of `T`'s range is an error `"{name}[{i}] = {v}{why}"`.
pub fn ints_as<T: TryFrom<i64>>(py: Python<'_>, values: Vec<i64>, name: &str, why: &str) -> PyResult<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(values.len()).map_err(|_| invalid(py, format!("{name}: cannot allocate {} entries", values.len())))?;
    for (i, v) in values.into_iter().enumerate() {
        out.push(T::try_from(v).map_err(|_| invalid(py, format!("{name}[{i}] = {v}{why}")))?);
    }
    Ok(out)
}

/// Block keys: a 1-D array of non-negative ints below 2**64 (see [`u64_keys`]), or an
/// `[n, 2]` uint64 array of `(high, low)` 64-bit halves of 128-bit keys.
pub fn block_keys(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<BlockKey>> {
    let py = obj.py();
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        if arr.ndim() == 2 {
            let a = obj.cast::<PyArray2<u64>>().map_err(|_| {
                invalid(py, format!("{name}: a 2-D key array must be uint64 of shape [n, 2] (high, low)"))
            })?;
            if arr.shape()[1] != 2 {
                return Err(invalid(py, format!("{name}: 2-D keys must have 2 columns (high, low), got shape {:?}", arr.shape())));
            }
            let ro = a.try_readonly().map_err(|e| invalid(py, format!("{name}: {e}")))?;
            let view = ro.as_array();
            return Ok(view.rows().into_iter().map(|r| ((r[0] as u128) << 64) | r[1] as u128).collect());
        }
    }
    Ok(u64_keys(obj, name)?.into_iter().map(|k| k as u128).collect())
}

/// `#[pyo3(from_py_with = ...)]` converters for scalar arguments, one per argument name so
/// that the message names it. PyO3's own extraction would raise `TypeError` for floats and
/// strings, `OverflowError` past int64 and accept bools as 0/1; these raise
/// `InvalidArgumentError` for all of them, like the array arguments do.
pub mod arg {
    use pyo3::prelude::*;

    use numpy::PyUntypedArray;

    use super::{count, count_arg, int32, int_scalar};
    use crate::types::SeqId;

    macro_rules! scalar_args {
        ($($f:ident($name:literal) -> $t:ty = $conv:path),* $(,)?) => {$(
            pub fn $f(obj: &Bound<'_, PyAny>) -> PyResult<$t> {
                $conv(obj.py(), int_scalar(obj, $name)?, $name)
            }
        )*};
    }

    scalar_args!(
        seq_id("seq_id") -> SeqId = super::seq_id,
        parent("parent") -> SeqId = super::seq_id,
        child("child") -> SeqId = super::seq_id,
        prompt_len("prompt_len") -> usize = super::new_tokens,
        // Tokens a call adds (append) are capped; tokens it only counts or drops are not.
        new_tokens("num_tokens") -> usize = super::new_tokens,
        num_tokens("num_tokens") -> usize = count,
        max_seqs("max_seqs") -> usize = count,
        max_blocks("max_blocks") -> usize = count,
        pad("pad") -> i32 = int32,
    );

    /// A layer index; its range is checked against the cache.
    pub fn layer(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
        count_arg(obj, "layer")
    }

    /// A non-negative int named `name`, or `None`.
    pub fn opt_count(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<usize>> {
        if obj.is_none() {
            return Ok(None);
        }
        count_arg(obj, name).map(Some)
    }

    macro_rules! opt_count_args {
        ($($f:ident($name:literal)),* $(,)?) => {$(
            pub fn $f(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
                opt_count(obj, $name)
            }
        )*};
    }

    opt_count_args!(
        split_size("split_size"),
        kv_heads_per_item("kv_heads_per_item"),
        nbytes("nbytes"),
        threads("threads"),
        passes("passes"),
    );

    /// `set_num_threads(n)`: a non-negative int (the range is the thread pool's).
    pub fn n_threads(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
        count_arg(obj, "n")
    }

    /// A softmax scale: `None`, or a positive finite float32 (see [`positive_f32`]).
    pub fn scale(obj: &Bound<'_, PyAny>) -> PyResult<Option<f32>> {
        positive_f32(obj, "scale")
    }

    /// Gemma-2's `logits_soft_cap`: `None`, or a positive finite float32.
    pub fn logits_soft_cap(obj: &Bound<'_, PyAny>) -> PyResult<Option<f32>> {
        positive_f32(obj, "logits_soft_cap")
    }

    /// `None`, or a real number (not a bool, not an array) that is positive and finite in
    /// float32, named `name` in errors.
    pub fn positive_f32(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<f32>> {
        let py = obj.py();
        if obj.is_none() {
            return Ok(None);
        }
        let ty = obj.get_type().name()?.to_string();
        let is_bool = obj.is_instance_of::<pyo3::types::PyBool>() || ty == "bool" || ty == "bool_";
        // An array is refused even with one element (older numpy converts it silently).
        let is_array = obj.cast::<PyUntypedArray>().is_ok();
        let v = if is_bool || is_array { None } else { obj.extract::<f64>().ok() };
        let Some(v) = v else {
            return Err(super::invalid(py, format!("{name} must be a float, got {ty}")));
        };
        let s = v as f32;
        if !(s.is_finite() && s > 0.0) {
            return Err(super::invalid(py, format!("{name} must be positive and finite in float32, got {v}")));
        }
        Ok(Some(s))
    }

    /// A probe's `clock`: the str `"wall"` or `"cpu"` (a `TypeError` for anything but a
    /// str, an `InvalidArgumentError` for another str).
    pub fn clock(obj: &Bound<'_, PyAny>) -> PyResult<crate::runtime::clock::Clock> {
        use super::super::errors::IntoPyResult;
        let Ok(s) = obj.cast::<pyo3::types::PyString>() else {
            let ty = obj.get_type().name()?.to_string();
            return Err(pyo3::exceptions::PyTypeError::new_err(format!("clock must be a str, got {ty}")));
        };
        crate::runtime::clock::Clock::parse(s.to_str()?).py_err(obj.py())
    }

    /// `block_id` is range-checked against the pool by the core; only the int is checked here.
    pub fn block_id(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
        int_scalar(obj, "block_id")
    }

    /// `max_blocks=None` means "the longest table".
    pub fn opt_max_blocks(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        if obj.is_none() {
            return Ok(None);
        }
        max_blocks(obj).map(Some)
    }
}
