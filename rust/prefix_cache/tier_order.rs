//! The eviction order of one tier below the device: one of the device's ranked policies
//! (`lru`, `fifo`, `lfu`), or S3-FIFO, which resists scans.
//!
//! # S3-FIFO in a tier
//!
//! A tier never sees a block twice while holding it (a hit takes it out), so the
//! frequency S3-FIFO keeps is the hits the block had in the device, at most 3. New blocks
//! enter the *small* FIFO, or the *main* FIFO when their key is in the *ghost*: the keys of
//! the last `capacity` blocks evicted from the small FIFO (a block that comes back after
//! being evicted from it is worth keeping). The victim, when the tier is full:
//!
//! - while the small FIFO holds at least `max(1, capacity / 10)` blocks (or the main one
//!   is empty): its oldest block; one with a frequency above 0 moves to the main FIFO's
//!   tail with frequency 0 instead, and the search goes on; one evicted is remembered in
//!   the ghost;
//! - otherwise the main FIFO's oldest block; one with a frequency above 0 goes back to its
//!   tail with one less, and the search goes on.
//!
//! A scan (blocks used once, evicted once) thus passes through the small FIFO and leaves
//! the main one alone. Unlike the ranked orders, S3-FIFO may keep a block whose parent it
//! evicted: room wasted (a hit cannot reach it past the missing parent), never a wrong hit.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::block_hash::BlockKey;
use super::eviction::{EvictionPolicy, EvictionQueue, Recency};
use crate::error::Result;
use crate::invalid;
use crate::types::BlockId;

/// A block's identity in every tier: layer group, chained key and partial fill (0 for a
/// full block, else its tokens), as the device's cache indexes it.
pub type TierKey = (u8, BlockKey, u16);

/// How a tier orders its blocks for eviction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierPolicy {
    /// One of the device's policies (not `priority`: a tier holds no pins).
    Ranked(EvictionPolicy),
    /// S3-FIFO (module doc).
    S3Fifo,
}

impl TierPolicy {
    /// Every tier order, in the order of their names: the device's ranked policies but
    /// `priority`, then S3-FIFO.
    pub const ALL: [TierPolicy; 4] = [
        Self::Ranked(EvictionPolicy::Lru),
        Self::Ranked(EvictionPolicy::Fifo),
        Self::Ranked(EvictionPolicy::Lfu),
        Self::S3Fifo,
    ];

    /// The order's name, as [`Self::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ranked(p) => p.name(),
            Self::S3Fifo => "s3fifo",
        }
    }

    /// Names: the device's policies and `"s3fifo"`.
    pub fn parse(name: &str) -> Result<Self> {
        if name == "s3fifo" {
            return Ok(Self::S3Fifo);
        }
        match name.parse::<EvictionPolicy>() {
            Ok(EvictionPolicy::Priority) | Err(_) => {
                Err(invalid!("tier_eviction: a tier orders its blocks by 'lru', 'fifo', 'lfu' or 's3fifo', got {name:?}"))
            }
            Ok(p) => Ok(Self::Ranked(p)),
        }
    }
}

impl From<EvictionPolicy> for TierPolicy {
    fn from(p: EvictionPolicy) -> Self {
        Self::Ranked(p)
    }
}

/// The blocks of one tier, in eviction order.
#[derive(Clone, Debug)]
pub(super) enum Order {
    Ranked { policy: EvictionPolicy, queue: EvictionQueue },
    S3(S3Fifo),
}

impl Order {
    pub(super) fn new(policy: TierPolicy, capacity: usize) -> Self {
        match policy {
            TierPolicy::Ranked(policy) => Self::Ranked { policy, queue: EvictionQueue::default() },
            TierPolicy::S3Fifo => Self::S3(S3Fifo::new(capacity)),
        }
    }

    fn ranked_key(policy: EvictionPolicy, slot: u32, hits: u32, tick: u64) -> (u64, u64, u32) {
        let r = Recency { last_touch: tick, stored_at: tick, hits: u64::from(hits), priority: 0 };
        policy.key(&r, BlockId(slot))
    }

    /// Block `key` entered `slot` at `tick`, with `hits` in the device.
    pub(super) fn insert(&mut self, slot: u32, key: TierKey, hits: u32, tick: u64) {
        match self {
            Self::Ranked { policy, queue } => queue.insert(Self::ranked_key(*policy, slot, hits, tick)),
            Self::S3(s) => s.insert(slot, key, hits),
        }
    }

    /// The block in `slot` (entered with `hits` at `tick`) left without being evicted.
    pub(super) fn remove(&mut self, slot: u32, hits: u32, tick: u64) {
        match self {
            Self::Ranked { policy, queue } => {
                queue.remove(&Self::ranked_key(*policy, slot, hits, tick));
            }
            Self::S3(s) => s.remove(slot),
        }
    }

    /// The next victim's slot, out of the order.
    pub(super) fn pop(&mut self) -> Option<u32> {
        match self {
            Self::Ranked { queue, .. } => queue.pop().map(|b| b.0),
            Self::S3(s) => s.pop(),
        }
    }

    /// Every slot, next victim first, as `pop` would give them with no block entering.
    pub(super) fn slots(&self) -> Vec<u32> {
        match self {
            Self::Ranked { queue, .. } => queue.iter().map(|b| b.0).collect(),
            Self::S3(s) => {
                let mut s = s.clone();
                std::iter::from_fn(|| s.pop()).collect()
            }
        }
    }

    /// Forget every block (an S3-FIFO ghost too).
    pub(super) fn clear(&mut self) {
        match self {
            Self::Ranked { queue, .. } => *queue = EvictionQueue::default(),
            Self::S3(s) => *s = S3Fifo::new(s.capacity),
        }
    }
}

/// Where a held block sits in an [`S3Fifo`].
#[derive(Clone, Copy, Debug)]
struct Place {
    key: TierKey,
    main: bool,
    freq: u8,
    /// Its entry number in its FIFO (the queue's order key).
    seq: u64,
}

/// S3-FIFO's two FIFOs and ghost (module doc).
#[derive(Clone, Debug)]
pub(super) struct S3Fifo {
    capacity: usize,
    small: EvictionQueue,
    main: EvictionQueue,
    at: FxHashMap<u32, Place>,
    seq: u64,
    ghost: FxHashMap<TierKey, u64>,
    ghost_fifo: VecDeque<(TierKey, u64)>,
}

impl S3Fifo {
    fn new(capacity: usize) -> Self {
        let (small, main) = (EvictionQueue::default(), EvictionQueue::default());
        Self { capacity, small, main, at: FxHashMap::default(), seq: 0, ghost: FxHashMap::default(), ghost_fifo: VecDeque::new() }
    }

    fn small_target(&self) -> usize {
        (self.capacity / 10).max(1)
    }

    /// Put `slot` at the tail of the small (`main == false`) or main FIFO.
    fn enqueue(&mut self, slot: u32, key: TierKey, main: bool, freq: u8) {
        self.seq += 1;
        let seq = self.seq;
        self.at.insert(slot, Place { key, main, freq, seq });
        if main { &mut self.main } else { &mut self.small }.insert((seq, 0, slot));
    }

    fn insert(&mut self, slot: u32, key: TierKey, hits: u32) {
        let main = self.ghost.contains_key(&key);
        self.enqueue(slot, key, main, hits.min(3) as u8);
    }

    fn remove(&mut self, slot: u32) {
        if let Some(p) = self.at.remove(&slot) {
            if p.main { &mut self.main } else { &mut self.small }.remove(&(p.seq, 0, slot));
        }
    }

    fn pop(&mut self) -> Option<u32> {
        loop {
            let from_small = self.small.len() >= self.small_target() || self.main.is_empty();
            let slot = if from_small { self.small.pop()? } else { self.main.pop()? }.0;
            let p = self.at.remove(&slot)?;
            match (from_small, p.freq) {
                (true, 0) => {
                    self.remember(p.key);
                    return Some(slot);
                }
                (true, _) => self.enqueue(slot, p.key, true, 0),
                (false, 0) => return Some(slot),
                (false, f) => self.enqueue(slot, p.key, true, f - 1),
            }
        }
    }

    /// Add `key` to the ghost, forgetting the oldest past `capacity` entries.
    fn remember(&mut self, key: TierKey) {
        self.seq += 1;
        self.ghost.insert(key, self.seq);
        self.ghost_fifo.push_back((key, self.seq));
        while self.ghost_fifo.len() > self.capacity {
            if let Some((k, s)) = self.ghost_fifo.pop_front() {
                if self.ghost.get(&k) == Some(&s) {
                    self.ghost.remove(&k);
                }
            }
        }
    }
}
