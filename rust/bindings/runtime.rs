//! The machine for Python: bandwidth and FLOP/s probes, the kernels' thread count, the
//! CPU's SIMD features and the kernel paths it runs.

use pyo3::prelude::*;

use super::attention::Tables;
use super::convert::arg;
use super::errors::{invalid, IntoPyResult};
use super::kv::PyKvCache;
use crate::attention::{self, Isa};
use crate::runtime::clock::Clock;

/// Read bandwidth in bytes/s: the best of ``passes`` multi-accumulator SIMD sweeps with
/// ``threads`` threads, each thread streaming one contiguous share.
///
/// Without ``cache`` the sweep reads a fresh ``nbytes`` buffer of 2 MiB-aligned,
/// huge-page-advised memory, allocated like a KV cache. With ``cache`` it reads that
/// cache's own storage (every layer's K and V, scales and padding: ``cache.nbytes``
/// bytes plus under 4 KiB per layer) front to back: the pages the kernel reads, the
/// fair ceiling for :func:`decode_attention` on a machine (a VM) where the read rate
/// depends on where pages landed.
///
/// With ``cache``, ``block_tables`` and ``seq_lens`` it reads instead exactly what
/// :func:`decode_attention` on ``layer`` reads for those tables (every key visible),
/// in its order and split into its work items: block by block in table order, each
/// block's K and V tiles of every KV head (one run of ``2 * num_kv_heads *
/// block_size * head_dim`` elements; whole blocks, a last block's unused slots too)
/// and, for int8, its scales.
/// The rate counts those bytes. With a scattered table each block starts at a random
/// address, and a short run (an int8 block of 8 heads of 16 x 128 is 32 KiB) reads
/// slower than a stream: this is the ceiling of that call's access pattern.
///
/// Args:
///     nbytes: bytes of the fresh buffer, 1 MiB..1 TiB (default 256 MiB); not with
///         ``cache``.
///     threads: threads, ``1..=1024`` (default: the kernel pool's, see
///         :func:`set_num_threads`).
///     cache: a :class:`KvCache` of at least 1 MiB to read instead.
///     passes: sweeps, ``1..=1000`` (default 7); the best is kept.
///     clock: ``"wall"`` (default) times a sweep from its start to its last thread's end;
///         ``"cpu"`` by the CPU seconds of its busiest thread, which leave out the time a
///         shared virtual machine's CPU was taken away (steal) or given to another
///         process, as kernel calls timed by thread CPU time do.
///     block_tables: int ``[n, max_blocks]``, as for :func:`decode_attention`; with
///         ``seq_lens`` and ``cache`` only.
///     seq_lens: ``n`` lengths in tokens, as for :func:`decode_attention`.
///     layer: the cache layer read with ``block_tables`` (default 0).
///
/// Raises:
///     TypeError: ``clock`` not a str; a table or length not an integer array.
///     InvalidArgumentError: both ``nbytes`` and ``cache``, ``nbytes`` outside
///         1 MiB..1 TiB, a cache smaller than 1 MiB, ``passes`` outside ``1..=1000``, a
///         thread count outside ``1..=1024``, ``clock`` neither ``"wall"`` nor ``"cpu"``;
///         ``block_tables`` without ``seq_lens`` (or the reverse), either or ``layer``
///         without ``cache``, ``layer`` out of range or without tables, a table or length
///         :func:`decode_attention` would refuse, or tables that read under 1 MiB.
#[pyfunction]
#[pyo3(signature = (nbytes = None, threads = None, *, cache = None, passes = None, clock = Clock::Wall, block_tables = None, seq_lens = None, layer = 0))]
#[pyo3(text_signature = "(nbytes=None, threads=None, *, cache=None, passes=None, clock='wall', block_tables=None, seq_lens=None, layer=0)")]
#[allow(clippy::too_many_arguments)]
fn read_bandwidth(
    py: Python<'_>,
    #[pyo3(from_py_with = arg::nbytes)] nbytes: Option<usize>,
    #[pyo3(from_py_with = arg::threads)] threads: Option<usize>,
    cache: Option<&Bound<'_, PyKvCache>>,
    #[pyo3(from_py_with = arg::passes)] passes: Option<usize>,
    #[pyo3(from_py_with = arg::clock)] clock: Clock,
    block_tables: Option<&Bound<'_, PyAny>>,
    seq_lens: Option<&Bound<'_, PyAny>>,
    #[pyo3(from_py_with = arg::layer)] layer: usize,
) -> PyResult<f64> {
    let tables = match (block_tables, seq_lens) {
        (Some(t), Some(l)) => Some(Tables::padded(py, t, l)?),
        (None, None) => None,
        _ => return Err(invalid(py, String::from("give block_tables and seq_lens together"))),
    };
    match cache {
        Some(_) if nbytes.is_some() => Err(invalid(py, String::from("give nbytes or cache, not both"))),
        Some(c) => {
            let c = c.get();
            let probe = |kv: &crate::kv::KvCache| match tables {
                Some(t) => {
                    let t = t.build(kv.shape().block_size, kv.shape().num_blocks, 0)?;
                    attention::read_probe::decode_read_bandwidth(kv, layer, &t, threads, passes, clock)
                }
                None if layer != 0 => Err(crate::invalid!("layer needs block_tables and seq_lens")),
                None => crate::runtime::probe::read_bandwidth_of(kv.bytes(), threads, passes, clock),
            };
            py.detach(|| probe(&c.read())).py_err(py)
        }
        None if tables.is_some() || layer != 0 => {
            Err(invalid(py, String::from("block_tables, seq_lens and layer need a cache")))
        }
        None => py.detach(|| crate::runtime::probe::read_bandwidth(nbytes, threads, passes, clock)).py_err(py),
    }
}

/// Peak f32 FLOP/s of register-only FMA chains (2 FLOP per lane per FMA), best of 3 runs.
///
/// Args:
///     threads: threads, ``1..=1024`` (default: the kernel pool's).
///     clock: ``"wall"`` (default) or ``"cpu"``, as for :func:`read_bandwidth`.
///
/// Raises:
///     TypeError: ``clock`` not a str.
///     InvalidArgumentError: a thread count outside ``1..=1024``, or ``clock`` neither
///         ``"wall"`` nor ``"cpu"``.
#[pyfunction]
#[pyo3(signature = (threads = None, *, clock = Clock::Wall))]
#[pyo3(text_signature = "(threads=None, *, clock='wall')")]
fn peak_flops(
    py: Python<'_>,
    #[pyo3(from_py_with = arg::threads)] threads: Option<usize>,
    #[pyo3(from_py_with = arg::clock)] clock: Clock,
) -> PyResult<f64> {
    py.detach(|| crate::runtime::probe::peak_flops(threads, clock)).py_err(py)
}

/// Set the threads of the kernel pool (initially ``PYKVPOOL_NUM_THREADS`` or all CPUs);
/// calls already running keep their pool. A call that one thread can do (a one-thread
/// pool, or a single work item) runs on the calling thread, without the hand-over to the
/// pool (30-100 us on a shared machine).
///
/// Args:
///     n: threads, ``1..=1024``.
///
/// Raises:
///     InvalidArgumentError: ``n`` outside ``1..=1024``, or the OS refused the threads.
#[pyfunction]
fn set_num_threads(py: Python<'_>, #[pyo3(from_py_with = arg::n_threads)] n: usize) -> PyResult<()> {
    let max = crate::runtime::threads::MAX_THREADS;
    if !(1..=max).contains(&n) {
        return Err(invalid(py, format!("n must be in 1..={max} threads, got {n}")));
    }
    py.detach(|| crate::runtime::threads::set_num_threads(n)).py_err(py)
}

/// Threads of the kernel pool.
///
/// Raises:
///     InvalidArgumentError: the pool could not be started (the OS refused the threads).
#[pyfunction]
fn get_num_threads(py: Python<'_>) -> PyResult<usize> {
    py.detach(crate::runtime::threads::num_threads).py_err(py)
}

/// SIMD features of this CPU relevant to the kernels.
///
/// Returns:
///     Feature names, e.g. ``["avx2", "fma", "avx512bf16"]`` or ``["neon"]``.
#[pyfunction]
fn cpu_features() -> Vec<&'static str> {
    attention::cpu_features().to_vec()
}

/// Decode-attention paths this CPU supports, fastest last: ``"scalar"`` always, then
/// ``"avx2"`` and ``"avx512"`` on x86-64 or ``"neon"`` on aarch64 when the CPU has them.
#[pyfunction]
fn kernel_paths() -> Vec<&'static str> {
    Isa::available().into_iter().map(Isa::name).collect()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(peak_flops, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_features, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_paths, m)?)?;
    Ok(())
}
