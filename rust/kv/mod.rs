//! KV storage: page-aligned (huge-page when possible) memory ([`aligned`]), the element
//! types a cache holds ([`elem`]) and the paged `[layers, blocks, 2, block_size, heads,
//! head_dim]` cache itself ([`storage`]).

pub mod aligned;
pub mod elem;
pub mod storage;

pub use elem::{DType, Elem};
pub use storage::{KvCache, KvShape};
