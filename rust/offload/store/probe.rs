//! What loading a block from each tier costs on this machine, measured on the store's own
//! memory and folder ([`TierStore::probe`]): the figures `set_tier_costs` compares with
//! the caller's recompute time.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::{TierStore, MAX_PROBE_BLOCKS, PROBE_GROUP};
use crate::error::Result;
use crate::invalid;
use crate::offload::host::{HostTier, Slot};
use crate::offload::transfer::{Batch, DeviceRegion};

impl TierStore {
    /// Nanoseconds to load one block from each tier, host first: the device -> host copy
    /// of `blocks` device blocks (`0..blocks`, read only) by the engine (a copy costs the
    /// same either way), and for the disk, those blocks written to the folder, dropped
    /// from the page cache, read back with their checksums and staged, plus the host
    /// copy. Waits for the batch in flight first; leaves nothing behind.
    ///
    /// Errors (`InvalidArgument`): `blocks` outside `1..=MAX_PROBE_BLOCKS` or above the
    /// device's; a disk failure (`Storage`).
    ///
    /// # Safety
    ///
    /// Device blocks `0..blocks` are not written until this returns.
    pub unsafe fn probe(&mut self, device: Arc<dyn DeviceRegion>, blocks: usize) -> Result<Vec<u64>> {
        if !(1..=MAX_PROBE_BLOCKS.min(device.num_blocks())).contains(&blocks) {
            return Err(invalid!("blocks: a probe moves 1..={} blocks, got {blocks}", MAX_PROBE_BLOCKS.min(device.num_blocks())));
        }
        self.wait()?;
        let mut probe = HostTier::new(self.slot_bytes(), blocks)?;
        let slots: Vec<Slot> = std::iter::from_fn(|| probe.alloc()).collect();
        let mut batch = Batch::from_dyn(device);
        for (b, &s) in slots.iter().enumerate() {
            batch.store(b, s);
        }
        let start = Instant::now();
        // SAFETY: the caller's promise: the blocks are only read, and not written meanwhile.
        unsafe { self.engine.submit(&mut probe, batch) }.wait()?;
        let host = per_block(start, blocks);
        let mut costs = vec![host];
        if self.disk.is_some() {
            costs.push(self.probe_disk(&probe, &slots)?.saturating_add(host));
        }
        Ok(costs)
    }

    /// Write the probe slots to disk, drop them from the page cache, time reading them
    /// back with their checksums (on the disk's thread, after the writes queued before);
    /// remove them. Nanoseconds per block.
    fn probe_disk(&mut self, probe: &HostTier, slots: &[Slot]) -> Result<u64> {
        let (dtype, block_size) = (self.dtype, self.block_size);
        let w = self.disk.as_ref().ok_or_else(|| invalid!("tier store: no disk tier to probe"))?;
        let blocks: Vec<Vec<u8>> = slots.iter().map(|s| probe.slot(s).map(<[u8]>::to_vec)).collect::<Result<_>>()?;
        w.run(move |disk| {
            let keys = 0..blocks.len() as u128;
            let written = blocks.iter().zip(keys.clone()).try_for_each(|(b, k)| disk.put(PROBE_GROUP, k, block_size, dtype, b));
            let timed = written.and_then(|()| {
                for k in keys.clone() {
                    drop_cached(&disk.block_path(PROBE_GROUP, k));
                }
                let start = Instant::now();
                let mut buf = Vec::with_capacity(blocks.first().map_or(0, Vec::len));
                for k in keys.clone() {
                    buf.clear();
                    if disk.get(PROBE_GROUP, k, &mut buf)?.is_none() {
                        return Err(invalid!("tier store: a probe block vanished from the disk tier"));
                    }
                }
                Ok(per_block(start, blocks.len()))
            });
            for k in keys {
                disk.remove(PROBE_GROUP, k)?;
            }
            timed
        })?
    }
}

fn per_block(start: Instant, blocks: usize) -> u64 {
    u64::try_from(start.elapsed().as_nanos() / blocks as u128).unwrap_or(u64::MAX)
}

/// Ask the kernel to drop `path`'s pages (synced first: dirty pages stay), so that a read
/// comes from the device. Best effort: a failure leaves the pages cached.
fn drop_cached(path: &Path) {
    let Ok(f) = File::open(path) else { return };
    if f.sync_data().is_ok() {
        // SAFETY: `f` is an open file for the whole call; the call reads no memory of ours.
        let _ = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}
