//! Arrays of other libraries (CPU torch tensors, anything exporting DLPack): viewed as a
//! numpy array over the same memory (`numpy.from_dlpack`, no copy) so that every array
//! argument goes through the one set of numpy checks in `arrays.rs` and `convert.rs`.
//! Memory on another device is refused before anything reads it.

use numpy::PyUntypedArray;
use pyo3::prelude::*;

use super::errors::invalid;

/// DLPack's `kDLCPU` device type (`__dlpack_device__()[0]`).
const DL_CPU: i64 = 1;

/// `None` when `obj` is a numpy array or exports no DLPack (the caller's own checks
/// apply); else a numpy array over `obj`'s memory, same shape, strides and dtype.
///
/// Errors (`InvalidArgumentError` naming `name`): a device other than the CPU, a torch
/// tensor whose negative or conjugate bit is set (DLPack carries the memory, not the bit:
/// read through it, `-x` would be `x`), or an export numpy cannot take (a dtype numpy
/// lacks, such as bfloat16; a torch tensor that requires grad).
pub fn numpy_view<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    if obj.cast::<PyUntypedArray>().is_ok() || !obj.hasattr("__dlpack__")? {
        return Ok(None);
    }
    let py = obj.py();
    let what = || describe(obj);
    let device = obj
        .call_method0("__dlpack_device__")
        .and_then(|d| d.extract::<(i64, i64)>())
        .map_err(|e| invalid(py, format!("{name}: {} has no usable __dlpack_device__ ({e})", what())))?;
    if device.0 != DL_CPU {
        return Err(invalid(
            py,
            format!("{name} must be in CPU memory, got {} on DLPack device {:?}", what(), device),
        ));
    }
    refuse_lazy_views(obj, name, &what)?;
    let arr = py
        .import("numpy")?
        .getattr("from_dlpack")?
        .call1((obj,))
        .map_err(|e| invalid(py, format!("{name}: {} cannot be read as a numpy array ({e})", what())))?;
    Ok(Some(arr))
}

/// Refuse a tensor that is a lazy view torch resolves on read (`is_neg()`: `torch._neg_view`,
/// the imaginary part of a conjugate; `is_conj()`): its memory holds other values than the
/// tensor shows, as torch's own `.numpy()` says when it refuses the same tensors.
fn refuse_lazy_views(obj: &Bound<'_, PyAny>, name: &str, what: &dyn Fn() -> String) -> PyResult<()> {
    for (method, bit, fix) in [("is_neg", "negative", "resolve_neg"), ("is_conj", "conjugate", "resolve_conj")] {
        let set = match obj.getattr(method) {
            Ok(f) => f.call0().and_then(|r| r.is_truthy()).unwrap_or(false),
            Err(_) => false,
        };
        if set {
            return Err(invalid(
                obj.py(),
                format!("{name}: {} has its {bit} bit set; pass {name}.{fix}() instead", what()),
            ));
        }
    }
    Ok(())
}

/// `torch.Tensor of dtype torch.float64` (type and dtype when it has one).
fn describe(obj: &Bound<'_, PyAny>) -> String {
    let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    match obj.getattr("dtype").ok().and_then(|d| d.str().ok()) {
        Some(d) => format!("a {ty} of dtype {d}"),
        None => format!("a {ty}"),
    }
}
