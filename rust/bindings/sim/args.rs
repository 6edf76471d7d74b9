//! Argument conversion for the simulator functions. PyO3's own extraction raises
//! `OverflowError` for a negative or huge int, accepts bools as 0/1 and floats, and
//! numpy's raises its own errors for ragged or 2-D input; these converters raise
//! `InvalidArgumentError` naming the argument instead (`TypeError` only where a value of
//! a wholly different type, such as a string for a float, reaches PyO3's `str`/`bool`
//! extraction).

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyString};

use crate::bindings::convert::{int_scalar, int_vec, ints_as};
use crate::bindings::errors::invalid;
use crate::sim::{MAX_REQUESTS, MAX_REQUEST_TOKENS};

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

fn is_bool(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyBool>() || matches!(type_name(obj).as_str(), "bool" | "bool_")
}

/// A non-negative int of at most `max`.
pub fn count(obj: &Bound<'_, PyAny>, name: &str, max: u64) -> PyResult<u64> {
    let v = int_scalar(obj, name)?;
    match u64::try_from(v) {
        Ok(c) if c <= max => Ok(c),
        _ => Err(invalid(obj.py(), format!("{name} must be in 0..={max}, got {v}"))),
    }
}

/// A real number (a Python or numpy int or float; not a bool, not a string).
pub fn real(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    let py = obj.py();
    let numeric = obj.is_instance_of::<PyFloat>() || obj.is_instance_of::<PyInt>() || obj.hasattr("__float__")?;
    if is_bool(obj) || !numeric || obj.is_instance_of::<PyString>() {
        return Err(invalid(py, format!("{name} must be a number, got {}", type_name(obj))));
    }
    obj.extract::<f64>().map_err(|_| invalid(py, format!("{name} must be a float in float64 range")))
}

/// A seed: any int in `0..2**64`.
pub fn seed(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    let py = obj.py();
    if is_bool(obj) || obj.is_instance_of::<PyFloat>() || !obj.hasattr("__index__")? {
        return Err(invalid(py, format!("seed must be an int, got {}", type_name(obj))));
    }
    obj.extract::<u64>().map_err(|_| invalid(py, "seed must be an int in 0..2**64"))
}

/// Items of a fixed-size sequence argument (a tuple or list), refusing strings.
fn items<'py>(obj: &Bound<'py, PyAny>, name: &str, what: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let py = obj.py();
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(invalid(py, format!("{name} must be {what}, got a string")));
    }
    let it = obj.try_iter().map_err(|_| invalid(py, format!("{name} must be {what}, got {}", type_name(obj))))?;
    it.collect()
}

/// A length distribution `(kind, [params...])`.
pub fn dist(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<(String, Vec<f64>)> {
    let py = obj.py();
    let what = "a (kind, [parameters]) pair";
    let v = items(obj, name, what)?;
    let [kind, params] = &v[..] else {
        return Err(invalid(py, format!("{name} must be {what}, got {} items", v.len())));
    };
    let kind: String = kind.extract().map_err(|_| invalid(py, format!("{name}: the kind must be a string")))?;
    let params = items(params, name, "a sequence of numbers")?
        .iter()
        .map(|p| real(p, &format!("{name} parameter")))
        .collect::<PyResult<Vec<f64>>>()?;
    Ok((kind, params))
}

/// A length clamp `(min, max)` in tokens.
pub fn clamp(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<(u32, u32)> {
    let py = obj.py();
    let what = "a (min, max) pair of token counts";
    let v = items(obj, name, what)?;
    let [lo, hi] = &v[..] else {
        return Err(invalid(py, format!("{name} must be {what}, got {} items", v.len())));
    };
    let (lo, hi) = (count(lo, name, MAX_REQUEST_TOKENS as u64)?, count(hi, name, MAX_REQUEST_TOKENS as u64)?);
    Ok((lo as u32, hi as u32))
}

/// `(num_prefixes, prefix_len, vocab_size)`, or None.
pub fn shared_prefixes(obj: &Bound<'_, PyAny>) -> PyResult<Option<(usize, u32, u32)>> {
    if obj.is_none() {
        return Ok(None);
    }
    let (name, what) = ("shared_prefixes", "(num_prefixes, prefix_len, vocab_size)");
    let v = items(obj, name, what)?;
    let [n, len, vocab] = &v[..] else {
        return Err(invalid(obj.py(), format!("{name} must be {what}, got {} items", v.len())));
    };
    let n = count(n, "shared_prefixes num_prefixes", MAX_REQUESTS as u64)? as usize;
    let len = count(len, "shared_prefixes prefix_len", MAX_REQUEST_TOKENS as u64)? as u32;
    let vocab = count(vocab, "shared_prefixes vocab_size", u32::MAX as u64)? as u32;
    Ok(Some((n, len, vocab)))
}

/// The number of entries of a 1-D column, refusing other shapes and strings.
fn column_len(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let py = obj.py();
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        if arr.ndim() != 1 {
            return Err(invalid(py, format!("{name} must be 1-D, got shape {:?}", arr.shape())));
        }
        return Ok(arr.len());
    }
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(invalid(py, format!("{name} must be a 1-D array or a sequence, got a string")));
    }
    obj.len().map_err(|_| invalid(py, format!("{name} must be a 1-D array or a sequence, got {}", type_name(obj))))
}

/// A workload column's length, at most [`MAX_REQUESTS`] (checked before any copy).
pub fn num_requests(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let n = column_len(obj, name)?;
    if n > MAX_REQUESTS {
        return Err(invalid(obj.py(), format!("{name}: {n} requests exceed the limit of {MAX_REQUESTS} per workload")));
    }
    Ok(n)
}

/// Integers of a 1-D column; an empty column of any dtype (`np.array([])` is float64) is
/// an empty column.
pub fn ints(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<i64>> {
    if column_len(obj, name)? == 0 {
        return Ok(Vec::new());
    }
    int_vec(obj, name)
}

/// A column of `T` (u32 lengths or ids, i32 priorities), each value checked.
pub fn typed<T: TryFrom<i64>>(obj: &Bound<'_, PyAny>, name: &str, range: &str) -> PyResult<Vec<T>> {
    ints_as(obj.py(), ints(obj, name)?, name, &format!(": {range}"))
}

/// Request lengths: `u32` here, the range `1..=MAX_REQUEST_TOKENS` checked by the workload.
pub fn lengths(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u32>> {
    typed(obj, name, &format!("lengths must be in 1..={MAX_REQUEST_TOKENS} tokens"))
}

/// A 1-D float column (any real dtype, any strides, or a sequence of numbers).
pub fn floats(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<f64>> {
    let py = obj.py();
    let n = column_len(obj, name)?;
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        if n == 0 {
            return Ok(Vec::new());
        }
        if !matches!(arr.dtype().kind(), b'f' | b'i' | b'u') {
            return Err(invalid(py, format!("{name} must have a real dtype, got {}", arr.dtype().str()?.to_cow()?)));
        }
        let owned;
        let a = match obj.cast::<PyArray1<f64>>() {
            Ok(a) => a,
            Err(_) => {
                owned = obj.call_method1("astype", ("float64",))?;
                owned.cast::<PyArray1<f64>>()?
            }
        };
        let ro = a.try_readonly().map_err(|e| invalid(py, format!("{name}: {e}")))?;
        return Ok(ro.as_array().to_vec());
    }
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| invalid(py, format!("{name}: cannot allocate {n} entries")))?;
    for (i, item) in obj.try_iter()?.enumerate() {
        out.push(real(&item?, &format!("{name}[{i}]"))?);
    }
    Ok(out)
}

/// A size (`usize`) argument.
fn size(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    Ok(count(obj, name, usize::MAX as u64)? as usize)
}

fn opt_size(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<usize>> {
    if obj.is_none() {
        return Ok(None);
    }
    size(obj, name).map(Some)
}

/// `#[pyo3(from_py_with = ...)]` converters, one per argument so that messages name it.
pub mod named {
    use pyo3::prelude::*;

    use super::{clamp, count, dist, opt_size, real, size};
    use crate::pool::allocator::MAX_BLOCKS;

    macro_rules! converters {
        ($($f:ident -> $t:ty = $conv:ident),* $(,)?) => {$(
            pub fn $f(obj: &Bound<'_, PyAny>) -> PyResult<$t> {
                $conv(obj, stringify!($f))
            }
        )*};
    }

    converters!(
        num_requests -> usize = size,
        num_blocks -> usize = size,
        block_size -> usize = size,
        tokens_per_key -> usize = size,
        max_running -> usize = size,
        max_batched_tokens -> Option<usize> = opt_size,
        max_steps -> Option<usize> = opt_size,
        rate -> f64 = real,
        cv -> f64 = real,
        watermark -> f64 = real,
        prompt -> (String, Vec<f64>) = dist,
        output -> (String, Vec<f64>) = dist,
        prompt_clamp -> (u32, u32) = clamp,
        output_clamp -> (u32, u32) = clamp,
    );

    pub fn priority_levels(obj: &Bound<'_, PyAny>) -> PyResult<u32> {
        Ok(count(obj, "priority_levels", u32::MAX as u64)? as u32)
    }

    pub fn host_blocks(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
        Ok(count(obj, "host_blocks", MAX_BLOCKS as u64)? as usize)
    }

    /// Replicas of a deployment: 1 to `MAX_REPLICAS`.
    pub fn replicas(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
        let max = crate::sim::MAX_REPLICAS;
        match count(obj, "replicas", max as u64)? {
            0 => Err(crate::bindings::errors::invalid(obj.py(), format!("replicas must be in 1..={max}, got 0"))),
            n => Ok(n as usize),
        }
    }

    pub fn reserve_tokens(obj: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
        if obj.is_none() {
            return Ok(None);
        }
        Ok(Some(count(obj, "reserve_tokens", u32::MAX as u64)? as u32))
    }
}

/// A span of a layer group spec, in tokens (`1..=MAX_SPAN`; sinks may be 0).
fn span(obj: &Bound<'_, PyAny>, name: &str, lo: u64) -> PyResult<usize> {
    let v = count(obj, name, crate::pool::spec::MAX_SPAN as u64)?;
    if v < lo {
        return Err(invalid(obj.py(), format!("{name} must be >= {lo} tokens, got {v}")));
    }
    Ok(v as usize)
}

/// The `groups` option: None, or a list of 1..=MAX_GROUPS layer group specs, each
/// `("full",)`, `("sliding", window)`, `("sliding", window, sink_tokens)` or
/// `("chunked", chunk_size)` (tokens).
pub fn groups(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<crate::pool::GroupSpec>>> {
    use crate::pool::{GroupSpec, MAX_GROUPS};
    let py = obj.py();
    if obj.is_none() {
        return Ok(None);
    }
    let specs = items(obj, "groups", "a list of layer group specs")?;
    if specs.is_empty() || specs.len() > MAX_GROUPS {
        return Err(invalid(py, format!("groups: expected 1..={MAX_GROUPS} layer groups, got {}", specs.len())));
    }
    let what = "a tuple ('full',), ('sliding', window[, sink_tokens]) or ('chunked', chunk_size)";
    let mut out = Vec::with_capacity(specs.len());
    for (i, g) in specs.iter().enumerate() {
        let name = format!("groups[{i}]");
        let v = items(g, &name, what)?;
        let kind: Option<String> = v.first().and_then(|k| k.extract().ok());
        let spec = match (kind.as_deref(), &v[..]) {
            (Some("full"), [_]) => GroupSpec::Full,
            (Some("sliding"), [_, w]) => GroupSpec::SlidingWindow { window: span(w, &format!("{name} window"), 1)?, sink_tokens: 0 },
            (Some("sliding"), [_, w, s]) => GroupSpec::SlidingWindow {
                window: span(w, &format!("{name} window"), 1)?,
                sink_tokens: span(s, &format!("{name} sink_tokens"), 0)?,
            },
            (Some("chunked"), [_, c]) => GroupSpec::Chunked { chunk: span(c, &format!("{name} chunk_size"), 1)? },
            _ => return Err(invalid(py, format!("{name} must be {what}, got {}", g.repr().map(|r| r.to_string()).unwrap_or_default()))),
        };
        out.push(spec);
    }
    Ok(Some(out))
}
