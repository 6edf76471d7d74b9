//! The bytes behind the prefix cache's tiers: a [`TierStore`] carries out the tiers'
//! decisions ([`Move`]s, then an admission's [`TierLoad`]s) on a host tier, an optional
//! disk tier and a device region, in the order the decisions were made.
//!
//! - Decision slot `i` of the host tier (tier 0) is host slot ticket `i`, allocated once;
//!   a few more host slots stage the disk's blocks on their way to the device.
//! - Decision slot `j` of the disk tier (tier 1) holds the block the store wrote there;
//!   its file is named by the block's layer group and key, and a partial block's fill
//!   goes into the file's group field (`group | fill << 8`), so a partial block and the
//!   full block of the same key are two files.
//! - Device <-> host copies go to the transfer engine as one batch per call, and run on
//!   its threads while the caller goes on; [`TierStore::wait`] (or `poll`) tells when the
//!   device blocks may be read. The disk tier lives on a thread of its own
//!   ([`DiskWorker`]), which runs its operations in the order they were decided: a
//!   demotion copies the host slot's bytes and queues their write (the call goes on), a
//!   load from disk waits for the file's bytes (after the writes queued before it) and
//!   stages them in a host slot that the batch then copies to the device;
//!   [`TierStore::wait_all`] waits for the writes too.
//! - Where a later decision needs the result of an earlier copy of the same call (a slot
//!   stored and then demoted, a device block stored and then loaded into, a slot stored
//!   again), the batch so far is submitted and waited for first: the order of the
//!   decisions is the order of the bytes.
//!
//! A disk block's payload is the slot's bytes followed by a trailer: the block's token
//! ids when the cache verifies tokens (u32 each), then [`TRAILER_BYTES`] bytes: magic
//! `PKVTIER2`, flags (u8: 1 parent present, 2 extra key present, 4 token ids present),
//! 3 zero bytes, the block's hits in the device (u32), its parent's key (u128), its extra
//! key (u64), the count of token ids (u32) and 4 zero bytes, little-endian. The token ids
//! give a restored block its token record, so that its hits stay exact. After a restart [`TierStore::restorable`] lists the folder's blocks
//! with what the tier needs to find them again, and [`TierStore::adopt`] gives one a slot.
//!
//! A block the disk no longer serves (its file damaged or removed behind the tier's back)
//! is never loaded: the device block keeps what it held, the call fails with
//! `Storage(Io)` naming the device blocks, and [`StoreStats::disk_lost`] counts them.

mod disk_worker;
mod probe;
mod read_ahead;
mod restart;
mod trailer;

use std::sync::Arc;

use crate::error::{vec_for, KvError, Result, StorageFault};
use crate::invalid;
use crate::kv::DType;
pub use self::disk_worker::DiskWorker;
pub use self::trailer::{most_payload_bytes, TRAILER_BYTES};
use self::read_ahead::ReadAhead;
use self::trailer::{push_trailer, trailer_bytes};
use crate::offload::disk::{DiskStats, DiskTier};
use crate::offload::host::{HostTier, Slot};
use crate::offload::transfer::{Batch, DeviceRegion, Handle, TransferEngine};
use crate::prefix_cache::block_hash::BlockKey;
use crate::prefix_cache::tiers::{Move, TierKey, TierLoad, TierMeta};

/// Host slots that stage blocks read from disk on their way to the device, per batch.
pub const STAGING_SLOTS: usize = 16;

/// The disk file group of probe blocks ([`TierStore::probe`]): above every real block's
/// (`group | fill << 8` fits 24 bits), and not a slot and a trailer long, so a restart
/// removes a leftover.
pub const PROBE_GROUP: u32 = u32::MAX;

/// Most blocks a probe moves.
pub const MAX_PROBE_BLOCKS: usize = 256;


/// What a [`TierStore`] carried out, in blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Device blocks copied into the host tier.
    pub host_stores: u64,
    /// Host blocks copied to the device.
    pub host_loads: u64,
    /// Host blocks written to disk.
    pub disk_writes: u64,
    /// Disk blocks read and copied to the device.
    pub disk_loads: u64,
    /// Disk blocks a load found damaged or gone (never served).
    pub disk_lost: u64,
    /// Batches submitted and waited for inside a call (see the module doc).
    pub flushes: u64,
}

/// A device region's tiers' bytes: host slots, an optional disk tier and the engine that
/// copies between host and device.
pub struct TierStore {
    host: HostTier,
    slots: Vec<Slot>,
    staging: Vec<Slot>,
    disk: Option<DiskWorker>,
    disk_keys: Vec<Option<TierKey>>,
    engine: TransferEngine,
    dtype: DType,
    block_size: u32,
    in_flight: Option<Handle>,
    scratch: Vec<u8>,
    stats: StoreStats,
}

impl std::fmt::Debug for TierStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TierStore({} host slots, disk: {})", self.slots.len(), self.disk.is_some())
    }
}

/// The batch being built by one [`TierStore::apply`], and what it touches.
struct Pending {
    batch: Batch,
    slots: Vec<usize>,
    blocks: Vec<usize>,
    staged: usize,
}

impl Pending {
    fn new(device: Arc<dyn DeviceRegion>) -> Self {
        Self { batch: Batch::from_dyn(device), slots: Vec::new(), blocks: Vec::new(), staged: 0 }
    }

    fn touches(&self, slot: Option<usize>, block: Option<usize>) -> bool {
        slot.is_some_and(|s| self.slots.contains(&s)) || block.is_some_and(|b| self.blocks.contains(&b))
    }
}

impl TierStore {
    /// A store for `host_blocks` host slots of `slot_bytes` bytes (plus
    /// [`STAGING_SLOTS`] when `disk` is given), the disk tier `disk` holding up to
    /// `disk_blocks` blocks, and an engine of `threads` threads. `dtype` and `block_size`
    /// (tokens) go into the disk files' headers.
    ///
    /// Errors (`InvalidArgument`): a zero count, a budget the host cannot map, `threads`
    /// out of range.
    pub fn new(
        host_blocks: usize,
        slot_bytes: usize,
        dtype: DType,
        block_size: u32,
        disk: Option<(DiskTier, usize)>,
        threads: usize,
    ) -> Result<Self> {
        let staging = if disk.is_some() { STAGING_SLOTS } else { 0 };
        let total = host_blocks.checked_add(staging).ok_or_else(|| invalid!("host_blocks: {host_blocks} is too large"))?;
        let mut host = HostTier::new(slot_bytes, total)?;
        let mut slots = vec_for(total, "host_blocks")?;
        while let Some(s) = host.alloc() {
            slots.push(s);
        }
        let staging = slots.split_off(host_blocks);
        let (disk, disk_blocks) = match disk {
            Some((d, n)) => (Some(DiskWorker::new(d, disk_queue(slot_bytes), most_payload_bytes(slot_bytes, block_size) as u64, n)?), n),
            None => (None, 0),
        };
        let disk_keys = crate::error::filled(None, disk_blocks, "disk_blocks")?;
        let engine = TransferEngine::new(threads)?;
        let stats = StoreStats::default();
        Ok(Self { host, slots, staging, disk, disk_keys, engine, dtype, block_size, in_flight: None, scratch: Vec::new(), stats })
    }

    /// Bytes of one block (one slot).
    pub fn slot_bytes(&self) -> usize {
        self.host.slot_bytes()
    }

    /// Bytes of host memory the host tier maps (its slots and the staging slots).
    pub fn host_bytes(&self) -> usize {
        self.host.bytes()
    }

    /// Counts of the copies carried out.
    pub fn stats(&self) -> StoreStats {
        self.stats
    }

    /// The disk tier's own counters, if there is a disk tier (after the writes queued).
    pub fn disk_stats(&self) -> Option<DiskStats> {
        self.disk.as_ref().and_then(|w| w.run(|d| d.stats()).ok())
    }

    /// The batch in flight, if any (a clone of its handle, to wait on elsewhere).
    pub fn in_flight(&self) -> Option<Handle> {
        self.in_flight.clone()
    }

    /// Forget every block stored (the tiers were emptied): wait for the batch in flight
    /// and remove the disk tier's files. Its error, if the batch failed, or a file
    /// could not be removed (the others are).
    pub fn clear(&mut self) -> Result<()> {
        let waited = self.wait();
        let keys: Vec<TierKey> = self.disk_keys.iter_mut().filter_map(Option::take).collect();
        let removed = match &self.disk {
            Some(w) => w.run(move |d| keys.iter().map(|k| d.remove(file_group(*k), k.1).map(drop)).fold(Ok(()), Result::and))?,
            None => Ok(()),
        };
        waited.and(removed)
    }

    /// [`Self::wait`], then wait for the disk writes queued; the first failure since the
    /// last call, of either.
    pub fn wait_all(&mut self) -> Result<()> {
        let waited = self.wait();
        let Some(w) = &self.disk else { return waited };
        w.run(|_| ())?;
        waited.and(w.take_error().map_or(Ok(()), Err))
    }

    /// Whether no batch is in flight (never blocks).
    pub fn poll(&mut self) -> bool {
        self.in_flight.as_ref().is_none_or(Handle::poll)
    }

    /// Block until the batch in flight, if any, is done; its error, if it failed.
    pub fn wait(&mut self) -> Result<()> {
        match self.in_flight.take() {
            Some(h) => h.wait(),
            None => Ok(()),
        }
    }

    /// Carry out `moves` in order, then `loads`, on `device`; the device <-> host copies
    /// are still running when this returns ([`Self::wait`]). Waits first for the batch of
    /// the previous call.
    ///
    /// Errors: a decision this store cannot carry out (`InvalidArgument`: a slot or tier
    /// out of range, a disk decision without a disk tier, a device block out of range), a
    /// disk failure (`Storage`), or disk blocks lost (`Storage(Io)`, after every other
    /// decision was carried out). The decisions before the failing one were carried out.
    ///
    /// # Safety
    ///
    /// The promise of [`TransferEngine::submit`] for every device block the moves store
    /// and the loads load, until [`Self::wait`] returned or [`Self::poll`] returned
    /// `true`; and the device blocks the moves store hold, when this is called, the bytes
    /// of the blocks the tiers decided to store.
    pub unsafe fn apply(&mut self, device: Arc<dyn DeviceRegion>, moves: &[Move], loads: &[TierLoad]) -> Result<()> {
        self.wait()?;
        let mut p = Pending::new(device.clone());
        for mv in moves {
            // SAFETY: the caller's promise, passed on.
            unsafe { self.carry_out(mv, &mut p, &device)? };
        }
        let mut ahead = self.read_ahead(loads);
        let mut lost = Vec::new();
        for l in loads {
            // SAFETY: as above.
            if !unsafe { self.load(l, &mut p, &device, &mut ahead)? } {
                lost.push(l.block.index());
            }
        }
        // SAFETY: as above.
        self.in_flight = Some(unsafe { self.engine.submit(&mut self.host, p.batch) });
        if lost.is_empty() {
            return Ok(());
        }
        self.stats.disk_lost += lost.len() as u64;
        let message = format!("disk tier: {} blocks failed their checks and were not loaded into device blocks {lost:?}", lost.len());
        Err(KvError::Storage { fault: StorageFault::Io, message })
    }

    /// The read-ahead of `loads`' disk blocks, its first files asked for.
    fn read_ahead(&self, loads: &[TierLoad]) -> ReadAhead {
        let keys: Vec<(u32, BlockKey)> = loads
            .iter()
            .filter(|l| l.tier == 1)
            .filter_map(|l| self.disk_keys.get(l.slot as usize).copied().flatten())
            .map(|k| (file_group(k), k.1))
            .collect();
        let mut ahead = ReadAhead::new(keys, self.slot_bytes());
        if let Some(w) = self.disk.as_ref() {
            ahead.start(w);
        }
        ahead
    }

    /// Submit the batch so far and wait for it.
    ///
    /// # Safety
    ///
    /// As [`Self::apply`].
    unsafe fn flush(&mut self, p: &mut Pending, device: &Arc<dyn DeviceRegion>) -> Result<()> {
        let full = std::mem::replace(p, Pending::new(device.clone()));
        self.stats.flushes += 1;
        // SAFETY: the caller's promise; waited for before returning.
        unsafe { self.engine.submit(&mut self.host, full.batch) }.wait()
    }

    /// One move.
    ///
    /// # Safety
    ///
    /// As [`Self::apply`].
    unsafe fn carry_out(&mut self, mv: &Move, p: &mut Pending, device: &Arc<dyn DeviceRegion>) -> Result<()> {
        match *mv {
            Move::Store { block, tier: 0, slot, .. } => {
                let (s, b) = (self.host_index(slot)?, block.index());
                if p.touches(Some(s), Some(b)) {
                    // SAFETY: the caller's promise.
                    unsafe { self.flush(p, device)? };
                }
                p.batch.store(b, self.slots[s]);
                p.slots.push(s);
                p.blocks.push(b);
                self.stats.host_stores += 1;
            }
            Move::Demote { key, tier: 0, slot, to_slot, ref meta } => {
                let s = self.host_index(slot)?;
                if p.touches(Some(s), None) {
                    // SAFETY: the caller's promise.
                    unsafe { self.flush(p, device)? };
                }
                self.demote(key, meta, s, to_slot)?;
            }
            Move::Drop { tier: 0, slot, .. } => {
                self.host_index(slot)?;
            }
            Move::Drop { tier: 1, slot, .. } => {
                let j = self.disk_index(slot)?;
                if let (Some(k), Some(w)) = (self.disk_keys[j].take(), &self.disk) {
                    w.send(move |d| d.remove(file_group(k), k.1).map(drop));
                }
            }
            ref other => return Err(invalid!("tier store: no tier below the disk for {other:?}")),
        }
        Ok(())
    }

    /// Queue the write of host slot `s`'s bytes and `meta` to disk slot `to_slot` as
    /// block `key` (the bytes copied now: the slot may take another block at once).
    fn demote(&mut self, key: TierKey, meta: &TierMeta, s: usize, to_slot: u32) -> Result<()> {
        let j = self.disk_index(to_slot)?;
        let (fill, dtype) = (if key.2 == 0 { self.block_size } else { u32::from(key.2) }, self.dtype);
        let bytes = self.host.slot(&self.slots[s])?;
        let mut payload = crate::error::vec_for(bytes.len() + trailer_bytes(meta), "payload")?;
        payload.extend_from_slice(bytes);
        push_trailer(&mut payload, meta);
        let w = self.disk.as_ref().ok_or_else(|| invalid!("tier store: a demotion without a disk tier"))?;
        let old = self.disk_keys[j].take();
        w.send(move |d| {
            if let Some(old) = old {
                d.remove(file_group(old), old.1)?;
            }
            d.put(file_group(key), key.1, fill, dtype, &payload)
        });
        self.disk_keys[j] = Some(key);
        self.stats.disk_writes += 1;
        Ok(())
    }

    /// One load; `false` when its disk block was lost.
    ///
    /// # Safety
    ///
    /// As [`Self::apply`].
    unsafe fn load(&mut self, l: &TierLoad, p: &mut Pending, device: &Arc<dyn DeviceRegion>, ahead: &mut ReadAhead) -> Result<bool> {
        let b = l.block.index();
        let slot = match l.tier {
            0 => Some(self.host_index(l.slot)?),
            1 => None,
            t => return Err(invalid!("tier store: a load from tier {t}, below the disk")),
        };
        let staged_out = l.tier == 1 && p.staged == self.staging.len();
        if staged_out || p.touches(slot, Some(b)) {
            // SAFETY: the caller's promise.
            unsafe { self.flush(p, device)? };
        }
        let ticket = match slot {
            Some(s) => {
                p.slots.push(s);
                self.stats.host_loads += 1;
                self.slots[s]
            }
            None => {
                if let Some(w) = self.disk.as_ref() {
                    ahead.step(w);
                }
                let Some(staged) = self.read_disk(l.slot, p.staged)? else { return Ok(false) };
                p.staged += 1;
                self.stats.disk_loads += 1;
                staged
            }
        };
        p.batch.load(ticket, b);
        p.blocks.push(b);
        Ok(true)
    }

    /// Read disk slot `slot`'s block into staging slot `k` (the hit takes it out of the
    /// tier: its file is removed); `None` when the disk no longer serves it.
    fn read_disk(&mut self, slot: u32, k: usize) -> Result<Option<Slot>> {
        let j = self.disk_index(slot)?;
        let w = self.disk.as_ref().ok_or_else(|| invalid!("tier store: a disk load without a disk tier"))?;
        let Some(key) = self.disk_keys[j].take() else { return Ok(None) };
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        let (served, buf) = w.run(move |d| {
            let (g, k) = (file_group(key), key.1);
            let served = d.get(g, k, &mut buf).and_then(|m| d.remove(g, k).map(|_| m));
            (served, buf)
        })?;
        self.scratch = buf;
        let served = served?;
        let stage = self.staging[k];
        let dst = self.host.slot_mut(&stage)?;
        match served {
            Some(_) if self.scratch.len() >= dst.len() + TRAILER_BYTES => {
                dst.copy_from_slice(&self.scratch[..dst.len()]);
                Ok(Some(stage))
            }
            _ => Ok(None),
        }
    }

    fn host_index(&self, slot: u32) -> Result<usize> {
        let s = slot as usize;
        if s >= self.slots.len() {
            return Err(invalid!("tier store: host slot {s} out of range 0..{}", self.slots.len()));
        }
        Ok(s)
    }

    fn disk_index(&self, slot: u32) -> Result<usize> {
        let j = slot as usize;
        if j >= self.disk_keys.len() {
            return Err(invalid!("tier store: disk slot {j} out of range 0..{}", self.disk_keys.len()));
        }
        Ok(j)
    }
}

impl Drop for TierStore {
    /// Let the batch in flight finish before the host tier and its slots go.
    fn drop(&mut self) {
        let _ = self.wait();
    }
}

/// Operations the disk queue holds: about 256 MiB of blocks waiting to be written, 4 to
/// 1024 of them.
fn disk_queue(slot_bytes: usize) -> usize {
    ((256 << 20) / slot_bytes.max(1)).clamp(4, 1024)
}

/// The group field of a block's disk file: its layer group, and a partial block's fill
/// above it.
fn file_group(key: TierKey) -> u32 {
    u32::from(key.0) | u32::from(key.2) << 8
}
