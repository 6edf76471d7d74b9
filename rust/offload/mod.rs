//! Where a cached block's bytes go below the device: the host tier (G2, a slab of block
//! slots in its own memory budget), the disk tier (G3, one checksummed file per block in
//! a folder) and the transfer engine that moves whole blocks between them and the
//! device's `KvCache` on its own threads. Which blocks live in which tier is the prefix
//! cache's decision; this module stores and moves bytes, and [`store`] carries out those
//! decisions in their order.

pub mod disk;
pub mod host;
pub mod store;
pub mod transfer;
