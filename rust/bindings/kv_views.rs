//! The numpy arrays of a `KvCache`: zero-copy views of one layer's K or V codes and of
//! its scales, and dequantized float32 copies.

use numpy::ndarray::{ArrayView1, ArrayView3, ArrayView4, ShapeBuilder};
use numpy::{PyArray1, PyArray3, PyArray4, PyArrayMethods};
use pyo3::prelude::*;

use super::errors::invalid;
use crate::kv::elem::ScaleKind;
use crate::kv::{DType, KvShape};

/// The numpy dtype a view of `dtype` is cast to (`None`: the raw array's own), imported
/// from numpy or ml_dtypes; ml_dtypes missing is an ImportError, never raw bits.
fn view_dtype(py: Python<'_>, dtype: DType) -> PyResult<Option<Bound<'_, PyAny>>> {
    let ml = |name: &str| {
        py.import("ml_dtypes").and_then(|m| m.getattr(name)).map_err(|e| {
            let msg = format!(
                "a view of a {} KvCache needs ml_dtypes (a pykvpool dependency: pip install ml_dtypes), \
                 which failed to import: {e}",
                dtype.name()
            );
            pyo3::exceptions::PyImportError::new_err(msg)
        })
    };
    Ok(match dtype {
        DType::F32 | DType::I8 => None,
        DType::F16 => Some(py.import("numpy")?.getattr("float16")?),
        DType::BF16 => Some(ml("bfloat16")?),
        DType::E4M3 => Some(ml("float8_e4m3fn")?),
        DType::E5M2 => Some(ml("float8_e5m2")?),
    })
}

/// One layer's K or V (`ptr`, element `strides`) of a cache of shape `s` and `dtype`,
/// kept alive by `owner` (the cache object), which the numpy views borrow.
pub(super) struct Region<'py> {
    pub owner: Bound<'py, PyAny>,
    pub s: KvShape,
    pub dtype: DType,
    pub ptr: *const u8,
}

/// A zero-copy numpy view of one layer's K or V in the logical shape
/// `[num_blocks, block_size, num_kv_heads, head_dim]` with element `strides`, kept alive
/// by the cache object; read-only unless `writable`. `r.ptr` is `KvCache::layer_ptr`'s.
///
/// The array aliases memory that `write`, `copy_blocks` and the kernels touch with the
/// GIL released (the `RwLock` guards the cache object, not this array): a Python thread
/// writing it while a kernel call runs on another is a data race the caller must avoid,
/// as the stubs document. Handing out views is what the zero-copy contract asks for.
pub(super) fn view(r: Region<'_>, strides: [usize; 4], writable: bool) -> PyResult<Bound<'_, PyAny>> {
    let py = r.owner.py();
    let (s, dtype, ptr, owner) = (r.s, r.dtype, r.ptr, r.owner);
    let target = view_dtype(py, dtype)?;
    let dims = (s.num_blocks, s.block_size, s.num_kv_heads, s.head_dim).strides((strides[0], strides[1], strides[2], strides[3]));
    let raw = match dtype.size() {
        4 => {
            // SAFETY: ptr addresses this layer's K (or V), shape().layer_span() f32
            // elements inside its region, which the strides above cover exactly (the
            // last block ends the span); the buffer never moves or shrinks
            // while the cache object (set as the array's base) is alive.
            let a = unsafe { ArrayView4::from_shape_ptr(dims, ptr.cast::<f32>()) };
            // SAFETY: as above; `owner` keeps the memory alive.
            unsafe { PyArray4::borrow_from_array(&a, owner) }.into_any()
        }
        2 => {
            // SAFETY: as for f32, with 2-byte elements.
            let a = unsafe { ArrayView4::from_shape_ptr(dims, ptr.cast::<u16>()) };
            // SAFETY: as above.
            unsafe { PyArray4::borrow_from_array(&a, owner) }.into_any()
        }
        _ => {
            // SAFETY: as for f32, with 1-byte codes (int8, or fp8 cast below).
            let a = unsafe { ArrayView4::from_shape_ptr(dims, ptr.cast::<i8>()) };
            // SAFETY: as above.
            unsafe { PyArray4::borrow_from_array(&a, owner) }.into_any()
        }
    };
    finish(raw, writable, target)
}

/// Read-only unless `writable`, then cast to `target`'s dtype (same item size).
fn finish<'py>(raw: Bound<'py, PyAny>, writable: bool, target: Option<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    if !writable {
        raw.getattr("flags")?.setattr("writeable", false)?;
    }
    match target {
        Some(t) => raw.call_method1("view", (t,)),
        None => Ok(raw),
    }
}

/// A zero-copy float32 view of one layer's K (`value = false`) or V scales: int8
/// `[num_blocks, block_size, num_kv_heads]` (strided), fp8 `[num_kv_heads]`. `r.ptr` is
/// `KvCache::scales_ptr`'s.
pub(super) fn scale_view(r: Region<'_>, value: bool, writable: bool) -> PyResult<Bound<'_, PyAny>> {
    let py = r.owner.py();
    let (s, dtype, owner) = (r.s, r.dtype, r.owner);
    let (hk, bs) = (s.num_kv_heads, s.block_size);
    let ptr = r.ptr.cast::<f32>();
    let raw = match dtype.scale_kind() {
        ScaleKind::None => {
            return Err(invalid(py, format!("a {} KvCache has no scales (only int8 and fp8 caches do)", dtype.name())));
        }
        ScaleKind::PerToken => {
            let dims = (s.num_blocks, bs, hk).strides((2 * hk * bs, 1, bs));
            // SAFETY: the layer's scales are `[num_blocks][2][hk][bs]` f32 from `ptr`
            // (kv::quant); V's start hk * bs later, and the strides reach at most
            // (num_blocks - 1) * 2 hk bs + hk bs + (hk - 1) bs + bs - 1 < count. The buffer
            // lives as long as `owner`, the array's base.
            let a = unsafe { ArrayView3::from_shape_ptr(dims, ptr.wrapping_add(if value { hk * bs } else { 0 })) };
            // SAFETY: as above.
            unsafe { PyArray3::borrow_from_array(&a, owner) }.into_any()
        }
        ScaleKind::PerHead => {
            // SAFETY: `[2][hk]` f32 from `ptr` (kv::quant); V's are the second hk.
            let a = unsafe { ArrayView1::from_shape_ptr(hk, ptr.wrapping_add(if value { hk } else { 0 })) };
            // SAFETY: as above.
            unsafe { PyArray1::borrow_from_array(&a, owner) }.into_any()
        }
    };
    finish(raw, writable, None)
}

/// `KvCache::dequantize`'s K and V as float32 arrays `[num_blocks, block_size,
/// num_kv_heads, head_dim]`.
pub(super) fn dequantized(py: Python<'_>, s: KvShape, (k, v): (Vec<f32>, Vec<f32>)) -> PyResult<(Bound<'_, PyAny>, Bound<'_, PyAny>)> {
    let dims = [s.num_blocks, s.block_size, s.num_kv_heads, s.head_dim];
    let arr = |x: Vec<f32>| -> PyResult<Bound<'_, PyAny>> {
        let a = PyArray1::from_vec(py, x);
        Ok(a.reshape(dims)?.into_any())
    };
    Ok((arr(k)?, arr(v)?))
}
