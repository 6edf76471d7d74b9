//! The docstrings of the exception classes that `errors.rs` builds.
//!
//! The classes are made with `type(name, bases, ns)`, which takes the doc as a string, so
//! this table turns `///` lines into those strings. Like every other docstring of the
//! extension, the `///` lines are written by `tests/docsync.py` from
//! `pykvpool/_native.pyi`: edit the stub, not these lines.

macro_rules! exception_docs {
    ($($(#[doc = $line:literal])* $name:ident,)*) => {
        /// The docstring of exception class `name` ("" for a class the table lacks):
        /// its `///` lines joined, minus the one leading space rustc keeps, as PyO3 does
        /// for a `#[pyclass]`.
        pub fn text(name: &str) -> String {
            let lines: &[&str] = match name {
                $(stringify!($name) => &[$($line),*],)*
                _ => &[],
            };
            lines.iter().map(|l| l.strip_prefix(' ').unwrap_or(l)).collect::<Vec<_>>().join("\n")
        }
    };
}

exception_docs! {
    /// Base class of every pykvpool error: ``except pykvpool.KvPoolError`` catches them all.
    KvPoolError,
    /// Not enough free blocks for the whole operation; nothing was changed.
    ///
    /// Also a ``MemoryError``. Attributes: ``requested``, the blocks the operation needed, and
    /// ``free``, the blocks that were free (both in blocks).
    PoolExhaustedError,
    /// A sequence id that is not live in the pool; nothing was changed.
    ///
    /// Also a ``KeyError``. Attribute: ``seq_id``, the id.
    UnknownSequenceError,
    /// A rejected argument value (a size, count, shape, dtype, index or option); nothing was
    /// changed.
    ///
    /// Also a ``ValueError``. The message names the argument.
    InvalidArgumentError,
    /// A sequence id that is already live (the target of an add or a fork); nothing was changed.
    ///
    /// An :class:`InvalidArgumentError` (so also a ``ValueError``). Attribute: ``seq_id``, the id.
    DuplicateSequenceError,
    /// An internal consistency check failed: always a pykvpool bug, please report it.
    ///
    /// Also an ``AssertionError``. :meth:`BlockPool.check_invariants` raises it on purpose; any
    /// other call raising it has found a bug.
    InvariantError,
}
