//! KV storage: page-aligned (huge-page when possible) memory ([`aligned`]), the element
//! types a cache holds ([`elem`], the fp8 codes in [`fp8`]), the paged `[layers, blocks,
//! 2, block_size, heads, head_dim]` cache itself ([`storage`]) and the scales of its
//! 8-bit dtypes ([`quant`]: the layout contract of the kernels; `storage_quant`: the
//! quantizing writes).

pub mod aligned;
pub mod elem;
pub mod fp8;
pub mod quant;
pub mod storage;
mod storage_quant;

pub use elem::{DType, Elem};
pub use storage::{BlockGeometry, KvCache, KvShape};
