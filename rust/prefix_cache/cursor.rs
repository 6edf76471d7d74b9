//! The token cursor of a cacheable sequence: the token ids the pool has seen for it and
//! the chained keys of its full blocks, kept in step as the sequence grows or is cut.

use super::block_hash::{BlockHasher, BlockKey, ROOT_PARENT};

/// The token ids of a cacheable sequence and the keys of its full blocks.
#[derive(Clone, Debug, Default)]
pub struct TokenCursor {
    pub tokens: Vec<u32>,
    pub keys: Vec<BlockKey>,
    pub extra: Option<u64>,
    /// The ids arrive after the tokens are stored (a sequence joined at its hit): a growth
    /// without ids keeps the record, which `store_tokens` catches up once the KV is
    /// computed. Otherwise a growth without ids drops it.
    pub deferred: bool,
}

impl TokenCursor {
    /// Append token ids and the chained keys of every block they fill; returns the index
    /// of the first new key (the new keys are `keys[first..]`).
    pub fn push_tokens(&mut self, tokens: &[u32], block_size: usize, hasher: BlockHasher) -> usize {
        let first = self.keys.len();
        self.tokens.extend_from_slice(tokens);
        let mut scratch = Vec::new();
        for i in first..self.tokens.len() / block_size {
            let parent = if i == 0 { ROOT_PARENT } else { self.keys[i - 1] };
            let k = hasher.block_key(parent, &self.tokens[i * block_size..(i + 1) * block_size], self.extra, &mut scratch);
            self.keys.push(k);
        }
        first
    }

    pub fn truncate(&mut self, len: usize, block_size: usize) {
        self.tokens.truncate(len);
        self.keys.truncate(len / block_size);
    }
}
