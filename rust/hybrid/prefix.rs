//! Prefix caching on layer groups: the longest hit valid for every group, and admission
//! by token ids or block keys on top of it.
//!
//! Rules (the contract of prefix caching on layer groups):
//!
//! - A prompt's full blocks are keyed by the chained keys of
//!   [`crate::prefix_cache::block_hash`]; the same keys serve every group and the index is
//!   per group (`(group, key) -> block`), so a key cached in one group never hits another.
//! - A hit of `h` tokens (a multiple of the block size, at most `prompt_len - 1`: at least
//!   one prompt token is computed) is valid for a group when every block the query at `h`
//!   needs before `h` is cached in that group ([`GroupSpec::needed_before`]): the whole
//!   prefix for full attention, the sinks and the window before `h` for a sliding window,
//!   the chunk of `h` for chunked attention. The admission takes the largest `h` valid for
//!   every group ([`longest_hit`]).
//! - The admitted sequence holds exactly the blocks its hit needs (refcount + 1, idle ones
//!   revived); its other logical blocks before the hit are holes; its frontier is the hit;
//!   the rest of the prompt is allocated in every group as by `add_sequence`. Its full
//!   prompt blocks past the hit are then registered in every group whose index lacks
//!   their key; blocks filled later by [`HybridPool::append_tokens`] likewise. Blocks
//!   the window rule releases stay cached, idle, until evicted (by the pool's policy).
//! - Admission is atomic: a refusal (duplicate id, bad arguments, too few blocks counting
//!   the idle blocks the hit revives) changes nothing, `out` included (left cleared).

use super::cache::{GroupCache, HybridCacheStats};
use super::spec::GroupSpec;
use super::table::{GroupTable, GroupTables};
use super::{HybridEntry, HybridPool, HybridStepOutput};
use crate::error::{KvError, Result};
use crate::invalid;
use crate::prefix_cache::block_hash::{BlockHasher, BlockKey, ROOT_PARENT};
use crate::prefix_cache::cursor::TokenCursor;
use crate::prefix_cache::eviction::EvictionPolicy;
use crate::types::{BlockId, SeqId};

/// Memo of `cached(group, block)` answers: 0 unknown, 1 cached, 2 not.
struct Memo<F> {
    f: F,
    n: usize,
    seen: Vec<u8>,
}

impl<F: Fn(usize, usize) -> bool> Memo<F> {
    fn get(&mut self, g: usize, i: usize) -> bool {
        let s = &mut self.seen[g * self.n + i];
        if *s == 0 {
            *s = if (self.f)(g, i) { 1 } else { 2 };
        }
        *s == 1
    }
}

/// The largest hit, in blocks, in `0..=n_blocks_max` valid for every group of `specs`
/// (block size `bs` tokens), where `cached(g, i)` says whether logical block `i` of the
/// prompt is cached in group `g`. A hit of 0 blocks is always valid.
///
/// Full groups are monotone (a hit valid at `k` is valid below `k`): their leading cached
/// runs bound the hit from above. Each other group then lowers the bound to its own largest
/// valid hit at or below it, found right to left (a missing block `j` of the window rules
/// out every hit whose window holds it, so the scan jumps below `j`), until no group lowers
/// it: the fixpoint is the largest hit valid for all. `cached` is asked at most once per
/// (group, block), and for windowed groups typically only about the window's blocks.
pub fn longest_hit(specs: &[GroupSpec], bs: usize, n_blocks_max: usize, cached: impl Fn(usize, usize) -> bool) -> usize {
    let mut memo = Memo { f: cached, n: n_blocks_max, seen: vec![0; specs.len() * n_blocks_max] };
    let mut h = n_blocks_max;
    for (g, _) in specs.iter().enumerate().filter(|(_, s)| !s.is_windowed()) {
        h = (0..h).find(|&i| !memo.get(g, i)).unwrap_or(h);
    }
    // Leading cached blocks per windowed group, found so far (for the sinks).
    let mut lead = vec![0usize; specs.len()];
    loop {
        let before = h;
        for (g, s) in specs.iter().enumerate().filter(|(_, s)| s.is_windowed()) {
            h = group_best(s, bs, h, g, &mut lead[g], &mut memo);
        }
        if h == before {
            return h;
        }
    }
}

/// The largest hit at or below `k` blocks valid for windowed group `g`.
fn group_best<F: Fn(usize, usize) -> bool>(s: &GroupSpec, bs: usize, mut k: usize, g: usize, lead: &mut usize, memo: &mut Memo<F>) -> usize {
    while k > 0 {
        let [sinks, window] = s.needed_before(k * bs, bs);
        let mut j = window.end;
        while j > window.start && memo.get(g, j - 1) {
            j -= 1;
        }
        if j > window.start {
            // Block j - 1 is missing: every hit above it needs it.
            k = j - 1;
            continue;
        }
        while *lead < sinks.end && memo.get(g, *lead) {
            *lead += 1;
        }
        if *lead >= sinks.end {
            return k;
        }
        // Sink block `lead` is missing: a hit needs at most `lead` sink blocks.
        k = (*lead).min(k - 1);
    }
    0
}

/// The blocks a hit of `hb` blocks makes `seq` hold: `(group, logical block, block)`.
type Held = Vec<(usize, usize, BlockId)>;

impl HybridPool {
    /// A pool with prefix caching on its groups, keying token ids with `hasher` and
    /// evicting idle blocks by `policy` ([`GroupCache`]'s module doc: `Priority` refused).
    pub fn with_prefix_cache(
        num_blocks: usize,
        block_size: usize,
        groups: Vec<GroupSpec>,
        hasher: BlockHasher,
        policy: EvictionPolicy,
    ) -> Result<Self> {
        hasher.validate()?;
        let cache = GroupCache::new(num_blocks, policy)?.with_hasher(hasher);
        let mut pool = Self::new(num_blocks, block_size, groups)?;
        pool.cache = Some(Box::new(cache));
        Ok(pool)
    }

    fn group_cache(&self) -> Result<&GroupCache> {
        self.cache.as_deref().ok_or_else(|| invalid!("prefix caching is off for this pool"))
    }

    /// The group cache (None without prefix caching): its index and idle list, read-only.
    pub fn prefix_cache(&self) -> Option<&GroupCache> {
        self.cache.as_deref()
    }

    /// The cache's own invariants ([`GroupCache::check`]) against the allocator and every
    /// stored table entry; `check_invariants` covers the rest.
    pub fn check_cache(&self) -> Result<()> {
        let Some(c) = self.cache.as_deref() else { return Ok(()) };
        let holders = self.seqs.values().flat_map(|e| e.tables.iter().enumerate().flat_map(|(g, t)| t.stored().map(move |(_, b)| (g, b))));
        c.check(&self.alloc, holders)
    }

    /// The cache's counters (None without prefix caching).
    /// Forget every cached block of every group ([`GroupCache::reset`]): idle ones become
    /// free, live ones stay with their sequences, uncached; a later admission finds nothing.
    /// Returns the blocks that were cached; `InvalidArgument` without prefix caching.
    pub fn reset_prefix_cache(&mut self) -> Result<usize> {
        let c = self.cache.as_deref_mut().ok_or_else(|| invalid!("prefix caching is off for this pool"))?;
        Ok(c.reset(&mut self.alloc))
    }

    pub fn cache_stats(&self) -> Option<HybridCacheStats> {
        self.cache.as_deref().map(|c| c.stats(self.groups.len()))
    }

    /// Keys of the full blocks of `tokens` (the same in every group).
    pub fn block_keys(&self, tokens: &[u32], extra: Option<u64>) -> Result<Vec<BlockKey>> {
        let mut keys = Vec::new();
        let h = self.group_cache()?.hasher();
        h.chain_keys(ROOT_PARENT, tokens, self.block_size, extra, &mut keys, &mut Vec::new());
        Ok(keys)
    }

    /// The hit, in blocks, an admission of a `len`-token prompt keyed by `keys` gets now.
    fn hit_blocks(&self, keys: &[BlockKey], len: usize) -> Result<usize> {
        // The last-token rule: the last prompt token is always computed.
        self.longest_cached(keys, (len.saturating_sub(1) / self.block_size).min(keys.len()))
    }

    /// The longest prefix of at most `max` of `keys` cached validly for every group.
    fn longest_cached(&self, keys: &[BlockKey], max: usize) -> Result<usize> {
        let cache = self.group_cache()?;
        Ok(longest_hit(&self.groups, self.block_size, max, |g, i| cache.lookup(g, keys[i]).is_some()))
    }

    /// Tokens of `tokens` held by cached full blocks valid for every group now, before the
    /// last-token rule of admission (as [`crate::pool::BlockPool::cached_prefix_len`]); no
    /// state change.
    pub fn cached_prefix_len(&self, tokens: &[u32], extra: Option<u64>) -> Result<usize> {
        Self::checked_len(0, tokens.len())?;
        let keys = self.block_keys(tokens, extra)?;
        Ok(self.longest_cached(&keys, keys.len())? * self.block_size)
    }

    /// Admit `seq` with its prompt token ids: reuse the longest valid hit, allocate the
    /// rest. Returns the cached tokens; `out` gets the slots `[G, len - cached]` of the
    /// tokens to compute and `seq_lens = [len]`.
    pub fn add_sequence_tokens(&mut self, seq: SeqId, tokens: &[u32], extra: Option<u64>, out: &mut HybridStepOutput) -> Result<usize> {
        out.clear();
        self.admit_checks(seq, tokens.len())?;
        let keys = self.block_keys(tokens, extra)?;
        let cursor = TokenCursor { tokens: tokens.to_vec(), keys: keys.clone(), extra };
        self.admit(seq, &keys, tokens.len(), Some(Box::new(cursor)), out)
    }

    /// Admit `seq` from block keys (a trace's chained keys, one per block of the
    /// `len`-token prompt; the last may stand for a partial block and is never cached).
    pub fn add_sequence_block_keys(&mut self, seq: SeqId, keys: &[BlockKey], len: usize, out: &mut HybridStepOutput) -> Result<usize> {
        out.clear();
        self.admit_checks(seq, len)?;
        let want = len.div_ceil(self.block_size);
        if keys.len() != want {
            return Err(invalid!(
                "keys: {} block keys for a prompt of {len} tokens: expected ceil({len}/{}) = {want}",
                keys.len(),
                self.block_size
            ));
        }
        self.admit(seq, keys, len, None, out)
    }

    fn admit_checks(&self, seq: SeqId, len: usize) -> Result<()> {
        self.group_cache()?;
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSequence(seq.0));
        }
        Self::checked_len(0, len).map(|_| ())
    }

    /// The admission proper: `keys` has one key per full block at least.
    fn admit(&mut self, seq: SeqId, keys: &[BlockKey], len: usize, cursor: Option<Box<TokenCursor>>, out: &mut HybridStepOutput) -> Result<usize> {
        let bs = self.block_size;
        let hb = self.hit_blocks(keys, len)?;
        let held = self.held_blocks(keys, hb)?;
        let mut revived: Vec<BlockId> = held.iter().map(|h| h.2).filter(|&b| self.alloc.refcount(b) == 0).collect();
        revived.sort_unstable();
        revived.dedup();
        let need = self.groups.len() * (len.div_ceil(bs) - hb);
        let free = self.num_free_blocks() - revived.len();
        if need > free {
            return Err(KvError::PoolExhausted { requested: need, free });
        }
        // Commit: nothing below fails except through a bug.
        let mut tables = self.take_hit(&held, hb);
        let n = len - hb * bs;
        out.slots.resize(self.groups.len() * n, 0);
        out.total_tokens = n;
        for (g, t) in tables.iter_mut().enumerate() {
            self.grow_table(t, hb * bs, n, &mut out.slots[g * n..(g + 1) * n], &mut out.cow)?;
        }
        out.seq_lens.push(len as i32);
        if let Some(c) = self.cache.as_deref_mut() {
            register(c, &tables, keys, hb, len / bs);
        }
        let mut per_group = vec![0usize; self.groups.len()];
        for h in &held {
            per_group[h.0] += 1;
        }
        if let Some(c) = self.cache.as_deref_mut() {
            c.record_query(len, hb * bs, &per_group);
        }
        let tables = GroupTables::from_vec(tables);
        self.seqs.insert(seq, HybridEntry { len, frontier: hb * bs, prev_frontier: hb * bs, mark: 0, tables, cursor });
        Ok(hb * bs)
    }

    /// The cached blocks a hit of `hb` blocks needs, per group, in logical order.
    fn held_blocks(&self, keys: &[BlockKey], hb: usize) -> Result<Held> {
        let cache = self.group_cache()?;
        let mut held = Vec::new();
        for (g, s) in self.groups.iter().enumerate() {
            for i in s.needed_before(hb * self.block_size, self.block_size).into_iter().flatten() {
                let b = cache.lookup(g, keys[i]).ok_or_else(|| KvError::Invariant(format!("hit block {i} of group {g} vanished")))?;
                held.push((g, i, b));
            }
        }
        Ok(held)
    }

    /// Take the held blocks (revive idle ones, else one more reference) and lay out the
    /// tables of a sequence of `hb` blocks: held blocks, holes elsewhere.
    fn take_hit(&mut self, held: &Held, hb: usize) -> Vec<GroupTable> {
        let mut tables: Vec<GroupTable> = self.groups.iter().map(|&s| GroupTable::new(s, self.block_size)).collect();
        for &(g, i, b) in held {
            if self.alloc.refcount(b) == 0 {
                if let Some(c) = self.cache.as_deref_mut() {
                    c.revive(b);
                }
                self.alloc.revive(b);
            } else {
                self.alloc.incref(b);
            }
            if let Some(c) = self.cache.as_deref_mut() {
                c.hit(b);
            }
            let t = &mut tables[g];
            while t.len_blocks() < i {
                // Holes lie past the sinks and before the window: needed_before's shape.
                let _ = t.push_hole();
            }
            t.push(b);
        }
        for t in &mut tables {
            while t.len_blocks() < hb {
                let _ = t.push_hole();
            }
        }
        tables
    }

    /// Append token ids to `seq` (a growth as [`Self::step`] of one sequence; `out` as
    /// there). Each block that fills is registered in every group whose index lacks its
    /// key, when the sequence was admitted by token ids and has seen every id since.
    pub fn append_tokens(&mut self, seq: SeqId, tokens: &[u32], out: &mut HybridStepOutput) -> Result<()> {
        let hasher = self.group_cache()?.hasher();
        let cursor = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSequence(seq.0))?.cursor.take();
        let r = self.step(&[seq], &[tokens.len()], out);
        let Some(e) = self.seqs.get_mut(&seq) else { return r };
        e.cursor = cursor;
        r?;
        let Some(mut cur) = e.cursor.take() else { return Ok(()) };
        let first = cur.push_tokens(tokens, self.block_size, hasher);
        if let Some(c) = self.cache.as_deref_mut() {
            register(c, &e.tables, &cur.keys, first, cur.keys.len());
        }
        e.cursor = Some(cur);
        Ok(())
    }
}

/// Register stored blocks `from..to` of `tables` under `keys` in every group whose index
/// lacks the key.
fn register(cache: &mut GroupCache, tables: &[GroupTable], keys: &[BlockKey], from: usize, to: usize) {
    for (g, t) in tables.iter().enumerate() {
        for (i, &k) in keys.iter().enumerate().take(to).skip(from) {
            if let Some(b) = t.get(i) {
                cache.insert(g, k, b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// The definition: `k` is valid when every group has every block it needs cached.
    fn brute(specs: &[GroupSpec], bs: usize, n: usize, cached: &dyn Fn(usize, usize) -> bool) -> usize {
        (0..=n)
            .rev()
            .find(|&k| {
                specs.iter().enumerate().all(|(g, s)| s.needed_before(k * bs, bs).into_iter().flatten().all(|i| cached(g, i)))
            })
            .unwrap_or(0)
    }

    /// A small deterministic generator (no dependency on the proptest crate in unit tests).
    fn lcg(x: &mut u64) -> u64 {
        *x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *x >> 33
    }

    #[test]
    fn longest_hit_equals_brute_force() {
        let kinds = [
            GroupSpec::Full,
            GroupSpec::sliding_window(1, 0).unwrap(),
            GroupSpec::sliding_window(7, 0).unwrap(),
            GroupSpec::sliding_window(8, 3).unwrap(),
            GroupSpec::sliding_window(5, 9).unwrap(),
            GroupSpec::chunked(8).unwrap(),
            GroupSpec::chunked(6).unwrap(),
        ];
        let mut x = 7u64;
        for case in 0..4000 {
            let ng = 1 + (lcg(&mut x) % 3) as usize;
            let specs: Vec<GroupSpec> = (0..ng).map(|_| kinds[(lcg(&mut x) % kinds.len() as u64) as usize]).collect();
            let bs = [1usize, 2, 4][(lcg(&mut x) % 3) as usize];
            let n = (lcg(&mut x) % 24) as usize;
            // Dense holes early on, or only a few: both regimes.
            let miss = 1 + lcg(&mut x) % 8;
            let table: Vec<Vec<bool>> = (0..ng).map(|_| (0..n).map(|_| lcg(&mut x) % 10 >= miss.min(9)).collect()).collect();
            let cached = |g: usize, i: usize| table[g][i];
            let calls = Cell::new(0usize);
            let counted = |g: usize, i: usize| {
                calls.set(calls.get() + 1);
                cached(g, i)
            };
            let got = longest_hit(&specs, bs, n, counted);
            assert_eq!(got, brute(&specs, bs, n, &cached), "case {case}: {specs:?} bs {bs} table {table:?}");
            assert!(calls.get() <= ng * n, "memoized: at most one question per (group, block)");
        }
    }

    #[test]
    fn window_hit_needs_only_sinks_and_window() {
        // Window of 8 tokens, 4 sink tokens, blocks of 4: a hit of k blocks needs block 0
        // and blocks from (4k - 7) / 4 on.
        let s = [GroupSpec::sliding_window(8, 4).unwrap()];
        let present = [0usize, 7, 8, 9];
        let calls = Cell::new(0usize);
        let h = longest_hit(&s, 4, 10, |_, i| {
            calls.set(calls.get() + 1);
            present.contains(&i)
        });
        // Hit of 10 blocks (40 tokens): first needed 33 -> blocks 8, 9 + sink 0.
        assert_eq!(h, 10);
        assert_eq!(calls.get(), 3, "only the window and the sink block are looked up");
        // Block 8 gone: 9 blocks need 7 and 8 (first needed 29); 8 blocks need 6, 7 ... none
        // down to a hit of 1 block (positions 0..4, sink): valid with block 0.
        assert_eq!(longest_hit(&s, 4, 10, |_, i| [0usize, 7, 9].contains(&i)), 1);
        // Hybrid: a full group caps it at its leading run; the window group then needs
        // its window before that point.
        let hybrid = [GroupSpec::Full, GroupSpec::sliding_window(8, 0).unwrap()];
        let lead = 6;
        assert_eq!(longest_hit(&hybrid, 4, 10, |g, i| if g == 0 { i < lead } else { i >= 3 }), 6);
        assert_eq!(longest_hit(&hybrid, 4, 10, |g, i| if g == 0 { i < lead } else { i != 4 }), 4);
    }

    #[test]
    fn chunk_boundary_hits_need_nothing() {
        // A hit at a chunk boundary needs no block of the chunked group.
        let s = [GroupSpec::chunked(8).unwrap()];
        assert_eq!(longest_hit(&s, 4, 5, |_, _| false), 4);
        assert_eq!(longest_hit(&s, 4, 5, |_, i| i == 4), 5);
        assert_eq!(longest_hit(&[GroupSpec::Full], 4, 0, |_, _| true), 0);
    }
}
