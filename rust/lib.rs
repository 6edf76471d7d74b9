//! pykvpool: a KV-cache block allocator, KV storage with a paged decode-attention
//! kernel, and a deterministic serving simulator.
//!
//! The core (everything but [`bindings`]) is plain Rust with no Python dependency; it is
//! tested with `cargo test`. The `python` feature adds the PyO3 bindings that build the
//! private extension module `pykvpool._native`.
//!
//! Data flows one way: [`allocator`] (free list and refcounts) -> [`block_table`]
//! (one sequence's logical -> physical map) -> [`pool`] (sequences, slot mapping,
//! copy-on-write, exports, statistics) -> bindings -> the Python facade.

pub mod allocator;
pub mod block_table;
pub mod error;
pub mod pool;
pub mod sim;
pub mod table_sync;
pub mod types;

#[cfg(feature = "python")]
pub mod bindings;

pub use error::{KvError, Result};
pub use pool::{BlockPool, PoolStats};
pub use types::{BlockId, SeqId};
