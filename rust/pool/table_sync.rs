//! Incremental export of block tables into a long-lived `[rows, width]` int32 matrix.
//!
//! A serving loop hands the kernel the same padded table every step, and between two
//! steps most rows changed by at most one appended entry. [`TableSync`] remembers what it
//! wrote into each row (which pool, which sequence, which table stamp, how many entries),
//! so a sync copies only new entries, and rewrites a row only when its sequence changed or
//! an existing entry was replaced (copy-on-write) or removed (truncation).

use crate::error::{filled, Result};
use crate::invalid;
use crate::pool::BlockPool;
use crate::types::SeqId;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RowState {
    pool: u64,
    seq: u64,
    stamp: u64,
    /// Table entries written; everything after them in the row is padding.
    written: usize,
}

/// Remembers the contents of a row-major `[rows, width]` block-table matrix.
#[derive(Clone, Debug)]
pub struct TableSync {
    width: usize,
    pad: i32,
    /// `None` where the row's contents are unknown (never written, or invalidated).
    rows: Vec<Option<RowState>>,
}

impl TableSync {
    /// `InvalidArgument` when the host cannot hold `rows` rows of bookkeeping.
    pub fn new(rows: usize, width: usize, pad: i32) -> Result<Self> {
        Ok(Self { width, pad, rows: filled(None, rows, "max_seqs")? })
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// Forget what the matrix holds: the next sync rewrites every row it touches.
    pub fn invalidate(&mut self) {
        self.rows.fill(None);
    }

    /// Make row `i` of `out` hold the table of `seqs[i]`, padded with `pad`. Rows from
    /// `seqs.len()` on are left as they are. Returns how many entries were written.
    /// Fails (writing nothing) on unknown ids, too many sequences or too long tables.
    pub fn sync(&mut self, pool: &BlockPool, seqs: &[SeqId], out: &mut [i32]) -> Result<usize> {
        if out.len() != self.rows.len() * self.width {
            return Err(invalid!(
                "table buffer holds {} entries, expected {} x {}",
                out.len(),
                self.rows.len(),
                self.width
            ));
        }
        if seqs.len() > self.rows.len() {
            return Err(invalid!("seq_ids: {} sequences do not fit in {} rows", seqs.len(), self.rows.len()));
        }
        let need = pool.max_table_len(seqs)?;
        if need > self.width {
            return Err(invalid!("seq_ids: a table of {need} blocks does not fit in {} columns", self.width));
        }
        let mut written = 0;
        for (i, &seq) in seqs.iter().enumerate() {
            let table = pool.table(seq)?;
            let blocks = table.blocks();
            let row = &mut out[i * self.width..(i + 1) * self.width];
            let state = RowState { pool: pool.pool_id(), seq: seq.0, stamp: table.stamp(), written: blocks.len() };
            let (from, pad_to) = match self.rows[i] {
                Some(old)
                    if old.pool == state.pool
                        && old.seq == state.seq
                        && old.stamp == state.stamp
                        && old.written <= blocks.len() =>
                {
                    (old.written, blocks.len())
                }
                Some(old) => (0, old.written.max(blocks.len())),
                None => (0, self.width),
            };
            for (dst, b) in row[from..blocks.len()].iter_mut().zip(&blocks[from..]) {
                *dst = b.as_i32();
            }
            row[blocks.len()..pad_to].fill(self.pad);
            written += pad_to - from;
            self.rows[i] = Some(state);
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u64]) -> Vec<SeqId> {
        v.iter().map(|&x| SeqId(x)).collect()
    }

    fn expected(pool: &BlockPool, seqs: &[SeqId], width: usize) -> Vec<i32> {
        let mut out = vec![0; seqs.len() * width];
        pool.padded_tables_into(seqs, width, -1, &mut out).unwrap();
        out
    }

    #[test]
    fn incremental_sync_matches_full_export() {
        let mut pool = BlockPool::new(64, 4).unwrap();
        let mut slots = Vec::new();
        let mut cow = Vec::new();
        pool.add_sequence(SeqId(1), 5, &mut slots).unwrap();
        pool.add_sequence(SeqId(2), 3, &mut slots).unwrap();
        let seqs = ids(&[1, 2]);
        let mut sync = TableSync::new(4, 8, -1).unwrap();
        let mut buf = vec![77; 32];
        assert_eq!(sync.sync(&pool, &seqs, &mut buf).unwrap(), 16);
        assert_eq!(&buf[..16], &expected(&pool, &seqs, 8)[..]);
        // Unchanged tables: nothing to write.
        assert_eq!(sync.sync(&pool, &seqs, &mut buf).unwrap(), 0);
        // One appended block: one entry.
        pool.append(SeqId(1), 4, &mut slots, &mut cow).unwrap();
        assert_eq!(sync.sync(&pool, &seqs, &mut buf).unwrap(), 1);
        assert_eq!(&buf[..16], &expected(&pool, &seqs, 8)[..]);
        // Copy-on-write replaces an entry: the row is rewritten.
        pool.fork(SeqId(2), SeqId(3)).unwrap();
        pool.append(SeqId(2), 1, &mut slots, &mut cow).unwrap();
        assert!(sync.sync(&pool, &seqs, &mut buf).unwrap() >= 1);
        assert_eq!(&buf[..16], &expected(&pool, &seqs, 8)[..]);
        // Truncation and a different sequence in a row.
        pool.truncate(SeqId(1), 8).unwrap();
        let swapped = ids(&[3, 1]);
        sync.sync(&pool, &swapped, &mut buf).unwrap();
        assert_eq!(&buf[..16], &expected(&pool, &swapped, 8)[..]);
        assert_eq!(&buf[16..], &[77; 16]);
    }

    #[test]
    fn rejects_without_writing() {
        let mut pool = BlockPool::new(8, 2).unwrap();
        pool.add_sequence(SeqId(1), 9, &mut Vec::new()).unwrap();
        let mut sync = TableSync::new(2, 4, -1).unwrap();
        let mut buf = vec![5; 8];
        assert!(sync.sync(&pool, &ids(&[1]), &mut buf).is_err()); // 5 blocks > 4 columns
        assert!(sync.sync(&pool, &ids(&[9]), &mut buf).is_err());
        assert!(sync.sync(&pool, &ids(&[1, 1, 1]), &mut buf).is_err());
        assert_eq!(buf, vec![5; 8]);
    }
}
