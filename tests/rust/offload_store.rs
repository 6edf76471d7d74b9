//! The tiers' bytes joined to the pool (`offload::store`), against the specification a
//! serving engine relies on: whatever way a block reached the device (computed, hit in
//! the device, loaded from the host tier or from disk), once the store's batch is done its
//! K/V bytes are the ones computed for its tokens.
//!
//! The K/V written for a token are a function of the token ids up to it (as a model's
//! are), so the model needs no memory: random programs admit prompts from a few families
//! sharing prefixes through a small pool with a host and a disk tier, carry out each
//! call's moves and loads, check every cached block of the admission against the function,
//! write the computed tokens, maybe mark them computed, and free (or keep) the sequence;
//! with write-back and with write-through.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::{env, fs};

use proptest::prelude::*;

use pykvpool::kv::{DType, KvCache, KvShape};
use pykvpool::offload::disk::{DiskTier, Durability, HEADER_BYTES};
use pykvpool::offload::store::{most_payload_bytes, TierStore};
use pykvpool::offload::transfer::{pack, slot_bytes_for, DeviceRegion, KvRegion};
use pykvpool::{BlockPool, CacheConfig, SeqId, StepOutput};
use pykvpool::prefix_cache::eviction::EvictionPolicy;
use pykvpool::prefix_cache::tiers::{TierConfig, TierPolicy, TierRules};

const BS: usize = 4;
const HEADS: usize = 2;
const DIM: usize = 8;
const LAYERS: usize = 3;

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = env::temp_dir().join(format!("pykvpool-store-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A pool with tiers, its cache behind a lock and the store of the tiers' bytes.
struct Rig {
    pool: BlockPool,
    cache: Arc<Mutex<KvCache>>,
    region: Arc<dyn DeviceRegion>,
    store: TierStore,
    out: StepOutput,
    _dir: TempDir,
}

impl Rig {
    fn new(num_blocks: usize, host: usize, disk: Option<usize>, dtype: DType) -> Self {
        Self::with_policy(num_blocks, host, disk, dtype, TierPolicy::Ranked(EvictionPolicy::Lru), TierRules::default())
    }

    fn with_policy(num_blocks: usize, host: usize, disk: Option<usize>, dtype: DType, policy: TierPolicy, rules: TierRules) -> Self {
        let mut pool = BlockPool::with_prefix_cache(num_blocks, BS, CacheConfig::default()).unwrap();
        let mut tiers = vec![TierConfig { capacity_blocks: host, policy }];
        tiers.extend(disk.map(|d| TierConfig { capacity_blocks: d, policy }));
        pool.set_tiers(&tiers, rules).unwrap();
        let shape = KvShape { num_layers: LAYERS, num_blocks, block_size: BS, num_kv_heads: HEADS, head_dim: DIM };
        let cache = KvCache::new(shape, dtype).unwrap();
        let slot_bytes = slot_bytes_for(&cache);
        let cache = Arc::new(Mutex::new(cache));
        // SAFETY: `cache` owns its KvCache for its whole life and nobody replaces it.
        let region: Arc<dyn DeviceRegion> = Arc::new(unsafe { KvRegion::new(&cache.lock().unwrap(), cache.clone()) });
        let dir = TempDir::new();
        let disk = disk.map(|n| {
            let d = DiskTier::open_with(&dir.0, 7, u64::MAX, Durability::NoFsync).unwrap();
            (d, n)
        });
        let store = TierStore::new(host, slot_bytes, dtype, BS as u32, disk, 2).unwrap();
        Rig { pool, cache, region, store, out: StepOutput::default(), _dir: dir }
    }

    /// Carry out the tiers' decisions of the last pool call and wait for their bytes.
    fn settle(&mut self) {
        let (mut moves, mut loads) = (Vec::new(), Vec::new());
        self.pool.drain_tier_moves(&mut moves, &mut loads).unwrap();
        // SAFETY: nothing touches the cache until `wait` returns below.
        unsafe { self.store.apply(self.region.clone(), &moves, &loads) }.unwrap();
        self.store.wait_all().unwrap();
    }

    /// Admit `tokens` as `seq`, check every cached block's bytes, write the computed
    /// tokens' K/V. Returns the cached tokens.
    fn admit(&mut self, seq: u64, tokens: &[u32]) -> usize {
        let cached = self.pool.add_sequence_tokens(SeqId(seq), tokens, None, &mut self.out).unwrap();
        self.settle();
        let table: Vec<usize> = {
            let t = self.pool.table(SeqId(seq), 0).unwrap();
            (0..tokens.len().div_ceil(BS)).map(|i| t.get(i).unwrap().index()).collect()
        };
        let mut cache = self.cache.lock().unwrap();
        for (i, &b) in table.iter().enumerate().take(cached / BS) {
            let want = block_bytes(&tokens[..(i + 1) * BS], cache.dtype());
            let mut got = vec![0u8; slot_bytes_for(&cache)];
            pack(&cache, b, &mut got).unwrap();
            assert!(got == want, "seq {seq}: cached block {i} (device block {b}) holds other bytes");
        }
        let slots: Vec<i64> = (cached..tokens.len()).map(|t| (table[t / BS] * BS + t % BS) as i64).collect();
        for layer in 0..LAYERS {
            let (k, v) = kv_rows(tokens, cached, layer);
            cache.write(layer, &k, &v, &slots).unwrap();
        }
        cached
    }
}

/// K and V rows (`[n, HEADS, DIM]`) of tokens `from..` of `tokens` in `layer`: each a
/// function of the ids up to the token.
fn kv_rows(tokens: &[u32], from: usize, layer: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut k, mut v) = (Vec::new(), Vec::new());
    let mut h: u32 = 0x9e37_79b9;
    for (t, &id) in tokens.iter().enumerate() {
        h = h.rotate_left(5).wrapping_mul(31).wrapping_add(id);
        if t < from {
            continue;
        }
        for e in 0..HEADS * DIM {
            let x = (h.wrapping_add((e * 7 + layer * 131) as u32) % 1000) as f32 / 100.0 - 5.0;
            k.push(x);
            v.push(-x * 0.5);
        }
    }
    (k, v)
}

/// The slot bytes of a block holding the last `BS` of `prefix` (written alone in a
/// scratch cache of one block).
fn block_bytes(prefix: &[u32], dtype: DType) -> Vec<u8> {
    let shape = KvShape { num_layers: LAYERS, num_blocks: 1, block_size: BS, num_kv_heads: HEADS, head_dim: DIM };
    let mut c = KvCache::new(shape, dtype).unwrap();
    let from = prefix.len() - BS;
    let slots: Vec<i64> = (0..BS as i64).collect();
    for layer in 0..LAYERS {
        let (k, v) = kv_rows(prefix, from, layer);
        c.write(layer, &k, &v, &slots).unwrap();
    }
    let mut out = vec![0u8; slot_bytes_for(&c)];
    pack(&c, 0, &mut out).unwrap();
    out
}

/// Prompt of family `f` (families share their first block), `blocks` full blocks and
/// `extra` more tokens.
fn prompt(f: u32, blocks: usize, extra: usize) -> Vec<u32> {
    (0..blocks * BS + extra).map(|i| if i < BS { 1 } else { f * 1000 + i as u32 }).collect()
}

#[test]
fn evicted_blocks_come_back_with_their_bytes_from_host_and_disk() {
    for (host, disk) in [(8, None), (2, Some(8))] {
        // a takes 5 blocks; b, sharing a's first, 9 more: a's other 3 full blocks go down.
        let mut r = Rig::new(10, host, disk, DType::F32);
        let a = prompt(1, 4, 1);
        assert_eq!(r.admit(1, &a), 0);
        r.pool.free(SeqId(1)).unwrap();
        assert_eq!(r.admit(2, &prompt(2, 9, 1)), BS, "the shared first block is a device hit");
        r.pool.free(SeqId(2)).unwrap();
        assert_eq!(r.admit(3, &a), 4 * BS, "host {host}, disk {disk:?}: a's blocks come back");
        let s = r.store.stats();
        assert!(s.host_stores > 0);
        if disk.is_some() {
            assert!(s.disk_writes > 0 && s.disk_loads > 0, "{s:?}");
        }
        r.pool.check_invariants().unwrap();
    }
}

/// Files under `root` (recursively) whose names end in `suffix`.
fn count_ending(root: &Path, suffix: &str) -> usize {
    let Ok(entries) = fs::read_dir(root) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => count_ending(&e.path(), suffix),
            _ => usize::from(e.file_name().to_string_lossy().ends_with(suffix)),
        })
        .sum()
}

#[test]
fn an_idle_disk_thread_makes_spares_that_demotions_write_into() {
    let mut r = Rig::new(10, 1, Some(6), DType::F32);
    // Idle, the disk's thread makes one spare per block of its budget.
    let deadline = Instant::now() + Duration::from_secs(20);
    while count_ending(&r._dir.0, ".tmp") < 6 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(count_ending(&r._dir.0, ".tmp"), 6);
    // Demotions write into them, and what comes back is checked byte for byte.
    let a = prompt(1, 4, 1);
    r.admit(1, &a);
    r.pool.free(SeqId(1)).unwrap();
    r.admit(2, &prompt(2, 9, 1));
    r.pool.free(SeqId(2)).unwrap();
    r.settle();
    let written = r.store.disk_stats().unwrap().blocks_written as usize;
    assert!(written > 0);
    let files = count_ending(&r._dir.0, ".blk") + count_ending(&r._dir.0, ".tmp");
    assert!(files <= 6, "{files} files: none beyond the budget");
    assert_eq!(r.admit(3, &a), 4 * BS);
}

#[test]
fn a_restart_finds_the_disk_blocks_again() {
    let mut r = Rig::new(10, 1, Some(32), DType::F32);
    let unique = |p: u32, blocks: usize| -> Vec<u32> { (0..(blocks * BS + 1) as u32).map(|i| p * 1000 + i).collect() };
    let a = unique(1, 4);
    r.admit(1, &a);
    r.pool.free(SeqId(1)).unwrap();
    for (i, p) in [2, 3].into_iter().enumerate() {
        r.admit(10 + i as u64, &unique(p, 9));
        r.pool.free(SeqId(10 + i as u64)).unwrap();
        r.settle();
    }
    let Rig { store, _dir: dir, .. } = r;
    drop(store);
    // A new pool, cache and store on the same folder.
    let mut again = Rig::new(10, 1, None, DType::F32);
    let disk = DiskTier::open_with(&dir.0, 7, u64::MAX, Durability::NoFsync).unwrap();
    let slot_bytes = again.store.slot_bytes();
    again.store = TierStore::new(1, slot_bytes, DType::F32, BS as u32, Some((disk, 32)), 2).unwrap();
    let tiers = [TierConfig { capacity_blocks: 1, policy: TierPolicy::S3Fifo }, TierConfig { capacity_blocks: 32, policy: TierPolicy::S3Fifo }];
    again.pool.set_tiers(&tiers, TierRules::default()).unwrap();
    let (mut moves, mut loads) = (Vec::new(), Vec::new());
    assert!(again.pool.drain_tier_moves(&mut moves, &mut loads).unwrap(), "new tiers report their emptying once");
    assert!(!again.pool.drain_tier_moves(&mut moves, &mut loads).unwrap());
    let found = again.store.restorable().unwrap();
    assert_eq!(found.len(), 12, "a's 4 blocks and 8 of b's");
    // Each comes back with its token record: the tokens of a full block of a prompt.
    let blocks: Vec<Vec<u32>> = [unique(1, 4), unique(2, 9), unique(3, 9)].iter().flat_map(|p| p.chunks_exact(BS).map(<[u32]>::to_vec).collect::<Vec<_>>()).collect();
    let records: Vec<Vec<u32>> = found.iter().map(|(_, m)| m.tokens.as_deref().expect("a token record").to_vec()).collect();
    assert!(records.iter().all(|r| blocks.contains(r)));
    assert!(a.chunks_exact(BS).all(|b| records.iter().any(|r| r == b)), "a's blocks' records");
    for (key, meta) in found {
        let slot = again.pool.restore_tier_block(1, key, meta).unwrap();
        again.store.adopt(slot, key).unwrap();
    }
    assert_eq!(again.admit(4, &a), 4 * BS, "a's blocks come back from disk, bytes checked");
    assert_eq!(again.store.stats().disk_loads, 4);
    again._dir = dir;
}

#[test]
fn a_failed_disk_write_is_reported_by_wait_all() {
    let mut r = Rig::new(10, 1, Some(8), DType::F32);
    // A disk tier with room for one block file: the second demotion's write fails, on
    // the disk's thread, after `apply` returned.
    let dir = TempDir::new();
    let disk = DiskTier::open_with(&dir.0, 7, (r.store.slot_bytes() + 200) as u64, Durability::NoFsync).unwrap();
    r.store = TierStore::new(1, r.store.slot_bytes(), DType::F32, BS as u32, Some((disk, 8)), 2).unwrap();
    let a = prompt(1, 4, 1);
    r.pool.add_sequence_tokens(SeqId(1), &a, None, &mut r.out).unwrap();
    r.pool.free(SeqId(1)).unwrap();
    r.pool.add_sequence_tokens(SeqId(2), &prompt(2, 9, 1), None, &mut r.out).unwrap();
    let (mut moves, mut loads) = (Vec::new(), Vec::new());
    r.pool.drain_tier_moves(&mut moves, &mut loads).unwrap();
    // SAFETY: nothing touches the cache until `wait_all` returns.
    unsafe { r.store.apply(r.region.clone(), &moves, &loads) }.unwrap();
    let err = r.store.wait_all().unwrap_err();
    assert!(err.to_string().contains("full"), "{err}");
    r.store.wait_all().unwrap();
    assert_eq!(r.store.disk_stats().unwrap().blocks_written, 1);
}

#[test]
fn a_disk_budget_of_most_payload_bytes_holds_its_blocks_with_their_token_records() {
    let mut r = Rig::new(10, 1, Some(8), DType::F32);
    let dir = TempDir::new();
    let file = (most_payload_bytes(r.store.slot_bytes(), BS as u32) + HEADER_BYTES) as u64;
    let disk = DiskTier::open_with(&dir.0, 7, 8 * file, Durability::NoFsync).unwrap();
    r.store = TierStore::new(1, r.store.slot_bytes(), DType::F32, BS as u32, Some((disk, 8)), 2).unwrap();
    for p in 1..6 {
        r.admit(p, &prompt(p as u32, 9, 1));
        r.pool.free(SeqId(p)).unwrap();
        r.settle();
    }
    let s = r.store.disk_stats().unwrap();
    assert!(s.blocks_written > 8, "{s:?}");
    assert_eq!(s.bytes_written, s.blocks_written * (file - HEADER_BYTES as u64), "every block with its token ids");
    r._dir = dir;
}

#[test]
fn a_damaged_disk_block_is_never_loaded() {
    let mut r = Rig::new(10, 1, Some(8), DType::F32);
    let a = prompt(1, 4, 1);
    r.admit(1, &a);
    r.pool.free(SeqId(1)).unwrap();
    r.admit(2, &prompt(2, 9, 1));
    r.pool.free(SeqId(2)).unwrap();
    // Damage every block file: each fails its checksum at the load.
    for f in walk(&r._dir.0) {
        if f.extension().is_some_and(|e| e == "blk") {
            let mut b = fs::read(&f).unwrap();
            let n = b.len();
            b[n - 1] ^= 0xff;
            fs::write(&f, b).unwrap();
        }
    }
    r.pool.add_sequence_tokens(SeqId(3), &a, None, &mut r.out).unwrap();
    let (mut moves, mut loads) = (Vec::new(), Vec::new());
    r.pool.drain_tier_moves(&mut moves, &mut loads).unwrap();
    // SAFETY: nothing touches the cache until `wait` returns.
    let err = unsafe { r.store.apply(r.region.clone(), &moves, &loads) }.unwrap_err();
    r.store.wait().unwrap();
    assert!(err.to_string().contains("failed their checks"), "{err}");
    assert!(r.store.stats().disk_lost > 0);
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn every_block_served_holds_the_bytes_of_its_tokens(
        ops in prop::collection::vec((0u32..5, 1usize..5, 0usize..BS, any::<bool>(), any::<bool>()), 1..40),
        host in 1usize..6,
        disk in prop::option::of(1usize..10),
        int8 in any::<bool>(),
        s3 in any::<bool>(),
        write_through in any::<bool>(),
    ) {
        let dtype = if int8 { DType::I8 } else { DType::F16 };
        let policy = if s3 { TierPolicy::S3Fifo } else { TierPolicy::Ranked(EvictionPolicy::Lru) };
        let mut r = Rig::with_policy(12, host, disk, dtype, policy, TierRules { gate: None, write_through });
        let mut live: Vec<u64> = Vec::new();
        for (n, (f, blocks, extra, keep, computed)) in ops.into_iter().enumerate() {
            let tokens = prompt(f, blocks, extra.max(1));
            let seq = n as u64;
            let need = tokens.len().div_ceil(BS);
            // Free the oldest kept sequences until the prompt fits without a hit.
            while r.pool.num_free_blocks() < need && !live.is_empty() {
                r.pool.free(SeqId(live.remove(0))).unwrap();
                r.settle();
            }
            r.admit(seq, &tokens);
            if computed {
                r.pool.mark_computed(&[SeqId(seq)]).unwrap();
                r.settle();
            }
            if keep { live.push(seq) } else { r.pool.free(SeqId(seq)).unwrap(); r.settle(); }
            r.pool.check_invariants().unwrap();
        }
    }
}
