//! A pool's tier storage for Python (`BlockPool.attach_tier_storage`): the bytes of the
//! tiers' blocks in a host slab and a disk folder, moved to and from one `KvCache` as the
//! pool decides. After every pool call that decided moves or loads, [`TierIo::carry_out`]
//! runs them under the cache's write lock and leaves the copies in flight in the cache's
//! fence, which every later access to the cache waits for. Blocks an earlier run left in
//! the disk folder go back into the pool's disk tier at attach (a warm restart).

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use xxhash_rust::xxh3::xxh3_128;

use crate::bindings::kv::{Fence, PyKvCache};
use crate::error::{KvError, Result};
use crate::invalid;
use crate::kv::KvCache;
use crate::offload::disk::{DiskTier, Durability, HEADER_BYTES};
use crate::offload::store::{most_payload_bytes, StoreStats, TierStore, MAX_PROBE_BLOCKS};
use crate::offload::transfer::{slot_bytes_for, DeviceRegion, KvRegion};
use crate::pool::BlockPool;
use crate::prefix_cache::tiers::{Move, TierLoad};

/// Where the disk tier lives and whose KV it holds.
pub(crate) struct DiskArgs {
    pub dir: PathBuf,
    pub model_id: String,
    pub fsync: bool,
}

/// The tier storage attached to a pool.
pub(crate) struct TierIo {
    store: TierStore,
    cache: Arc<RwLock<KvCache>>,
    fence: Arc<Fence>,
    region: Arc<dyn DeviceRegion>,
    /// The first failure since the last `wait`, reported by it.
    error: Option<KvError>,
    moves: Vec<Move>,
    loads: Vec<TierLoad>,
}

impl TierIo {
    /// Storage for `pool`'s tiers (host `host_blocks`, disk `disk_blocks`) on `cache`.
    ///
    /// Errors (`InvalidArgument`): the cache's block count differs from the pool's, or
    /// the disk arguments do not match the pool's tiers; and those of opening the disk
    /// folder (`Storage`).
    pub(crate) fn new(pool: &mut BlockPool, tiers: (usize, Option<usize>), cache: &PyKvCache, disk: Option<DiskArgs>, threads: usize) -> Result<Self> {
        let (shared, fence) = cache.shared();
        let guard = shared.read().unwrap_or_else(|p| p.into_inner());
        let shape = guard.shape();
        if shape.num_blocks != pool.num_blocks() || shape.block_size != pool.block_size() {
            let (nb, bs) = (pool.num_blocks(), pool.block_size());
            return Err(invalid!("cache: its {} blocks of {} tokens differ from the pool's {nb} of {bs}", shape.num_blocks, shape.block_size));
        }
        let slot_bytes = slot_bytes_for(&guard);
        let disk = match (disk, tiers.1) {
            (Some(d), Some(n)) => Some((open_disk(&d, &guard, n, slot_bytes)?, n)),
            (None, None) => None,
            (Some(_), None) => return Err(invalid!("disk_dir: the pool has no disk tier (build it with disk_blocks=)")),
            (None, Some(_)) => return Err(invalid!("disk_dir: the pool has a disk tier; give its folder")),
        };
        let mut store = TierStore::new(tiers.0, slot_bytes, guard.dtype(), shape.block_size as u32, disk, threads)?;
        // Nothing was stored before (the caller checked): what the pool decided so far,
        // the emptying of its new tiers included, concerns no bytes.
        pool.drain_tier_moves(&mut Vec::new(), &mut Vec::new())?;
        restore(pool, &mut store)?;
        let owner = shared.clone();
        // SAFETY: `owner` (the Python cache's lock) holds the KvCache for its whole life;
        // the Python cache never replaces it.
        let region: Arc<dyn DeviceRegion> = Arc::new(unsafe { KvRegion::new(&guard, owner) });
        drop(guard);
        Ok(Self { store, cache: shared, fence, region, error: None, moves: Vec::new(), loads: Vec::new() })
    }

    /// Carry out what `pool` decided since the last call; a failure waits for `wait`.
    /// When disk blocks were lost, the device blocks they were to fill are cached but
    /// hold stale bytes: the pool's cache is reset (every cached block forgotten, the
    /// sequences keep theirs) so that nothing hits them again.
    pub(crate) fn carry_out(&mut self, pool: &mut BlockPool) {
        let cleared = pool.drain_tier_moves(&mut self.moves, &mut self.loads).unwrap_or(false);
        if cleared {
            let r = self.store.clear();
            self.note(r);
        }
        if self.moves.is_empty() && self.loads.is_empty() {
            return;
        }
        let lost = self.store.stats().disk_lost;
        let guard = self.cache.write().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the write lock excludes every access to the storage now, and every
        // later one (`PyKvCache::read`/`write_lock`) waits for the fence, which gets the
        // batch's handle before the lock is released; the stored device blocks hold what
        // the pool decided to store, since nothing wrote them after the pool call that
        // evicted them (this runs before the call returns).
        let r = unsafe { self.store.apply(self.region.clone(), &self.moves, &self.loads) };
        if let Some(h) = self.store.in_flight() {
            self.fence.push(h);
        }
        drop(guard);
        self.note(r);
        self.moves.clear();
        self.loads.clear();
        if self.store.stats().disk_lost > lost {
            let reset = pool.reset_prefix_cache().map(drop);
            self.note(reset);
            // The reset emptied the tiers too.
            let _ = pool.drain_tier_moves(&mut self.moves, &mut self.loads);
            self.moves.clear();
            self.loads.clear();
            let r = self.store.clear();
            self.note(r);
        }
    }

    /// Keep the first failure for `wait`.
    fn note(&mut self, r: Result<()>) {
        if let Err(e) = r {
            self.error.get_or_insert(e);
        }
    }

    /// Wait for the copies in flight; the first failure since the last call, if any.
    /// With `disk_writes`, the disk writes queued too.
    pub(crate) fn wait(&mut self, disk_writes: bool) -> Result<()> {
        let r = if disk_writes { self.store.wait_all() } else { self.store.wait() };
        match self.error.take() {
            Some(e) => Err(e),
            None => r,
        }
    }

    /// Nanoseconds to load a block from each tier, measured on `blocks` device blocks
    /// ([`TierStore::probe`]).
    pub(crate) fn probe(&mut self, blocks: usize) -> Result<Vec<u64>> {
        let guard = self.cache.write().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the write lock excludes every access to the storage until the probe,
        // which only reads device blocks, has waited for its copies.
        let r = unsafe { self.store.probe(self.region.clone(), blocks) };
        drop(guard);
        r
    }

    /// Counts of the copies carried out, and the host memory mapped (bytes).
    pub(crate) fn stats(&self) -> (StoreStats, usize, usize) {
        (self.store.stats(), self.store.host_bytes(), self.store.slot_bytes())
    }
}

/// The disk tier in `d.dir`, its fingerprint the model id and the cache's layout.
fn open_disk(d: &DiskArgs, cache: &KvCache, blocks: usize, slot_bytes: usize) -> Result<DiskTier> {
    let s = cache.shape();
    let id = format!(
        "pykvpool-tiers/{}/{}x{}x{}x{}x{}",
        d.model_id,
        s.num_layers,
        s.block_size,
        s.num_kv_heads,
        s.head_dim,
        cache.dtype().name()
    );
    // Room for the blocks and for a probe's (`TierStore::probe`).
    let files = blocks.saturating_add(MAX_PROBE_BLOCKS) as u64;
    let file = most_payload_bytes(slot_bytes, s.block_size as u32).saturating_add(HEADER_BYTES);
    let budget = files.saturating_mul(file as u64);
    let durability = if d.fsync { Durability::Fsync } else { Durability::NoFsync };
    DiskTier::open_with(&d.dir, xxh3_128(id.as_bytes()), budget, durability)
}

/// Give the blocks an earlier run left in the disk folder back to `pool`'s disk tier (a
/// warm restart), as many as it holds; the others are removed.
fn restore(pool: &mut BlockPool, store: &mut TierStore) -> Result<()> {
    for (key, meta) in store.restorable()? {
        let slot = pool.restore_tier_block(1, key, meta)?;
        store.adopt(slot, key)?;
    }
    // The removals of the blocks that did not fit are done before attach returns.
    store.wait_all()
}
