//! What a prefix cache is configured with and what it reports: [`CacheConfig`],
//! [`CacheStats`] (hit metrics and occupancy) and [`CacheEvent`]s (vLLM's KV events).

use crate::prefix_cache::block_hash::{BlockHasher, BlockKey};
use crate::prefix_cache::eviction::EvictionPolicy;
use crate::types::BlockId;

/// Default capacity of the event queue: 100,000 events, about 8 MB (vLLM's publisher
/// queue holds 100,000).
pub const DEFAULT_MAX_EVENTS: usize = 100_000;

/// Largest event-queue capacity accepted (about 1.3 GB of events).
pub const MAX_EVENTS_LIMIT: usize = 1 << 24;

/// How a pool caches prefixes.
#[derive(Clone, Copy, Debug)]
pub struct CacheConfig {
    pub policy: EvictionPolicy,
    /// Keep each cached block's token ids and compare them on a hit, so a key collision
    /// is a miss, never wrong KV. Costs `4 * block_size` bytes per block.
    pub verify_tokens: bool,
    /// When the last-token rule drops a fully cached last block, copy it (a CoW pair)
    /// instead, so only the final prompt token is computed.
    pub cow_partial_hit: bool,
    pub hasher: BlockHasher,
    /// Record [`CacheEvent`]s for [`PrefixCache::drain_events`](super::PrefixCache::drain_events).
    pub record_events: bool,
    /// Capacity of the event queue (`1..=MAX_EVENTS_LIMIT`): past it the oldest undrained
    /// event is dropped and counted in [`CacheStats::dropped_events`].
    pub max_events: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            policy: EvictionPolicy::Lru,
            verify_tokens: true,
            cow_partial_hit: false,
            hasher: BlockHasher::Xxh3,
            record_events: false,
            max_events: DEFAULT_MAX_EVENTS,
        }
    }
}

/// Hit metrics and occupancy of the cache. Hits count only admissions that succeeded.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheStats {
    pub policy: EvictionPolicy,
    /// Admissions that looked the cache up (token ids or block keys).
    pub queries: u64,
    /// Prompt blocks looked up (full blocks for token ids, every key for block keys).
    pub query_blocks: u64,
    /// Leading prompt blocks found cached (before the last-token rule).
    pub hit_blocks: u64,
    /// Prompt tokens admitted.
    pub query_tokens: u64,
    /// Prompt tokens returned as cached (after the last-token rule, CoW hits included).
    pub hit_tokens: u64,
    /// Blocks registered in the cache.
    pub stored_blocks: u64,
    /// Idle cached blocks reclaimed by allocations.
    pub evictions: u64,
    /// Lookups that found the key but failed verification (parent, extra key, tokens).
    pub collisions: u64,
    /// Admissions that took a copy-on-write partial hit.
    pub cow_hits: u64,
    /// Per layer group (one entry without groups): blocks the admissions took from the
    /// cache in that group (a windowed group takes only its sinks and window).
    pub group_hit_blocks: Vec<u64>,
    pub cached_blocks: usize,
    /// Cached blocks with refcount 0.
    pub idle_blocks: usize,
    /// Idle blocks that are not hard-pinned (allocatable by eviction).
    pub evictable_blocks: usize,
    /// Cached blocks covered by at least one hard pin.
    pub pinned_blocks: usize,
    pub num_pins: usize,
    pub clock: u64,
    /// Events recorded and not drained yet (at most `max_events`).
    pub pending_events: usize,
    /// Events dropped, oldest first, because the queue was full when a new one came.
    pub dropped_events: u64,
}

impl CacheStats {
    /// `hit_tokens / query_tokens` (0.0 before any query).
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hit_tokens, self.query_tokens)
    }
    /// `hit_blocks / query_blocks` (0.0 before any query).
    pub fn block_hit_rate(&self) -> f64 {
        ratio(self.hit_blocks, self.query_blocks)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// What happened to the cache (vLLM's KV events: BlockStored, BlockRemoved, AllBlocksCleared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CacheEventKind {
    Stored = 0,
    Removed = 1,
    AllCleared = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheEvent {
    pub kind: CacheEventKind,
    /// `None` for `AllCleared`.
    pub block: Option<BlockId>,
    pub key: BlockKey,
    /// Key of the parent block; `None` for a root block or `AllCleared`.
    pub parent_key: Option<BlockKey>,
    /// Tokens of KV the block holds (`block_size`, fewer for a keyed prompt's partly
    /// filled last block); 0 for `AllCleared`.
    pub tokens: u32,
    pub clock: u64,
    /// The layer group of the block (`0` in a pool without groups and for `AllCleared`).
    pub group: u32,
    /// Where the block is stored or removed: [`MEDIUM_DEVICE`] (the pool), [`MEDIUM_HOST`]
    /// or [`MEDIUM_DISK`] (the tiers below it; their events have no block id).
    pub medium: u8,
}

/// [`CacheEvent::medium`] of the pool's own blocks.
pub const MEDIUM_DEVICE: u8 = 0;
/// [`CacheEvent::medium`] of the host tier.
pub const MEDIUM_HOST: u8 = 1;
/// [`CacheEvent::medium`] of the disk tier.
pub const MEDIUM_DISK: u8 = 2;
