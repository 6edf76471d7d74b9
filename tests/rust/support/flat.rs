//! The one-group call shapes these tests were written in: slots appended to a flat
//! `Vec<i64>`, copy-on-write pairs to a `Vec`, a table as its list of blocks. Each call is
//! one `BlockPool` call on a pool with one full-attention group, its [`StepOutput`]'s single
//! row appended to the caller's vectors (as the tests' models expect).

// Each test binary uses the calls it needs.
#![allow(dead_code)]

use pykvpool::prefix_cache::block_hash::BlockKey;
use pykvpool::{BlockId, BlockPool, Result, SeqId, StepOutput};

fn extend(out: &StepOutput, slots: &mut Vec<i64>, cow: Option<&mut Vec<(BlockId, BlockId)>>) {
    slots.extend_from_slice(&out.slots[..out.total_tokens]);
    if let Some(c) = cow {
        c.extend_from_slice(&out.cow);
    }
}

pub trait Flat {
    fn add_sequence_flat(&mut self, seq: SeqId, n: usize, slots: &mut Vec<i64>) -> Result<()>;
    fn append_flat(&mut self, seq: SeqId, n: usize, slots: &mut Vec<i64>, cow: &mut Vec<(BlockId, BlockId)>) -> Result<()>;
    fn add_sequence_tokens_flat(&mut self, seq: SeqId, tokens: &[u32], extra: Option<u64>, slots: &mut Vec<i64>) -> Result<usize>;
    fn add_sequence_tokens_cow_flat(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        extra: Option<u64>,
        slots: &mut Vec<i64>,
        cow: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<usize>;
    fn add_sequence_block_keys_flat(&mut self, seq: SeqId, keys: &[BlockKey], len: usize, slots: &mut Vec<i64>) -> Result<usize>;
    fn append_tokens_flat(&mut self, seq: SeqId, tokens: &[u32], slots: &mut Vec<i64>, cow: &mut Vec<(BlockId, BlockId)>) -> Result<()>;
    /// The blocks of `seq`'s table (one group, no holes).
    fn blocks_of(&self, seq: SeqId) -> Result<Vec<BlockId>>;
    /// The slot of position `pos` of `seq`.
    fn slot_of(&self, seq: SeqId, pos: usize) -> Result<i64>;
}

impl Flat for BlockPool {
    fn add_sequence_flat(&mut self, seq: SeqId, n: usize, slots: &mut Vec<i64>) -> Result<()> {
        let mut out = StepOutput::default();
        self.add_sequence(seq, n, &mut out)?;
        extend(&out, slots, None);
        Ok(())
    }

    fn append_flat(&mut self, seq: SeqId, n: usize, slots: &mut Vec<i64>, cow: &mut Vec<(BlockId, BlockId)>) -> Result<()> {
        let mut out = StepOutput::default();
        self.step(&[seq], &[n], &mut out)?;
        extend(&out, slots, Some(cow));
        Ok(())
    }

    fn add_sequence_tokens_flat(&mut self, seq: SeqId, tokens: &[u32], extra: Option<u64>, slots: &mut Vec<i64>) -> Result<usize> {
        let mut out = StepOutput::default();
        let c = self.add_sequence_tokens(seq, tokens, extra, &mut out)?;
        extend(&out, slots, None);
        Ok(c)
    }

    fn add_sequence_tokens_cow_flat(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        extra: Option<u64>,
        slots: &mut Vec<i64>,
        cow: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<usize> {
        let mut out = StepOutput::default();
        let c = self.add_sequence_tokens(seq, tokens, extra, &mut out)?;
        extend(&out, slots, Some(cow));
        Ok(c)
    }

    fn add_sequence_block_keys_flat(&mut self, seq: SeqId, keys: &[BlockKey], len: usize, slots: &mut Vec<i64>) -> Result<usize> {
        let mut out = StepOutput::default();
        let c = self.add_sequence_block_keys(seq, keys, len, &mut out)?;
        extend(&out, slots, None);
        Ok(c)
    }

    fn append_tokens_flat(&mut self, seq: SeqId, tokens: &[u32], slots: &mut Vec<i64>, cow: &mut Vec<(BlockId, BlockId)>) -> Result<()> {
        let mut out = StepOutput::default();
        self.append_tokens(seq, tokens, &mut out)?;
        extend(&out, slots, Some(cow));
        Ok(())
    }

    fn blocks_of(&self, seq: SeqId) -> Result<Vec<BlockId>> {
        Ok(self.table(seq, 0)?.stored().map(|(_, b)| b).collect())
    }

    fn slot_of(&self, seq: SeqId, pos: usize) -> Result<i64> {
        let bs = self.block_size();
        let b = self.table(seq, 0)?.get(pos / bs).ok_or_else(|| pykvpool::KvError::Invariant(format!("no block at {pos}")))?;
        Ok(b.first_slot(bs) + (pos % bs) as i64)
    }
}
