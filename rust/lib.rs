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
//!
//! Prefix caching plugs into the pool: [`block_hash`] (chained block keys) ->
//! [`prefix_cache`] (key <-> block, idle blocks, metrics, events) with [`eviction`] and
//! [`pins`] -> [`pool_prefix`] (admission by token ids or block keys, on `BlockPool`).
//!
//! Every `unsafe` block states why it is sound (`// SAFETY:`), and an `unsafe fn` body
//! is not one implicit unsafe block: both lints below are errors.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod aligned;
pub mod allocator;
pub mod block_hash;
pub mod block_table;
pub mod error;
pub mod eviction;
pub mod kernel;
pub mod kv_storage;
pub mod pins;
pub mod pool;
mod pool_decode;
pub mod pool_prefix;
pub mod prefix_cache;
pub mod probe;
pub mod seq_map;
pub mod sim;
pub mod table_sync;
pub mod threads;
pub mod types;

#[cfg(feature = "python")]
pub mod bindings;

pub use error::{KvError, Result};
pub use block_hash::{BlockHasher, BlockKey};
pub use eviction::EvictionPolicy;
pub use pool::{BlockPool, PoolStats};
pub use prefix_cache::{CacheConfig, CacheEvent, CacheEventKind, CacheStats};
pub use kv_storage::{DType, KvCache, KvShape};
pub use types::{BlockId, SeqId};
