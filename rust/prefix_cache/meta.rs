//! The per-block record of the prefix cache.

use crate::prefix_cache::block_hash::BlockKey;

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
    /// Tokens the block holds when it is partly filled (`1..block_size`: a keyed prompt's
    /// last block), 0 when it is full. Only a lookup for a block of the same fill matches.
    pub(super) partial: u16,
    pub(super) flags: u8,
    /// The layer group the block is cached in (`0` in a pool without groups).
    pub(super) group: u8,
}

// One cache line, as the comment above says.
const _: () = assert!(std::mem::size_of::<Meta>() == 64);

/// Cached with refcount 0 (mirrors the allocator, so the forest can be updated without it).
pub(super) const IDLE: u8 = 1;
pub(super) const HAS_TOKENS: u8 = 2;
pub(super) const QUEUED: u8 = 4;
pub(super) const HAS_EXTRA: u8 = 8;
/// A windowed block standing on its prefix's lineage (`lineage.rs`).
pub(super) const LINEAGE: u8 = 16;

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
    /// `partial` for a block of `filled` tokens out of `block_size`.
    #[inline]
    pub(super) fn partial_of(filled: usize, block_size: usize) -> u16 {
        debug_assert!(filled >= 1 && filled <= block_size && block_size <= 1 << 16);
        if filled >= block_size {
            0
        } else {
            filled as u16
        }
    }
    #[inline]
    pub(super) fn extra(&self) -> Option<u64> {
        self.has(HAS_EXTRA).then_some(self.extra)
    }
}
