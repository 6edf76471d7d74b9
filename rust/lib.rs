//! pykvpool: a KV-cache block allocator, KV storage with a paged decode-attention
//! kernel, and a deterministic serving simulator.
//!
//! The core (everything but the `bindings` module) is plain Rust with no Python dependency; it is
//! tested with `cargo test`. The `python` feature adds the PyO3 bindings that build the
//! private extension module `pykvpool._native`.
//!
//! One folder per concept; dependencies point one way, down this list (`tests/
//! test_layout_rust.py` fails on any import cycle):
//!
//! - [`error`], [`types`]: the crate-wide error and the block and sequence ids;
//! - [`runtime`]: the kernels' thread pool and the machine probes;
//! - [`prefix_cache`]: chained block keys, the key <-> block cache, eviction policies,
//!   pins, events and the token cursor of a cacheable sequence;
//! - [`pool`]: the allocator (free list and refcounts), the sequence map, the attention
//!   kinds of layer groups and their block tables, `BlockPool` (admission, growth and the
//!   one-pass decode, prefix caching on every group, exports and incremental table sync);
//! - [`kv`]: aligned memory, the element types and the paged KV storage;
//! - [`offload`]: the tiers below the device (host memory, disk files) and the transfer
//!   engine that moves blocks' bytes between them and a `KvCache`;
//! - [`attention`]: the decode-attention kernel (one file per instruction set, the
//!   dispatch, the block tables it reads);
//! - [`sim`]: the serving simulator over a real `BlockPool`;
//! - `bindings` (feature `python`): the Python classes and functions.
//!
//! Every `unsafe` block states why it is sound (`// SAFETY:`), and an `unsafe fn` body
//! is not one implicit unsafe block: both lints below are errors.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]
// The crate is documented for its developers (`cargo doc --document-private-items`): a
// public item's doc linking to the private helper it relies on is the point, not a leak.
#![allow(rustdoc::private_intra_doc_links)]

pub mod attention;
pub mod error;
pub mod kv;
pub mod offload;
pub mod pool;
pub mod prefix_cache;
pub mod runtime;
pub mod sim;
pub mod types;

#[cfg(feature = "python")]
pub mod bindings;

pub use error::{KvError, Result};
pub use kv::{DType, KvCache, KvShape};
pub use pool::{BlockPool, GroupSpec, PoolStats, StepOutput};
pub use prefix_cache::block_hash::{BlockHasher, BlockKey};
pub use prefix_cache::eviction::EvictionPolicy;
pub use prefix_cache::{CacheConfig, CacheEvent, CacheEventKind, CacheStats};
pub use types::{BlockId, SeqId};
