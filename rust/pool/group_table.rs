//! One (sequence, group) block table: logical block `i` (positions `i*bs .. (i+1)*bs`) ->
//! a physical block, or a *hole* (released by the window rule, or never stored by a
//! prefix-cache hit).
//!
//! Layout, bounded by the window whatever the sequence's length: the sink blocks
//! (`0 .. min(len_blocks, sink_blocks)`, never released, so always stored) in `head`, then
//! holes, then the contiguous *run* of stored window blocks in a `VecDeque` with the
//! logical index of its first entry. The window rule releases from the front of the run
//! only (a block's release point grows with its index), and growth appends at the back, so
//! a table of a sequence 100x its window holds the same few entries as at 1x. A full
//! attention group has no sinks and never releases: its run is the whole table.
//!
//! Shape invariants (checked by `BlockPool::check_invariants`): `head.len() ==
//! min(len_blocks, sink_blocks)`; holes are exactly `head.len() .. run_start`; the run ends
//! at `len_blocks`, and an empty run has `run_start == len_blocks` (a table may end in
//! holes only when its run is empty: a window of one token, or a chunk boundary, after a
//! truncation).
//!
//! A block taken at a hole (a growth from a length inside a released block) holds no KV
//! for the positions before the growth: the table keeps the first position its run holds
//! (`written_from`, read by [`GroupTable::holds`]), so that a rollback into those positions is refused and
//! such a block is never cached.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use super::spec::GroupSpec;
use crate::error::{KvError, Result};
use crate::types::BlockId;

/// The smallest growth start (sequence length) at which the window rule releases logical
/// block `i`: `releasable(i, bs, p)` holds exactly for `p >= release_len(i)`
/// (`usize::MAX`: never, for full attention and sink blocks).
pub fn release_len(spec: &GroupSpec, i: usize, bs: usize) -> usize {
    let end = (i.saturating_add(1)).saturating_mul(bs);
    match *spec {
        GroupSpec::Full => usize::MAX,
        GroupSpec::SlidingWindow { window, sink_tokens } => {
            if i.saturating_mul(bs) < sink_tokens {
                usize::MAX
            } else {
                end.saturating_add(window - 1)
            }
        }
        GroupSpec::Chunked { chunk } => end.div_ceil(chunk).saturating_mul(chunk),
    }
}

/// No block: a hole, or an empty table.
const NIL: u32 = u32::MAX;

/// Stamps of table versions, unique across every table of the process (a table mirror
/// compares them: an equal stamp means the same table, changed at most by appends and
/// window releases).
static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

fn next_stamp() -> u64 {
    NEXT_STAMP.fetch_add(1, Ordering::Relaxed)
}

/// The logical block table of one sequence in one group: the two fields a decode step
/// reads inline (8 bytes, next to the sequence's length), the rest behind a box, touched
/// only when a block is added or released (about once per `block_size` tokens).
#[derive(Clone, Debug)]
pub struct GroupTable {
    /// The last entry when it is stored, else `NIL`.
    last: u32,
    /// `release_len(run_start)` while the run is not empty and that length is reachable
    /// (`<= i32::MAX`), else `u32::MAX`: a decode step compares the length against it.
    release_at: u32,
    b: Box<Body>,
}

#[derive(Clone, Debug)]
struct Body {
    len_blocks: usize,
    run_start: usize,
    sink_blocks: usize,
    block_size: usize,
    spec: GroupSpec,
    head: Vec<BlockId>,
    run: VecDeque<BlockId>,
    /// A new stamp whenever an entry is replaced or removed (not on appends or window
    /// releases, which only turn the run's front into holes).
    stamp: u64,
    /// The first position the run holds KV for: `run_start * block_size` or below, except
    /// when the run's first block was taken at a hole, whose positions before the growth
    /// that took it were never written.
    written_from: usize,
}

#[inline]
fn pack(b: Option<BlockId>) -> u32 {
    b.map_or(NIL, |b| b.0)
}

#[inline]
fn clamp(len: usize) -> u32 {
    len.min(u32::MAX as usize) as u32
}

impl GroupTable {
    /// An empty table for a group of kind `spec` with blocks of `block_size` tokens.
    pub fn new(spec: GroupSpec, block_size: usize) -> Self {
        Self {
            last: NIL,
            release_at: u32::MAX,
            b: Box::new(Body {
                len_blocks: 0,
                run_start: 0,
                sink_blocks: spec.sink_tokens().div_ceil(block_size),
                block_size,
                spec,
                head: Vec::new(),
                run: VecDeque::new(),
                stamp: next_stamp(),
                written_from: 0,
            }),
        }
    }

    /// A table whose every entry is stored: `blocks`, in logical order (a new sequence's
    /// blocks; the run takes the vector's buffer as is).
    pub fn from_blocks(spec: GroupSpec, block_size: usize, mut blocks: Vec<BlockId>) -> Self {
        let mut t = Self::new(spec, block_size);
        let n = blocks.len();
        let sinks = n.min(t.b.sink_blocks);
        // The sinks get a buffer of their own size; the run keeps the vector's.
        t.b.head = blocks.drain(..sinks).collect();
        t.b.run = VecDeque::from(blocks);
        t.b.len_blocks = n;
        t.b.run_start = sinks;
        t.refresh();
        t
    }

    /// An empty table with room for `blocks` entries appended without reallocation.
    pub fn with_capacity(spec: GroupSpec, block_size: usize, blocks: usize) -> Self {
        let mut t = Self::new(spec, block_size);
        let sinks = blocks.min(t.b.sink_blocks);
        t.b.head.reserve_exact(sinks);
        t.b.run.reserve_exact(blocks - sinks);
        t
    }

    /// Logical blocks: `ceil(len / block_size)` of the sequence.
    #[inline]
    pub fn len_blocks(&self) -> usize {
        self.b.len_blocks
    }

    /// Entries stored (not holes).
    #[inline]
    pub fn num_stored(&self) -> usize {
        self.b.head.len() + self.b.run.len()
    }

    /// Hole entries.
    #[inline]
    pub fn num_holes(&self) -> usize {
        self.b.len_blocks - self.num_stored()
    }

    /// The last entry if it is stored.
    #[inline]
    pub fn last(&self) -> Option<BlockId> {
        (self.last != NIL).then_some(BlockId(self.last))
    }

    /// The sequence length at which the next growth releases the run's first block.
    #[inline]
    pub fn release_at(&self) -> usize {
        self.release_at as usize
    }

    /// Blocks `0 .. sink_blocks` hold a sink position and are never released.
    #[inline]
    pub fn sink_blocks(&self) -> usize {
        self.b.sink_blocks
    }

    /// Logical index of the run's first entry (`len_blocks` when the run is empty): the
    /// `kv_page_start` of FlashInfer's export.
    #[inline]
    pub fn run_start(&self) -> usize {
        self.b.run_start
    }

    /// The stored sink entries, logical blocks `0 .. head().len()`.
    #[inline]
    pub fn head(&self) -> &[BlockId] {
        &self.b.head
    }

    /// The stored window entries, logical blocks `run_start() ..`.
    #[inline]
    pub fn run(&self) -> &VecDeque<BlockId> {
        &self.b.run
    }

    /// Whether stored entry `i` holds KV for all of its positions (a block taken at a hole
    /// does not).
    #[inline]
    pub fn fully_written(&self, i: usize) -> bool {
        i < self.b.head.len() || i * self.b.block_size >= self.b.written_from
    }

    /// Whether entry `i` is stored and holds KV for its positions from `p` on (a block
    /// taken at a hole holds none before its first write).
    #[inline]
    pub fn holds(&self, i: usize, p: usize) -> bool {
        self.get(i).is_some() && (self.fully_written(i) || p.max(i * self.b.block_size) >= self.b.written_from)
    }

    /// Entry `i` (None for a hole or past the end).
    #[inline]
    pub fn get(&self, i: usize) -> Option<BlockId> {
        if i < self.b.head.len() {
            Some(self.b.head[i])
        } else if i >= self.b.run_start {
            self.b.run.get(i - self.b.run_start).copied()
        } else {
            None
        }
    }

    /// Every logical entry in order: a block or `None` for a hole.
    pub fn entries(&self) -> impl Iterator<Item = Option<BlockId>> + '_ {
        let holes = self.b.run_start - self.b.head.len();
        let tail = self.b.len_blocks - self.b.run_start - self.b.run.len();
        self.b.head
            .iter()
            .map(|&b| Some(b))
            .chain(std::iter::repeat_n(None, holes))
            .chain(self.b.run.iter().map(|&b| Some(b)))
            .chain(std::iter::repeat_n(None, tail))
    }

    /// `(logical index, block)` of every stored entry, in logical order.
    pub fn stored(&self) -> impl Iterator<Item = (usize, BlockId)> + '_ {
        let rs = self.b.run_start;
        self.b.head.iter().copied().enumerate().chain(self.b.run.iter().enumerate().map(move |(k, &b)| (rs + k, b)))
    }

    fn refresh(&mut self) {
        if self.b.run.is_empty() {
            self.b.run_start = self.b.len_blocks;
            self.release_at = u32::MAX;
            self.last = pack(if self.b.head.len() == self.b.len_blocks { self.b.head.last().copied() } else { None });
        } else {
            self.release_at = clamp(release_len(&self.b.spec, self.b.run_start, self.b.block_size));
            self.last = pack(self.b.run.back().copied());
        }
    }

    /// Append a stored entry at logical index `len_blocks()`.
    #[inline]
    pub fn push(&mut self, b: BlockId) {
        if self.b.len_blocks < self.b.sink_blocks {
            self.b.head.push(b);
            self.b.len_blocks += 1;
            self.b.run_start = self.b.len_blocks;
        } else {
            let was_empty = self.b.run.is_empty();
            self.b.run.push_back(b);
            self.b.len_blocks += 1;
            if was_empty {
                // A block pushed is written from its start; `min` keeps what an undone
                // release hands back (the one-pass decode's log) as it was.
                self.b.written_from = self.b.written_from.min(self.b.run_start * self.b.block_size);
                self.release_at = clamp(release_len(&self.b.spec, self.b.run_start, self.b.block_size));
            }
        }
        self.last = b.0;
    }

    /// Append a hole at logical index `len_blocks()` (a prefix-cache hit's skipped blocks).
    /// Only past the sinks and before any stored window entry.
    pub fn push_hole(&mut self) -> Result<()> {
        if self.b.len_blocks < self.b.sink_blocks || !self.b.run.is_empty() {
            return Err(KvError::Invariant(format!(
                "a hole at logical block {} of a table with {} sink blocks and {} window blocks",
                self.b.len_blocks,
                self.b.sink_blocks,
                self.b.run.len()
            )));
        }
        self.b.len_blocks += 1;
        self.refresh();
        Ok(())
    }

    /// A new version for mirrors: the table is not the one a mirror saw under the old
    /// stamp (a fork's copy of its parent's table).
    pub fn restamp(&mut self) {
        self.b.stamp = next_stamp();
    }

    /// The table's version for mirrors (see the field).
    #[inline]
    pub fn stamp(&self) -> u64 {
        self.b.stamp
    }

    /// Put `b` in the last entry (a copy-on-write copy, or a new block for a last entry
    /// that is a hole, which a growth writes from offset `from` on); returns the block it
    /// replaces, if any.
    pub fn set_last(&mut self, b: BlockId, from: usize) -> Option<BlockId> {
        self.b.stamp = next_stamp();
        let old = if let Some(x) = self.b.run.back_mut() {
            Some(std::mem::replace(x, b))
        } else if self.b.head.len() == self.b.len_blocks && !self.b.head.is_empty() {
            self.b.head.last_mut().map(|x| std::mem::replace(x, b))
        } else {
            // A trailing hole (the run is empty and the last entry lies past the sinks).
            self.b.run_start = self.b.len_blocks - 1;
            self.b.written_from = self.b.run_start * self.b.block_size + from;
            self.b.run.push_back(b);
            self.release_at = clamp(release_len(&self.b.spec, self.b.run_start, self.b.block_size));
            None
        };
        self.last = b.0;
        old
    }

    /// Put `b` in stored entry `i` (a block's cached twin taking its place); returns the
    /// block it replaces, None (changing nothing) for a hole or past the end.
    pub fn replace(&mut self, i: usize, b: BlockId) -> Option<BlockId> {
        let x = if i < self.b.head.len() {
            &mut self.b.head[i]
        } else if i >= self.b.run_start {
            self.b.run.get_mut(i - self.b.run_start)?
        } else {
            return None;
        };
        let old = std::mem::replace(x, b);
        self.b.stamp = next_stamp();
        if self.last == old.0 && i + 1 == self.b.len_blocks {
            self.last = b.0;
        }
        Some(old)
    }

    /// Window blocks the rule releases at the start of a growth from length `len`: a
    /// prefix of the run.
    pub fn releasable_count(&self, len: usize) -> usize {
        if len < self.release_at as usize {
            return 0;
        }
        let mut k = 1;
        while k < self.b.run.len() && release_len(&self.b.spec, self.b.run_start + k, self.b.block_size) <= len {
            k += 1;
        }
        k
    }

    /// The first `k` blocks of the run (those [`Self::releasable_count`] counted).
    pub fn run_front(&self, k: usize) -> impl Iterator<Item = BlockId> + '_ {
        self.b.run.iter().take(k).copied()
    }

    /// Release the run entries the window rule releases at the start of a growth from
    /// length `len` (they become holes), first one first, handing each to `f`; returns how
    /// many ([`Self::releasable_count`]).
    pub fn release_for(&mut self, len: usize, mut f: impl FnMut(BlockId)) -> usize {
        let mut k = 0;
        while len >= self.release_at as usize {
            let Some(b) = self.b.run.pop_front() else { break };
            self.b.run_start += 1;
            k += 1;
            f(b);
            self.release_at = if self.b.run.is_empty() { u32::MAX } else { clamp(release_len(&self.b.spec, self.b.run_start, self.b.block_size)) };
        }
        if k > 0 {
            // A long prompt filled the run once; the window keeps a few blocks of it.
            let n = self.b.run.len();
            if self.b.run.capacity() > 4 * n + 64 {
                self.b.run.shrink_to(2 * n + 16);
            }
            if n == 0 {
                self.refresh();
            }
        }
        k
    }

    /// Undo one release of [`Self::release_for`]: the hole before the run gets `b` back.
    /// The stamp stays: the table is as it was before the release (a mirror's view).
    pub fn unrelease_front(&mut self, b: BlockId) {
        self.b.run_start -= 1;
        self.b.run.push_front(b);
        self.refresh();
    }

    /// Empty the table, handing its stored blocks to `f` head first, in at most three
    /// slices (the sinks, then the run's two halves).
    pub fn drain_head_first(&mut self, mut f: impl FnMut(&[BlockId])) {
        self.b.stamp = next_stamp();
        f(&self.b.head);
        let (a, b) = self.b.run.as_slices();
        f(a);
        f(b);
        self.b.head.clear();
        self.b.run.clear();
        self.b.len_blocks = 0;
        self.refresh();
    }

    /// Undo the last [`Self::push`] (or hole fill) of a failed call: the entry goes,
    /// returned, and the stamp becomes `stamp`, what it was before (a mirror's view: the
    /// table is as it was).
    pub fn unpush(&mut self, stamp: u64) -> Option<BlockId> {
        let b = if self.b.run.is_empty() { self.b.head.pop() } else { self.b.run.pop_back() };
        self.b.len_blocks -= 1;
        self.b.stamp = stamp;
        self.refresh();
        b
    }

    /// Drop every entry from logical index `keep` on, handing the stored ones to `f`, last
    /// one first.
    pub fn truncate(&mut self, keep: usize, mut f: impl FnMut(BlockId)) {
        if self.b.len_blocks > keep {
            self.b.stamp = next_stamp();
        }
        while self.b.len_blocks > keep {
            let i = self.b.len_blocks - 1;
            if !self.b.run.is_empty() && i >= self.b.run_start {
                if let Some(b) = self.b.run.pop_back() {
                    f(b);
                }
            } else if i < self.b.head.len() {
                if let Some(b) = self.b.head.pop() {
                    f(b);
                }
            }
            self.b.len_blocks -= 1;
        }
        self.refresh();
    }

    /// Entries the table's buffers can hold without reallocating (its memory, in entries).
    pub fn capacity(&self) -> usize {
        self.b.head.capacity() + self.b.run.capacity()
    }

    /// Whether the shape invariants hold (see the module doc); the reason if not.
    pub fn shape_error(&self) -> Option<String> {
        let want_head = self.b.len_blocks.min(self.b.sink_blocks);
        if self.b.head.len() != want_head {
            return Some(format!("{} sink entries stored, expected {want_head}", self.b.head.len()));
        }
        if self.b.run_start < self.b.head.len() || self.b.run_start + self.b.run.len() > self.b.len_blocks {
            return Some(format!(
                "window run at {}..{} outside {}..{}",
                self.b.run_start,
                self.b.run_start + self.b.run.len(),
                self.b.head.len(),
                self.b.len_blocks
            ));
        }
        if !self.b.run.is_empty() && self.b.run_start + self.b.run.len() != self.b.len_blocks {
            return Some("the window run does not end at the last entry".into());
        }
        if self.b.run.is_empty() && self.b.run_start != self.b.len_blocks {
            return Some(format!("empty run starts at {}, not at {}", self.b.run_start, self.b.len_blocks));
        }
        let last = self.get(self.b.len_blocks.wrapping_sub(1));
        if self.last() != last {
            return Some(format!("caches {:?} as its last entry, which is {last:?}", self.last()));
        }
        let want = if self.b.run.is_empty() { u32::MAX } else { clamp(release_len(&self.b.spec, self.b.run_start, self.b.block_size)) };
        if self.release_at != want {
            return Some(format!("release point {} instead of {want}", self.release_at));
        }
        None
    }
}

/// The tables of one sequence, one per group. Up to two are stored inline, so that a
/// decode step over a typical hybrid model (full + sliding window) reads them next to the
/// sequence's length instead of behind a pointer.
#[derive(Clone, Debug)]
pub enum GroupTables {
    One(GroupTable),
    Two([GroupTable; 2]),
    Many(Vec<GroupTable>),
}

impl GroupTables {
    /// No tables yet, with room for `n` (pushed in group order).
    pub fn with_capacity(n: usize) -> Self {
        if n > 2 { Self::Many(Vec::with_capacity(n)) } else { Self::Many(Vec::new()) }
    }

    /// Append the next group's table (inline while there are at most two).
    pub fn push(&mut self, t: GroupTable) {
        *self = match std::mem::replace(self, Self::Many(Vec::new())) {
            Self::Many(v) if v.is_empty() && v.capacity() == 0 => Self::One(t),
            Self::One(a) => Self::Two([a, t]),
            Self::Two([a, b]) => Self::Many(vec![a, b, t]),
            Self::Many(mut v) => {
                v.push(t);
                Self::Many(v)
            }
        };
    }

    /// The tables as an array of `G` (None when there are not `G` of them): a decode visit
    /// over a constant count of groups, without the slice's length check per group.
    #[inline]
    pub fn as_array_mut<const G: usize>(&mut self) -> Option<&mut [GroupTable; G]> {
        match self {
            Self::One(t) if G == 1 => std::slice::from_mut(t).try_into().ok(),
            Self::Two(ts) if G == 2 => (&mut ts[..]).try_into().ok(),
            Self::Many(v) => (&mut v[..]).try_into().ok(),
            _ => None,
        }
    }
}

impl FromIterator<GroupTable> for GroupTables {
    fn from_iter<I: IntoIterator<Item = GroupTable>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut tables = Self::with_capacity(iter.size_hint().0);
        iter.for_each(|t| tables.push(t));
        tables
    }
}

impl std::ops::Deref for GroupTables {
    type Target = [GroupTable];

    #[inline]
    fn deref(&self) -> &[GroupTable] {
        match self {
            Self::One(t) => std::slice::from_ref(t),
            Self::Two(ts) => ts,
            Self::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for GroupTables {
    #[inline]
    fn deref_mut(&mut self) -> &mut [GroupTable] {
        match self {
            Self::One(t) => std::slice::from_mut(t),
            Self::Two(ts) => ts,
            Self::Many(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_len_is_the_first_length_that_releases() {
        let specs = [
            GroupSpec::Full,
            GroupSpec::sliding_window(1, 0).unwrap(),
            GroupSpec::sliding_window(6, 0).unwrap(),
            GroupSpec::sliding_window(5, 7).unwrap(),
            GroupSpec::chunked(4).unwrap(),
            GroupSpec::chunked(6).unwrap(),
        ];
        for s in specs {
            for bs in [1usize, 3, 4] {
                for i in 0..12 {
                    let r = release_len(&s, i, bs);
                    for p in 0..80 {
                        assert_eq!(s.releasable(i, bs, p), p >= r, "{s} bs {bs} block {i} p {p}");
                    }
                }
            }
        }
    }

    #[test]
    fn sinks_holes_and_run_stay_in_shape() {
        let s = GroupSpec::sliding_window(4, 3).unwrap();
        let mut t = GroupTable::new(s, 2);
        assert_eq!(t.sink_blocks(), 2);
        for b in 0..6 {
            t.push(BlockId(b));
        }
        assert_eq!(t.release_at(), 3 * 2 + 3);
        assert_eq!(t.releasable_count(12), 2, "blocks 2, 3: (i+1)*2 <= 12 + 1 - 4");
        assert_eq!(t.releasable_count(13), 3, "blocks 2, 3, 4");
        let mut gone = Vec::new();
        assert_eq!(t.release_for(13, |b| gone.push(b)), 3);
        assert_eq!(gone, [BlockId(2), BlockId(3), BlockId(4)]);
        let e: Vec<_> = t.entries().collect();
        assert_eq!(e, [Some(BlockId(0)), Some(BlockId(1)), None, None, None, Some(BlockId(5))]);
        assert_eq!((t.run_start(), t.num_holes(), t.get(3), t.get(5)), (5, 3, None, Some(BlockId(5))));
        t.unrelease_front(BlockId(4));
        assert_eq!(t.get(4), Some(BlockId(4)));
        t.truncate(4, |b| gone.push(b));
        assert_eq!(gone.last(), Some(&BlockId(4)));
        assert_eq!((t.len_blocks(), t.run_start(), t.last()), (4, 4, None));
        assert_eq!(t.set_last(BlockId(9), 1), None, "trailing hole filled");
        assert!(t.holds(3, 7) && !t.holds(3, 6), "written from offset 1 of logical block 3");
        assert!(t.fully_written(1) && !t.fully_written(3));
        assert_eq!(t.entries().last(), Some(Some(BlockId(9))));
        assert!(t.shape_error().is_none(), "{:?}", t.shape_error());
        assert!(t.push_hole().is_err(), "a hole after a stored window entry");
        let stored: Vec<_> = t.stored().collect();
        assert_eq!(stored, [(0, BlockId(0)), (1, BlockId(1)), (3, BlockId(9))]);
    }
}
