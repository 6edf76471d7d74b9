//! Growth of sequences in every group: admission, batched steps and the one-pass decode.
//!
//! A growth of a sequence of length `L` by `n > 0` tokens first releases, in each
//! windowed group, the stored blocks the window rule releases for `L` (a prefix of the
//! table's window run), then appends `n` slots in every group: the rest of a partly filled
//! last block (copied first when it is shared or cached; a fresh block when that entry is
//! a hole, which happens only after a truncation), then new blocks. A growth by 0 tokens
//! is no growth: nothing is released and the frontier stays. `mark_computed` applies the
//! same release for a next query at the current length without growing (a chunk whose
//! queries are all computed gives back at once what left the window).
//!
//! A batch runs in three phases: plan (resolve every id, catch duplicates and overflow,
//! count releases, new blocks and copies as the apply will see them), check (the blocks
//! needed against free + idle cached + what the batch's releases free), apply (every
//! release of the batch first, then every growth in batch order). Nothing is mutated
//! before the check passes, so an error leaves the pool as it was.
//!
//! The all-ones decode step on a pool with no shared and no cached block takes a one-pass
//! path: each sequence is resolved, released and grown in one visit,
//! and an error undoes the visits already made, in reverse, from a log of what they did,
//! which leaves the allocator's free-list stack exactly as it was.

use super::group_table::{GroupTable, GroupTables};
use super::GroupSpec;
use super::{SeqEntry, BlockPool, StepOutput, Undo};
use crate::error::{KvError, Result};
use crate::invalid;
use crate::pool::MAX_SEQ_TOKENS;
use crate::pool::seq_map::SeqMap;
use crate::types::{BlockId, SeqId};

impl BlockPool {
    /// Add `seq` holding `prompt_len` tokens in every group (a growth from 0: nothing to
    /// release). `out` gets the slots `[G, prompt_len]` and `seq_lens = [prompt_len]`.
    pub fn add_sequence(&mut self, seq: SeqId, prompt_len: usize, out: &mut StepOutput) -> Result<()> {
        out.clear();
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSequence(seq.0));
        }
        Self::checked_len(0, prompt_len)?;
        let nb = prompt_len.div_ceil(self.block_size);
        self.ensure_available(nb * self.groups.len(), 0)?;
        let tables = self.grow_new(prompt_len, out)?;
        let entry = SeqEntry { len: prompt_len, frontier: 0, prev_frontier: 0, mark: 0, tables, cursor: None };
        self.seqs.insert(seq, entry);
        out.seq_lens.push(prompt_len as i32);
        self.end_op();
        Ok(())
    }

    /// Add `seq` holding `len` tokens whose latest growth started at `frontier` (`<= len`):
    /// every group stores what the release rule keeps for that growth, the rest are holes
    /// (a sequence moved back from another pool, e.g. a swap-in). Its blocks are fresh
    /// (never cached); the caller writes their K/V. `frontier` 0 is [`Self::add_sequence`]
    /// without slots.
    pub fn add_sequence_at(&mut self, seq: SeqId, len: usize, frontier: usize) -> Result<()> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSequence(seq.0));
        }
        Self::checked_len(0, len)?;
        if frontier > len {
            return Err(invalid!("frontier: {frontier} is past the sequence's {len} tokens"));
        }
        let bs = self.block_size;
        let nb = len.div_ceil(bs);
        let kept = |s: &super::GroupSpec| (0..nb).filter(|&i| !s.releasable(i, bs, frontier)).count();
        let need: usize = self.groups.iter().map(kept).sum();
        self.ensure_available(need, 0)?;
        let mut tables = GroupTables::with_capacity(self.groups.len());
        for spec in self.groups.clone() {
            let mut t = GroupTable::with_capacity(spec, bs, kept(&spec));
            for i in 0..nb {
                if spec.releasable(i, bs, frontier) {
                    t.push_hole()?;
                } else {
                    t.push(self.take_block()?);
                }
            }
            tables.push(t);
        }
        self.seqs.insert(seq, SeqEntry { len, frontier, prev_frontier: frontier, mark: 0, tables, cursor: None });
        self.end_op();
        Ok(())
    }

    /// New tables of `len` tokens in every group, their slots in `out` (blocks checked by
    /// the caller), group after group.
    pub(crate) fn grow_new(&mut self, len: usize, out: &mut StepOutput) -> Result<GroupTables> {
        let bs = self.block_size;
        let nb = len.div_ceil(bs);
        let g_count = self.groups.len();
        out.slots.clear();
        out.slots.reserve(g_count * len);
        out.total_tokens = len;
        let mut tables = GroupTables::with_capacity(g_count);
        for g in 0..g_count {
            // Room to grow: the decode that follows appends its first blocks without moving
            // the table (a move at every table's first new block made the first steps after
            // an admission cost 3-8x the steady state's).
            let mut blocks = Vec::with_capacity(nb + nb / 8 + 8);
            for _ in 0..nb {
                // Checked by the caller: a failure here is a bug, reported after cleanup.
                let Ok(b) = self.take_block() else {
                    blocks.into_iter().rev().for_each(|b| self.release_block(b));
                    for t in tables.iter_mut() {
                        t.truncate(0, |b| self.release_block(b));
                    }
                    out.clear();
                    return Err(KvError::Invariant("allocation after a successful capacity check failed".into()));
                };
                blocks.push(b);
            }
            // Full blocks, then the last one's tokens (a loop of constant-length runs).
            let slots = &mut out.slots;
            let (full, rest) = (len / bs, len % bs);
            for b in &blocks[..full] {
                let first = b.first_slot(bs);
                slots.extend(first..first + bs as i64);
            }
            if let Some(b) = blocks.get(full).filter(|_| rest > 0) {
                let first = b.first_slot(bs);
                slots.extend(first..first + rest as i64);
            }
            tables.push(GroupTable::from_blocks(self.groups[g], bs, blocks));
        }
        Ok(tables)
    }

    /// Grow every sequence `seqs[i]` by `counts[i]` tokens, atomically over the batch.
    pub fn step(&mut self, seqs: &[SeqId], counts: &[usize], out: &mut StepOutput) -> Result<()> {
        out.clear();
        if seqs.len() != counts.len() {
            return Err(invalid!("counts: {} sequence ids but {} token counts", seqs.len(), counts.len()));
        }
        self.step_run(seqs, counts, false, out)?;
        self.end_op();
        Ok(())
    }

    /// [`Self::step`] with one token for every sequence (a decode step).
    pub fn step_decode(&mut self, seqs: &[SeqId], out: &mut StepOutput) -> Result<()> {
        // `slots` keeps its length: the one-pass decode overwrites every entry, so a batch
        // as long as the last one writes its slots without zero-filling them first.
        out.total_tokens = 0;
        out.cow.clear();
        out.seq_lens.clear();
        out.loads.clear();
        let mut ones = std::mem::take(&mut self.decode.ones);
        if ones.len() < seqs.len() {
            ones.resize(seqs.len(), 1);
        }
        let r = self.step_run(seqs, &ones[..seqs.len()], true, out);
        self.decode.ones = ones;
        r?;
        self.end_op();
        Ok(())
    }

    /// A step without closing the call (`append_tokens` registers blocks first).
    pub(crate) fn step_run(&mut self, seqs: &[SeqId], counts: &[usize], all_ones: bool, out: &mut StepOutput) -> Result<()> {
        // The map is moved out so that tables can be borrowed next to the allocator.
        let mut map = std::mem::take(&mut self.seqs);
        let r = self.step_in(&mut map, seqs, counts, all_ones, out);
        self.seqs = map;
        if r.is_err() {
            out.clear();
        }
        r
    }

    fn step_in(
        &mut self,
        map: &mut SeqMap<SeqEntry>,
        seqs: &[SeqId],
        counts: &[usize],
        all_ones: bool,
        out: &mut StepOutput,
    ) -> Result<()> {
        self.batch_mark += 1;
        if self.one_pass_fits(seqs.len()) && (all_ones || counts.iter().all(|&n| n == 1)) {
            let mark = self.batch_mark;
            let done = match self.groups[..] {
                [GroupSpec::Full] => self.decode_one_pass_full(map, seqs, mark, out)?,
                [_] => self.decode_one_pass::<1>(map, seqs, mark, out)?,
                [_, _] => self.decode_one_pass::<2>(map, seqs, mark, out)?,
                [_, _, _] => self.decode_one_pass::<3>(map, seqs, mark, out)?,
                _ => self.decode_one_pass::<4>(map, seqs, mark, out)?,
            };
            if done {
                return Ok(());
            }
            // Ran dry part-way (undone): the general path reports it.
            out.clear();
            self.batch_mark += 1;
        }
        out.slots.clear();
        let mut slots = std::mem::take(&mut self.slot_scratch);
        let planned = self.plan(map, seqs, counts, &mut slots);
        let r = planned.and_then(|(need, gained, total)| {
            self.ensure_available(need, gained)?;
            self.apply(map, &slots, counts, total, out)
        });
        self.slot_scratch = slots;
        r
    }

    /// Plan a batch: `(blocks needed, blocks the releases make available, new tokens)`.
    /// Marks entries (a later duplicate is an error) but changes nothing else.
    fn plan(
        &mut self,
        map: &mut SeqMap<SeqEntry>,
        seqs: &[SeqId],
        counts: &[usize],
        slots: &mut Vec<u32>,
    ) -> Result<(usize, usize, usize)> {
        let mark = self.batch_mark;
        let plain = self.alloc.num_shared() == 0 && self.cache.is_none();
        let bs = self.block_size;
        let mut releases = std::mem::take(&mut self.release_scratch);
        releases.clear();
        slots.clear();
        slots.reserve(seqs.len());
        let (mut need, mut gained, mut total) = (0usize, 0usize, 0usize);
        let mut result = Ok(());
        for (&seq, &n) in seqs.iter().zip(counts) {
            let Some((slot, e)) = map.slot(&seq).and_then(|s| Some((s, map.at_mut(s)?))) else {
                result = Err(KvError::UnknownSequence(seq.0));
                break;
            };
            if e.mark == mark {
                result = Err(invalid!("seq_ids: sequence id {} appears twice in one step", seq.0));
                break;
            }
            e.mark = mark;
            slots.push(slot);
            let end = match Self::checked_len(e.len, n) {
                Ok(end) => end,
                Err(err) => {
                    result = Err(err);
                    break;
                }
            };
            if n == 0 {
                continue;
            }
            total += n;
            let hole_last = self.offset_in_block(e.len) != 0;
            for t in e.tables.iter() {
                let k = t.releasable_count(e.len);
                if plain {
                    gained += k;
                    need += (hole_last && t.last().is_none()) as usize;
                } else {
                    releases.extend(t.run_front(k));
                }
                need += end.div_ceil(bs) - t.len_blocks();
            }
        }
        if result.is_ok() && !plain {
            releases.sort_unstable();
            gained = self.released_to_zero(&releases);
            need += self.plan_copies(map, slots, counts, &releases);
        }
        self.release_scratch = releases;
        result.map(|()| (need, gained, total))
    }

    /// Blocks whose every reference the sorted `releases` drop and that become available
    /// (free, or idle and not hard-pinned).
    fn released_to_zero(&self, releases: &[BlockId]) -> usize {
        let mut gained = 0;
        for run in releases.chunk_by(|a, b| a == b) {
            gained += (self.alloc.refcount(run[0]) as usize == run.len() && !self.is_hard_pinned(run[0])) as usize;
        }
        gained
    }

    /// Blocks the partly filled last entries of a planned batch take: a copy of a shared or
    /// cached block (as the apply will see it: after every release of the batch and the
    /// copies earlier in it), or a fresh block for a trailing hole.
    fn plan_copies(&mut self, map: &mut SeqMap<SeqEntry>, slots: &[u32], counts: &[usize], releases: &[BlockId]) -> usize {
        let mut copies = std::mem::take(&mut self.cow_scratch);
        copies.clear();
        let mut need = 0;
        for (&slot, &n) in slots.iter().zip(counts) {
            let Some(e) = map.at_mut(slot) else { continue };
            if n == 0 || self.offset_in_block(e.len) == 0 {
                continue;
            }
            for t in e.tables.iter() {
                let Some(b) = t.last() else {
                    need += 1;
                    continue;
                };
                let released = releases.partition_point(|&x| x < b);
                let released = (releases[released..].partition_point(|&x| x == b)) as u32;
                let copied = copies.iter().find(|(x, _)| *x == b).map_or(0, |c| c.1);
                if self.must_copy(b, copied, released) {
                    need += 1;
                    match copies.iter_mut().find(|(x, _)| *x == b) {
                        Some(c) => c.1 += 1,
                        None => copies.push((b, 1)),
                    }
                }
            }
        }
        self.cow_scratch = copies;
        need
    }

    /// Apply a planned, checked batch: every release first, then every growth.
    fn apply(
        &mut self,
        map: &mut SeqMap<SeqEntry>,
        slots: &[u32],
        counts: &[usize],
        total: usize,
        out: &mut StepOutput,
    ) -> Result<()> {
        let lost = || KvError::Invariant("batch entry lost between plan and apply".into());
        for (&slot, &n) in slots.iter().zip(counts) {
            let e = map.at_mut(slot).ok_or_else(lost)?;
            if n > 0 {
                self.release_for(&mut e.tables, e.len);
            }
        }
        let g_count = self.groups.len();
        out.slots.resize(g_count * total, 0);
        out.total_tokens = total;
        out.seq_lens.reserve(slots.len());
        let mut at = 0;
        for (&slot, &n) in slots.iter().zip(counts) {
            let e = map.at_mut(slot).ok_or_else(lost)?;
            if n > 0 {
                for (g, t) in e.tables.iter_mut().enumerate() {
                    let mut i = g * total + at;
                    let slots = &mut out.slots;
                    let emit = |run: std::ops::Range<i64>| {
                        for s in run {
                            slots[i] = s;
                            i += 1;
                        }
                    };
                    self.grow_table(t, e.len, n, emit, &mut out.cow)?;
                }
                e.frontier = e.len;
                e.len += n;
                if !e.cursor.as_ref().is_some_and(|c| c.deferred) {
                    e.cursor = None;
                }
                at += n;
            }
            out.seq_lens.push(e.len as i32);
        }
        Ok(())
    }

    /// The release rule for a next query at `len`, in every group of one sequence: each
    /// table drops the front of its window run that no query at or after `len` needs.
    fn release_for(&mut self, tables: &mut GroupTables, len: usize) {
        for t in tables.iter_mut() {
            t.release_for(len, |b| self.release_block(b));
        }
    }

    /// Every query up to the current length of each of `seqs` has been computed: the
    /// frontier becomes the length and every windowed group releases now what the release
    /// rule releases for a next query at the length (what the next growth would release
    /// first). Atomic: an unknown id fails before anything changes. Idempotent: a second
    /// call, or an id listed twice, releases nothing more.
    pub fn mark_computed(&mut self, seqs: &[SeqId]) -> Result<()> {
        if let Some(s) = seqs.iter().find(|s| !self.seqs.contains_key(s)) {
            return Err(KvError::UnknownSequence(s.0));
        }
        let mut map = std::mem::take(&mut self.seqs);
        for s in seqs {
            if let Some(e) = map.get_mut(s) {
                e.frontier = e.len;
                e.prev_frontier = e.len;
                self.release_for(&mut e.tables, e.len);
            }
        }
        self.seqs = map;
        self.end_op();
        Ok(())
    }

    /// Blocks the release rule for a next query at the current length of `seq` would make
    /// available now (what [`Self::mark_computed`] or the next growth releases, less the
    /// blocks another sequence still holds or a hard pin keeps).
    pub fn release_gain(&self, seq: SeqId) -> Result<usize> {
        let e = self.entry(seq)?;
        Ok(e.tables.iter().map(|t| t.run_front(t.releasable_count(e.len)).filter(|&b| self.sole_unpinned(b)).count()).sum())
    }

    /// Blocks a growth of `seq` by `n` tokens makes available by copying away: a cached
    /// partly filled last block that only `seq` holds and no hard pin keeps goes idle
    /// once its copy takes its place (one per group).
    pub fn copy_gain(&self, seq: SeqId, n: usize) -> Result<usize> {
        let e = self.entry(seq)?;
        if n == 0 || self.offset_in_block(e.len) == 0 {
            return Ok(0);
        }
        Ok(e.tables.iter().filter(|t| t.last().is_some_and(|b| self.is_cached(b) && self.sole_unpinned(b))).count())
    }

    #[inline]
    fn sole_unpinned(&self, b: BlockId) -> bool {
        self.alloc.refcount(b) == 1 && !self.is_hard_pinned(b)
    }

    /// Append `n` tokens to table `t` of a sequence of `len` tokens (releases done, blocks
    /// checked by the caller): copy-on-write or fill of the last entry, then new blocks.
    /// The new tokens' slots go to `emit` as runs of consecutive slots, in order.
    pub(crate) fn grow_table(
        &mut self,
        t: &mut GroupTable,
        len: usize,
        n: usize,
        mut emit: impl FnMut(std::ops::Range<i64>),
        cow: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<()> {
        let bs = self.block_size;
        let off = self.offset_in_block(len);
        let mut w = 0;
        if off != 0 && n > 0 {
            let b = match t.last() {
                Some(src) if self.must_copy(src, 0, 0) => {
                    let dst = self.take_block()?;
                    self.release_block(src);
                    t.set_last(dst, off);
                    cow.push((src, dst));
                    self.cow_copies += 1;
                    dst
                }
                Some(b) => b,
                None => {
                    let dst = self.take_block()?;
                    t.set_last(dst, off);
                    dst
                }
            };
            w = (bs - off).min(n);
            let first = b.first_slot(bs) + off as i64;
            emit(first..first + w as i64);
        }
        while w < n {
            let b = self.take_block()?;
            t.push(b);
            let run = bs.min(n - w);
            let first = b.first_slot(bs);
            emit(first..first + run as i64);
            w += run;
        }
        Ok(())
    }

    /// Blocks growing `seq` by `n` tokens would allocate (new blocks, copies and filled
    /// holes, every group), before releases.
    pub fn blocks_needed(&self, seq: SeqId, n: usize) -> Result<usize> {
        let e = self.entry(seq)?;
        let end = Self::checked_len(e.len, n)?;
        if n == 0 {
            return Ok(0);
        }
        let partial = self.offset_in_block(e.len) != 0;
        Ok(e.tables
            .iter()
            .map(|t| {
                let fill = partial && t.last().is_none_or(|b| self.must_copy(b, 0, 0));
                end.div_ceil(self.block_size) - t.len_blocks() + fill as usize
            })
            .sum())
    }

    /// Whether the one-pass decode is worth trying: nothing shared, no cache, and free
    /// blocks for the whole batch or twice what uniformly spread lengths need.
    #[inline]
    pub(crate) fn one_pass_fits(&self, len: usize) -> bool {
        let g = self.groups.len();
        self.alloc.num_shared() == 0
            && self.cache.is_none()
            && self.alloc.num_free() >= (g * len).min(2 * g * len.div_ceil(self.block_size))
    }

    /// One token for each of `seqs`, resolved, released and grown in one visit per id, on
    /// a pool of `G` groups (a constant, so that the visit of a sequence's tables is
    /// unrolled and each group writes its own row of slots; a pool of more groups than the
    /// largest instance takes the general path). `Ok(false)` (everything undone) when the
    /// free list runs dry part-way; also, doing nothing, for an empty batch or a pool
    /// without `G` groups. The rare paths (a release, a new block, an error) are out of
    /// line so that the common visit (a length check and one slot per group) stays in
    /// registers.
    fn decode_one_pass<const G: usize>(
        &mut self,
        map: &mut SeqMap<SeqEntry>,
        seqs: &[SeqId],
        mark: u64,
        out: &mut StepOutput,
    ) -> Result<bool> {
        let n = seqs.len();
        if n == 0 || self.groups.len() != G {
            return Ok(false);
        }
        let bs = self.block_size;
        let mut log = std::mem::take(&mut self.decode.log);
        log.clear();
        out.slots.resize(G * n, 0);
        out.total_tokens = n;
        out.seq_lens.reserve(n);
        let mut rows = out.slots.chunks_exact_mut(n);
        let mut rows: [&mut [i64]; G] = std::array::from_fn(|_| rows.next().unwrap_or_default());
        let mut stop = None;
        let mut done = 0;
        'seqs: for (i, &seq) in seqs.iter().enumerate() {
            let Some(e) = map.slot(&seq).and_then(|s| map.at_mut(s)) else {
                stop = Some(Stop::Unknown);
                break;
            };
            if e.mark == mark || e.len >= MAX_SEQ_TOKENS {
                stop = Some(if e.mark == mark { Stop::Twice } else { Stop::Overflow(e.len) });
                break;
            }
            let Some(tables) = e.tables.as_array_mut::<G>() else {
                return Err(KvError::Invariant("a sequence's table count is not the pool's group count".into()));
            };
            let len = e.len;
            let off = self.offset_in_block(len);
            for (g, (t, row)) in tables.iter_mut().zip(rows.iter_mut()).enumerate() {
                if len >= t.release_at() {
                    self.decode_release(t, len, (i, g), &mut log);
                }
                let b = match t.last() {
                    Some(b) if off != 0 => b,
                    _ => match self.decode_open(t, off, (i, g), &mut log) {
                        Some(b) => b,
                        None => {
                            stop = Some(Stop::Dry);
                            break 'seqs;
                        }
                    },
                };
                row[i] = b.first_slot(bs) + off as i64;
            }
            e.mark = mark;
            e.prev_frontier = e.frontier;
            e.frontier = len;
            e.len = len + 1;
            out.seq_lens.push((len + 1) as i32);
            done = i + 1;
        }
        let r = match stop {
            None => Ok(true),
            Some(stop) => {
                self.undo_decode(map, &seqs[..done], seqs, &log);
                out.clear();
                stop.into_result(seqs[done])
            }
        };
        self.decode.log = log;
        r
    }

    /// [`Self::decode_one_pass`] on a pool of one full-attention group: nothing is ever
    /// released, so a visit is a length check and a slot, and an undo needs no log (a
    /// visit at a block boundary took one new block, which goes back).
    #[inline(never)]
    fn decode_one_pass_full(&mut self, map: &mut SeqMap<SeqEntry>, seqs: &[SeqId], mark: u64, out: &mut StepOutput) -> Result<bool> {
        let bs = self.block_size;
        out.slots.clear();
        out.slots.reserve(seqs.len());
        out.total_tokens = seqs.len();
        out.seq_lens.reserve(seqs.len());
        for (i, &seq) in seqs.iter().enumerate() {
            let stop = match map.slot(&seq).and_then(|s| map.at_mut(s)) {
                None => Stop::Unknown,
                Some(e) if e.mark == mark => Stop::Twice,
                Some(e) if e.len >= MAX_SEQ_TOKENS => Stop::Overflow(e.len),
                Some(e) => {
                    let GroupTables::One(t) = &mut e.tables else {
                        return Err(KvError::Invariant("a one-group pool's sequence has another table count".into()));
                    };
                    let len = e.len;
                    let off = self.offset_in_block(len);
                    let b = match t.last() {
                        Some(b) if off != 0 => Some(b),
                        _ => self.alloc.allocate().inspect(|&b| t.push(b)),
                    };
                    if let Some(b) = b {
                        e.mark = mark;
                        out.slots.push(b.first_slot(bs) + off as i64);
                        e.prev_frontier = e.frontier;
                        e.frontier = len;
                        e.len = len + 1;
                        out.seq_lens.push((len + 1) as i32);
                        continue;
                    }
                    Stop::Dry
                }
            };
            self.undo_decode_full(map, &seqs[..i]);
            out.clear();
            return stop.into_result(seq);
        }
        Ok(true)
    }

    /// Undo [`Self::decode_one_pass_full`]'s visits of `done`, last first (new blocks go
    /// back onto the free-list stack in reverse order: it ends as it was).
    #[cold]
    fn undo_decode_full(&mut self, map: &mut SeqMap<SeqEntry>, done: &[SeqId]) {
        for seq in done.iter().rev() {
            let Some(e) = map.get_mut(seq) else { continue };
            e.len -= 1;
            e.frontier = e.prev_frontier;
            if self.offset_in_block(e.len) == 0 {
                let stamp = e.tables[0].stamp();
                if let Some(b) = e.tables[0].unpush(stamp) {
                    self.alloc.release(b);
                }
            }
        }
    }

    /// The window rule's releases of one decode visit (nothing is shared: each released
    /// block drops from 1 to 0, a store without a read of its refcount).
    #[inline(never)]
    fn decode_release(&mut self, t: &mut GroupTable, len: usize, (i, g): (usize, usize), log: &mut Vec<Undo>) {
        let k = t.release_for(len, |b| self.alloc.release_unshared(std::slice::from_ref(&b)));
        log.push(Undo::Release(i as u32, g as u32, k as u32));
    }

    /// A new block for a decode token at offset `off`: appended at a block boundary, else
    /// filling a trailing hole. None when the free list is empty.
    #[inline(never)]
    fn decode_open(&mut self, t: &mut GroupTable, off: usize, (i, g): (usize, usize), log: &mut Vec<Undo>) -> Option<BlockId> {
        let b = self.alloc.allocate()?;
        if off == 0 {
            t.push(b);
            log.push(Undo::Push(i as u32, g as u32));
        } else {
            let stamp = t.stamp();
            t.set_last(b, off);
            log.push(Undo::Fill(i as u32, g as u32, stamp));
        }
        Some(b)
    }

    /// Undo the visits of a failed one-pass decode, last first.
    /// `done`: the sequences whose visit completed (a prefix of `seqs`).
    #[cold]
    fn undo_decode(&mut self, map: &mut SeqMap<SeqEntry>, done: &[SeqId], seqs: &[SeqId], log: &[Undo]) {
        for u in log.iter().rev() {
            let (i, g) = match *u {
                Undo::Release(i, g, _) | Undo::Push(i, g) | Undo::Fill(i, g, _) => (i as usize, g as usize),
            };
            let Some(t) = map.get_mut(&seqs[i]).map(|e| &mut e.tables[g]) else { continue };
            match *u {
                Undo::Push(..) => {
                    // A push keeps the stamp: the table is back as the mirror last saw it.
                    if let Some(b) = t.unpush(t.stamp()) {
                        self.alloc.release(b);
                    }
                }
                Undo::Fill(_, _, stamp) => {
                    if let Some(b) = t.unpush(stamp) {
                        self.alloc.release(b);
                    }
                    // The entry was a trailing hole past the sinks: it is one again.
                    let _ = t.push_hole();
                }
                Undo::Release(_, _, k) => {
                    for _ in 0..k {
                        if let Some(b) = self.alloc.allocate() {
                            t.unrelease_front(b);
                        }
                    }
                }
            }
        }
        for seq in done.iter().rev() {
            if let Some(e) = map.get_mut(seq) {
                e.len -= 1;
                e.frontier = e.prev_frontier;
            }
        }
    }
}

/// Why a one-pass decode stopped at a sequence.
#[derive(Clone, Copy, Debug)]
enum Stop {
    Unknown,
    Twice,
    Overflow(usize),
    /// The free list ran dry: the general path decides.
    Dry,
}

impl Stop {
    #[cold]
    fn into_result(self, seq: SeqId) -> Result<bool> {
        match self {
            Self::Unknown => Err(KvError::UnknownSequence(seq.0)),
            Self::Twice => Err(invalid!("seq_ids: sequence id {} appears twice in one step", seq.0)),
            Self::Overflow(len) => BlockPool::checked_len(len, 1).map(|_| false),
            Self::Dry => Ok(false),
        }
    }
}
