//! Layer groups in one pool: several attention kinds (full, sliding window with sinks,
//! chunked) sharing one physical block space, one block table per (sequence, group).

pub mod cache;
pub mod prefix;
pub mod spec;

pub use spec::GroupSpec;
