//! One sequence's block table: logical block `i` -> physical [`BlockId`], plus how many
//! tokens the sequence holds. Token `t` lives in logical block `t / block_size` at offset
//! `t % block_size`.

use crate::error::Result;
use crate::invalid;
use crate::types::BlockId;

/// Longest sequence, in tokens: lengths are exported as int32.
pub const MAX_SEQ_TOKENS: usize = i32::MAX as usize;

/// `tokens % block_size`: the filled slots of the last block of a sequence of `tokens`
/// tokens (0 when it is full). Block sizes are almost always powers of two, and a mask
/// is far cheaper than the division a decode hot path would otherwise do per sequence.
#[inline]
pub fn offset_in_block(tokens: usize, block_size: usize) -> usize {
    if block_size.is_power_of_two() {
        tokens & (block_size - 1)
    } else {
        tokens % block_size
    }
}

/// `len + n` if a sequence of `len` tokens may grow by `n` (at most [`MAX_SEQ_TOKENS`]).
pub fn checked_len(len: usize, n: usize) -> Result<usize> {
    match len.checked_add(n) {
        Some(total) if total <= MAX_SEQ_TOKENS => Ok(total),
        _ => Err(invalid!(
            "num_tokens: a sequence of {len} tokens cannot grow by {n}: the limit is {MAX_SEQ_TOKENS} tokens"
        )),
    }
}

/// Blocks needed to hold `tokens` tokens: `ceil(tokens / block_size)`.
#[inline]
pub fn blocks_for(tokens: usize, block_size: usize) -> usize {
    tokens.div_ceil(block_size)
}

/// The block table of one live sequence.
#[derive(Clone, Debug, Default)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    num_tokens: usize,
    /// Changes whenever an existing entry is replaced or removed (copy-on-write,
    /// truncation, a new sequence under a reused id). Appending entries keeps it, so a
    /// mirror of the table only has to copy the new tail. See `TableSync`.
    stamp: u64,
    /// `blocks.last()`, kept beside the length: a decode step then finds its slot in the
    /// sequence's own entry, without loading the table's heap buffer (a cache miss per
    /// sequence once the tables outgrow L1).
    last: Option<BlockId>,
}

impl BlockTable {
    pub fn with_blocks(blocks: Vec<BlockId>, num_tokens: usize, stamp: u64) -> Self {
        let last = blocks.last().copied();
        Self { blocks, num_tokens, stamp, last }
    }

    #[inline]
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// The last entry (the block that takes the next token unless it is full).
    #[inline]
    pub fn last(&self) -> Option<BlockId> {
        self.last
    }

    #[inline]
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    #[inline]
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    #[inline]
    pub fn restamp(&mut self, stamp: u64) {
        self.stamp = stamp;
    }

    #[inline]
    pub fn set_num_tokens(&mut self, n: usize) {
        self.num_tokens = n;
    }

    #[inline]
    pub fn push(&mut self, b: BlockId) {
        self.blocks.push(b);
        self.last = Some(b);
    }

    /// Replace the entry at `index` (copy-on-write of the last block).
    #[inline]
    pub fn replace(&mut self, index: usize, b: BlockId) {
        self.blocks[index] = b;
        self.last = self.blocks.last().copied();
    }

    /// Drop every entry from `keep` on and hand them to `f` (last one first, so that a
    /// cache evicting "tail before head" sees the tail released first).
    pub fn truncate_blocks(&mut self, keep: usize, mut f: impl FnMut(BlockId)) {
        while self.blocks.len() > keep {
            if let Some(b) = self.blocks.pop() {
                f(b);
            }
        }
        self.last = self.blocks.last().copied();
    }

    /// Take every entry out, for freeing the sequence.
    pub fn take_blocks(&mut self) -> Vec<BlockId> {
        self.num_tokens = 0;
        self.last = None;
        std::mem::take(&mut self.blocks)
    }

    /// Slot of token position `pos` (must be `< num_tokens`).
    #[inline]
    pub fn slot_of(&self, pos: usize, block_size: usize) -> i64 {
        self.blocks[pos / block_size].first_slot(block_size) + (pos % block_size) as i64
    }

    /// Filled slots of logical block `i`.
    #[inline]
    pub fn filled_in_block(&self, i: usize, block_size: usize) -> usize {
        let start = i * block_size;
        self.num_tokens.saturating_sub(start).min(block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_for_rounds_up() {
        assert_eq!(blocks_for(0, 16), 0);
        assert_eq!(blocks_for(1, 16), 1);
        assert_eq!(blocks_for(16, 16), 1);
        assert_eq!(blocks_for(17, 16), 2);
    }

    #[test]
    fn slots_and_fill() {
        let t = BlockTable::with_blocks(vec![BlockId(7), BlockId(2)], 20, 0);
        assert_eq!(t.slot_of(0, 16), 7 * 16);
        assert_eq!(t.slot_of(17, 16), 2 * 16 + 1);
        assert_eq!(t.filled_in_block(0, 16), 16);
        assert_eq!(t.filled_in_block(1, 16), 4);
    }
}
