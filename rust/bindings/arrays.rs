//! Array arguments of the KV-cache calls: float32 inputs read in logical order whatever
//! their strides, 2-D integer matrices (arrays or sequences of rows, ragged ones refused,
//! empty ones of any dtype accepted), and the checks on a caller's `out`. Objects that
//! export DLPack (CPU torch tensors) are read through a numpy view of their memory
//! (`dlpack.rs`), so they get the same checks, without a copy.

use std::ops::Range;
use std::sync::Mutex;

use numpy::{Element, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::type_object::PyTypeInfo;
use pyo3::types::{PyBytes, PyString};

use super::convert::int_vec;
use super::dlpack::numpy_view;
use super::errors::invalid;

/// The address ranges of every live `KvCache`'s storage (registered at creation, removed
/// when the cache is dropped): an `out` reaching any of them is refused even when no
/// `base` chain leads to the cache (a torch tensor over a view). Held only for the scan,
/// never across Python.
static CACHE_STORAGES: Mutex<Vec<Range<usize>>> = Mutex::new(Vec::new());

/// Record a cache's storage addresses (`KvCache` creation).
pub fn register_storage(r: Range<usize>) {
    CACHE_STORAGES.lock().unwrap_or_else(|p| p.into_inner()).push(r);
}

/// Forget a cache's storage addresses (`KvCache` drop).
pub fn release_storage(r: &Range<usize>) {
    let mut v = CACHE_STORAGES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = v.iter().position(|x| x == r) {
        v.swap_remove(i);
    }
}

fn overlaps_a_cache(r: &Range<usize>) -> bool {
    CACHE_STORAGES.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|s| overlaps(r, s))
}

/// A float32 array argument read for one call: its shape and its values in logical (C)
/// order. A C-contiguous array outside every cache is read in place (the numpy borrow is
/// held for the call, the slice goes into `py.detach`); any other layout (Fortran order,
/// slices, negative steps) and memory inside a `KvCache` (written under that cache's
/// lock, by the very call that reads it in `write`) are copied into a new C-order array.
pub struct F32Input<'py> {
    pub shape: Vec<usize>,
    data: Held<'py, f32>,
}

/// Values borrowed from a numpy array, or copied out of it.
enum Held<'py, T: Element> {
    Borrowed(PyReadonlyArrayDyn<'py, T>),
    Owned(Vec<T>),
}

impl<T: Element> Held<'_, T> {
    /// The values. A borrowed array was checked C-contiguous; should `as_slice` still
    /// refuse it, the empty slice fails the callee's length check (no panic, no misread).
    fn values(&self) -> &[T] {
        match self {
            Held::Borrowed(ro) => ro.as_slice().unwrap_or(&[]),
            Held::Owned(v) => v,
        }
    }
}

impl F32Input<'_> {
    /// The values in logical order, `shape.iter().product()` of them.
    pub fn values(&self) -> &[f32] {
        self.data.values()
    }
}

/// Elements a broadcast input may expand to when copied (256 MiB of f32).
const MAX_BROADCAST_ELEMS: usize = 1 << 26;

/// Read `arr` in place when C-contiguous and outside every cache, else copy it in logical
/// order (a broadcast array only up to [`MAX_BROADCAST_ELEMS`]).
fn hold<'py, T: Element + Copy>(arr: &Bound<'py, PyArrayDyn<T>>, name: &str) -> PyResult<Held<'py, T>> {
    let py = arr.py();
    let ro = arr.try_readonly().map_err(|e| invalid(py, format!("{name}: {e}")))?;
    // `as_slice` also accepts a Fortran-contiguous array (in memory order): only a
    // C-contiguous one may be read as one run.
    if arr.is_c_contiguous() && ro.as_slice().is_ok() && !overlaps_a_cache(&extent(arr)) {
        return Ok(Held::Borrowed(ro));
    }
    // A self-overlapping array (a zero stride: `broadcast_to`) holds more elements than its
    // memory: its copy is the one allocation its caller's memory does not bound.
    let span = extent(arr);
    if arr.len() > (span.end - span.start) / std::mem::size_of::<T>() && arr.len() > MAX_BROADCAST_ELEMS {
        return Err(invalid(
            py,
            format!(
                "{name}: a broadcast (zero-stride) array of {} elements would be copied; at most {MAX_BROADCAST_ELEMS} are",
                arr.len()
            ),
        ));
    }
    // numpy's own copy into a new C-order array (`PyArray_CopyInto`, no Python method a
    // subclass could override): it walks the strides in blocks, 10-20x faster than an
    // element-by-element walk on a transposed array. The copy is ours alone.
    let copy = PyArrayDyn::<T>::zeros(py, arr.shape(), false);
    arr.copy_to(&copy)?;
    let held = copy.try_readonly().map_err(|e| invalid(py, format!("{name}: {e}")))?;
    if held.as_slice().is_ok() {
        return Ok(Held::Borrowed(held));
    }
    Ok(Held::Owned(ro.as_array().iter().copied().collect()))
}

/// A float32 array argument ([`F32Input`]): a numpy array or a DLPack exporter (a CPU
/// torch tensor), any strides.
pub fn f32_input<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<F32Input<'py>> {
    if let Some(view) = numpy_view(obj, name)? {
        return f32_input(&view, name);
    }
    let py = obj.py();
    let arr = obj.cast::<PyArrayDyn<f32>>().map_err(|_| {
        let got = obj
            .cast::<PyUntypedArray>()
            .ok()
            .and_then(|a| a.dtype().str().ok().map(|s| s.to_string()))
            .unwrap_or_else(|| obj.get_type().name().map(|n| n.to_string()).unwrap_or_default());
        invalid(py, format!("{name} must be a float32 numpy array, got {got}"))
    })?;
    Ok(F32Input { shape: arr.shape().to_vec(), data: hold(arr, name)? })
}

/// A 1-D int argument (`slot_mapping`): a C-contiguous native int64 array (or tensor) is
/// read in place as [`f32_input`] reads floats; everything else goes through
/// [`int_vec`] (other widths, lists, strides: converted, with its checks and errors).
pub struct IntInput<'py>(Held<'py, i64>);

impl IntInput<'_> {
    pub fn values(&self) -> &[i64] {
        self.0.values()
    }
}

pub fn int_input<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<IntInput<'py>> {
    if let Some(view) = numpy_view(obj, name)? {
        return int_input(&view, name);
    }
    match obj.cast::<PyArrayDyn<i64>>() {
        Ok(arr) if arr.ndim() == 1 => Ok(IntInput(hold(arr, name)?)),
        _ => Ok(IntInput(Held::Owned(int_vec(obj, name)?))),
    }
}

/// A 2-D integer array, or a sequence of equal-length rows of ints, with `cols` columns
/// (any number when `None`), flattened row-major, with its row and column counts. Empty
/// inputs are zero rows, whatever their dtype (`[]`, `np.empty((0, 2))`).
pub fn int_matrix(obj: &Bound<'_, PyAny>, name: &str, cols: Option<usize>) -> PyResult<(Vec<i64>, usize, usize)> {
    let py = obj.py();
    let fits = |c: usize| cols.is_none_or(|w| w == c);
    let what = match cols {
        Some(c) => format!("a [n, {c}] integer array or a sequence of [{c}] rows"),
        None => "a 2-D integer array or a sequence of equal-length rows".to_string(),
    };
    if let Some(view) = numpy_view(obj, name)? {
        return int_matrix(&view, name, cols);
    }
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        let shape = arr.shape().to_vec();
        return match shape[..] {
            // No values to misread: any dtype (numpy makes empty arrays float64).
            [0] => Ok((Vec::new(), 0, cols.unwrap_or(0))),
            [r, c] if fits(c) && r * c == 0 => Ok((Vec::new(), r, c)),
            [r, c] if fits(c) => Ok((int_vec(&obj.call_method0("ravel")?, name)?, r, c)),
            _ => Err(invalid(py, format!("{name} must be {what}, got shape {shape:?}"))),
        };
    }
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(invalid(py, format!("{name} must be {what}, got a string")));
    }
    let rows = obj.try_iter().map_err(|_| invalid(py, format!("{name} must be {what}")))?;
    let (mut flat, mut n, mut width) = (Vec::new(), 0usize, cols);
    for row in rows {
        let row = int_vec(&row?, &format!("{name}[{n}]"))?;
        match width {
            Some(w) if w != row.len() => {
                return Err(invalid(py, format!("{name} must be {what}: row {n} has {} entries, not {w}", row.len())))
            }
            _ => width = Some(row.len()),
        }
        flat.extend(row);
        n += 1;
    }
    Ok((flat, n, width.unwrap_or(0)))
}

/// Byte addresses `[lo, hi)` that an array's elements occupy (empty for an empty array),
/// whatever its strides.
fn extent<T: Element>(arr: &Bound<'_, PyArrayDyn<T>>) -> Range<usize> {
    if arr.shape().contains(&0) {
        return 0..0;
    }
    let data = arr.data() as usize;
    let (mut lo, mut hi) = (0isize, std::mem::size_of::<T>() as isize);
    for (&n, &st) in arr.shape().iter().zip(arr.strides()) {
        let span = (n as isize - 1) * st;
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    data.wrapping_add_signed(lo)..data.wrapping_add_signed(hi)
}

/// The rows of a C-contiguous uint8 `[rows, cols]` array argument, as one slice in row
/// order: read in place, or copied first when it shares memory with a `KvCache` (a byte
/// view of a cache, written under that cache's lock by the call reading it).
/// `TypeError` for anything but a uint8 numpy array; `InvalidArgumentError` naming `name`
/// for another shape or a layout that is not C-contiguous.
pub fn byte_rows<'py>(obj: &Bound<'py, PyAny>, name: &str, rows: usize, cols: usize) -> PyResult<ByteRows<'py>> {
    let py = obj.py();
    let arr = obj.cast::<PyArrayDyn<u8>>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!("{name} must be a uint8 numpy array, got {}", obj.get_type().name().map_or_else(|_| "?".into(), |n| n.to_string())))
    })?;
    if arr.shape() != [rows, cols] {
        return Err(invalid(py, format!("{name} must have shape [{rows}, {cols}], got {:?}", arr.shape())));
    }
    if !arr.is_c_contiguous() {
        return Err(invalid(py, format!("{name} must be C-contiguous")));
    }
    let ro = arr.try_readonly().map_err(|e| invalid(py, format!("{name}: {e}")))?;
    if overlaps_a_cache(&extent(arr)) {
        let copy = ro.as_slice().map_err(|e| invalid(py, format!("{name}: {e}")))?.to_vec();
        return Ok(ByteRows::Copied(copy));
    }
    Ok(ByteRows::Borrowed(ro))
}

/// [`byte_rows`]' result.
pub enum ByteRows<'py> {
    Borrowed(PyReadonlyArrayDyn<'py, u8>),
    Copied(Vec<u8>),
}

impl ByteRows<'_> {
    /// The bytes, row after row.
    pub fn bytes(&self) -> &[u8] {
        match self {
            // A C-contiguous array (checked by `byte_rows`) is one slice.
            Self::Borrowed(a) => a.as_slice().unwrap_or(&[]),
            Self::Copied(v) => v,
        }
    }
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// The caller's `out` for an `[n, hq, d]` result: a C-contiguous, writeable float32
/// array of that shape that shares no memory with `q`, with the cache's `storage` or with
/// any view of a `Cache` object (the `KvCache` class: the kernel reads the one while it
/// writes the other with the GIL released). Generic so this module needs no class.
pub fn checked_out<'py, Cache: PyTypeInfo>(
    o: &Bound<'py, PyAny>,
    q: &Bound<'py, PyAny>,
    shape: [usize; 3],
    storage: &Range<usize>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let py = o.py();
    if let Some(view) = numpy_view(o, "out")? {
        let q = numpy_view(q, "q")?.unwrap_or_else(|| q.clone());
        return checked_out::<Cache>(&view, &q, shape, storage);
    }
    let arr = o.cast::<PyArrayDyn<f32>>().map_err(|_| invalid(py, "out must be a float32 numpy array"))?;
    if arr.shape() != shape {
        return Err(invalid(py, format!("out must have shape {shape:?}, got {:?}", arr.shape())));
    }
    if !arr.is_c_contiguous() {
        return Err(invalid(py, "out must be C-contiguous"));
    }
    let range = extent(arr);
    let q_range = q.cast::<PyArrayDyn<f32>>().map(extent).unwrap_or(0..0);
    if overlaps(&range, storage) || overlaps(&range, &q_range) {
        return Err(invalid(py, "out must not share memory with q or with the cache's K/V"));
    }
    // A view of another cache would be written while that cache may be written or read
    // by another thread under its own lock. numpy stops collapsing a view's `base` at a
    // non-array owner, so the chain of `base` attributes (as_strided's wrapper has one
    // too) leads to the cache; it is short, the bound only guards against odd objects.
    let mut base = o.getattr("base")?;
    for _ in 0..32 {
        if base.is_instance_of::<Cache>() {
            return Err(invalid(py, format!("out must not be a view of a {}", Cache::type_object(py).name()?)));
        }
        match base.getattr_opt("base")? {
            Some(next) if !next.is_none() => base = next,
            _ => break,
        }
    }
    if overlaps_a_cache(&range) {
        return Err(invalid(py, format!("out must not share memory with a {}", Cache::type_object(py).name()?)));
    }
    Ok(arr.clone())
}
