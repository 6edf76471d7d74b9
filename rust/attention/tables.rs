//! Block tables as the kernels read them.
//!
//! Two input forms, both exported by [`crate::BlockPool`] (and, with holes, by the hybrid
//! pool): a padded `[n, width]` table with sequence lengths (vLLM style; logical block `b`
//! in column `b`), and FlashInfer's `(kv_indptr, kv_indices, kv_last_page_len)` with an
//! optional `kv_page_start` (a windowed sequence lists only its stored pages). A
//! [`SeqTables`] knows each sequence's logical length and where each logical block's entry
//! is, and trusts no entry. A call then selects the keys its queries see
//! ([`SeqTables::select`]); only the blocks holding one of them are looked up and checked
//! against the pool, into [`Visible`] runs the kernels index without further checks. Other
//! entries (a pad, a released block's stale id) are never read.
//!
//! FlashInfer pages with `kv_page_start` (`ps`) and `sink_tokens` (`S`): sequence `i`
//! has `P` pages; its first `sp = min(ceil(S / bs), ps, P)` pages are logical blocks
//! `0..sp` (the sinks), page `j >= sp` is logical block `ps + (j - sp)` (the window run).
//! Its logical length is `lb(P - 1) * bs + kv_last_page_len` with `lb` that map: `(ps + P -
//! sp - 1) * bs + last` when the window run is non-empty, `(P - 1) * bs + last` when every
//! page is a sink page (the sequence ends inside its sinks; `ps` then only bounds `sp`),
//! 0 without pages. `ps = 0` (the default) is FlashInfer's plain layout.

use std::ops::Range;

use crate::error::Result;
use crate::invalid;

/// Per-sequence logical lengths and the caller's (unchecked) block entries.
#[derive(Clone, Debug)]
pub struct SeqTables {
    src: Source,
    lens: Vec<usize>,
    block_size: usize,
    num_blocks: usize,
}

#[derive(Clone, Debug)]
enum Source {
    /// Row `i`, column `b`: `table[i * width + b]`.
    Padded { table: Vec<i64>, width: usize },
    /// Pages `indices[indptr[i]..indptr[i + 1]]`, the first `sink_pages[i]` of them
    /// logical blocks `0..`, the rest from logical block `page_start[i]` on.
    Paged { indptr: Vec<usize>, indices: Vec<i64>, page_start: Vec<usize>, sink_pages: Vec<usize> },
}

/// A run of visible keys of one sequence: logical tokens `tok0..tok1` (non-empty), held by
/// logical blocks `tok0 / bs ..= (tok1 - 1) / bs`, whose checked ids start at `at` in
/// [`Visible::blocks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub tok0: usize,
    pub tok1: usize,
    pub at: usize,
}

impl Run {
    /// Logical index of the run's first block.
    #[inline]
    pub fn first_block(&self, bs: usize) -> usize {
        self.tok0 / bs
    }

    /// Blocks the run spans.
    #[inline]
    pub fn num_blocks(&self, bs: usize) -> usize {
        (self.tok1 - 1) / bs + 1 - self.tok0 / bs
    }
}

/// The keys a call reads, per sequence sorted disjoint [`Run`]s, every block id inside
/// `0..num_blocks`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Visible {
    blocks: Vec<u32>,
    runs: Vec<Run>,
    /// `offsets[i]..offsets[i + 1]` are the runs of sequence `i`.
    offsets: Vec<usize>,
}

impl Visible {
    /// The runs of sequence `i`, sorted by position.
    #[inline]
    pub fn runs(&self, i: usize) -> &[Run] {
        &self.runs[self.offsets[i]..self.offsets[i + 1]]
    }

    /// Every run's checked block ids (a run's start at its `at`).
    #[inline]
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }
}

/// `x` as a block id; `what` names the entry that holds it.
fn block_id(x: i64, num_blocks: usize, what: impl FnOnce() -> String) -> Result<u32> {
    if x < 0 || x as u64 >= num_blocks as u64 {
        return Err(invalid!("{} holds block {x}, outside 0..{num_blocks}", what()));
    }
    Ok(x as u32)
}

impl SeqTables {
    /// From a row-major padded table of `seq_lens.len()` rows of `width` entries; no
    /// entry is read until [`select`](Self::select).
    ///
    /// Errors: table size not `n * width`, negative length, a length needing more blocks
    /// than `width`.
    pub fn padded(table: &[i64], width: usize, seq_lens: &[i64], block_size: usize, num_blocks: usize) -> Result<Self> {
        Self::padded_owned(table.to_vec(), width, seq_lens, block_size, num_blocks)
    }

    /// As [`padded`](Self::padded), keeping the caller's table without a copy.
    pub fn padded_owned(table: Vec<i64>, width: usize, seq_lens: &[i64], block_size: usize, num_blocks: usize) -> Result<Self> {
        let n = seq_lens.len();
        if n.checked_mul(width) != Some(table.len()) {
            return Err(invalid!("block_tables has {} entries, expected {n} x {width}", table.len()));
        }
        let mut lens = Vec::with_capacity(n);
        for (i, &len) in seq_lens.iter().enumerate() {
            let len = usize::try_from(len).map_err(|_| invalid!("seq_lens[{i}] = {len} is negative"))?;
            let need = len.div_ceil(block_size);
            if need > width {
                return Err(invalid!("seq_lens[{i}] = {len} tokens needs {need} blocks, the table holds {width}"));
            }
            lens.push(len);
        }
        Ok(Self { src: Source::Padded { table, width }, lens, block_size, num_blocks })
    }

    /// From FlashInfer's paged form without released pages: sequence `i` owns pages
    /// `kv_indices[kv_indptr[i]..kv_indptr[i + 1]]` (logical blocks `0..`) and its last
    /// page holds `kv_last_page_len[i]` tokens (`1..=block_size`, or 0 without a page).
    pub fn flashinfer(indptr: &[i64], indices: &[i64], last_page_len: &[i64], block_size: usize, num_blocks: usize) -> Result<Self> {
        Self::flashinfer_windowed(indptr, indices, last_page_len, None, 0, block_size, num_blocks)
    }

    /// As [`flashinfer`](Self::flashinfer), the pages of sequence `i` being its sink pages
    /// then its window run from logical block `page_start[i]` (module docs; `None` is
    /// zeros), `sink_tokens` the call's sinks.
    ///
    /// Errors: `kv_indptr` not `n + 1` non-decreasing offsets inside `kv_indices`, a last
    /// page length outside `1..=block_size` (0 exactly without pages), `kv_page_start` not
    /// `n` values `>= 0`, a logical length that overflows.
    #[allow(clippy::too_many_arguments)]
    pub fn flashinfer_windowed(
        indptr: &[i64],
        indices: &[i64],
        last_page_len: &[i64],
        page_start: Option<&[i64]>,
        sink_tokens: usize,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self> {
        let n = last_page_len.len();
        if indptr.len() != n + 1 {
            return Err(invalid!("kv_indptr has {} entries for {n} sequences (expected n + 1)", indptr.len()));
        }
        if let Some(ps) = page_start {
            if ps.len() != n {
                return Err(invalid!("kv_page_start has {} entries for {n} sequences", ps.len()));
            }
        }
        let sink_blocks = sink_tokens.div_ceil(block_size);
        let (mut offs, mut starts, mut sinks, mut lens) = (vec![0], Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            let (a, b) = (indptr[i], indptr[i + 1]);
            if a < 0 || b < a || b as u64 > indices.len() as u64 {
                return Err(invalid!(
                    "kv_indptr[{i}..={}] = {a}..{b} is not a range inside kv_indices (len {})",
                    i + 1,
                    indices.len()
                ));
            }
            if i == 0 {
                offs[0] = a as usize;
            }
            let ps = page_start.map_or(0, |p| p[i]);
            let ps = usize::try_from(ps).map_err(|_| invalid!("kv_page_start[{i}] = {ps} is negative"))?;
            let pages = (b - a) as usize;
            let sp = sink_blocks.min(ps).min(pages);
            let last = last_page_len[i];
            let len = match pages {
                0 if last == 0 => 0,
                0 => return Err(invalid!("kv_last_page_len[{i}] = {last} for a sequence with no page")),
                _ if last < 1 || last as u64 > block_size as u64 => {
                    return Err(invalid!("kv_last_page_len[{i}] = {last} outside 1..={block_size}"))
                }
                _ => {
                    // The end of the last block must fit too: the kernels compute it.
                    let last_block = if pages > sp { ps.checked_add(pages - 1 - sp) } else { Some(pages - 1) };
                    last_block
                        .and_then(|lb| lb.checked_add(1)?.checked_mul(block_size)?.checked_sub(block_size))
                        .map(|t| t + last as usize)
                        .ok_or_else(|| invalid!("kv_page_start[{i}] = {ps}: the logical length overflows"))?
                }
            };
            offs.push(b as usize);
            starts.push(ps);
            sinks.push(sp);
            lens.push(len);
        }
        let src = Source::Paged { indptr: offs, indices: indices.to_vec(), page_start: starts, sink_pages: sinks };
        Ok(Self { src, lens, block_size, num_blocks })
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Logical length in tokens of sequence `i`.
    pub fn seq_len(&self, i: usize) -> usize {
        self.lens[i]
    }

    /// The checked block id of logical block `b` of sequence `i`.
    ///
    /// Errors: the entry is not a block of the pool (a pad, garbage), or (FlashInfer) the
    /// block is not among the sequence's pages.
    pub fn block(&self, i: usize, b: usize) -> Result<u32> {
        let nb = self.num_blocks;
        match &self.src {
            Source::Padded { table, width } => {
                debug_assert!(b < *width);
                block_id(table[i * width + b], nb, || format!("block_tables[{i}, {b}] (a block with visible keys)"))
            }
            Source::Paged { indptr, indices, page_start, sink_pages } => {
                let (sp, ps) = (sink_pages[i], page_start[i]);
                let j = match b {
                    _ if b < sp => b,
                    _ if b >= ps => sp + (b - ps),
                    _ => {
                        return Err(invalid!(
                            "kv_page_start[{i}] = {ps}: logical block {b} holds visible keys but is not among the \
                             sequence's pages (sink pages 0..{sp}, window run from block {ps})"
                        ))
                    }
                };
                let at = indptr[i] + j;
                if at >= indptr[i + 1] {
                    return Err(invalid!("kv_indices: logical block {b} of sequence {i} is past its pages"));
                }
                block_id(indices[at], nb, || format!("kv_indices[{at}] (logical block {b} of sequence {i})"))
            }
        }
    }

    /// The visible keys of every sequence: `needs(i, len, ranges)` pushes the token ranges
    /// (inside `0..len`, any order, may overlap or be empty) that sequence `i`'s queries
    /// see. Only the blocks holding them are looked up and checked.
    ///
    /// Errors: as [`block`](Self::block), for the first bad block with visible keys.
    pub(crate) fn select(&self, mut needs: impl FnMut(usize, usize, &mut Vec<Range<usize>>)) -> Result<Visible> {
        let bs = self.block_size;
        let mut out = Visible { offsets: Vec::with_capacity(self.len() + 1), ..Visible::default() };
        out.offsets.push(0);
        let mut ranges = Vec::new();
        for i in 0..self.len() {
            ranges.clear();
            needs(i, self.lens[i], &mut ranges);
            ranges.retain(|r| r.start < r.end);
            ranges.sort_unstable_by_key(|r| r.start);
            let mut k = 0;
            while k < ranges.len() {
                let (tok0, mut tok1) = (ranges[k].start, ranges[k].end);
                k += 1;
                while k < ranges.len() && ranges[k].start <= tok1 {
                    tok1 = tok1.max(ranges[k].end);
                    k += 1;
                }
                debug_assert!(tok1 <= self.lens[i]);
                let run = Run { tok0, tok1, at: out.blocks.len() };
                for b in run.first_block(bs)..run.first_block(bs) + run.num_blocks(bs) {
                    out.blocks.push(self.block(i, b)?);
                }
                out.runs.push(run);
            }
            out.offsets.push(out.runs.len());
        }
        Ok(out)
    }

    /// Every key of every sequence visible (no window): every block is checked.
    #[cfg(test)]
    pub(crate) fn select_all(&self) -> Result<Visible> {
        self.select(|_, len, r| r.push(0..len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks_of(v: &Visible, i: usize, bs: usize) -> Vec<(Range<usize>, Vec<u32>)> {
        v.runs(i).iter().map(|r| (r.tok0..r.tok1, v.blocks()[r.at..r.at + r.num_blocks(bs)].to_vec())).collect()
    }

    #[test]
    fn padded_reads_only_visible_entries_and_checks_them() {
        let t = SeqTables::padded(&[3, -1, 0, 1], 2, &[4, 5], 4, 4).unwrap();
        let v = t.select_all().unwrap();
        assert_eq!(blocks_of(&v, 0, 4), vec![(0..4, vec![3])]);
        assert_eq!(blocks_of(&v, 1, 4), vec![(0..5, vec![0, 1])]);
        assert!(SeqTables::padded(&[4, -1], 2, &[1], 4, 4).unwrap().select_all().is_err()); // block == num_blocks
        assert!(SeqTables::padded(&[0, 1], 2, &[9], 4, 4).is_err()); // beyond capacity
        assert!(SeqTables::padded(&[0, 1], 2, &[-1], 4, 4).is_err());
        assert!(SeqTables::padded(&[0, 1, 2], 2, &[1], 4, 4).is_err());
        assert_eq!(SeqTables::padded(&[], 0, &[0], 4, 4).unwrap().seq_len(0), 0);
        // A window over the last 2 tokens plus 2 sinks of a 14-token sequence: blocks 1
        // and 2 are holes (pad and garbage), never read.
        let t = SeqTables::padded(&[5, -1, 99, 6], 4, &[14], 4, 8).unwrap();
        let v = t.select(|_, len, r| r.extend([len - 2..len, 0..2])).unwrap();
        assert_eq!(blocks_of(&v, 0, 4), vec![(0..2, vec![5]), (12..14, vec![6])]);
        let e = t.select(|_, len, r| r.push(len - 3..len)).unwrap_err().to_string(); // reaches the garbage
        assert!(e.contains("block_tables[0, 2]"), "{e}");
        assert!(t.select(|_, len, r| r.push(len - 9..len)).is_err()); // reaches the pad
        // Overlapping and adjacent ranges merge into one run.
        let t = SeqTables::padded(&[1, 2, 3], 3, &[10], 4, 8).unwrap();
        let v = t.select(|_, _, r| r.extend([5..9, 0..3, 3..5, 7..7])).unwrap();
        assert_eq!(blocks_of(&v, 0, 4), vec![(0..9, vec![1, 2, 3])]);
    }

    #[test]
    fn flashinfer_lengths_and_errors() {
        let t = SeqTables::flashinfer(&[0, 2, 2, 3], &[1, 2, 0], &[3, 0, 4], 4, 3).unwrap();
        let v = t.select_all().unwrap();
        assert_eq!((blocks_of(&v, 0, 4), t.seq_len(0)), (vec![(0..7, vec![1, 2])], 7));
        assert_eq!(t.seq_len(1), 0);
        assert_eq!(blocks_of(&v, 2, 4), vec![(0..4, vec![0])]);
        assert!(SeqTables::flashinfer(&[0, 1], &[0], &[5], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[0, 1], &[0], &[0], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[0, 0], &[], &[1], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[0, 2], &[0], &[1], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[1, 0], &[0], &[1], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[0, 1], &[3], &[1], 4, 3).unwrap().select_all().is_err());
        assert!(SeqTables::flashinfer(&[0], &[], &[1], 4, 3).is_err());
    }

    #[test]
    fn flashinfer_page_start_maps_pages_to_logical_blocks() {
        // bs 4, 5 sink tokens (2 sink blocks), window run from logical block 10: pages
        // [7, 8 | 2, 3] are blocks 0, 1, 10, 11; the last holds 3 tokens: length 47.
        let t = SeqTables::flashinfer_windowed(&[0, 4], &[7, 8, 2, 3], &[3], Some(&[10]), 5, 4, 9).unwrap();
        assert_eq!(t.seq_len(0), 47);
        let v = t.select(|_, len, r| r.extend([0..5, len - 6..len])).unwrap();
        assert_eq!(blocks_of(&v, 0, 4), vec![(0..5, vec![7, 8]), (41..47, vec![2, 3])]);
        // A window reaching block 9 (released): the hole is an error naming kv_page_start.
        let e = t.select(|_, len, r| r.push(len - 8..len)).unwrap_err().to_string();
        assert!(e.contains("kv_page_start"), "{e}");
        // Only sink pages stored: the sequence ends inside them, page_start only bounds them.
        let t = SeqTables::flashinfer_windowed(&[0, 2], &[7, 8], &[1], Some(&[6]), 8, 4, 9).unwrap();
        assert_eq!(t.seq_len(0), 5);
        // page_start below the sinks: the sinks are the pages before it, then contiguous.
        let t = SeqTables::flashinfer_windowed(&[0, 3], &[7, 8, 1], &[2], Some(&[1]), 8, 4, 9).unwrap();
        assert_eq!(t.seq_len(0), 10);
        assert_eq!(blocks_of(&t.select_all().unwrap(), 0, 4), vec![(0..10, vec![7, 8, 1])]);
        // Defaults: no page start is the plain layout, whatever the sinks.
        let t = SeqTables::flashinfer_windowed(&[0, 2], &[7, 8], &[4], None, 8, 4, 9).unwrap();
        assert_eq!(t.seq_len(0), 8);
        // Wrong page_start: length, negative, overflow; a huge page_start is refused
        // before anything is allocated.
        assert!(SeqTables::flashinfer_windowed(&[0, 1], &[7], &[1], Some(&[]), 0, 4, 9).is_err());
        assert!(SeqTables::flashinfer_windowed(&[0, 1], &[7], &[1], Some(&[-1]), 0, 4, 9).is_err());
        assert!(SeqTables::flashinfer_windowed(&[0, 1], &[7], &[1], Some(&[i64::MAX]), 0, 4, 9).is_err());
        let edge = (usize::MAX / 4) as i64; // block `edge` ends past usize::MAX
        assert!(SeqTables::flashinfer_windowed(&[0, 1], &[7], &[1], Some(&[edge]), 0, 4, 9).is_err());
        assert!(SeqTables::flashinfer_windowed(&[0, 1], &[7], &[1], Some(&[edge - 1]), 0, 4, 9).is_ok());
        let t = SeqTables::flashinfer_windowed(&[0, 1], &[7], &[1], Some(&[1 << 40]), 0, 4, 9).unwrap();
        assert!(t.select_all().is_err()); // every block before it is a hole: the first fails
    }
}
