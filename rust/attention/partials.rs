//! Where decode's work items accumulate, and how their partial results become the
//! output.
//!
//! The output chunk of a (sequence, KV head group) is `per_item` rows of `head_dim`
//! (`per_item` query heads), and its items are consecutive in the plan. An item that is
//! its chunk's only one (no FlashDecoding split: the common case) accumulates straight
//! into the caller's `out` and normalizes it in place on the worker that ran it
//! ([`finish_alone`]): no scratch the size of the output, no second pass over it on the
//! calling thread and no second dispatch to the pool. Split chunks accumulate in
//! scratch rows and are merged by log-sum-exp afterwards ([`merge_split`]). Both end in
//! the same arithmetic ([`super::work::merge_row`] for one partial is
//! [`super::work::finish_row`]).

use std::ops::Range;
use std::sync::Mutex;

use rayon::prelude::*;

use super::work::{finish_row, lanes_finite, merge_row, Partial, LANES};

/// Rows of `out` per output chunk and their length.
#[derive(Clone, Copy)]
pub(super) struct Rows {
    /// Query heads per chunk (per item).
    pub per_item: usize,
    /// `head_dim`.
    pub d: usize,
}

/// One item's accumulator; `lse` is set when the item is its chunk's only one (its
/// `acc` is then that chunk of `out`, normalized by [`finish_alone`]).
pub(super) struct Slot<'a> {
    pub p: Partial<'a>,
    pub lse: Option<&'a mut [f32]>,
}

/// A split chunk: its items (indices into the plan), and where its merged rows and LSEs go.
pub(super) struct Split<'o> {
    pub items: Range<usize>,
    /// The chunk's first row among the scratch rows of split items.
    pub scratch_at: usize,
    pub out: &'o mut [f32],
    pub lse: &'o mut [f32],
}

/// The item ranges of each output chunk, given each item's chunk key in plan order
/// (equal keys are consecutive).
pub(super) fn spans<K: PartialEq>(keys: impl IntoIterator<Item = K>) -> Vec<Range<usize>> {
    let mut spans: Vec<Range<usize>> = Vec::new();
    let mut last = None;
    for (i, k) in keys.into_iter().enumerate() {
        match spans.last_mut() {
            Some(s) if last.as_ref() == Some(&k) => s.end = i + 1,
            _ => spans.push(i..i + 1),
        }
        last = Some(k);
    }
    spans
}

/// Scratch rows the split chunks of `spans` need (one per query head of each of their items).
pub(super) fn scratch_rows(spans: &[Range<usize>], rows: Rows) -> usize {
    spans.iter().filter(|s| s.len() > 1).map(|s| s.len() * rows.per_item).sum()
}

/// Every item's slot (in plan order) and the split chunks. `out` / `lse`: the call's
/// output (one chunk per span); `acc`: [`scratch_rows`] rows of `d`, zeroed; `m`, `l`:
/// `per_item` values per item, `-inf` and 0.
pub(super) fn slots<'o, 's, 'x>(
    spans: &[Range<usize>],
    rows: Rows,
    out: &'o mut [f32],
    lse: &'o mut [f32],
    acc: &'s mut [f32],
    m: &'s mut [f32],
    l: &'s mut [f32],
) -> (Vec<Mutex<Slot<'x>>>, Vec<Split<'o>>)
where
    'o: 'x,
    's: 'x,
{
    let Rows { per_item, d } = rows;
    let mut slots = Vec::with_capacity(m.len() / per_item.max(1));
    let mut splits = Vec::new();
    let mut scratch = acc.chunks_mut(per_item * d);
    let mut ml = m.chunks_mut(per_item).zip(l.chunks_mut(per_item));
    let mut scratch_at = 0;
    for ((span, o), ls) in spans.iter().zip(out.chunks_mut(per_item * d)).zip(lse.chunks_mut(per_item)) {
        if span.len() == 1 {
            let (m, l) = ml.next().expect("m and l hold a row per item and head");
            slots.push(Mutex::new(Slot { p: Partial { acc: o, m, l, nan_codes: false }, lse: Some(ls) }));
            continue;
        }
        for _ in span.clone() {
            let (m, l) = ml.next().expect("m and l hold a row per item and head");
            let acc = scratch.next().expect("scratch holds the split items' rows");
            slots.push(Mutex::new(Slot { p: Partial { acc, m, l, nan_codes: false }, lse: None }));
        }
        splits.push(Split { items: span.clone(), scratch_at, out: o, lse: ls });
        scratch_at += span.len() * per_item;
    }
    (slots, splits)
}

/// Normalize an alone item's rows in place (its `acc` is its chunk of `out`) and write
/// their LSEs: what merging its one partial would give. Returns whether every output
/// value is finite.
pub(super) fn finish_alone(p: &mut Partial, lse: &mut [f32], d: usize) -> bool {
    let mut sums = [0f32; LANES];
    for ((row, (&m, &l)), ls) in p.acc.chunks_exact_mut(d.max(1)).zip(p.m.iter().zip(p.l.iter())).zip(lse) {
        *ls = finish_row(row, m, l, &mut sums);
    }
    lanes_finite(&sums, p.acc)
}

/// Merge each split chunk's partials into its rows of `out` (`acc`: the scratch rows;
/// `m`, `l`: every item's), on the pool when there is more than a little of it.
pub(super) fn merge_split(splits: Vec<Split>, rows: Rows, acc: &[f32], m: &[f32], l: &[f32], pool: &rayon::ThreadPool) {
    let Rows { per_item, d } = rows;
    let body = |s: Split| {
        let n = s.items.len();
        let acc = &acc[s.scratch_at * d..(s.scratch_at + n * per_item) * d];
        let (m, l) = (&m[s.items.start * per_item..s.items.end * per_item], &l[s.items.start * per_item..s.items.end * per_item]);
        for h in 0..per_item {
            let parts = (0..n).map(|k| k * per_item + h);
            s.lse[h] = merge_row(parts, acc, m, l, &mut s.out[h * d..(h + 1) * d]);
        }
    };
    // Below this many partial values a second dispatch to the pool (tens of
    // microseconds to wake its threads on a virtual machine) costs more than it saves.
    const PARALLEL_ABOVE: usize = 1 << 18;
    if splits.len() <= 1 || pool.current_num_threads() == 1 || acc.len() <= PARALLEL_ABOVE {
        splits.into_iter().for_each(body);
    } else {
        pool.install(|| splits.into_par_iter().for_each(body));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_group_consecutive_equal_keys() {
        assert_eq!(spans([(0, 0), (0, 0), (0, 1), (1, 0), (1, 0), (1, 0)]), vec![0..2, 2..3, 3..6]);
        assert_eq!(spans(Vec::<u8>::new()), Vec::<Range<usize>>::new());
        assert_eq!(spans([7]), vec![0..1]);
    }

    /// Alone items get their chunk of `out` (rows `per_item * d` long, in order), split
    /// ones scratch rows in order, every item its own `m` / `l` rows.
    #[test]
    fn alone_items_accumulate_in_out_and_split_ones_in_scratch() {
        let rows = Rows { per_item: 2, d: 3 };
        let sp = vec![0..1, 1..3, 3..4];
        let (mut out, mut lse) = (vec![0f32; 3 * 6], vec![0f32; 3 * 2]);
        let mut acc = vec![0f32; scratch_rows(&sp, rows) * 3];
        assert_eq!(acc.len(), 2 * 2 * 3);
        let (mut m, mut l) = (vec![f32::NEG_INFINITY; 4 * 2], vec![0f32; 4 * 2]);
        let (slots, splits) = slots(&sp, rows, &mut out, &mut lse, &mut acc, &mut m, &mut l);
        assert_eq!(slots.len(), 4);
        let mark = |i: usize, v: f32| {
            let mut s = slots[i].lock().unwrap();
            s.p.acc.fill(v);
            s.p.m.fill(v);
            s.lse.is_some()
        };
        assert_eq!([mark(0, 1.0), mark(1, 2.0), mark(2, 3.0), mark(3, 4.0)], [true, false, false, true]);
        assert_eq!(splits.len(), 1);
        assert_eq!((splits[0].items.clone(), splits[0].scratch_at, splits[0].out.len()), (1..3, 0, 6));
        drop((slots, splits));
        assert_eq!(out, [[1.0; 6], [0.0; 6], [4.0; 6]].concat());
        assert_eq!(acc, [[2.0; 6], [3.0; 6]].concat());
        assert_eq!(m, [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]);
    }
}
