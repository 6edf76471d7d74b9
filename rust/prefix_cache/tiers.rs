//! The tiers below the device as the prefix cache sees them: which cached blocks each
//! tier holds, in what eviction order, and where a block the device evicts goes. The
//! bytes live in `crate::offload`; this module only decides, on the logical clock, so
//! that the simulator and a replay can drive the same decisions and get the same numbers.
//!
//! # Specification
//!
//! - Tiers are ordered (tier 0 is G2, the host; tier 1 is G3, the disk) and *exclusive*: a
//!   block (its group, key and fill) is in at most one tier, and a caller promotes it out
//!   of its tier when the device caches it again ([`Tiers::take`]). A tier of capacity 0 is
//!   not allowed; a pool without tiers has no [`Tiers`].
//! - A block the device evicts is *offered* ([`Tiers::offer`]). The *reuse gate*, when
//!   set, admits it only if its key was *seen* ([`Tiers::note_seen`]: stored or hit in the
//!   device) at least `min_seen` times; counts halve every `half_life` observations, so
//!   they measure recent reuse. An admitted block goes to tier 0. A full tier first
//!   evicts its policy's victim, which moves to the next tier (already admitted once: no
//!   gate there) or, past the last tier, is dropped.
//! - Each tier orders its blocks by one of the device's policies (`lru`, `fifo`, `lfu`) or
//!   by S3-FIFO ([`super::tier_order`]). A block is *stored* in a tier, and *used* there,
//!   when it enters it (from the device or the tier above); a hit takes it out, so nothing
//!   else uses it. `lru` and `fifo` are therefore the same order, entry order; `lfu` orders
//!   by the hits the block had in the device, then entry order. `priority` is refused:
//!   tiers hold no pins. The device evicts a chain's blocks tail first, and a parent has at
//!   least its child's hits, so these policies evict a chain tail first in every tier too:
//!   a tier never keeps a block whose parent it dropped before it (S3-FIFO may).
//! - A slot a hit empties takes no block before the pool call ends ([`Tiers::end_call`]):
//!   its bytes are still to be loaded. A tier whose every slot is so held stores nothing
//!   (an offer is not stored, a victim from above is dropped).
//! - A [`Tiers::take`] of a block whose stored verification (parent key, extra key,
//!   tokens) differs from the caller's is a *collision*: a miss that removes nothing.
//! - *Write-through* ([`TierRules::write_through`]): once a cached block's KV is computed,
//!   the device also *copies it through* ([`Tiers::copy_through`]): the gate applies as to
//!   an offer, and an admitted block is stored in tier 0 as for an offer, but *resident*:
//!   the device keeps it too. A resident block is no hit (the device serves it; `take`
//!   and `matches` pass over it), and a tier evicting it drops it (the device has its
//!   bytes) instead of moving it down. When the device evicts a block a tier holds
//!   resident, the offer moves no bytes: the block stops being resident and enters its
//!   tier again, with its hits, as if stored then. A copy-through of a key a tier holds
//!   makes it resident (equal keys are equal content) and moves nothing.
//!
//! Every call returns the [`Move`]s it decided, in order, for the byte layer to carry out.

use rustc_hash::FxHashMap;

use crate::error::Result;
use crate::invalid;
use crate::prefix_cache::block_hash::BlockKey;
use crate::prefix_cache::eviction::EvictionPolicy;
use crate::prefix_cache::tier_order::Order;
pub use crate::prefix_cache::tier_gate::GateConfig;
use crate::prefix_cache::tier_gate::Gate;
pub use crate::prefix_cache::tier_order::{TierKey, TierPolicy};
use crate::types::BlockId;

/// What a tier stores about a block besides its bytes: its hits in the device (`lfu`
/// orders by them) and what a hit must match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierEntry {
    pub hits: u32,
    /// The key of the block before it in its chain (None: a root or a windowed block).
    pub parent: Option<BlockKey>,
    pub extra: Option<u64>,
    /// The block's token ids, when the cache verifies tokens.
    pub tokens: Option<Box<[u32]>>,
}

/// One tier: a capacity in blocks and a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierConfig {
    pub capacity_blocks: usize,
    pub policy: TierPolicy,
}

/// How blocks go below the device, besides the tiers' capacities and orders.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierRules {
    /// The reuse gate, if any.
    pub gate: Option<GateConfig>,
    /// Copy each cached block to tier 0 once its KV is computed (write-through), not only
    /// when the device evicts it (write-back, the default).
    pub write_through: bool,
}

/// A decision for the byte layer. Slots index a tier's storage (`0..capacity_blocks`).
/// The byte layer carries out a call's moves in order, then its loads (a hit's
/// [`TierLoad`]s): a store reads a device block before a load may overwrite it, and a
/// load reads a slot that no move of the same call writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Move {
    /// The device's `block` is stored into `slot` of `tier`.
    Store { key: TierKey, block: BlockId, tier: usize, slot: u32 },
    /// A victim moves from `slot` of `tier` to `to_slot` of `tier + 1`; `meta` is what a
    /// restart needs to find it there again ([`Tiers::restore`]).
    Demote { key: TierKey, tier: usize, slot: u32, to_slot: u32, meta: TierMeta },
    /// The block in `slot` of `tier` is forgotten (evicted past the last tier).
    Drop { key: TierKey, tier: usize, slot: u32 },
}

/// What a tier knows of a block besides its key: its parent's key, extra key, hits in the
/// device and token ids (a block stored on disk keeps them, to be restored after a
/// restart).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierMeta {
    pub parent: Option<BlockKey>,
    pub extra: Option<u64>,
    pub hits: u32,
    /// The block's token ids, when the cache verifies tokens.
    pub tokens: Option<Box<[u32]>>,
}

/// A block a hit takes from a tier into the device: the bytes of `slot` of `tier` go to
/// device block `block`, which must not be read before they arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierLoad {
    pub tier: usize,
    pub slot: u32,
    pub block: BlockId,
}

/// Counts of the tiers' decisions at the top: evicted blocks the gate refused, and
/// admissions that loaded blocks from below or found recomputing them faster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierChoices {
    pub gated: u64,
    pub loads_won: u64,
    pub recompute_won: u64,
}

/// Counts per tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Blocks written into the tier (offers admitted, or demotions from the tier above).
    pub stored: u64,
    /// Blocks taken out by a hit.
    pub hits: u64,
    /// Blocks evicted from the tier (demoted or dropped).
    pub evicted: u64,
    /// Lookups whose key was present but whose verification differed.
    pub collisions: u64,
    /// Blocks held now (the tier's index, read when the counts are taken).
    pub held: usize,
}

/// A block a tier holds: its key, what it stores about it, the tick it entered at and
/// whether the device holds it too (written through).
#[derive(Clone, Debug)]
struct Held {
    key: TierKey,
    entry: TierEntry,
    tick: u64,
    resident: bool,
}

#[derive(Clone, Debug)]
struct Tier {
    map: FxHashMap<TierKey, u32>,
    slots: Vec<Option<Held>>,
    free: Vec<u32>,
    /// Slots of blocks taken by hits during the current pool call: their bytes are still
    /// to be read (the call's load plan), so no block enters them before [`Tiers::end_call`].
    taken: Vec<u32>,
    order: Order,
    stats: TierStats,
}

impl Tier {
    fn new(cfg: TierConfig) -> Result<Self> {
        let n = u32::try_from(cfg.capacity_blocks).ok().filter(|&n| n > 0 && n < u32::MAX);
        let n = n.ok_or_else(|| invalid!("capacity_blocks: a tier holds 1..{} blocks, got {}", u32::MAX, cfg.capacity_blocks))?;
        if cfg.policy == TierPolicy::Ranked(EvictionPolicy::Priority) {
            return Err(invalid!("policy: a tier holds no pins, so 'priority' does not apply; use lru, fifo, lfu or s3fifo"));
        }
        let mut slots = Vec::new();
        slots.try_reserve_exact(n as usize).map_err(|_| invalid!("capacity_blocks: cannot index {n} blocks"))?;
        slots.resize(n as usize, None);
        let order = Order::new(cfg.policy, n as usize);
        Ok(Self { map: FxHashMap::default(), slots, free: (0..n).rev().collect(), taken: Vec::new(), order, stats: TierStats::default() })
    }

    /// Put `entry` into a free slot (the caller made room) at `tick`.
    fn put(&mut self, key: TierKey, entry: TierEntry, tick: u64, resident: bool) -> Option<u32> {
        let slot = self.free.pop()?;
        self.order.insert(slot, key, entry.hits, tick);
        self.slots[slot as usize] = Some(Held { key, entry, tick, resident });
        self.map.insert(key, slot);
        self.stats.stored += 1;
        Some(slot)
    }

    /// Remove the block in `slot`, returning it; the caller says where the slot goes
    /// (`free`, or `taken` by a hit).
    fn remove(&mut self, slot: u32) -> Option<Held> {
        let h = self.slots[slot as usize].as_ref()?;
        self.order.remove(slot, h.entry.hits, h.tick);
        self.vacate(slot)
    }

    /// Empty `slot`, already out of the order (the caller places the slot).
    fn vacate(&mut self, slot: u32) -> Option<Held> {
        let h = self.slots[slot as usize].take()?;
        self.map.remove(&h.key);
        Some(h)
    }

    /// Whether the block in `slot` is resident (the device holds it too).
    fn is_resident(&self, slot: u32) -> bool {
        self.slots[slot as usize].as_ref().is_some_and(|h| h.resident)
    }

    /// The device evicted the resident block in `slot`: it enters the order again at
    /// `tick` with the `hits` it had in the device, no longer resident.
    fn settle(&mut self, slot: u32, hits: u32, tick: u64) {
        let Some(h) = self.slots[slot as usize].as_mut() else { return };
        self.order.remove(slot, h.entry.hits, h.tick);
        (h.entry.hits, h.tick, h.resident) = (hits, tick, false);
        self.order.insert(slot, h.key, hits, tick);
    }
}

/// The tiers of one cache, top (G2) first.
#[derive(Clone, Debug)]
pub struct Tiers {
    tiers: Vec<Tier>,
    gate: Option<Gate>,
    /// Entries so far (the tiers' logical clock).
    tick: u64,
    /// Offers and copies-through the gate refused.
    pub gated: u64,
    write_through: bool,
    /// What loading a block from each tier costs and what computing a token costs, in
    /// nanoseconds, when the caller set them ([`Tiers::set_costs`]).
    costs: Option<(Vec<u64>, u64)>,
    /// Admissions that loaded blocks from below the device.
    pub loads_won: u64,
    /// Admissions that found blocks below the device but recomputed some or all of them,
    /// as faster.
    pub recompute_won: u64,
}

impl Tiers {
    /// Tiers of the given configurations (1 or 2: host, then disk), with `rules`.
    /// Errors: `InvalidArgument` for no tier, more than two, a capacity of 0, the
    /// `priority` policy or a gate out of range.
    pub fn new(tiers: &[TierConfig], rules: TierRules) -> Result<Self> {
        if !(1..=2).contains(&tiers.len()) {
            return Err(invalid!("tiers: 1 (host) or 2 (host, disk) tiers, got {}", tiers.len()));
        }
        let total: usize = tiers.iter().map(|t| t.capacity_blocks).sum();
        let gate = rules.gate.map(|g| Gate::new(g, total.saturating_mul(2).min(1 << 24))).transpose()?;
        let tiers = tiers.iter().map(|&c| Tier::new(c)).collect::<Result<_>>()?;
        Ok(Self { tiers, gate, tick: 0, gated: 0, write_through: rules.write_through, costs: None, loads_won: 0, recompute_won: 0 })
    }

    /// Whether cached blocks are copied through once computed ([`TierRules::write_through`]).
    pub fn writes_through(&self) -> bool {
        self.write_through
    }

    /// Whether the reuse gate refuses `key` (counted).
    fn gate_refuses(&mut self, key: &TierKey) -> bool {
        let refused = self.gate.as_ref().is_some_and(|g| !g.admits(key));
        self.gated += refused as u64;
        refused
    }

    /// Count one sighting of `key` for the reuse gate (a store or a hit in the device).
    pub fn note_seen(&mut self, key: &TierKey) {
        if let Some(g) = &mut self.gate {
            g.see(key);
        }
    }

    /// The device evicts `block` (`key`, `entry`): store it in tier 0 if the gate admits it,
    /// cascading victims down. A key already held below (a second copy cached in the
    /// device since) is replaced, unless it is held resident (written through): that
    /// block just stops being resident. Returns the moves, in order.
    pub fn offer(&mut self, block: BlockId, key: TierKey, entry: TierEntry) -> Vec<Move> {
        let mut moves = Vec::new();
        let held = self.find(&key);
        if let Some((t, slot)) = held.filter(|&(t, s)| self.tiers[t].is_resident(s)) {
            self.tick += 1;
            self.tiers[t].settle(slot, entry.hits, self.tick);
            return moves;
        }
        if self.gate_refuses(&key) {
            return moves;
        }
        if let Some((t, slot)) = held {
            self.tiers[t].remove(slot);
            self.tiers[t].free.push(slot);
            moves.push(Move::Drop { key, tier: t, slot });
        }
        self.store_top(block, key, entry, false, &mut moves);
        moves
    }

    /// Write-through: cached device `block` (`key`, `entry`) has its KV computed. Store a
    /// resident copy in tier 0 if the gate admits it and no tier holds the key (a held
    /// one becomes resident). Returns the moves, in order.
    pub fn copy_through(&mut self, block: BlockId, key: TierKey, entry: TierEntry) -> Vec<Move> {
        let mut moves = Vec::new();
        if let Some((t, slot)) = self.find(&key) {
            if let Some(h) = self.tiers[t].slots[slot as usize].as_mut() {
                h.resident = true;
            }
            return moves;
        }
        if !self.gate_refuses(&key) {
            self.store_top(block, key, entry, true, &mut moves);
        }
        moves
    }

    /// Store device `block` in tier 0, making room first.
    fn store_top(&mut self, block: BlockId, key: TierKey, entry: TierEntry, resident: bool, moves: &mut Vec<Move>) {
        self.make_room(0, moves);
        self.tick += 1;
        if let Some(slot) = self.tiers[0].put(key, entry, self.tick, resident) {
            moves.push(Move::Store { key, block, tier: 0, slot });
        }
    }

    /// Free one slot in `tier` if it is full: its victim moves down (making room there
    /// first) or is dropped past the last tier.
    fn make_room(&mut self, tier: usize, moves: &mut Vec<Move>) {
        if !self.tiers[tier].free.is_empty() {
            return;
        }
        let Some(slot) = self.tiers[tier].order.pop() else { return };
        let Some(Held { key, entry, resident, .. }) = self.tiers[tier].vacate(slot) else { return };
        self.tiers[tier].free.push(slot);
        self.tiers[tier].stats.evicted += 1;
        // Past the last tier, or a copy the device still holds: forgotten.
        if tier + 1 == self.tiers.len() || resident {
            moves.push(Move::Drop { key, tier, slot });
            return;
        }
        self.make_room(tier + 1, moves);
        self.tick += 1;
        let meta = TierMeta { parent: entry.parent, extra: entry.extra, hits: entry.hits, tokens: entry.tokens.clone() };
        match self.tiers[tier + 1].put(key, entry, self.tick, false) {
            Some(to_slot) => moves.push(Move::Demote { key, tier, slot, to_slot, meta }),
            // Every slot below is being loaded this call: the victim is dropped.
            None => moves.push(Move::Drop { key, tier, slot }),
        }
    }

    /// Put a block found in `tier`'s storage after a restart back into `tier`, with its
    /// verification data (a block stored without token ids has no token record: a hit
    /// then verifies its parent and extra key), behind the blocks there. Returns
    /// its slot; None, changing nothing, when the tier is full, `tier` does not exist or
    /// a tier holds `key` already (the caller then removes the stored copy).
    pub fn restore(&mut self, tier: usize, key: TierKey, meta: TierMeta) -> Option<u32> {
        if self.find(&key).is_some() || self.tiers.get(tier)?.free.is_empty() {
            return None;
        }
        self.tick += 1;
        let entry = TierEntry { hits: meta.hits, parent: meta.parent, extra: meta.extra, tokens: meta.tokens };
        self.tiers[tier].put(key, entry, self.tick, false)
    }

    /// What `slot` of `tier` holds, if anything. Pure.
    pub fn entry(&self, tier: usize, slot: u32) -> Option<&TierEntry> {
        self.tiers.get(tier)?.slots.get(slot as usize)?.as_ref().map(|h| &h.entry)
    }

    /// The tier and slot holding `key`, if any. Pure.
    pub fn find(&self, key: &TierKey) -> Option<(usize, u32)> {
        self.tiers.iter().enumerate().find_map(|(t, tier)| tier.map.get(key).map(|&s| (t, s)))
    }

    /// Whether the block held under `key` matches the caller's verification data (None:
    /// not held, or held resident: no hit). Pure.
    pub fn matches(&self, key: &TierKey, parent: Option<BlockKey>, extra: Option<u64>, tokens: Option<&[u32]>) -> Option<bool> {
        let (t, slot) = self.find(key)?;
        let Held { entry: e, resident: false, .. } = self.tiers[t].slots[slot as usize].as_ref()? else { return None };
        let tokens_ok = match (&e.tokens, tokens) {
            (Some(have), Some(want)) => have[..] == *want,
            _ => true,
        };
        Some(e.parent == parent && e.extra == extra && tokens_ok)
    }

    /// A hit below the device: remove the block from its tier (the caller promotes it)
    /// and return `(tier, slot, entry)`; the slot stays readable by the byte layer until
    /// the caller's next call. None on a miss, or on a collision (counted; nothing moves).
    pub fn take(&mut self, key: &TierKey, parent: Option<BlockKey>, extra: Option<u64>, tokens: Option<&[u32]>) -> Option<(usize, u32, TierEntry)> {
        let (t, slot) = self.find(key)?;
        match self.matches(key, parent, extra, tokens) {
            Some(true) => {}
            Some(false) => {
                self.tiers[t].stats.collisions += 1;
                return None;
            }
            None => return None,
        }
        let Held { entry, .. } = self.tiers[t].remove(slot)?;
        let tier = &mut self.tiers[t];
        tier.taken.push(slot);
        tier.stats.hits += 1;
        Some((t, slot, entry))
    }

    /// Set the cost of loading one block from each tier (top first; every group's copy of
    /// it) and of computing one token, in nanoseconds: from then on a hit takes from the
    /// tiers only the leading blocks whose loading saves time ([`Tiers::worth_loading`]).
    /// `InvalidArgument` for another count of tiers.
    pub fn set_costs(&mut self, load_ns_per_block: &[u64], recompute_ns_per_token: u64) -> Result<()> {
        if load_ns_per_block.len() != self.tiers.len() {
            return Err(invalid!("load_ns_per_block: {} costs for {} tiers", load_ns_per_block.len(), self.tiers.len()));
        }
        self.costs = Some((load_ns_per_block.to_vec(), recompute_ns_per_token));
        Ok(())
    }

    /// Of a hit's blocks below the device, in chain order, held in tiers `tiers[i]` (`n`
    /// copies each, one per group) and holding `block_tokens` tokens each: how many leading
    /// ones to load rather than compute. Without costs, all; with them, the count that
    /// saves the most time (the smallest such count on a tie; 0 saves nothing). Pure.
    pub fn worth_loading(&self, tiers: &[usize], copies: u64, block_tokens: u64) -> usize {
        let Some((load, per_token)) = &self.costs else { return tiers.len() };
        let compute = (block_tokens * per_token) as i128;
        let (mut saved, mut best, mut best_k) = (0i128, 0i128, 0);
        for (k, &t) in tiers.iter().enumerate() {
            saved += compute - (copies * load.get(t).copied().unwrap_or(u64::MAX)) as i128;
            if saved > best {
                (best, best_k) = (saved, k + 1);
            }
        }
        best_k
    }

    /// Count one admission that found `found` blocks below the device and loaded `loaded`.
    pub fn record_choice(&mut self, found: usize, loaded: usize) {
        self.loads_won += (loaded > 0) as u64;
        self.recompute_won += (loaded < found) as u64;
    }

    /// The pool call is over: the slots its hits emptied may take blocks again.
    pub fn end_call(&mut self) {
        for t in &mut self.tiers {
            let Tier { free, taken, .. } = t;
            free.append(taken);
        }
    }

    /// Forget every block (counts stay); the gate's counts too.
    pub fn clear(&mut self) {
        for t in &mut self.tiers {
            let n = t.slots.len() as u32;
            t.map.clear();
            t.slots.iter_mut().for_each(|s| *s = None);
            t.free = (0..n).rev().collect();
            t.taken.clear();
            t.order.clear();
        }
        if let Some(g) = &mut self.gate {
            g.clear();
        }
    }

    /// Per-tier counts, top first.
    pub fn stats(&self) -> Vec<TierStats> {
        self.tiers.iter().map(|t| TierStats { held: t.map.len(), ..t.stats.clone() }).collect()
    }

    /// The keys a tier holds, next victim first (tests and reports).
    pub fn order(&self, tier: usize) -> Vec<TierKey> {
        let Some(t) = self.tiers.get(tier) else { return Vec::new() };
        t.order.slots().into_iter().filter_map(|s| t.slots[s as usize].as_ref().map(|h| h.key)).collect()
    }
}
