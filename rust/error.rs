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

    /// An internal consistency check failed (`check_invariants`). Always a bug.
    #[error("invariant violated: {0}")]
    Invariant(String),
}

/// Shorthand used across the core.
pub type Result<T, E = KvError> = std::result::Result<T, E>;

/// Build an [`KvError::InvalidArgument`] with `format!` syntax.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::error::KvError::InvalidArgument(format!($($arg)*)) };
}
