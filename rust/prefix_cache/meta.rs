//! The per-block record of the prefix cache.

use crate::block_hash::BlockKey;

/// Per-block cache state, one cache line: eviction and lookup touch it for random blocks,
/// so its size is what an eviction costs. Rarely used data (soft pins) lives aside.
#[derive(Clone, Copy, Debug, Default)]
#[repr(align(64))]
pub(super) struct Meta {
    pub(super) key: BlockKey,
    pub(super) last_touch: u64,
    pub(super) stored_at: u64,
    /// The extra key (valid with `HAS_EXTRA`).
    pub(super) extra: u64,
    pub(super) parent: u32,
    pub(super) depth: u32,
    pub(super) children: u32,
    pub(super) hard_pins: u32,
    pub(super) hits: u32,
    pub(super) flags: u8,
}

/// Cached with refcount 0 (mirrors the allocator, so the forest can be updated without it).
pub(super) const IDLE: u8 = 1;
pub(super) const HAS_TOKENS: u8 = 2;
pub(super) const QUEUED: u8 = 4;
pub(super) const HAS_EXTRA: u8 = 8;

impl Meta {
    #[inline]
    pub(super) fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }
    #[inline]
    pub(super) fn set(&mut self, f: u8, on: bool) {
        if on {
            self.flags |= f
        } else {
            self.flags &= !f
        }
    }
    #[inline]
    pub(super) fn extra(&self) -> Option<u64> {
        self.has(HAS_EXTRA).then_some(self.extra)
    }
}
