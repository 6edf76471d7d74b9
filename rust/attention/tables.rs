//! Block tables as the kernel reads them, validated once per call.
//!
//! Two input forms, both exported by [`crate::BlockPool`]: a padded `[n, max_blocks]`
//! table with sequence lengths (vLLM style), and FlashInfer's `(kv_indptr, kv_indices,
//! kv_last_page_len)`. Both become one flat list of physical block ids per sequence, with
//! every id the kernel will touch checked against the pool, so the kernel can index K/V
//! without further checks on caller data.

use crate::error::Result;
use crate::invalid;

/// Per-sequence block lists and lengths, all entries inside `0..num_blocks`.
#[derive(Clone, Debug, Default)]
pub struct SeqTables {
    blocks: Vec<u32>,
    /// `offsets[i]..offsets[i + 1]` are the blocks of sequence `i`.
    offsets: Vec<usize>,
    lens: Vec<usize>,
}

/// `x` as a block id; `what` names the argument that holds it.
fn block_id(x: i64, num_blocks: usize, seq: usize, what: &str) -> Result<u32> {
    if x < 0 || x as u64 >= num_blocks as u64 {
        return Err(invalid!("{what} of sequence {seq} holds block {x}, outside 0..{num_blocks}"));
    }
    Ok(x as u32)
}

impl SeqTables {
    /// From a row-major padded table of `seq_lens.len()` rows of `width` entries. Only
    /// the first `ceil(len / block_size)` entries of a row are read (padding is free).
    ///
    /// Errors: table size not `n * width`, negative length, a length needing more blocks
    /// than `width`, a used entry outside `0..num_blocks`.
    pub fn padded(table: &[i64], width: usize, seq_lens: &[i64], block_size: usize, num_blocks: usize) -> Result<Self> {
        let n = seq_lens.len();
        if n.checked_mul(width) != Some(table.len()) {
            return Err(invalid!("block_tables has {} entries, expected {n} x {width}", table.len()));
        }
        let mut out = Self { offsets: vec![0], ..Self::default() };
        for (i, &len) in seq_lens.iter().enumerate() {
            let len = usize::try_from(len).map_err(|_| invalid!("seq_lens[{i}] = {len} is negative"))?;
            let need = len.div_ceil(block_size);
            if need > width {
                return Err(invalid!(
                    "seq_lens[{i}] = {len} tokens needs {need} blocks, the table holds {width}"
                ));
            }
            for &x in &table[i * width..i * width + need] {
                out.blocks.push(block_id(x, num_blocks, i, "block_tables row")?);
            }
            out.offsets.push(out.blocks.len());
            out.lens.push(len);
        }
        Ok(out)
    }

    /// From FlashInfer's paged form: sequence `i` owns pages
    /// `kv_indices[kv_indptr[i]..kv_indptr[i + 1]]` and its last page holds
    /// `kv_last_page_len[i]` tokens (`1..=block_size`, or 0 when it has no page).
    pub fn flashinfer(
        indptr: &[i64],
        indices: &[i64],
        last_page_len: &[i64],
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self> {
        let n = last_page_len.len();
        if indptr.len() != n + 1 {
            return Err(invalid!("kv_indptr has {} entries for {n} sequences (expected n + 1)", indptr.len()));
        }
        let mut out = Self { offsets: vec![0], ..Self::default() };
        for i in 0..n {
            let (a, b) = (indptr[i], indptr[i + 1]);
            if a < 0 || b < a || b as u64 > indices.len() as u64 {
                return Err(invalid!(
                    "kv_indptr[{i}..={}] = {a}..{b} is not a range inside kv_indices (len {})",
                    i + 1,
                    indices.len()
                ));
            }
            let pages = (b - a) as usize;
            let last = last_page_len[i];
            let len = match pages {
                0 if last == 0 => 0,
                0 => return Err(invalid!("kv_last_page_len[{i}] = {last} for a sequence with no page")),
                _ if last < 1 || last as u64 > block_size as u64 => {
                    return Err(invalid!("kv_last_page_len[{i}] = {last} outside 1..={block_size}"))
                }
                _ => (pages - 1) * block_size + last as usize,
            };
            for &x in &indices[a as usize..b as usize] {
                out.blocks.push(block_id(x, num_blocks, i, "kv_indices")?);
            }
            out.offsets.push(out.blocks.len());
            out.lens.push(len);
        }
        Ok(out)
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Blocks (exactly `ceil(len / block_size)`) and length in tokens of sequence `i`.
    pub fn seq(&self, i: usize) -> (&[u32], usize) {
        (&self.blocks[self.offsets[i]..self.offsets[i + 1]], self.lens[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_reads_only_used_entries_and_checks_them() {
        let t = SeqTables::padded(&[3, -1, 0, 1], 2, &[4, 5], 4, 4).unwrap();
        assert_eq!(t.seq(0), (&[3u32][..], 4));
        assert_eq!(t.seq(1), (&[0u32, 1][..], 5));
        assert!(SeqTables::padded(&[4, -1], 2, &[1], 4, 4).is_err()); // block == num_blocks
        assert!(SeqTables::padded(&[0, 1], 2, &[9], 4, 4).is_err()); // beyond capacity
        assert!(SeqTables::padded(&[0, 1], 2, &[-1], 4, 4).is_err());
        assert!(SeqTables::padded(&[0, 1, 2], 2, &[1], 4, 4).is_err());
        assert_eq!(SeqTables::padded(&[], 0, &[0], 4, 4).unwrap().seq(0).1, 0);
    }

    #[test]
    fn flashinfer_lengths_and_errors() {
        let t = SeqTables::flashinfer(&[0, 2, 2, 3], &[1, 2, 0], &[3, 0, 4], 4, 3).unwrap();
        assert_eq!(t.seq(0), (&[1u32, 2][..], 7));
        assert_eq!(t.seq(1).1, 0);
        assert_eq!(t.seq(2), (&[0u32][..], 4));
        assert!(SeqTables::flashinfer(&[0, 1], &[0], &[5], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[0, 1], &[0], &[0], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[0, 0], &[], &[1], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[0, 2], &[0], &[1], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[1, 0], &[0], &[1], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[0, 1], &[3], &[1], 4, 3).is_err());
        assert!(SeqTables::flashinfer(&[0], &[], &[1], 4, 3).is_err());
    }
}
