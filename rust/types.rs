//! Newtypes for the identifiers that flow through the pool, so that a physical block id
//! and a sequence id can never be mixed up by accident.

use std::fmt;

/// Index of a physical block in the pool, `0..num_blocks`.
///
/// `u32` keeps block tables compact and matches the int32 tables kernels read.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The block id as a table entry (int32 in every exported table).
    #[inline]
    pub fn as_i32(self) -> i32 {
        // Pool sizes are capped at `MAX_BLOCKS` (< 2^31), so this never truncates.
        self.0 as i32
    }

    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// First token slot of this block: `slot = block_id * block_size + offset`.
    #[inline]
    pub fn first_slot(self, block_size: usize) -> i64 {
        self.0 as i64 * block_size as i64
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}", self.0)
    }
}

/// A caller-chosen sequence (request) id. Python exposes it as a non-negative int that
/// fits in int64, so that batches of ids travel as int64 arrays.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sequence {}", self.0)
    }
}
