//! The one error type of the core. Every fallible operation returns it, and it is
//! returned *before* any state changes: a failed operation leaves the pool as it was.
//! The bindings map each variant to one Python exception class.

use thiserror::Error;

/// Errors of pykvpool's core.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KvError {
    /// Not enough free (or evictable) blocks for the whole request.
    #[error("pool exhausted: requested {requested} blocks, {free} free")]
    PoolExhausted { requested: usize, free: usize },

    /// A sequence id that is not live in the pool (never added, or already freed).
    #[error("unknown sequence id {0}")]
    UnknownSequence(u64),

    /// A sequence id that is already live (add or fork target).
    #[error("sequence id {0} already exists")]
    DuplicateSequence(u64),

    /// Any other rejected input: a bad size, count, shape, dtype or index.
    #[error("{0}")]
    InvalidArgument(String),

    /// A tier below the device could not store or read a block: the disk is full, a
    /// file or folder may not be read or written, or the folder holds another model's
    /// blocks. Nothing was stored or served.
    #[error("{message}")]
    Storage { fault: StorageFault, message: String },
    /// An internal consistency check failed (`check_invariants`). Always a bug.
    #[error("invariant violated: {0}")]
    Invariant(String),
}

/// What kind of storage failure a [`KvError::Storage`] is (the bindings choose the Python
/// exception by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// No space left on the device (`ENOSPC`) or the tier's byte budget is spent.
    Full,
    /// The folder or a file may not be read or written (`EACCES`, `EPERM`).
    PermissionDenied,
    /// The folder holds blocks of another model or layout (its fingerprint differs).
    ForeignFolder,
    /// Any other I/O failure.
    Io,
}

/// Shorthand used across the core.
pub type Result<T, E = KvError> = std::result::Result<T, E>;

/// Build an [`KvError::InvalidArgument`] with `format!` syntax.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::error::KvError::InvalidArgument(format!($($arg)*)) };
}

// Fallible allocation: every buffer whose size a caller chooses (a pool's block count, a
// workload's length) is made through these, so a host that cannot hold it gets an
// `InvalidArgument` naming what was asked for instead of an abort.

/// An empty vector with room for `n` entries, or `InvalidArgument` (naming `what`) when
/// the host cannot provide it: never an abort.
pub fn vec_for<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        let mib = (n as f64) * (std::mem::size_of::<T>() as f64) / (1u64 << 20) as f64;
        invalid!("{what}: cannot allocate {n} entries ({mib:.0} MiB)")
    })?;
    Ok(v)
}

/// `vec![value; n]` through [`vec_for`].
pub fn filled<T: Clone>(value: T, n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = vec_for(n, what)?;
    v.resize(n, value);
    Ok(v)
}

/// `(0..n).map(f).collect()` through [`vec_for`].
pub fn collect_n<T>(n: usize, what: &str, f: impl FnMut(usize) -> T) -> Result<Vec<T>> {
    let mut v = vec_for(n, what)?;
    v.extend((0..n).map(f));
    Ok(v)
}
