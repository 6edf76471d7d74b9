//! The prefix cache's side of its tiers ([`super::tiers`]): a block the device evicts is
//! offered to them with what a later hit must match, every store and hit counts as a
//! sighting for the reuse gate, and an admission finds and takes the blocks that continue
//! its chain below the device. The moves the tiers decide wait in the cache until the
//! caller drains them ([`PrefixCache::drain_tier_moves`]): the device block of a `Store`
//! must be copied out before the block is written again.
//!
//! With `record_events`, every tier's stores and removals are events too, their
//! `medium` the tier's (vLLM's KV events name the medium as well): a block moving down is
//! removed from one tier and stored in the next; a hit removes it from its tier and the
//! device stores it again.
//!
//! Tiers serve full-attention groups: a windowed group's blocks are verified against the
//! lineage of their prefix, which the tiers do not keep, so a cache with a windowed group
//! refuses tiers.

use super::meta::{Meta, HAS_TOKENS};
use super::tiers::{Move, TierChoices, TierConfig, TierEntry, TierKey, TierLoad, TierMeta, TierRules, TierStats, Tiers};
use super::{BlockKey, CacheEvent, CacheEventKind, PrefixCache, MEDIUM_DISK, MEDIUM_HOST, NO_PARENT};
use crate::error::Result;
use crate::invalid;
use crate::types::BlockId;

impl PrefixCache {
    /// Give the cache tiers below the device (host, then disk), with `rules` (reuse gate,
    /// write-through). Errors: `InvalidArgument` for a cache with a windowed group or a
    /// configuration [`Tiers::new`] refuses. Replaces any tiers the cache had (their
    /// blocks are forgotten).
    pub fn set_tiers(&mut self, tiers: &[TierConfig], rules: TierRules) -> Result<()> {
        if self.windowed.iter().any(|&w| w) {
            return Err(invalid!("tiers: a pool with a sliding-window or chunked group cannot spill blocks below the device"));
        }
        self.tiers = Some(Box::new(Tiers::new(tiers, rules)?));
        self.tier_moves.clear();
        self.tier_loads.clear();
        self.tiers_cleared = true;
        Ok(())
    }

    /// Whether the cache has tiers.
    pub fn has_tiers(&self) -> bool {
        self.tiers.is_some()
    }

    /// Per-tier counts, top first (None without tiers), and the tiers' admission counts.
    pub fn tier_stats(&self) -> Option<(Vec<TierStats>, TierChoices)> {
        self.tiers.as_ref().map(|t| (t.stats(), TierChoices { gated: t.gated, loads_won: t.loads_won, recompute_won: t.recompute_won }))
    }

    /// Move the tiers' pending decisions into `moves` and the admissions' loads into
    /// `loads`, oldest first. Returns whether the tiers were emptied (a reset, or new
    /// tiers) since the last drain: the byte layer then forgets what it stored before
    /// carrying out `moves`, which all came after.
    pub fn drain_tier_moves(&mut self, moves: &mut Vec<Move>, loads: &mut Vec<TierLoad>) -> bool {
        moves.append(&mut self.tier_moves);
        loads.append(&mut self.tier_loads);
        std::mem::take(&mut self.tiers_cleared)
    }

    /// Queue the loads an admission placed, for [`Self::drain_tier_moves`].
    pub fn queue_tier_loads(&mut self, loads: &[TierLoad]) {
        self.tier_loads.extend_from_slice(loads);
    }

    /// Whether moves and loads wait to be drained (default) or are dropped by
    /// [`Self::end_op`] (nobody carries them out: the tiers model decisions only).
    pub fn keep_tier_moves(&mut self, keep: bool) {
        self.keep_moves = keep;
    }

    /// At the end of a call: drop the moves and loads nobody will drain.
    pub(super) fn forget_undrained(&mut self) {
        if !self.keep_moves {
            self.tier_moves.clear();
            self.tier_loads.clear();
        }
    }

    /// Count a sighting of cached block `b` (stored or hit) for the reuse gate.
    pub(super) fn seen(&mut self, b: BlockId) {
        if let Some(t) = self.tiers.as_deref_mut() {
            let m = &self.meta[b.index()];
            t.note_seen(&(m.group, m.key, m.partial));
        }
    }

    /// Offer block `b`, being evicted, to the tiers (before its meta is cleared).
    pub(super) fn spill(&mut self, b: BlockId) {
        if self.tiers.is_none() {
            return;
        }
        let (key, entry) = self.tier_entry(b);
        let moves = self.tiers.as_deref_mut().map(|t| t.offer(b, key, entry)).unwrap_or_default();
        self.queue_moves(moves);
    }

    /// Whether the cache writes its blocks through to the top tier once computed.
    pub fn writes_through(&self) -> bool {
        self.tiers.as_deref().is_some_and(Tiers::writes_through)
    }

    /// Write-through: cached block `b`'s KV is now computed; copy it to the top tier
    /// ([`Tiers::copy_through`]). Nothing for a block no longer cached or without
    /// write-through.
    pub fn write_through(&mut self, b: BlockId) {
        if !self.writes_through() || !self.is_cached(b) {
            return;
        }
        let (key, entry) = self.tier_entry(b);
        let moves = self.tiers.as_deref_mut().map(|t| t.copy_through(b, key, entry)).unwrap_or_default();
        self.queue_moves(moves);
    }

    /// What the tiers keep of cached block `b`: its identity and verification data.
    fn tier_entry(&self, b: BlockId) -> (TierKey, TierEntry) {
        let m: Meta = self.meta[b.index()];
        let parent = (m.parent != NO_PARENT).then(|| self.meta[m.parent as usize].key);
        let tokens = m.has(HAS_TOKENS).then(|| {
            let fill = if m.partial == 0 { self.block_size } else { m.partial as usize };
            let start = b.index() * self.block_size;
            self.tokens[start..start + fill].into()
        });
        ((m.group, m.key, m.partial), TierEntry { hits: m.hits, parent, extra: m.extra(), tokens })
    }

    /// Queue `moves` for the byte layer, with their events.
    fn queue_moves(&mut self, moves: Vec<Move>) {
        for mv in &moves {
            self.tier_events(mv);
        }
        self.tier_moves.extend(moves);
    }

    /// The events of one tier move (with `record_events`): a store into a tier, a removal
    /// from one, or both for a block moving down.
    fn tier_events(&mut self, mv: &Move) {
        if !self.cfg.record_events {
            return;
        }
        let (removed, stored) = match *mv {
            Move::Store { key, tier, slot, .. } => (None, Some((key, tier, slot))),
            Move::Demote { key, tier, to_slot, .. } => (Some((key, tier)), Some((key, tier + 1, to_slot))),
            Move::Drop { key, tier, .. } => (Some((key, tier)), None),
        };
        if let Some((key, tier)) = removed {
            self.push_tier_event(CacheEventKind::Removed, key, None, tier);
        }
        if let Some((key, tier, slot)) = stored {
            let parent = self.tiers.as_deref().and_then(|t| t.entry(tier, slot)).and_then(|e| e.parent);
            self.push_tier_event(CacheEventKind::Stored, key, parent, tier);
        }
    }

    /// Queue an event of block `key` in `tier` (0: host, 1: disk).
    fn push_tier_event(&mut self, kind: CacheEventKind, (group, key, partial): TierKey, parent_key: Option<BlockKey>, tier: usize) {
        let tokens = if partial == 0 { self.block_size as u32 } else { partial as u32 };
        let medium = if tier == 0 { MEDIUM_HOST } else { MEDIUM_DISK };
        let (clock, group) = (self.clock, group as u32);
        self.events.push(CacheEvent { kind, block: None, key, parent_key, tokens, clock, group, medium });
    }

    /// The tier holding full block `key` of group `group` after `parent` (None: the
    /// root), with `extra` and, when the cache verifies, the block's `tokens`. Pure.
    pub fn tier_of(&self, group: usize, key: BlockKey, parent: Option<BlockKey>, extra: Option<u64>, tokens: Option<&[u32]>) -> Option<usize> {
        let t = self.tiers.as_deref()?;
        let tokens = tokens.filter(|_| self.cfg.verify_tokens);
        let k = tier_key(group, key);
        (t.matches(&k, parent, extra, tokens) == Some(true)).then(|| t.find(&k).map(|(tier, _)| tier)).flatten()
    }

    /// Set what loading a block from each tier and computing a token cost
    /// ([`Tiers::set_costs`]). `InvalidArgument` without tiers or for another count.
    pub fn set_tier_costs(&mut self, load_ns_per_block: &[u64], recompute_ns_per_token: u64) -> Result<()> {
        let t = self.tiers.as_deref_mut().ok_or_else(|| invalid!("the pool has no tiers (host_blocks)"))?;
        t.set_costs(load_ns_per_block, recompute_ns_per_token)
    }

    /// How many of a hit's tier blocks to load ([`Tiers::worth_loading`]); all without tiers' costs.
    pub fn tier_blocks_worth_loading(&self, tiers: &[usize], copies: u64) -> usize {
        self.tiers.as_deref().map_or(0, |t| t.worth_loading(tiers, copies, self.block_size as u64))
    }

    /// Count an admission's choice between loading and recomputing ([`Tiers::record_choice`]).
    pub fn record_tier_choice(&mut self, found: usize, loaded: usize) {
        if let Some(t) = self.tiers.as_deref_mut().filter(|_| found > 0) {
            t.record_choice(found, loaded);
        }
    }

    /// Take the block [`Self::tier_of`] found out of its tier (the caller promotes it
    /// into a device block): `(tier, slot)` to load its bytes from.
    pub fn take_from_tiers(&mut self, group: usize, key: BlockKey, parent: Option<BlockKey>, extra: Option<u64>, tokens: Option<&[u32]>) -> Option<(usize, u32)> {
        let tokens = tokens.filter(|_| self.cfg.verify_tokens);
        let t = self.tiers.as_deref_mut()?;
        let (tier, slot, _) = t.take(&tier_key(group, key), parent, extra, tokens)?;
        if self.cfg.record_events {
            self.push_tier_event(CacheEventKind::Removed, tier_key(group, key), None, tier);
        }
        Some((tier, slot))
    }

    /// Put block `key` (group, key, fill), found in `tier`'s storage after a restart, back
    /// into `tier` ([`Tiers::restore`]); a stored event with the tier's medium. None when
    /// the cache has no such tier, it is full, or holds the key.
    pub fn restore_tier_block(&mut self, tier: usize, key: TierKey, meta: TierMeta) -> Option<u32> {
        let parent = meta.parent;
        let slot = self.tiers.as_deref_mut()?.restore(tier, key, meta)?;
        if self.cfg.record_events {
            self.push_tier_event(CacheEventKind::Stored, key, parent, tier);
        }
        Some(slot)
    }

    /// Forget every block the tiers hold (a reset of the cache).
    pub(super) fn clear_tiers(&mut self) {
        if let Some(t) = self.tiers.as_deref_mut() {
            t.clear();
        }
        self.tier_moves.clear();
        self.tier_loads.clear();
        self.tiers_cleared = true;
    }
}

/// A full block's identity in the tiers.
fn tier_key(group: usize, key: BlockKey) -> TierKey {
    (group as u8, key, 0)
}
