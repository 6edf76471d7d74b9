//! The token cursor of a cacheable sequence: the token ids the pool has seen for it and
//! the chained keys of its full blocks, kept in step as the sequence grows or is cut.

use super::block_hash::BlockKey;

/// The token ids of a cacheable sequence and the keys of its full blocks.
#[derive(Clone, Debug, Default)]
pub struct TokenCursor {
    pub tokens: Vec<u32>,
    pub keys: Vec<BlockKey>,
    pub extra: Option<u64>,
}

impl TokenCursor {
    pub fn truncate(&mut self, len: usize, block_size: usize) {
        self.tokens.truncate(len);
        self.keys.truncate(len / block_size);
    }
}
