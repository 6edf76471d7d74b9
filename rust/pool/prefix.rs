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
//!   prompt blocks past the hit are then stored in the one [`PrefixCache`]: in a full
//!   group as a chain (a block after the cached block before it in its table, stopping
//!   where the chain breaks or the key is taken), in a windowed group each block whose key
//!   its group lacks; blocks filled later by [`BlockPool::append_tokens`] likewise. Blocks
//!   the window rule releases stay cached, idle, until evicted (by the pool's policy).
//! - A prompt admitted by block keys may end in a partly filled block. It is cached with
//!   its fill in every group, and the fill is part of its identity (the index slot): it
//!   matches only a later prompt ending in the same key with the same fill, and a full
//!   block under that key is another entry (neither takes the other's place). The
//!   last-token rule never takes it, so it counts as found (`hit_blocks`, Mooncake's cache
//!   ratio), not as cached tokens. A sequence growing into it copies it first.
//! - Uses: an admission touches (a use for the eviction policy) every block it takes, and
//!   each full group's verified chain past the hit: the blocks the last-token rule leaves
//!   are a hit the prompt found, as vLLM touches a whole hit.
//! - Verification: a full group's hit is the cache's chain lookup (parents, extra key and,
//!   with `verify_tokens`, token ids); a windowed group's block is checked on its own key,
//!   extra key and token ids, and on the prefix before it through the cache's lineage
//!   (`prefix_cache/lineage.rs`): a hit may use it only below the prompt's verified depth.
//!   A failed check is a miss, counted in `collisions`.
//! - The cache's clock advances once per successful mutating call; pins (every block the
//!   hit of a prefix needs, in every group) lapse on it.
//! - Admission is atomic: a refusal (duplicate id, bad arguments, too few blocks counting
//!   the idle blocks the hit revives) changes nothing, `out` included (left cleared).

use std::cell::Cell;

use super::spec::GroupSpec;
use super::group_table::{GroupTable, GroupTables};
use super::{PendingThrough, SeqEntry, BlockPool, StepOutput};
use crate::error::{KvError, Result};
use crate::invalid;
use crate::prefix_cache::block_hash::{BlockKey, ROOT_PARENT};
use crate::prefix_cache::cursor::TokenCursor;
use crate::prefix_cache::tiers::{Move, TierChoices, TierConfig, TierKey, TierLoad, TierMeta, TierRules, TierStats};
use crate::prefix_cache::{CacheEvent, CacheStats, Found, PrefixCache};
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

/// What an admission looks up: the prompt's keys, and its token ids and extra key when
/// admitted by tokens (they verify every block of the hit).
#[derive(Clone, Copy)]
struct Query<'a> {
    keys: &'a [BlockKey],
    tokens: Option<&'a [u32]>,
    extra: Option<u64>,
    /// The prompt's length in tokens: block `i` holds `min(block_size, len - i * bs)`.
    len: usize,
}

impl Query<'_> {
    /// Tokens of logical block `i` of the prompt (a keyed prompt's last block may be
    /// partly filled; token ids key their full blocks only).
    fn fill(&self, i: usize, bs: usize) -> usize {
        bs.min(self.len.saturating_sub(i * bs))
    }
}

/// Hits found in the cache: each full group's verified chain, every windowed group's
/// blocks as asked, and whether a verification failed.
struct Hits {
    chains: Vec<Vec<BlockId>>,
    /// Leading blocks whose whole prefix a windowed group's hit may rely on
    /// ([`PrefixCache::verified_depth`]).
    verified: usize,
    collision: Cell<bool>,
}

/// What an admission would take, found without changing anything.
struct HitPlan {
    hits: Hits,
    /// The longest valid hit before the last-token rule, and the one taken, in blocks.
    found: usize,
    hb: usize,
    held: Held,
    /// A copy-on-write partial hit: `(group, source)` of each group that needs logical
    /// block `hb` for the query at `len - 1`; copied, it serves all but the last token.
    copies: Option<Vec<(usize, BlockId)>>,
    /// Distinct held and copied blocks that are idle and evictable now (taking them
    /// revives them).
    revived: usize,
    /// Blocks after `hb` that the tiers below the device hold in every group, and of
    /// those the leading ones the admission loads (allocated, their bytes loaded, not
    /// computed): all, or with the tiers' costs set the count that saves the most time.
    tier_found: usize,
    tb: usize,
}

impl HitPlan {
    /// Tokens the admission serves from the cache (the device's and the tiers').
    fn cached(&self, len: usize, bs: usize) -> usize {
        if self.copies.is_some() { len - 1 } else { (self.hb + self.tb) * bs }
    }
}

impl BlockPool {
    fn cache_ref(&self) -> Result<&PrefixCache> {
        self.cache.as_deref().ok_or_else(|| invalid!("prefix caching is off for this pool"))
    }

    fn cache_mut(&mut self) -> Result<&mut PrefixCache> {
        self.cache.as_deref_mut().ok_or_else(|| invalid!("prefix caching is off for this pool"))
    }

    /// The prefix cache (None without prefix caching), read-only.
    pub fn prefix_cache(&self) -> Option<&PrefixCache> {
        self.cache.as_deref()
    }

    /// The cache's own invariants ([`PrefixCache::check`]) against the allocator;
    /// `check_invariants` covers the rest (and calls this).
    pub fn check_cache(&self) -> Result<()> {
        self.cache.as_deref().map_or(Ok(()), |c| c.check(&self.alloc))
    }

    /// Forget every cached block of every group ([`PrefixCache::reset`]): idle ones become
    /// free, live ones stay with their sequences, uncached; refused while pins are held.
    /// Returns the blocks that were cached; `InvalidArgument` without prefix caching.
    pub fn reset_prefix_cache(&mut self) -> Result<usize> {
        let c = self.cache.as_deref_mut().ok_or_else(|| invalid!("prefix caching is off for this pool"))?;
        c.reset(&mut self.alloc)
    }

    /// Give the prefix cache tiers below the device ([`PrefixCache::set_tiers`]): blocks it
    /// evicts go down them, and an admission's hit continues into them (the blocks it finds
    /// there are allocated and listed in `StepOutput::loads`). `InvalidArgument` without
    /// prefix caching, with a windowed group, or for a configuration the tiers refuse.
    pub fn set_tiers(&mut self, tiers: &[TierConfig], rules: TierRules) -> Result<()> {
        self.cache_mut()?.set_tiers(tiers, rules)
    }

    /// Per-tier counts, host first, and the tiers' decisions (None without tiers);
    /// `InvalidArgument` without prefix caching.
    pub fn tier_stats(&self) -> Result<Option<(Vec<TierStats>, TierChoices)>> {
        Ok(self.cache_ref()?.tier_stats())
    }

    /// Set what a load from each tier costs per block and a computed token costs, in
    /// nanoseconds ([`PrefixCache::set_tier_costs`]): an admission then loads only the
    /// tier blocks that are faster to load than to compute. `InvalidArgument` without
    /// tiers or for another count of tiers.
    pub fn set_tier_costs(&mut self, load_ns_per_block: &[u64], recompute_ns_per_token: u64) -> Result<()> {
        self.cache_mut()?.set_tier_costs(load_ns_per_block, recompute_ns_per_token)
    }

    /// The tiers' decisions since the last drain, oldest first (none without tiers), and
    /// the loads of the admissions since: the byte layer carries out the moves in order,
    /// then the loads, before the next pool call (a held slot is free again after it).
    /// Returns whether the tiers were emptied since the last drain (a reset of the cache):
    /// what the byte layer stored before is then forgotten.
    pub fn drain_tier_moves(&mut self, moves: &mut Vec<Move>, loads: &mut Vec<TierLoad>) -> Result<bool> {
        Ok(self.cache_mut()?.drain_tier_moves(moves, loads))
    }

    /// Put a block found in tier `tier`'s storage after a restart back into the tier
    /// ([`PrefixCache::restore_tier_block`]): its slot, or None (no such tier, full, or
    /// held already). `InvalidArgument` without prefix caching.
    pub fn restore_tier_block(&mut self, tier: usize, key: TierKey, meta: TierMeta) -> Result<Option<u32>> {
        Ok(self.cache_mut()?.restore_tier_block(tier, key, meta))
    }

    /// Whether the tiers' moves and loads wait for [`Self::drain_tier_moves`] (default)
    /// or are dropped at the end of each call (the tiers only model decisions, and
    /// nobody drains).
    pub fn keep_tier_moves(&mut self, keep: bool) -> Result<()> {
        self.cache_mut()?.keep_tier_moves(keep);
        Ok(())
    }

    /// The cache's counters; `InvalidArgument` without prefix caching.
    pub fn cache_stats(&self) -> Result<CacheStats> {
        Ok(self.cache_ref()?.stats())
    }

    /// Keys of the full blocks of `tokens` (the same in every group).
    pub fn block_keys(&self, tokens: &[u32], extra: Option<u64>) -> Result<Vec<BlockKey>> {
        let mut keys = Vec::new();
        let h = self.cache_ref()?.hasher();
        h.chain_keys(ROOT_PARENT, tokens, self.block_size, extra, &mut keys, &mut Vec::new());
        Ok(keys)
    }

    /// Each full group's verified cached chain over the first `max` of `q.keys`, and how
    /// far windowed groups' blocks are verified.
    fn full_chains(&self, q: Query<'_>, max: usize) -> Result<Hits> {
        let c = self.cache_ref()?;
        let any_windowed = self.groups.iter().any(|s| s.is_windowed());
        let verified = if any_windowed { c.verified_depth(q.keys, q.tokens, q.extra, max) } else { 0 };
        let mut collision = false;
        let chains = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, s)| {
                if s.is_windowed() {
                    return Vec::new();
                }
                let fill = if max == 0 { self.block_size } else { q.fill(max - 1, self.block_size) };
                let l = c.lookup_in(g, &q.keys[..max], q.tokens, q.extra, fill);
                collision |= l.collision;
                l.blocks
            })
            .collect();
        Ok(Hits { chains, verified, collision: Cell::new(collision) })
    }

    /// The cached block of logical block `i` in group `g` valid for `q`, if any.
    fn hit_block(&self, hits: &Hits, q: Query<'_>, g: usize, i: usize) -> Option<BlockId> {
        if !self.groups[g].is_windowed() {
            return hits.chains[g].get(i).copied();
        }
        match self.cache.as_deref()?.find(g, i, q.keys[i], q.fill(i, self.block_size), q.tokens, q.extra) {
            Found::Hit(b) if i < hits.verified => Some(b),
            Found::Miss => None,
            Found::Hit(_) | Found::Collision => {
                hits.collision.set(true);
                None
            }
        }
    }

    /// The longest prefix of at most `max` of `q.keys` cached validly for every group, in
    /// blocks.
    fn longest_cached(&self, hits: &Hits, q: Query<'_>, max: usize) -> usize {
        longest_hit(&self.groups, self.block_size, max, |g, i| self.hit_block(hits, q, g, i).is_some())
    }

    /// Tokens of `tokens` held by cached full blocks valid for every group now, before the
    /// last-token rule of admission (as [`crate::pool::BlockPool::cached_prefix_len`]); no
    /// state change.
    pub fn cached_prefix_len(&self, tokens: &[u32], extra: Option<u64>) -> Result<usize> {
        Self::checked_len(0, tokens.len())?;
        let keys = self.block_keys(tokens, extra)?;
        let q = Query { keys: &keys, tokens: Some(tokens), extra, len: tokens.len() };
        let hits = self.full_chains(q, keys.len())?;
        Ok(self.longest_cached(&hits, q, keys.len()) * self.block_size)
    }

    /// Admit `seq` with its prompt token ids: reuse the longest valid hit, allocate the
    /// rest. Returns the cached tokens; `out` gets the slots `[G, len - cached]` of the
    /// tokens to compute and `seq_lens = [len]`.
    pub fn add_sequence_tokens(&mut self, seq: SeqId, tokens: &[u32], extra: Option<u64>, out: &mut StepOutput) -> Result<usize> {
        out.clear();
        self.admit_checks(seq, tokens.len())?;
        let keys = self.block_keys(tokens, extra)?;
        let cursor = TokenCursor { tokens: tokens.to_vec(), keys, extra, deferred: false };
        self.admit(seq, tokens.len(), cursor.keys.clone(), Some(Box::new(cursor)), out)
    }

    /// Admit `seq` from block keys (a trace's chained keys, one per block of the
    /// `len`-token prompt). Keys are trusted as chained content ids. The last may stand for
    /// a partly filled block: full groups cache it with its fill, and it matches only a
    /// later partial last block of the same fill (the last-token rule recomputes it).
    pub fn add_sequence_block_keys(&mut self, seq: SeqId, keys: &[BlockKey], len: usize, out: &mut StepOutput) -> Result<usize> {
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
        self.admit(seq, len, keys.to_vec(), None, out)
    }

    fn admit_checks(&self, seq: SeqId, len: usize) -> Result<()> {
        self.cache_ref()?;
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSequence(seq.0));
        }
        Self::checked_len(0, len).map(|_| ())
    }

    /// The hit an admission of `q` would take now, and what it revives. `cow`: a
    /// copy-on-write partial hit may be taken (when the cache's config allows it).
    fn hit_plan(&self, q: Query<'_>, cow: bool) -> Result<HitPlan> {
        let bs = self.block_size;
        let full = q.keys.len().min(q.len.div_ceil(bs));
        let hits = self.full_chains(q, full)?;
        let found = self.longest_cached(&hits, q, full);
        // The last-token rule: the last prompt token is always computed.
        let last = q.len.saturating_sub(1);
        let cap = (last / bs).min(full);
        let hb = if found <= cap { found } else { self.longest_cached(&hits, q, cap) };
        let cow = cow && q.tokens.is_some() && self.cache_ref()?.config().cow_partial_hit;
        // Only the block holding the last token is copied: the prompt fills block `hb`.
        let copies = if cow && last > hb * bs && last / bs == hb && hb < full { self.partial_copies(&hits, q, hb, last) } else { None };
        let p = if copies.is_some() { last } else { hb * bs };
        let held = self.held_blocks(&hits, q, p, hb)?;
        let c = self.cache_ref()?;
        let copied = copies.iter().flatten().map(|x| x.1);
        let mut revived: Vec<BlockId> = held.iter().map(|h| h.2).chain(copied).filter(|&b| c.is_evictable(b, &self.alloc)).collect();
        revived.sort_unstable();
        revived.dedup();
        let tiers = if copies.is_none() { self.tier_run(q, hb, cap) } else { Vec::new() };
        let tb = self.cache.as_deref().map_or(0, |c| c.tier_blocks_worth_loading(&tiers, self.groups.len() as u64));
        Ok(HitPlan { hits, found, hb, held, copies, revived: revived.len(), tier_found: tiers.len(), tb })
    }

    /// The full blocks from `from` (below `to`) that continue the prompt's chain in the
    /// tiers below the device in every group: for each, the deepest tier holding one of
    /// its groups' copies (what a load of it costs at most). Pure.
    fn tier_run(&self, q: Query<'_>, from: usize, to: usize) -> Vec<usize> {
        let Some(c) = self.cache.as_deref().filter(|c| c.has_tiers()) else { return Vec::new() };
        let bs = self.block_size;
        let deepest = |i: usize| {
            let parent = i.checked_sub(1).map(|p| q.keys[p]);
            let tokens = q.tokens.map(|t| &t[i * bs..(i + 1) * bs]);
            (0..self.groups.len()).try_fold(0, |d, g| c.tier_of(g, q.keys[i], parent, q.extra, tokens).map(|t| d.max(t)))
        };
        (from..to).map_while(deepest).collect()
    }

    /// Take the plan's tier blocks out of the tiers, before the admission allocates (an
    /// eviction it causes may push blocks down the tiers): `(group, block index, tier, slot)`.
    fn take_tier_blocks(&mut self, plan: &HitPlan, q: Query<'_>) -> Vec<(usize, usize, usize, u32)> {
        let (bs, hb, tb, groups) = (self.block_size, plan.hb, plan.tb, self.groups.len());
        let Some(c) = self.cache.as_deref_mut().filter(|_| tb > 0) else { return Vec::new() };
        let mut taken = Vec::with_capacity(groups * tb);
        for g in 0..groups {
            for i in hb..hb + tb {
                let parent = i.checked_sub(1).map(|p| q.keys[p]);
                let tokens = q.tokens.map(|t| &t[i * bs..(i + 1) * bs]);
                if let Some((tier, slot)) = c.take_from_tiers(g, q.keys[i], parent, q.extra, tokens) {
                    taken.push((g, i, tier, slot));
                }
            }
        }
        taken
    }

    /// The loads of the taken tier blocks into the admission's new blocks (`out.loads`),
    /// and their tokens dropped from the slots to compute.
    fn place_loads(&self, taken: &[(usize, usize, usize, u32)], tb: usize, tables: &[GroupTable], out: &mut StepOutput) {
        for &(g, i, tier, slot) in taken {
            if let Some(block) = tables[g].get(i) {
                out.loads.push(TierLoad { tier, slot, block });
            }
        }
        let (n, skip) = (out.total_tokens, tb * self.block_size);
        if skip > 0 {
            let kept: Vec<i64> = out.slots.chunks_exact(n).flat_map(|row| row[skip..].iter().copied()).collect();
            out.slots = kept;
            out.total_tokens = n - skip;
        }
    }

    /// The copy sources of a partial hit of `p` tokens (`hb * bs < p < (hb + 1) * bs`):
    /// None unless every block the query at `p` needs before `p` is cached in every group.
    fn partial_copies(&self, hits: &Hits, q: Query<'_>, hb: usize, p: usize) -> Option<Vec<(usize, BlockId)>> {
        let mut copies = Vec::new();
        for (g, s) in self.groups.iter().enumerate() {
            for i in s.needed_before(p, self.block_size).into_iter().flatten() {
                let b = self.hit_block(hits, q, g, i)?;
                if i == hb {
                    copies.push((g, b));
                }
            }
        }
        Some(copies)
    }

    /// What admitting a `len`-token prompt would take now, changing nothing: `(cached
    /// tokens, allocatable blocks consumed)`, the blocks being every group's new blocks
    /// plus the idle ones the hit revives. `keys` as for the admission (token ids' keys from
    /// [`Self::block_keys`], or a trace's block keys with `tokens` None).
    pub fn admission_plan(&self, keys: &[BlockKey], tokens: Option<&[u32]>, extra: Option<u64>, len: usize) -> Result<(usize, usize)> {
        Self::checked_len(0, len)?;
        let plan = self.hit_plan(Query { keys, tokens, extra, len }, false)?;
        let bs = self.block_size;
        Ok(((plan.hb + plan.tb) * bs, self.groups.len() * (len.div_ceil(bs) - plan.hb) + plan.revived))
    }

    /// The admission proper: `keys` has one key per full block at least.
    fn admit(&mut self, seq: SeqId, len: usize, keys: Vec<BlockKey>, cursor: Option<Box<TokenCursor>>, out: &mut StepOutput) -> Result<usize> {
        let bs = self.block_size;
        let tokens = cursor.as_ref().map(|c| &c.tokens[..]);
        let q = Query { keys: &keys, tokens, extra: cursor.as_ref().and_then(|c| c.extra), len };
        let plan = self.hit_plan(q, true)?;
        let hb = plan.hb;
        let need = self.groups.len() * (len.div_ceil(bs) - hb);
        let free = self.num_free_blocks() - plan.revived;
        if need > free {
            return Err(KvError::PoolExhausted { requested: need, free });
        }
        // Commit: nothing below fails except through a bug.
        let taken = self.take_tier_blocks(&plan, q);
        let mut tables = self.take_hit(&plan.held, hb);
        self.take_copies_and_touch(&plan);
        let n = len - hb * bs;
        out.slots.clear();
        out.slots.reserve(self.groups.len() * n);
        out.total_tokens = n;
        for t in tables.iter_mut() {
            self.grow_table(t, hb * bs, n, |run| out.slots.extend(run), &mut out.cow)?;
        }
        let cached = plan.cached(len, bs);
        if let Some(copies) = &plan.copies {
            self.finish_copies(copies, &tables, hb, out);
        }
        let first_load = out.loads.len();
        self.place_loads(&taken, plan.tb, &tables, out);
        out.seq_lens.push(len as i32);
        // The blocks loaded from a tier hold their bytes once loaded: not copied back.
        self.register(&tables, q, hb, keys.len(), Some((seq, hb + plan.tb)));
        self.record_hit(&plan, keys.len(), len, cached)?;
        let c = self.cache_mut()?;
        c.record_tier_choice(plan.tier_found, plan.tb);
        c.queue_tier_loads(&out.loads[first_load..]);
        self.seqs.insert(seq, SeqEntry { len, frontier: cached, prev_frontier: cached, mark: 0, tables, cursor });
        self.end_op();
        Ok(cached)
    }

    /// Count one successful admission of a `len`-token prompt of `blocks` keys serving
    /// `cached` tokens in the cache's metrics (totals and per group).
    fn record_hit(&mut self, plan: &HitPlan, blocks: usize, len: usize, cached: usize) -> Result<()> {
        let mut per_group = vec![0usize; self.groups.len()];
        for h in &plan.held {
            per_group[h.0] += 1;
        }
        let c = self.cache_mut()?;
        c.record_query(blocks, plan.found, len, cached, plan.hits.collision.get(), plan.copies.is_some());
        c.record_group_hits(&per_group);
        Ok(())
    }

    /// Hold the copy sources of a partial hit (so that nothing evicts them before the
    /// copy) and touch the full groups' chain blocks past the hit that the admission does
    /// not take (a hit for the eviction policy, as in vLLM).
    fn take_copies_and_touch(&mut self, plan: &HitPlan) {
        let Some(c) = self.cache.as_deref_mut() else { return };
        let copies = plan.copies.as_deref().unwrap_or(&[]);
        for &(_, b) in copies {
            c.acquire(b, &mut self.alloc);
        }
        for chain in &plan.hits.chains {
            for &b in chain.iter().skip(plan.hb) {
                if !copies.iter().any(|x| x.1 == b) {
                    c.touch_hit(b);
                }
            }
        }
    }

    /// A partial hit's copies: `(source, new block hb)` pairs to `out.cow`, the sources
    /// released, and only the last token's slots kept (the others are copied, not computed).
    fn finish_copies(&mut self, copies: &[(usize, BlockId)], tables: &[GroupTable], hb: usize, out: &mut StepOutput) {
        for &(g, src) in copies {
            if let Some(dst) = tables[g].get(hb) {
                out.cow.push((src, dst));
                self.cow_copies += 1;
            }
            self.release_block(src);
        }
        let n = out.total_tokens;
        let last: Vec<i64> = (0..self.groups.len()).map(|g| out.slots[g * n + n - 1]).collect();
        out.slots = last;
        out.total_tokens = 1;
    }

    /// The cached blocks a hit serving a query at `p` needs before block `hb` (blocks
    /// `..hb`), per group, in logical order.
    fn held_blocks(&self, hits: &Hits, q: Query<'_>, p: usize, hb: usize) -> Result<Held> {
        let mut held = Vec::new();
        for (g, s) in self.groups.iter().enumerate() {
            for i in s.needed_before(p, self.block_size).into_iter().flatten().filter(|&i| i < hb) {
                let b = self.hit_block(hits, q, g, i).ok_or_else(|| KvError::Invariant(format!("hit block {i} of group {g} vanished")))?;
                held.push((g, i, b));
            }
        }
        Ok(held)
    }

    /// Take the held blocks (revive idle ones, else one more reference) and lay out the
    /// tables of a sequence of `hb` blocks: held blocks, holes elsewhere.
    fn take_hit(&mut self, held: &Held, hb: usize) -> GroupTables {
        let mut tables: GroupTables = self.groups.iter().map(|&s| GroupTable::new(s, self.block_size)).collect();
        for &(g, i, b) in held {
            if let Some(c) = self.cache.as_deref_mut() {
                c.acquire(b, &mut self.alloc);
            }
            let t = &mut tables[g];
            while t.len_blocks() < i {
                // Holes lie past the sinks and before the window: needed_before's shape.
                let _ = t.push_hole();
            }
            t.push(b);
        }
        for t in tables.iter_mut() {
            while t.len_blocks() < hb {
                let _ = t.push_hole();
            }
        }
        tables
    }

    /// Append token ids to `seq` (a growth as [`Self::step`] of one sequence; `out` as
    /// there). Each block that fills is registered in every group whose index lacks its
    /// key, when the sequence was admitted by token ids and has seen every id since.
    pub fn append_tokens(&mut self, seq: SeqId, tokens: &[u32], out: &mut StepOutput) -> Result<()> {
        let hasher = self.cache_ref()?.hasher();
        out.clear();
        let e = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSequence(seq.0))?;
        // A record behind the stored tokens (a joined sequence not caught up) cannot take
        // these ids: the sequence goes on unrecorded.
        let len = e.len;
        let cursor = e.cursor.take().filter(|c| c.tokens.len() == len);
        let r = self.step_run(&[seq], &[tokens.len()], false, out);
        let mut map = std::mem::take(&mut self.seqs);
        let r = match map.get_mut(&seq) {
            Some(e) => {
                e.cursor = cursor;
                if let (Ok(()), Some(cur)) = (&r, e.cursor.as_mut()) {
                    let first = cur.push_tokens(tokens, self.block_size, hasher);
                    let q = Query { keys: &cur.keys, tokens: Some(&cur.tokens), extra: cur.extra, len: cur.tokens.len() };
                    self.register(&e.tables[..], q, first, cur.keys.len(), Some((seq, first)));
                }
                r
            }
            None => r,
        };
        self.seqs = map;
        r?;
        self.end_op();
        Ok(())
    }

    /// Join `seq` holding only the longest valid hit of the prompt `tokens` (at most
    /// `len - 1` tokens, the last-token rule): its length and frontier are the cached
    /// tokens, returned; nothing else is allocated or registered. The caller then grows it
    /// by the rest of the prompt (any growth keeps its token record) and, once that KV is
    /// computed, hands the ids to [`Self::store_tokens`], which registers the blocks they
    /// fill: vLLM's order (hit, allocate, compute, cache), so no block is cached before
    /// its KV exists. The query counts in the hit metrics as an admission's.
    ///
    /// With tiers, the hit continues below the device: the blocks worth loading are
    /// allocated, cached and listed as loads ([`Self::drain_tier_moves`]), as an
    /// admission's are (their KV exists once the loads are done); when the pool lacks the
    /// blocks for them, none is loaded (the caller computes them).
    pub fn add_sequence_hit(&mut self, seq: SeqId, tokens: &[u32], extra: Option<u64>) -> Result<usize> {
        self.admit_checks(seq, tokens.len())?;
        let bs = self.block_size;
        let keys = self.block_keys(tokens, extra)?;
        let q = Query { keys: &keys, tokens: Some(tokens), extra, len: tokens.len() };
        let mut plan = self.hit_plan(q, false)?;
        if self.groups.len() * plan.tb > self.num_free_blocks() - plan.revived {
            plan.tb = 0;
        }
        let (hb, tb) = (plan.hb, plan.tb);
        let taken = self.take_tier_blocks(&plan, q);
        let mut tables = self.take_hit(&plan.held, hb);
        self.take_copies_and_touch(&plan);
        let mut out = StepOutput::default();
        if tb > 0 {
            out.total_tokens = tb * bs;
            for t in tables.iter_mut() {
                self.grow_table(t, hb * bs, tb * bs, |_| {}, &mut out.cow)?;
            }
            self.place_loads(&taken, 0, &tables, &mut out);
            self.register(&tables, q, hb, hb + tb, None);
        }
        let len = (hb + tb) * bs;
        self.record_hit(&plan, keys.len(), tokens.len(), len)?;
        let c = self.cache_mut()?;
        c.record_tier_choice(plan.tier_found, tb);
        c.queue_tier_loads(&out.loads);
        let cursor = TokenCursor { tokens: tokens[..len].to_vec(), keys: keys[..hb + tb].to_vec(), extra, deferred: true };
        self.seqs.insert(seq, SeqEntry { len, frontier: len, prev_frontier: len, mark: 0, tables, cursor: Some(Box::new(cursor)) });
        self.end_op();
        Ok(len)
    }

    /// Give `seq` the ids of its next stored tokens, whose KV is now computed, and register
    /// in the cache each block they fill (as [`Self::append_tokens`] does, without growing).
    /// `InvalidArgument`, changing nothing, when `seq` keeps no token record (it was not
    /// admitted by token ids, or grew without them) or stores fewer tokens than its record
    /// and `tokens` add up to.
    pub fn store_tokens(&mut self, seq: SeqId, tokens: &[u32]) -> Result<()> {
        let hasher = self.cache_ref()?.hasher();
        let e = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSequence(seq.0))?;
        let Some(cur) = e.cursor.as_mut() else {
            return Err(invalid!("seq_id: sequence {} keeps no token record (admitted or grown without token ids)", seq.0));
        };
        if cur.tokens.len() + tokens.len() > e.len {
            return Err(invalid!(
                "token_ids: {} more ids for sequence {}, which stores {} tokens and has the ids of {}",
                tokens.len(),
                seq.0,
                e.len,
                cur.tokens.len()
            ));
        }
        let first = cur.push_tokens(tokens, self.block_size, hasher);
        let mut map = std::mem::take(&mut self.seqs);
        if let Some(SeqEntry { tables, cursor: Some(cur), .. }) = map.get_mut(&seq) {
            let q = Query { keys: &cur.keys, tokens: Some(&cur.tokens), extra: cur.extra, len: cur.tokens.len() };
            self.adopt_twins(tables, q, first, cur.keys.len());
            self.register(&tables[..], q, first, cur.keys.len(), Some((seq, first)));
        }
        self.seqs = map;
        self.end_op();
        Ok(())
    }

    /// In each full group, give blocks `from..to` of `tables` whose content a cached block
    /// already holds (its twin: same key, parent, extra key and tokens, computed by another
    /// sequence in the same pass) that twin instead: the sequence holds the cached block,
    /// its own goes back to the free list, and the chain goes on through the twin. (With
    /// one block per key, the duplicate could not be cached, and nothing after it.)
    fn adopt_twins(&mut self, tables: &mut GroupTables, q: Query<'_>, from: usize, to: usize) {
        let bs = self.block_size;
        for (g, t) in tables.iter_mut().enumerate() {
            if self.groups[g].is_windowed() {
                continue;
            }
            for i in from..to.min(q.keys.len()) {
                let Some(c) = self.cache.as_deref_mut() else { return };
                let Some(b) = t.get(i) else { break };
                if c.is_cached(b) || q.fill(i, bs) < bs {
                    continue;
                }
                let parent = match i.checked_sub(1).map(|j| t.get(j)) {
                    None => None,
                    Some(Some(p)) if c.is_cached(p) => Some(p),
                    Some(_) => break,
                };
                let Some(twin) = c.twin(g, i, q.keys[i], parent, q.extra, q.tokens) else { break };
                c.acquire(twin, &mut self.alloc);
                t.replace(i, twin);
                self.release_block(b);
            }
        }
    }

    /// Hard-pin (`priority` None: never evicted) or soft-pin (retention `priority` under the
    /// priority policy) every block an admission of `tokens` followed by more tokens needs
    /// (a hit of all their full blocks: every full group's chain, each windowed group's
    /// sinks and window), until `unpin` or until the clock reaches `expires_at`.
    /// `InvalidArgument` when that hit is not cached in every group.
    pub fn pin_prefix_tokens(&mut self, tokens: &[u32], extra: Option<u64>, priority: Option<u32>, expires_at: Option<u64>) -> Result<u64> {
        let keys = self.block_keys(tokens, extra)?;
        self.pin_hit(Query { keys: &keys, tokens: Some(tokens), extra, len: tokens.len() }, priority, expires_at)
    }

    /// [`Self::pin_prefix_tokens`] for a prefix given as block keys, one per full block.
    pub fn pin_prefix_keys(&mut self, keys: &[BlockKey], priority: Option<u32>, expires_at: Option<u64>) -> Result<u64> {
        self.pin_hit(Query { keys, tokens: None, extra: None, len: keys.len().saturating_mul(self.block_size) }, priority, expires_at)
    }

    fn pin_hit(&mut self, q: Query<'_>, priority: Option<u32>, expires_at: Option<u64>) -> Result<u64> {
        let n = q.keys.len();
        if n == 0 {
            return Err(invalid!("a pin needs at least one full block ({} tokens)", self.block_size));
        }
        let hits = self.full_chains(q, n)?;
        let mut blocks = Vec::new();
        for (g, s) in self.groups.iter().enumerate() {
            for i in s.needed_before(n * self.block_size, self.block_size).into_iter().flatten() {
                let b = self.hit_block(&hits, q, g, i).ok_or_else(|| {
                    invalid!("prefix is not cached: group {g} ({s}) lacks logical block {i} of the {n} a hit needs")
                })?;
                blocks.push(b);
            }
        }
        self.cache_mut()?.pin(&blocks, priority, expires_at)
    }

    /// Drop pin `pin_id`; `InvalidArgument` for an unknown or lapsed pin or without caching.
    pub fn unpin(&mut self, pin_id: u64) -> Result<()> {
        self.cache_mut()?.unpin(pin_id)
    }

    /// Drive the logical clock from the caller's step counter (it never goes back).
    pub fn set_clock(&mut self, t: u64) -> Result<()> {
        self.cache_mut()?.set_clock(t)
    }

    /// Move the recorded cache events into `out`, oldest first (each names its group).
    pub fn drain_events(&mut self, out: &mut Vec<CacheEvent>) -> Result<()> {
        self.cache_mut()?.drain_events(out);
        Ok(())
    }

    /// Register stored blocks `from..to` of `tables` under `q.keys`: in a full group as a
    /// chain (each block the child of the one before, stopping where the chain breaks or a
    /// key is taken), in a windowed group each stored block on its own. A keyed prompt's
    /// partly filled last block is cached with its fill (its identity: see the module doc).
    /// With write-through, each block newly cached for sequence `seq` of `through = (seq,
    /// first)` at index `first` or later waits for its KV (module `write_through`); the
    /// others (blocks a tier load fills) are not copied back.
    fn register(&mut self, tables: &[GroupTable], q: Query<'_>, from: usize, to: usize, through: Option<(SeqId, usize)>) {
        let bs = self.block_size;
        let Some(c) = self.cache.as_deref_mut() else { return };
        let through = through.filter(|_| c.writes_through());
        let mut depth = None;
        for (g, t) in tables.iter().enumerate() {
            let windowed = self.groups[g].is_windowed();
            for i in from..to.min(q.keys.len()) {
                let Some(b) = t.get(i) else { continue };
                if !t.fully_written(i) {
                    continue; // taken at a hole: no KV before the growth that took it
                }
                let (key, fill) = (q.keys[i], q.fill(i, bs));
                if fill == 0 || (fill < bs && i + 1 < to) {
                    break; // only the last block may be partly filled
                }
                if c.is_cached(b) {
                    // Already cached as this block: a chain goes on through it.
                    if c.key_of(b) == Some(key) && c.group_of(b) == Some(g) && c.filled(b) == Some(fill) {
                        continue;
                    }
                    if windowed {
                        continue;
                    }
                    break;
                }
                let parent = match (windowed, i) {
                    (true, _) | (false, 0) => None,
                    (false, _) => match t.get(i - 1) {
                        Some(p) if c.key_of(p) == Some(q.keys[i - 1]) && c.group_of(p) == Some(g) && c.filled(p) == Some(bs) => Some(p),
                        _ => break,
                    },
                };
                if let (true, Some(tokens)) = (windowed, q.tokens) {
                    let d = depth.get_or_insert_with(|| c.verified_depth(q.keys, q.tokens, q.extra, to));
                    c.register_windowed(g, b, &q.keys[..=i], tokens, q.extra, d);
                    continue;
                }
                let tok = q.tokens.map(|t| &t[i * bs..i * bs + fill]);
                if !c.register_in(g, b, key, parent, q.extra, tok, fill) {
                    if windowed {
                        continue;
                    }
                    break;
                }
                if let Some((seq, _)) = through.filter(|&(_, first)| i >= first) {
                    self.through.push(PendingThrough { seq, group: g, index: i, block: b, end: i * bs + fill });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
