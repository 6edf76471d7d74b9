//! The host tier (G2) and the transfer engine: slot allocation and its typed errors,
//! the slot byte order's exact round trip for every dtype (`pack` / `unpack`), and the
//! engine's copies (exact results under many concurrent batches, refused batches failing
//! only their own handle, the tier's guard of slots in flight, worker panics as errors).
//! Patterns that could hang or crash (handles and engines dropped with copies in flight)
//! run in a child process with a timeout: this binary re-run with `OFFLOAD_HOST_CHILD`
//! naming the pattern.

use std::ops::Range;
use std::process::{Command, Stdio};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use pykvpool::kv::aligned::AlignedBuf;
use pykvpool::kv::{DType, Elem, KvCache, KvShape};
use pykvpool::offload::host::{HostTier, Slot, SLOT_ALIGN};
use pykvpool::offload::transfer::{pack, slot_bytes_for, unpack, Batch, DeviceRegion, Handle, TransferEngine, MIN_PART_BYTES};
use pykvpool::{KvError, Result};
use rand::{RngExt, SeedableRng};

const CHILD: &str = "OFFLOAD_HOST_CHILD";

fn shape(num_layers: usize, num_blocks: usize, block_size: usize, num_kv_heads: usize, head_dim: usize) -> KvShape {
    KvShape { num_layers, num_blocks, block_size, num_kv_heads, head_dim }
}

/// Shapes of the round trips: block_size 1, odd sizes, several layers and heads.
fn shapes() -> Vec<KvShape> {
    vec![shape(1, 3, 1, 1, 1), shape(2, 5, 1, 3, 5), shape(3, 4, 3, 2, 4), shape(2, 3, 16, 2, 8), shape(4, 2, 7, 1, 64)]
}

/// A cache of `shape` and `dtype` whose every slot of every layer holds random K and V.
fn filled(shape: KvShape, dtype: DType, seed: u64) -> KvCache {
    let mut c = KvCache::new(shape, dtype).unwrap();
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
    let slots: Vec<i64> = (0..(shape.num_blocks * shape.block_size) as i64).collect();
    let n = slots.len() * shape.num_kv_heads * shape.head_dim;
    for layer in 0..shape.num_layers {
        let k: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
        c.write(layer, &k, &v, &slots).unwrap();
    }
    c
}

/// An empty cache like `like`, with its fp8 scales (a slot's values are its source's
/// only under the same scales).
fn empty_like(like: &KvCache) -> KvCache {
    let mut c = KvCache::new(like.shape(), like.dtype()).unwrap();
    if matches!(like.dtype(), DType::E4M3 | DType::E5M2) {
        let h = like.shape().num_kv_heads;
        for layer in 0..like.shape().num_layers {
            let s = like.scales(layer).unwrap().data.to_vec();
            c.set_fp8_scales(layer, &s[..h], &s[h..]).unwrap();
        }
    }
    c
}

/// Block `block`'s bytes in every layer, read straight from the cache's layout.
fn raw_block(c: &KvCache, block: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for layer in 0..c.shape().num_layers {
        for r in c.block_bytes(layer, block).unwrap() {
            out.extend_from_slice(&c.bytes()[r]);
        }
    }
    out
}

/// Block `block`'s K and V values (codes times scales) of every layer, in logical order.
fn values(c: &KvCache, block: usize) -> Vec<f32> {
    pykvpool::with_elem!(c.dtype(), E => values_of::<E>(c, block))
}

fn values_of<E: Elem>(c: &KvCache, block: usize) -> Vec<f32> {
    let s = c.shape();
    let (ks, vs) = (c.key_strides(), c.value_strides());
    let mut out = Vec::new();
    for layer in 0..s.num_layers {
        let (k, v) = c.layer::<E>(layer).unwrap();
        let scales = c.scales(layer).unwrap();
        for h in 0..s.num_kv_heads {
            let (sk, sv) = scales.tile(block, h);
            for t in 0..s.block_size {
                for i in 0..s.head_dim {
                    out.push(k[block * ks[0] + t * ks[1] + h * ks[2] + i * ks[3]].to_f32() * sk.at(t));
                    out.push(v[block * vs[0] + t * vs[1] + h * vs[2] + i * vs[3]].to_f32() * sv.at(t));
                }
            }
        }
    }
    out
}

fn is_invalid<T: std::fmt::Debug>(r: Result<T>, needle: &str) {
    match r {
        Err(KvError::InvalidArgument(m)) => assert!(m.contains(needle), "{m:?} does not mention {needle:?}"),
        other => panic!("expected InvalidArgument mentioning {needle:?}, got {other:?}"),
    }
}

/// Submit `batch`: every test keeps the device rule (no block of a batch in flight is
/// touched by anything else) by touching device caches only after `wait`.
fn submit(engine: &TransferEngine, host: &mut HostTier, batch: Batch) -> Handle {
    // SAFETY: the callers read or write a batch's device blocks only after its handle is
    // done, and never name a block in two batches in flight at once.
    unsafe { engine.submit(host, batch) }
}

// ---------------------------------------------------------------------------------------
// The tier

#[test]
fn tier_allocates_frees_and_runs_out() {
    let mut t = HostTier::new(100, 3).unwrap();
    assert_eq!((t.slot_bytes(), t.capacity(), t.used(), t.bytes()), (100, 3, 0, 3 * 128));
    let a: Vec<Slot> = (0..3).map(|_| t.alloc().unwrap()).collect();
    assert_eq!(a.iter().map(Slot::index).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(t.used(), 3);
    assert!(t.alloc().is_none());
    t.free(a[1]).unwrap();
    assert_eq!(t.used(), 2);
    let again = t.alloc().unwrap();
    assert_eq!(again.index(), 1);
    assert_ne!(again, a[1]);
    assert_eq!(t.slot(&again).unwrap().len(), 100);
    assert!(!t.in_flight(&again).unwrap());

    let b = HostTier::with_budget_bytes(100, 1000).unwrap();
    assert_eq!((b.capacity(), b.bytes()), (7, 7 * 128));
    assert_eq!(HostTier::with_budget_bytes(SLOT_ALIGN, SLOT_ALIGN).unwrap().capacity(), 1);
}

#[test]
fn tier_refuses_double_free_stale_and_foreign_slots() {
    let mut t = HostTier::new(8, 2).unwrap();
    let mut other = HostTier::new(8, 4).unwrap();
    let s = t.alloc().unwrap();
    t.free(s).unwrap();
    is_invalid(t.free(s), "double free");
    is_invalid(t.slot(&s), "free");
    is_invalid(t.slot_mut(&s), "free");
    let reused = t.alloc().unwrap();
    assert_eq!(reused.index(), s.index());
    is_invalid(t.free(s), "allocated again");
    is_invalid(t.slot(&s), "allocated again");
    // Another tier's slot, with an index in range here or not.
    let o: Vec<Slot> = (0..4).map(|_| other.alloc().unwrap()).collect();
    for x in &o {
        is_invalid(t.free(*x), "another host tier");
        is_invalid(t.slot(x), "another host tier");
    }
    assert_eq!((t.used(), other.used()), (1, 4));
    t.free(reused).unwrap();
}

#[test]
fn tier_refuses_budgets_the_host_cannot_give() {
    is_invalid(HostTier::new(0, 4), "slot_bytes");
    is_invalid(HostTier::new(64, 0), "capacity_slots");
    is_invalid(HostTier::new(64, u32::MAX as usize + 1), "capacity_slots");
    is_invalid(HostTier::new(usize::MAX - 3, 1), "slot_bytes");
    is_invalid(HostTier::new(1 << 40, 1 << 20), "capacity_slots"); // 2^60 bytes
    is_invalid(HostTier::new(1 << 20, 1 << 30), "capacity_slots"); // 1 PiB
    is_invalid(HostTier::with_budget_bytes(100, 127), "budget_bytes");
    is_invalid(HostTier::with_budget_bytes(0, 1 << 20), "slot_bytes");
}

#[test]
fn tier_slots_are_disjoint_to_the_last_byte() {
    let mut t = HostTier::new(67, 5).unwrap();
    let slots: Vec<Slot> = (0..5).map(|_| t.alloc().unwrap()).collect();
    for (n, s) in slots.iter().enumerate() {
        t.slot_mut(s).unwrap().fill(n as u8 + 1);
    }
    for (n, s) in slots.iter().enumerate() {
        assert!(t.slot(s).unwrap().iter().all(|&b| b == n as u8 + 1), "slot {n}");
    }
}

// ---------------------------------------------------------------------------------------
// Slot byte order

#[test]
fn slot_bytes_follow_the_shape_and_dtype() {
    let s = shape(3, 4, 5, 2, 6);
    for dt in DType::ALL {
        let c = KvCache::new(s, dt).unwrap();
        let scales = if dt == DType::I8 { 4 } else { 0 };
        assert_eq!(slot_bytes_for(&c), 3 * 2 * 2 * 5 * (6 * dt.size() + scales), "{dt:?}");
        assert_eq!(raw_block(&c, 3).len(), slot_bytes_for(&c));
        assert_eq!(c.slot_bytes(), slot_bytes_for(&c));
    }
}

/// Pack block b, unpack it into block c of the same cache and into block c of another
/// cache of the same shape (fp8: with the same scales): the bytes and values of c are b's,
/// every other block is unchanged, and the slot is the layers' runs in order.
#[test]
fn pack_unpack_round_trip_is_exact_for_every_dtype_and_shape() {
    for (n, s) in shapes().into_iter().enumerate() {
        for dt in DType::ALL {
            let mut c = filled(s, dt, n as u64);
            let (b, last) = (0, s.num_blocks - 1);
            let mut slot = vec![0u8; slot_bytes_for(&c)];
            pack(&c, b, &mut slot).unwrap();
            assert_eq!(slot, raw_block(&c, b), "{dt:?} {s:?}: slot order");
            let before: Vec<Vec<u8>> = (0..s.num_blocks).map(|x| raw_block(&c, x)).collect();
            unpack(&slot, &mut c, last).unwrap();
            assert_eq!(raw_block(&c, last), before[b], "{dt:?} {s:?}");
            assert_eq!(values(&c, last), values(&c, b), "{dt:?} {s:?}");
            for (x, was) in before.iter().enumerate().take(last).skip(1) {
                assert_eq!(&raw_block(&c, x), was, "{dt:?} {s:?}: block {x} changed");
            }
            let mut other = empty_like(&c);
            unpack(&slot, &mut other, last).unwrap();
            assert_eq!(raw_block(&other, last), before[b], "{dt:?} {s:?}");
            assert_eq!(values(&other, last), values(&c, b), "{dt:?} {s:?}");
            assert!(raw_block(&other, 0).iter().all(|&x| x == 0) || s.num_blocks == 1);
            assert!(!c.raw_writes() && !other.raw_writes(), "{dt:?}: written codes are not foreign");
        }
    }
}

#[test]
fn pack_and_unpack_refuse_wrong_sizes_and_blocks() {
    let mut c = filled(shape(2, 3, 2, 1, 4), DType::I8, 9);
    let n = slot_bytes_for(&c);
    let mut out = vec![7u8; n + 1];
    is_invalid(pack(&c, 0, &mut out), "out must hold");
    is_invalid(pack(&c, 3, &mut out[..n]), "out of range");
    assert!(out.iter().all(|&x| x == 7));
    let before = c.bytes().to_vec();
    is_invalid(unpack(&out[..n - 1], &mut c, 0), "slot must hold");
    is_invalid(unpack(&out[..n], &mut c, 3), "out of range");
    assert_eq!(c.bytes(), &before[..]);
}

/// A code no write makes (e4m3 NaN) marks the cache it is unpacked into; written codes
/// do not.
#[test]
fn unpack_marks_foreign_codes() {
    let src = filled(shape(2, 2, 4, 1, 8), DType::E4M3, 3);
    let mut slot = vec![0u8; slot_bytes_for(&src)];
    pack(&src, 1, &mut slot).unwrap();
    let mut dst = empty_like(&src);
    unpack(&slot, &mut dst, 0).unwrap();
    assert!(!dst.raw_writes());
    slot[5] = 0x7f;
    unpack(&slot, &mut dst, 1).unwrap();
    assert!(dst.raw_writes());
}

// ---------------------------------------------------------------------------------------
// The engine: copies

/// A filled device cache, an empty one like it, and a tier with a slot per block.
fn setup(s: KvShape, dt: DType, seed: u64) -> (Arc<KvCache>, Arc<KvCache>, HostTier) {
    let src = filled(s, dt, seed);
    let dst = empty_like(&src);
    let host = HostTier::new(slot_bytes_for(&src), s.num_blocks).unwrap();
    (Arc::new(src), Arc::new(dst), host)
}

/// Store every block of `src` (block i -> a slot), then load slot of block i into block
/// `num_blocks - 1 - i` of `dst`; check slots and blocks byte for byte.
fn store_and_load(engine: &TransferEngine, s: KvShape, dt: DType, seed: u64) {
    let (src, mut dst, mut host) = setup(s, dt, seed);
    let slots: Vec<Slot> = (0..s.num_blocks).map(|_| host.alloc().unwrap()).collect();
    let mut store = Batch::new(src.clone());
    for (b, slot) in slots.iter().enumerate() {
        store.store(b, *slot);
    }
    submit(engine, &mut host, store).wait().unwrap();
    for (b, slot) in slots.iter().enumerate() {
        assert_eq!(host.slot(slot).unwrap(), &raw_block(&src, b)[..], "{dt:?} block {b}");
    }
    let mut load = Batch::new(dst.clone());
    for (b, slot) in slots.iter().enumerate() {
        load.load(*slot, s.num_blocks - 1 - b);
    }
    submit(engine, &mut host, load).wait().unwrap();
    for b in 0..s.num_blocks {
        let to = s.num_blocks - 1 - b;
        assert_eq!(raw_block(&dst, to), raw_block(&src, b), "{dt:?} block {b} -> {to}");
        assert_eq!(values(&dst, to), values(&src, b));
    }
    // The engine holds no `Arc` of a cache once its handles are done.
    assert!(Arc::get_mut(&mut dst).is_some());
}

#[test]
fn engine_store_and_load_are_exact_for_every_dtype() {
    let engine = TransferEngine::new(2).unwrap();
    for (n, s) in shapes().into_iter().enumerate() {
        for dt in DType::ALL {
            store_and_load(&engine, s, dt, 100 + n as u64);
        }
    }
}

/// Batches larger than `threads * MIN_PART_BYTES` run as several parts at once.
#[test]
fn engine_splits_large_batches_and_stays_exact() {
    let engine = TransferEngine::new(3).unwrap();
    // 48 blocks of 512 KiB (f32, 8 layers x 64 KiB): 24 MiB, parts of 8 MiB.
    let s = shape(8, 48, 16, 8, 64);
    const { assert!(48 * 512 * 1024 > 3 * MIN_PART_BYTES) };
    store_and_load(&engine, s, DType::F32, 7);
    store_and_load(&engine, shape(4, 40, 32, 4, 128), DType::I8, 8);
}

#[test]
fn engine_runs_many_batches_concurrently_from_several_threads() {
    let engine = TransferEngine::new(2).unwrap();
    std::thread::scope(|scope| {
        for caller in 0..3u64 {
            let engine = &engine;
            scope.spawn(move || {
                let s = shape(3, 64, 4, 2, 16);
                let dt = DType::ALL[caller as usize % DType::ALL.len()];
                let (src, dst, mut host) = setup(s, dt, caller);
                let slots: Vec<Slot> = (0..s.num_blocks).map(|_| host.alloc().unwrap()).collect();
                // One batch per block, all in flight before any wait.
                let stores: Vec<Handle> = (0..s.num_blocks)
                    .map(|b| {
                        let mut batch = Batch::new(src.clone());
                        batch.store(b, slots[b]);
                        submit(engine, &mut host, batch)
                    })
                    .collect();
                stores.iter().for_each(|h| h.wait().unwrap());
                let loads: Vec<Handle> = (0..s.num_blocks / 4)
                    .map(|q| {
                        let mut batch = Batch::new(dst.clone());
                        for (b, slot) in slots.iter().enumerate().skip(4 * q).take(4) {
                            batch.load(*slot, b);
                        }
                        submit(engine, &mut host, batch)
                    })
                    .collect();
                loads.iter().for_each(|h| h.wait().unwrap());
                for b in 0..s.num_blocks {
                    assert_eq!(raw_block(&dst, b), raw_block(&src, b), "caller {caller} block {b}");
                }
            });
        }
    });
}

#[test]
fn engine_poll_becomes_true() {
    let engine = TransferEngine::new(1).unwrap();
    let (src, _, mut host) = setup(shape(4, 32, 16, 8, 128), DType::BF16, 1);
    let mut batch = Batch::new(src.clone());
    let slots: Vec<Slot> = (0..32).map(|_| host.alloc().unwrap()).collect();
    for (b, s) in slots.iter().enumerate() {
        batch.store(b, *s);
    }
    let h = submit(&engine, &mut host, batch);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !h.poll() {
        assert!(Instant::now() < deadline, "poll never became true");
        std::thread::sleep(Duration::from_millis(1));
    }
    h.wait().unwrap();
    assert!(h.poll());
    assert_eq!(host.slot(&slots[31]).unwrap(), &raw_block(&src, 31)[..]);
    // An empty batch is done at once.
    assert!(submit(&engine, &mut host, Batch::new(src)).poll());
}

#[test]
fn engine_thread_counts_are_checked() {
    is_invalid(TransferEngine::new(0), "threads");
    is_invalid(TransferEngine::new(65), "threads");
    assert_eq!(TransferEngine::new(4).unwrap().threads(), 4);
}

/// A refused batch fails its own handle, copies and marks nothing; a good batch
/// submitted among them is exact.
#[test]
fn engine_refused_batches_fail_only_their_handle() {
    let engine = TransferEngine::new(2).unwrap();
    let s = shape(2, 6, 4, 2, 8);
    let (src, dst, mut host) = setup(s, DType::I8, 5);
    let mut other = HostTier::new(slot_bytes_for(&src), 10).unwrap();
    let foreign: Vec<Slot> = (0..8).map(|_| other.alloc().unwrap()).collect();
    let slots: Vec<Slot> = (0..6).map(|_| host.alloc().unwrap()).collect();
    let freed = slots[5];
    host.free(freed).unwrap();
    let mut small = HostTier::new(8, 2).unwrap();
    let small_slot = small.alloc().unwrap();

    let bad: Vec<(&str, Batch)> = vec![
        ("another host tier", { let mut b = Batch::new(src.clone()); b.store(0, slots[0]).store(1, foreign[7]); b }),
        ("out of range", { let mut b = Batch::new(src.clone()); b.store(0, slots[0]).store(6, slots[1]); b }),
        ("slot", { let mut b = Batch::new(src.clone()); b.store(0, slots[0]).store(1, slots[0]); b }),
        ("block 2 appears", { let mut b = Batch::new(dst.clone()); b.load(slots[0], 2).load(slots[1], 2); b }),
        ("free", { let mut b = Batch::new(src.clone()); b.store(0, freed); b }),
    ];
    let mut handles = Vec::new();
    for (i, (needle, batch)) in bad.into_iter().enumerate() {
        let mut good = Batch::new(src.clone());
        good.store(i % 4, slots[i % 4]);
        handles.push((needle, submit(&engine, &mut host, batch)));
        submit(&engine, &mut host, good).wait().unwrap();
    }
    let mut b = Batch::new(src.clone());
    b.store(0, small_slot);
    handles.push(("bytes", submit(&engine, &mut small, b)));
    for (needle, h) in handles {
        assert!(h.poll());
        is_invalid(h.wait(), needle);
    }
    // Nothing was marked: every slot is idle and usable.
    for slot in &slots[..5] {
        assert!(!host.in_flight(slot).unwrap());
    }
    assert!(small.slot(&small_slot).unwrap().iter().all(|&x| x == 0));
    for (b, slot) in slots.iter().enumerate().take(4) {
        assert_eq!(host.slot(slot).unwrap(), &raw_block(&src, b)[..]);
    }
    assert!(raw_block(&dst, 2).iter().all(|&x| x == 0), "a refused load copied");
}

// ---------------------------------------------------------------------------------------
// The engine: slots in flight, panics, raw codes

/// What a [`TestRegion`] does when its last `Arc` drops (on the worker, inside a part).
enum OnDrop {
    Nothing,
    /// Block until the gate opens: the part stays in flight, its slots marked.
    Wait(Arc<(Mutex<bool>, Condvar)>),
    Panic,
}

/// A device region of `blocks` blocks of `block` contiguous bytes, block `b` holding
/// byte `b + 1` everywhere.
struct TestRegion {
    ptr: NonNull<u8>,
    len: usize,
    block: usize,
    on_drop: OnDrop,
    _buf: AlignedBuf,
}

// SAFETY: the pointer is `_buf`'s own (`as_mut_ptr`), never used by anything but the
// engine's `RawBytes` and `TestRegion::byte`, while `_buf` keeps the mapping alive.
unsafe impl Send for TestRegion {}
// SAFETY: as for `Send`.
unsafe impl Sync for TestRegion {}

impl TestRegion {
    fn new(blocks: usize, block: usize, on_drop: OnDrop) -> Arc<Self> {
        let mut buf = AlignedBuf::zeroed(blocks * block).unwrap();
        for (b, chunk) in buf.as_mut_slice().chunks_mut(block).enumerate() {
            chunk.fill(b as u8 + 1);
        }
        let ptr = NonNull::new(buf.as_mut_ptr()).unwrap();
        Arc::new(Self { ptr, len: blocks * block, block, on_drop, _buf: buf })
    }
}

// SAFETY: `ptr` is the mapping's own pointer, valid for reads and writes of `len` bytes
// for as long as `_buf`, a field of the region, lives; it never moves.
unsafe impl DeviceRegion for TestRegion {
    fn memory(&self) -> (NonNull<u8>, usize) {
        (self.ptr, self.len)
    }
    fn num_blocks(&self) -> usize {
        self.len / self.block
    }
    fn slot_bytes(&self) -> usize {
        self.block
    }
    fn block_runs(&self, block: usize, runs: &mut Vec<Range<usize>>) -> Result<()> {
        // Two runs per block, the second at the block's end: the bounds of the region.
        let at = block * self.block;
        runs.extend([at..at + self.block / 2, at + self.block / 2..at + self.block]);
        Ok(())
    }
}

impl Drop for TestRegion {
    fn drop(&mut self) {
        match &self.on_drop {
            OnDrop::Nothing => {}
            OnDrop::Wait(gate) => {
                let mut open = gate.0.lock().unwrap();
                while !*open {
                    open = gate.1.wait(open).unwrap();
                }
            }
            OnDrop::Panic => panic!("test region dropped"),
        }
    }
}

/// While a store is in flight its slot can be neither read, written, freed nor used by
/// another batch; a load's slot can be read but not written; all is free again after.
#[test]
fn engine_guards_slots_in_flight() {
    let engine = TransferEngine::new(1).unwrap();
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let mut host = HostTier::new(4096, 4).unwrap();
    let slots: Vec<Slot> = (0..4).map(|_| host.alloc().unwrap()).collect();
    host.slot_mut(&slots[1]).unwrap().fill(9);
    let region = TestRegion::new(4, 4096, OnDrop::Wait(gate.clone()));
    let mut batch = Batch::new(region);
    // The last block of the region into the last slot: both at their bounds.
    batch.store(3, slots[3]).load(slots[1], 0);
    let h = submit(&engine, &mut host, batch);
    std::thread::sleep(Duration::from_millis(50));
    assert!(!h.poll(), "the gate holds the part in flight");
    assert!(host.in_flight(&slots[3]).unwrap() && host.in_flight(&slots[1]).unwrap());
    is_invalid(host.slot(&slots[3]), "being written");
    is_invalid(host.slot_mut(&slots[3]), "in flight");
    is_invalid(host.free(slots[3]), "in flight");
    assert!(host.slot(&slots[1]).unwrap().iter().all(|&b| b == 9), "a loaded slot may be read");
    is_invalid(host.slot_mut(&slots[1]), "in flight");
    let side = TestRegion::new(4, 4096, OnDrop::Nothing);
    // Refused at submit (done at once: the one worker is held by the gate).
    let mut conflict = Batch::new(side.clone());
    conflict.store(0, slots[1]);
    let refused = submit(&engine, &mut host, conflict);
    assert!(refused.poll());
    is_invalid(refused.wait(), "in flight");
    let mut conflict = Batch::new(side);
    conflict.load(slots[3], 0);
    let refused = submit(&engine, &mut host, conflict);
    assert!(refused.poll());
    is_invalid(refused.wait(), "being written");
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    h.wait().unwrap();
    assert!(host.slot(&slots[3]).unwrap().iter().all(|&b| b == 4), "block 3 holds 4s");
    host.free(slots[3]).unwrap();
    host.slot_mut(&slots[1]).unwrap().fill(0);
}

/// A panic on a worker (here the region's drop, the one foreign code a part runs) fails
/// that handle with `Invariant`; the worker lives on and later batches are exact.
#[test]
fn engine_worker_panic_fails_its_handle_only() {
    let engine = TransferEngine::new(1).unwrap();
    let mut host = HostTier::new(256, 4).unwrap();
    let slots: Vec<Slot> = (0..4).map(|_| host.alloc().unwrap()).collect();
    let mut batch = Batch::new(TestRegion::new(2, 256, OnDrop::Panic));
    batch.store(1, slots[0]);
    match submit(&engine, &mut host, batch).wait() {
        Err(KvError::Invariant(m)) => assert!(m.contains("panicked") && m.contains("test region dropped"), "{m}"),
        other => panic!("expected Invariant, got {other:?}"),
    }
    assert!(!host.in_flight(&slots[0]).unwrap());
    let mut batch = Batch::new(TestRegion::new(3, 256, OnDrop::Nothing));
    batch.store(2, slots[1]);
    submit(&engine, &mut host, batch).wait().unwrap();
    assert!(host.slot(&slots[1]).unwrap().iter().all(|&b| b == 3));
}

/// A slot written through `slot_mut` may hold any codes: loading it marks the cache;
/// slots stored from a clean cache do not.
#[test]
fn engine_loads_pass_raw_codes_on() {
    let engine = TransferEngine::new(1).unwrap();
    let (src, dst, mut host) = setup(shape(2, 3, 4, 1, 8), DType::E4M3, 4);
    let (a, b) = (host.alloc().unwrap(), host.alloc().unwrap());
    let mut batch = Batch::new(src.clone());
    batch.store(0, a);
    submit(&engine, &mut host, batch).wait().unwrap();
    let mut batch = Batch::new(dst.clone());
    batch.load(a, 1);
    submit(&engine, &mut host, batch).wait().unwrap();
    assert!(!dst.raw_writes());
    pack(&src, 2, host.slot_mut(&b).unwrap()).unwrap();
    let mut batch = Batch::new(dst.clone());
    batch.load(b, 2);
    submit(&engine, &mut host, batch).wait().unwrap();
    assert!(dst.raw_writes());
    assert_eq!(raw_block(&dst, 2), raw_block(&src, 2));
    // A store from a marked cache marks its slot in turn.
    let other = Arc::new(empty_like(&src));
    let mut batch = Batch::new(dst.clone());
    batch.store(0, a);
    submit(&engine, &mut host, batch).wait().unwrap();
    let mut batch = Batch::new(other.clone());
    batch.load(a, 0);
    submit(&engine, &mut host, batch).wait().unwrap();
    assert!(other.raw_writes());
}

// ---------------------------------------------------------------------------------------
// Patterns in a child process (no hang, no crash)

/// Run `pattern` in a child (this binary, only `child_pattern`), failing if it does not
/// exit successfully within 20 s.
fn in_child(pattern: &str) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "child_pattern", "--nocapture", "--test-threads=1"])
        .env(CHILD, pattern)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            assert!(status.success(), "pattern {pattern} failed: {status}\n{text}");
            assert!(text.contains("1 passed"), "pattern {pattern} did not run:\n{text}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("pattern {pattern} did not finish within 20 s (a hang?)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The child's entry: runs the pattern `OFFLOAD_HOST_CHILD` names (nothing without it).
#[test]
fn child_pattern() {
    match std::env::var(CHILD).as_deref() {
        Ok("drop_handles") => drop_handles(),
        Ok("drop_engine") => drop_engine(),
        Ok("drop_owners") => drop_owners(),
        Ok(other) => panic!("unknown pattern {other}"),
        Err(_) => {}
    }
}

/// 16 MiB of f16 in 16 blocks of 1 MiB (2 layers), filled, with a tier for all.
fn big_setup() -> (Arc<KvCache>, HostTier, Vec<Slot>) {
    let s = shape(2, 16, 128, 8, 128);
    let src = filled(s, DType::F16, 11);
    let mut host = HostTier::new(slot_bytes_for(&src), s.num_blocks).unwrap();
    let slots = (0..s.num_blocks).map(|_| host.alloc().unwrap()).collect();
    (Arc::new(src), host, slots)
}

fn store_each(engine: &TransferEngine, src: &Arc<KvCache>, host: &mut HostTier, slots: &[Slot]) -> Vec<Handle> {
    (0..slots.len())
        .map(|b| {
            let mut batch = Batch::new(src.clone());
            batch.store(b, slots[b]);
            submit(engine, host, batch)
        })
        .collect()
}

/// Handles dropped unwaited: the copies still complete (slots come free) and are exact.
fn drop_handles() {
    let engine = TransferEngine::new(2).unwrap();
    let (src, mut host, slots) = big_setup();
    drop(store_each(&engine, &src, &mut host, &slots));
    let deadline = Instant::now() + Duration::from_secs(15);
    while slots.iter().any(|s| host.in_flight(s).unwrap()) {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    for (b, s) in slots.iter().enumerate() {
        assert_eq!(host.slot(s).unwrap(), &raw_block(&src, b)[..]);
    }
}

/// The engine dropped with batches queued and running: its drop finishes them and joins.
fn drop_engine() {
    let engine = TransferEngine::new(2).unwrap();
    let (src, mut host, slots) = big_setup();
    let handles = store_each(&engine, &src, &mut host, &slots);
    drop(engine);
    for (b, (h, s)) in handles.iter().zip(&slots).enumerate() {
        assert!(h.poll());
        h.wait().unwrap();
        assert_eq!(host.slot(s).unwrap(), &raw_block(&src, b)[..]);
    }
}

/// The caller's cache, tier and handles dropped with copies in flight: the jobs' `Arc`s
/// keep the memory alive until the engine is done with it.
fn drop_owners() {
    let engine = TransferEngine::new(2).unwrap();
    for _ in 0..3 {
        let (src, mut host, slots) = big_setup();
        let handles = store_each(&engine, &src, &mut host, &slots);
        let mut load = Batch::new(src.clone());
        load.load(slots[0], 15);
        drop((src, host, handles, load));
    }
    drop(engine);
}

#[test]
fn dropped_handles_still_complete() {
    in_child("drop_handles");
}

#[test]
fn dropping_the_engine_finishes_queued_batches_and_joins() {
    in_child("drop_engine");
}

#[test]
fn dropping_the_cache_and_tier_in_flight_is_safe() {
    in_child("drop_owners");
}
