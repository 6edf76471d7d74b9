//! Work items of a prefill call, and the log-sum-exp merge of their partial results.

use super::mask::Span;
use crate::attention::work::merge_row;

/// Keys per tile (the pack width every path shares).
pub(crate) const TW: usize = 64;

/// One work item: KV head `head` of sequence `seq`, query rows `q0..q1` (global row
/// indices), keys `k0..k1`. `tile` is the index of its query tile; `cost` the visible
/// (query, key) pairs, for longest-first scheduling.
#[derive(Clone, Debug)]
pub(crate) struct Item {
    pub seq: usize,
    pub head: usize,
    pub q0: usize,
    pub q1: usize,
    pub k0: usize,
    pub k1: usize,
    pub cost: usize,
}

/// The plan: items ordered by (query tile, KV head, key piece), and per query tile its
/// first item and its number of key pieces (the same for every head).
pub(crate) struct Plan {
    pub items: Vec<Item>,
    pub tiles: Vec<(usize, usize)>,
    pub tile_of: Vec<usize>,
}

/// Cut every sequence into query tiles of about `rows` rows (queries x `g` heads),
/// times `hkv` heads, and split their key ranges when the tiles alone would leave
/// threads idle (fewer than four items per thread) or when `split` asks for it.
pub(crate) fn plan(indptr: &[i64], spans: &[Span], hkv: usize, g: usize, threads: usize, split: Option<usize>, rows: usize) -> Plan {
    let qt = query_tile(g, rows);
    let mut tiles = Vec::new(); // (seq, q0, q1, hull)
    for seq in 0..indptr.len().saturating_sub(1) {
        let (a, b) = (indptr[seq] as usize, indptr[seq + 1] as usize);
        let mut q0 = a;
        while q0 < b {
            let q1 = b.min(q0 + qt);
            let hull = spans[q0..q1]
                .iter()
                .map(Span::hull)
                .filter(|h| h.0 < h.1)
                .fold((usize::MAX, 0), |acc, h| (acc.0.min(h.0), acc.1.max(h.1)));
            tiles.push((seq, q0, q1, if hull.0 < hull.1 { hull } else { (0, 0) }));
            q0 = q1;
        }
    }
    let piece = match split {
        Some(0) => usize::MAX,
        Some(t) => t.div_ceil(TW).max(1) * TW,
        None if tiles.len() * hkv >= 4 * threads => usize::MAX,
        None => {
            let keys: usize = tiles.iter().map(|t| t.3 .1 - t.3 .0).sum::<usize>() * hkv;
            keys.div_ceil(4 * threads).max(256).div_ceil(TW) * TW
        }
    };
    let mut out = Plan { items: Vec::new(), tiles: Vec::with_capacity(tiles.len()), tile_of: Vec::new() };
    for (ti, &(seq, q0, q1, (h0, h1))) in tiles.iter().enumerate() {
        let first = out.items.len();
        let mut np = 0;
        for head in 0..hkv {
            let mut k0 = h0;
            np = 0;
            loop {
                let k1 = h1.min(k0.saturating_add(piece));
                let cost = spans[q0..q1].iter().map(|s| s.count(k0, k1)).sum::<usize>() + (q1 - q0);
                out.items.push(Item { seq, head, q0, q1, k0, k1, cost });
                np += 1;
                k0 = k1;
                if k0 >= h1 {
                    break;
                }
            }
        }
        out.tiles.push((first, np));
        out.tile_of.extend(std::iter::repeat_n(ti, q1 - q0));
    }
    out
}

/// Queries per tile for `g` heads per KV head: about `rows` rows, preferably a multiple
/// of 6 (the AVX-512 register tile's rows), so that no row block runs half empty.
pub(crate) fn query_tile(g: usize, rows: usize) -> usize {
    let qt = (rows / g).max(1);
    (qt.div_ceil(2)..=qt).rev().find(|&t| (t * g).is_multiple_of(6)).unwrap_or(qt)
}

/// The partial results of every item: rows `offsets[i]..offsets[i + 1]` of `acc` (`d`
/// per row, unnormalised), `m` (log2 running maximum) and `l` (sum).
pub(crate) struct Parts<'a> {
    pub plan: &'a Plan,
    pub offsets: &'a [usize],
    pub acc: &'a [f32],
    pub m: &'a [f32],
    pub l: &'a [f32],
    pub g: usize,
    pub d: usize,
}

impl Parts<'_> {
    /// Merge query row `qi`: `o` is its `[Hq, d]` output, `ls` its `[Hq]` LSE.
    pub fn merge_row(&self, qi: usize, o: &mut [f32], ls: &mut [f32]) {
        let (g, d) = (self.g, self.d);
        let (first, np) = self.plan.tiles[self.plan.tile_of[qi]];
        let q0 = self.plan.items[first].q0;
        for (h, (orow, lrow)) in o.chunks_mut(g * d).zip(ls.chunks_mut(g)).enumerate() {
            let pieces = first + h * np..first + (h + 1) * np;
            for j in 0..g {
                let rows = pieces.clone().map(|i| self.offsets[i] + (qi - q0) * g + j);
                lrow[j] = merge_row(rows, self.acc, self.m, self.l, &mut orow[j * d..(j + 1) * d]);
            }
        }
    }
}
