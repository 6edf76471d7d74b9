//! What a pool with layer groups exports, per group: padded block tables (holes as the
//! pad), FlashInfer's paged layout with `kv_page_start`, the stored token ranges of a
//! sequence, and occupancy statistics.

use rustc_hash::FxHashMap;

use super::{BlockPool, PoolStats};
use crate::error::Result;
use crate::invalid;
use crate::types::{BlockId, SeqId};

impl BlockPool {
    /// Longest table among `seqs`, in logical blocks (the same in every group).
    pub fn max_table_len(&self, seqs: &[SeqId]) -> Result<usize> {
        let mut m = 0;
        for s in seqs {
            m = m.max(self.entry(*s)?.len.div_ceil(self.block_size));
        }
        Ok(m)
    }

    /// The tables of `seqs` in `group` as a row-major `[seqs.len(), width]` int32 matrix:
    /// logical block `i` in column `i`, holes and the columns past each table as `pad`.
    pub fn padded_tables_into(&self, seqs: &[SeqId], group: usize, width: usize, pad: i32, out: &mut [i32]) -> Result<()> {
        self.check_group(group)?;
        if Some(out.len()) != seqs.len().checked_mul(width) {
            return Err(invalid!("out: holds {} entries, expected {} x {width}", out.len(), seqs.len()));
        }
        let need = self.max_table_len(seqs)?;
        if need > width {
            return Err(invalid!("max_blocks: a table of {need} blocks does not fit in {width} columns"));
        }
        for (row, s) in out.chunks_exact_mut(width.max(1)).zip(seqs) {
            let t = &self.seqs[s].tables[group];
            row.fill(pad);
            for (dst, b) in row.iter_mut().zip(t.head()) {
                *dst = b.as_i32();
            }
            for (dst, b) in row[t.run_start()..].iter_mut().zip(t.run()) {
                *dst = b.as_i32();
            }
        }
        Ok(())
    }

    /// FlashInfer's paged layout of `seqs` in `group`: `(kv_indptr [n+1], kv_indices
    /// [nnz], kv_last_page_len [n], kv_page_start [n])`. Each sequence lists its stored
    /// pages in logical order (sink pages, then the window run); `kv_page_start` is the
    /// logical block of its first page after the sink pages. The last page length is in
    /// `1..=block_size` (`block_size` when the last logical block is a hole), 0 without pages.
    #[allow(clippy::type_complexity)]
    pub fn flashinfer_tables(&self, seqs: &[SeqId], group: usize) -> Result<(Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>)> {
        self.check_group(group)?;
        let mut nnz = 0usize;
        for s in seqs {
            nnz += self.entry(*s)?.tables[group].num_stored();
        }
        if nnz > i32::MAX as usize {
            return Err(invalid!("seq_ids: {nnz} table entries overflow int32 kv_indptr"));
        }
        let bs = self.block_size;
        let mut indptr = Vec::with_capacity(seqs.len() + 1);
        let mut indices = Vec::with_capacity(nnz);
        let mut last = Vec::with_capacity(seqs.len());
        let mut start = Vec::with_capacity(seqs.len());
        indptr.push(0);
        for s in seqs {
            let e = &self.seqs[s];
            let t = &e.tables[group];
            indices.extend(t.head().iter().chain(t.run()).map(|b| b.as_i32()));
            indptr.push(indices.len() as i32);
            let page_len = match (t.num_stored(), t.last()) {
                (0, _) => 0,
                (_, Some(_)) => (e.len - 1) % bs + 1,
                (_, None) => bs,
            };
            last.push(page_len as i32);
            start.push(t.run_start() as i32);
        }
        Ok((indptr, indices, last, start))
    }

    /// The logical token ranges of `seq` whose K/V `group` stores, sorted and merged.
    pub fn stored_ranges(&self, seq: SeqId, group: usize) -> Result<Vec<(usize, usize)>> {
        self.check_group(group)?;
        let e = self.entry(seq)?;
        let bs = self.block_size;
        let mut out: Vec<(usize, usize)> = Vec::new();
        for (i, _) in e.tables[group].stored() {
            let (a, b) = (i * bs, ((i + 1) * bs).min(e.len));
            match out.last_mut() {
                Some(r) if r.1 == a => r.1 = b,
                _ => out.push((a, b)),
            }
        }
        Ok(out)
    }

    /// Occupancy statistics. O(table entries).
    pub fn stats(&self) -> PoolStats {
        let bs = self.block_size;
        let g_count = self.groups.len();
        let mut group_blocks = vec![0usize; g_count];
        let mut group_stored = vec![0u64; g_count];
        let mut group_holes = vec![0u64; g_count];
        let mut logical = 0u64;
        // Shared blocks: the fullest holder decides the filled slots.
        let mut shared: FxHashMap<BlockId, (usize, usize)> = FxHashMap::default();
        for e in self.seqs.values() {
            logical += e.len as u64;
            for (g, t) in e.tables.iter().enumerate() {
                group_holes[g] += t.num_holes() as u64;
                for (i, b) in t.stored() {
                    let filled = e.len.saturating_sub(i * bs).min(bs);
                    if self.alloc.refcount(b) > 1 {
                        let f = shared.entry(b).or_insert((g, 0));
                        f.1 = f.1.max(filled);
                    } else {
                        group_blocks[g] += 1;
                        group_stored[g] += filled as u64;
                    }
                }
            }
        }
        for &(g, f) in shared.values() {
            group_blocks[g] += 1;
            group_stored[g] += f as u64;
        }
        let used = self.num_used_blocks();
        let stored: u64 = group_stored.iter().sum();
        let capacity = (used * bs) as u64;
        PoolStats {
            block_size: bs,
            total_blocks: self.num_blocks(),
            free_blocks: self.num_free_blocks(),
            used_blocks: used,
            num_seqs: self.seqs.len(),
            logical_tokens: logical,
            stored_tokens: stored,
            shared_blocks: shared.len(),
            cow_copies: self.cow_copies,
            empty_slots: capacity.saturating_sub(stored),
            utilization: if capacity == 0 { 1.0 } else { stored as f64 / capacity as f64 },
            idle_cached_blocks: self.cache.as_ref().map_or(0, |c| c.idle_count()),
            group_blocks,
            group_stored_tokens: group_stored,
            group_holes,
        }
    }
}
