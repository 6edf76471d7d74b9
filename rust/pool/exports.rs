//! What a pool exports for kernels and monitoring: padded block tables (or FlashInfer's
//! paged layout) for a batch of sequences, and occupancy statistics.

use rustc_hash::FxHashMap;

use super::{BlockPool, PoolStats};
use crate::error::{KvError, Result};
use crate::invalid;
use crate::types::{BlockId, SeqId};

impl BlockPool {
    /// Validate a batch of ids without changing anything.
    pub fn check_known(&self, seqs: &[SeqId]) -> Result<()> {
        for s in seqs {
            if !self.seqs.contains_key(s) {
                return Err(KvError::UnknownSequence(s.0));
            }
        }
        Ok(())
    }

    /// Longest table among `seqs`, in blocks.
    pub fn max_table_len(&self, seqs: &[SeqId]) -> Result<usize> {
        let mut m = 0;
        for s in seqs {
            m = m.max(self.table(*s)?.blocks().len());
        }
        Ok(m)
    }

    /// Write the tables of `seqs` as rows of a row-major `[seqs.len(), width]` int32
    /// matrix, padding unused entries with `pad`.
    pub fn padded_tables_into(&self, seqs: &[SeqId], width: usize, pad: i32, out: &mut [i32]) -> Result<()> {
        if out.len() != seqs.len() * width {
            return Err(invalid!("output holds {} entries, expected {} x {}", out.len(), seqs.len(), width));
        }
        let need = self.max_table_len(seqs)?;
        if need > width {
            return Err(invalid!("max_blocks: a table of {need} blocks does not fit in {width} columns"));
        }
        for (row, s) in out.chunks_exact_mut(width.max(1)).zip(seqs) {
            let blocks = self.seqs[s].table.blocks();
            for (dst, b) in row.iter_mut().zip(blocks) {
                *dst = b.as_i32();
            }
            row[blocks.len()..].fill(pad);
        }
        Ok(())
    }

    /// FlashInfer's paged layout for `seqs`: `(kv_indptr [n+1], kv_indices [nnz],
    /// kv_last_page_len [n])`. The last page length is in `1..=block_size`, or 0 for an
    /// empty sequence.
    pub fn flashinfer_tables(&self, seqs: &[SeqId]) -> Result<(Vec<i32>, Vec<i32>, Vec<i32>)> {
        let mut nnz = 0usize;
        for s in seqs {
            nnz += self.table(*s)?.blocks().len();
        }
        if nnz > i32::MAX as usize {
            return Err(invalid!("{nnz} table entries overflow int32 kv_indptr"));
        }
        let mut indptr = Vec::with_capacity(seqs.len() + 1);
        let mut indices = Vec::with_capacity(nnz);
        let mut last = Vec::with_capacity(seqs.len());
        indptr.push(0);
        for s in seqs {
            let t = &self.seqs[s].table;
            indices.extend(t.blocks().iter().map(|b| b.as_i32()));
            indptr.push(indices.len() as i32);
            let n = t.num_tokens();
            last.push(if n == 0 { 0 } else { (n - 1) % self.block_size + 1 } as i32);
        }
        Ok((indptr, indices, last))
    }

    /// Occupancy statistics. O(table entries).
    pub fn stats(&self) -> PoolStats {
        let bs = self.block_size;
        let mut logical = 0u64;
        let mut stored = 0u64;
        // Filled slots of shared blocks: the fullest holder decides.
        let mut shared_fill: FxHashMap<BlockId, usize> = FxHashMap::default();
        for e in self.seqs.values() {
            let t = &e.table;
            logical += t.num_tokens() as u64;
            for (i, &b) in t.blocks().iter().enumerate() {
                let filled = t.filled_in_block(i, bs);
                if self.alloc.refcount(b) > 1 {
                    let f = shared_fill.entry(b).or_insert(0);
                    *f = (*f).max(filled);
                } else {
                    stored += filled as u64;
                }
            }
        }
        stored += shared_fill.values().map(|&f| f as u64).sum::<u64>();
        let total = self.num_blocks();
        let free = self.num_free_blocks();
        let used = self.num_used_blocks();
        let capacity = (used * bs) as u64;
        PoolStats {
            block_size: bs,
            total_blocks: total,
            free_blocks: free,
            used_blocks: used,
            num_seqs: self.seqs.len(),
            logical_tokens: logical,
            stored_tokens: stored,
            shared_blocks: shared_fill.len(),
            cow_copies: self.cow_copies,
            empty_slots: capacity - stored,
            utilization: if capacity == 0 { 1.0 } else { stored as f64 / capacity as f64 },
        }
    }
}
