//! Incremental export of block tables into a long-lived `[rows, width]` int32 matrix.
//!
//! A serving loop hands the kernel the same padded table every step, and between two
//! steps most rows changed by at most one appended entry. [`TableSync`] remembers what it
//! wrote into each row (which pool, which sequence, which table stamp, how many entries),
//! so a sync copies only new entries, and rewrites a row only when its sequence changed or
//! an existing entry was replaced (copy-on-write) or removed (truncation). A buffer mirrors one
//! layer group's tables: holes are padding, and the entries a window released since the
//! last sync become padding in place.

use crate::error::{filled, Result};
use crate::invalid;
use crate::pool::BlockPool;
use crate::types::{BlockId, SeqId};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RowState {
    pool: u64,
    seq: u64,
    stamp: u64,
    /// Table entries written; everything after them in the row is padding.
    written: usize,
    /// Entries before it were holes or padding when written (a window's released front).
    run_start: usize,
}

/// What a sync writes into one row: `from..to` of the table, padding up to `pad_to`,
/// and padding over `released` (entries that became holes).
struct RowPlan {
    from: usize,
    pad_to: usize,
    released: std::ops::Range<usize>,
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

    /// Check the buffer, the batch and the longest table `need` before anything is written.
    fn check(&self, seqs: &[SeqId], need: usize, out: &[i32]) -> Result<()> {
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
        if need > self.width {
            return Err(invalid!("seq_ids: a table of {need} blocks does not fit in {} columns", self.width));
        }
        Ok(())
    }

    /// What row `i` needs to hold `state`'s table, and the row's new record.
    fn plan(&mut self, i: usize, state: RowState) -> RowPlan {
        let n = state.written;
        let plan = match self.rows[i] {
            Some(old)
                if (old.pool, old.seq, old.stamp) == (state.pool, state.seq, state.stamp)
                    && old.written <= n
                    && old.run_start <= state.run_start =>
            {
                RowPlan { from: old.written, pad_to: n, released: old.run_start..state.run_start.min(old.written) }
            }
            Some(old) => RowPlan { from: 0, pad_to: old.written.max(n), released: 0..0 },
            None => RowPlan { from: 0, pad_to: self.width, released: 0..0 },
        };
        self.rows[i] = Some(state);
        plan
    }

    /// Make row `i` of `out` hold the table of `seqs[i]` in `group`, padded with `pad`
    /// (a hole is `pad` too). Rows from `seqs.len()` on are left as they are. Returns how
    /// many entries were written. Fails (writing nothing) on an unknown group or id, too
    /// many sequences or too long tables.
    pub fn sync(&mut self, pool: &BlockPool, group: usize, seqs: &[SeqId], out: &mut [i32]) -> Result<usize> {
        let mut need = 0;
        for &s in seqs {
            need = need.max(pool.table(s, group)?.len_blocks());
        }
        self.check(seqs, need, out)?;
        let mut written = 0;
        for (i, &seq) in seqs.iter().enumerate() {
            let t = pool.table(seq, group)?;
            let n = t.len_blocks();
            let state = RowState { pool: pool.pool_id(), seq: seq.0, stamp: t.stamp(), written: n, run_start: t.run_start() };
            let p = self.plan(i, state);
            let row = &mut out[i * self.width..(i + 1) * self.width];
            row[p.released.clone()].fill(self.pad);
            for (dst, b) in row[p.from..n].iter_mut().zip(t.entries().skip(p.from)) {
                *dst = b.map_or(self.pad, BlockId::as_i32);
            }
            row[n..p.pad_to].fill(self.pad);
            written += p.pad_to - p.from + p.released.len();
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::StepOutput;

    fn ids(v: &[u64]) -> Vec<SeqId> {
        v.iter().map(|&x| SeqId(x)).collect()
    }

    fn expected(pool: &BlockPool, seqs: &[SeqId], width: usize) -> Vec<i32> {
        let mut out = vec![0; seqs.len() * width];
        pool.padded_tables_into(seqs, 0, width, -1, &mut out).unwrap();
        out
    }

    #[test]
    fn incremental_sync_matches_full_export() {
        let mut pool = BlockPool::new(64, 4).unwrap();
        let mut out = StepOutput::default();
        pool.add_sequence(SeqId(1), 5, &mut out).unwrap();
        pool.add_sequence(SeqId(2), 3, &mut out).unwrap();
        let seqs = ids(&[1, 2]);
        let mut sync = TableSync::new(4, 8, -1).unwrap();
        let mut buf = vec![77; 32];
        assert_eq!(sync.sync(&pool, 0, &seqs, &mut buf).unwrap(), 16);
        assert_eq!(&buf[..16], &expected(&pool, &seqs, 8)[..]);
        // Unchanged tables: nothing to write.
        assert_eq!(sync.sync(&pool, 0, &seqs, &mut buf).unwrap(), 0);
        // One appended block: one entry.
        pool.step(&[SeqId(1)], &[4], &mut out).unwrap();
        assert_eq!(sync.sync(&pool, 0, &seqs, &mut buf).unwrap(), 1);
        assert_eq!(&buf[..16], &expected(&pool, &seqs, 8)[..]);
        // Copy-on-write replaces an entry: the row is rewritten.
        pool.fork(SeqId(2), SeqId(3)).unwrap();
        pool.step(&[SeqId(2)], &[1], &mut out).unwrap();
        assert!(sync.sync(&pool, 0, &seqs, &mut buf).unwrap() >= 1);
        assert_eq!(&buf[..16], &expected(&pool, &seqs, 8)[..]);
        // Truncation and a different sequence in a row.
        pool.truncate(SeqId(1), 8).unwrap();
        let swapped = ids(&[3, 1]);
        sync.sync(&pool, 0, &swapped, &mut buf).unwrap();
        assert_eq!(&buf[..16], &expected(&pool, &swapped, 8)[..]);
        assert_eq!(&buf[16..], &[77; 16]);
    }

    /// Every group's buffer equals the full export after each change of a pool with
    /// layer groups: growth, window releases, a copy-on-write, a truncation, a prefix hit
    /// with holes, an id freed and reused.
    #[test]
    fn group_sync_matches_full_export() {
        use crate::pool::GroupSpec;
        use crate::prefix_cache::CacheConfig;
        let groups = vec![GroupSpec::Full, GroupSpec::sliding_window(6, 2).unwrap()];
        let mut pool = BlockPool::with_options(200, 2, groups, Some(CacheConfig::default())).unwrap();
        let mut out = StepOutput::default();
        let width = 24;
        let mut syncs: Vec<TableSync> = (0..2).map(|_| TableSync::new(4, width, -1).unwrap()).collect();
        let mut bufs = vec![vec![55; 4 * width]; 2];
        let check = |pool: &BlockPool, syncs: &mut Vec<TableSync>, bufs: &mut Vec<Vec<i32>>, seqs: &[SeqId]| {
            for g in 0..2 {
                syncs[g].sync(pool, g, seqs, &mut bufs[g]).unwrap();
                let mut want = vec![0; seqs.len() * width];
                pool.padded_tables_into(seqs, g, width, -1, &mut want).unwrap();
                assert_eq!(&bufs[g][..want.len()], &want[..], "group {g}");
            }
        };
        let prompt: Vec<u32> = (0..11).collect();
        pool.add_sequence_tokens(SeqId(1), &prompt, None, &mut out).unwrap();
        pool.add_sequence(SeqId(2), 5, &mut out).unwrap();
        let seqs = ids(&[1, 2]);
        check(&pool, &mut syncs, &mut bufs, &seqs);
        for _ in 0..9 {
            pool.step_decode(&seqs, &mut out).unwrap();
            check(&pool, &mut syncs, &mut bufs, &seqs);
        }
        // Unchanged tables: nothing to write.
        assert_eq!(syncs[1].sync(&pool, 1, &seqs, &mut bufs[1]).unwrap(), 0);
        pool.fork(SeqId(2), SeqId(3)).unwrap();
        pool.step(&[SeqId(2)], &[1], &mut out).unwrap(); // copy-on-write of the shared last block
        check(&pool, &mut syncs, &mut bufs, &ids(&[1, 2, 3]));
        pool.truncate(SeqId(1), 1).unwrap(); // within the window
        check(&pool, &mut syncs, &mut bufs, &ids(&[1, 2, 3]));
        // A hit: the window group's skipped blocks are holes.
        let long: Vec<u32> = (0..30).collect();
        pool.add_sequence_tokens(SeqId(4), &long, None, &mut out).unwrap();
        pool.free(SeqId(4)).unwrap();
        pool.add_sequence_tokens(SeqId(4), &[&long[..], &[7]].concat(), None, &mut out).unwrap();
        assert!(pool.table(SeqId(4), 1).unwrap().num_holes() > 0);
        check(&pool, &mut syncs, &mut bufs, &ids(&[4, 2, 3, 1]));
        pool.free(SeqId(2)).unwrap();
        pool.add_sequence(SeqId(2), 3, &mut out).unwrap();
        check(&pool, &mut syncs, &mut bufs, &ids(&[4, 2, 3, 1]));
        // Another pool's tables are never trusted for the same ids.
        let mut other = BlockPool::with_groups(50, 2, vec![GroupSpec::Full, GroupSpec::sliding_window(6, 2).unwrap()]).unwrap();
        for s in [4u64, 2, 3, 1] {
            other.add_sequence(SeqId(s), 1, &mut out).unwrap();
        }
        check(&other, &mut syncs, &mut bufs, &ids(&[4, 2, 3, 1]));
    }

    #[test]
    fn rejects_without_writing() {
        let mut pool = BlockPool::new(8, 2).unwrap();
        pool.add_sequence(SeqId(1), 9, &mut StepOutput::default()).unwrap();
        let mut sync = TableSync::new(2, 4, -1).unwrap();
        let mut buf = vec![5; 8];
        assert!(sync.sync(&pool, 0, &ids(&[1]), &mut buf).is_err()); // 5 blocks > 4 columns
        assert!(sync.sync(&pool, 0, &ids(&[9]), &mut buf).is_err());
        assert!(sync.sync(&pool, 0, &ids(&[1, 1, 1]), &mut buf).is_err());
        assert_eq!(buf, vec![5; 8]);
    }
}
