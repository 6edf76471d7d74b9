//! A worker thread and the unit it runs: a [`Part`] of a batch (some of its copy jobs,
//! with `Arc`s of the memory they touch) and its [`Ticket`] (the slots it marked and the
//! completion it reports to).

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::handle::Completion;
use super::region::DeviceRegion;
use crate::error::{KvError, Result};
use crate::invalid;
use crate::offload::host::memory::HostMemory;
use crate::offload::host::raw::RawBytes;

/// One copy: a block's runs (indices into [`Work::runs`]) and a slot.
#[derive(Clone, Debug)]
pub struct Planned {
    /// Host -> device (a load) or device -> host (a store).
    pub load: bool,
    /// Index of the host slot.
    pub slot: usize,
    /// Indices of the block's runs in [`Work::runs`].
    pub runs: Range<usize>,
}

/// Some jobs of a batch and the memory they touch, kept alive by the part's `Arc`s.
/// Fields drop in declaration order: the ticket last, and it drops its own `Arc` before
/// it reports, so the engine holds no `Arc` of the batch's memory once its handle is
/// done.
pub struct Part {
    work: Work,
    device: Arc<dyn DeviceRegion>,
    ticket: Ticket,
}

/// The copies of a part.
struct Work {
    /// The device's memory (the region, which the part's `device` keeps alive, promised
    /// it valid).
    device_raw: RawBytes,
    /// The host tier's memory.
    host: Arc<HostMemory>,
    /// Every run of the batch (checked inside `device_raw`).
    runs: Arc<[Range<usize>]>,
    jobs: Vec<Planned>,
}

impl Part {
    /// The part copying `jobs` of `device` and `host` (runs already checked inside the
    /// device's memory), which reports to `ticket` once run or dropped.
    pub fn new(device: Arc<dyn DeviceRegion>, host: Arc<HostMemory>, runs: Arc<[Range<usize>]>, jobs: Vec<Planned>, ticket: Ticket) -> Self {
        let (ptr, len) = device.memory();
        // SAFETY: the `DeviceRegion` contract: `memory` is valid for reads and writes for
        // as long as the region lives, and the part's `device` keeps it alive until
        // after `work` (and so `device_raw`) is dropped (`run`, and field order).
        let device_raw = unsafe { RawBytes::new(ptr, len) };
        Self { work: Work { device_raw, host, runs, jobs }, device, ticket }
    }

    /// Copy the jobs and drop the memory `Arc`s (the region's last one may run its
    /// owner's drop), catching a panic of either, then report to the handle.
    pub fn run(self) {
        let Part { work, device, mut ticket } = self;
        let result = catch_unwind(AssertUnwindSafe(move || {
            let copied = work.copy();
            drop(work);
            drop(device);
            copied
        }));
        ticket.result = Some(result.unwrap_or_else(|p| Err(panicked(p.as_ref()))));
    }
}

impl Work {
    /// Copy every job, in order; stops at the first error.
    fn copy(&self) -> Result<()> {
        for job in &self.jobs {
            let slot = self.host.slot_range(job.slot);
            let runs = self.runs.get(job.runs.clone()).ok_or_else(|| invalid!("job runs {:?} out of range", job.runs))?;
            let mut at = slot.start;
            for run in runs {
                let host = at..at + run.len();
                at = host.end;
                if host.end > slot.end {
                    return Err(invalid!("slot {}: the block's runs exceed its {} bytes", job.slot, slot.len()));
                }
                if job.load {
                    self.load(host, run.clone())?;
                } else {
                    self.store(run.clone(), host)?;
                }
            }
        }
        Ok(())
    }

    /// Host bytes `host` -> device bytes `device`.
    fn load(&self, host: Range<usize>, device: Range<usize>) -> Result<()> {
        // SAFETY: the slot is marked read by this batch until the ticket drops, so
        // neither the tier (`slot_mut`) nor another job writes it.
        let src = unsafe { self.host.raw().get(host)? };
        // SAFETY: `TransferEngine::submit`'s caller promised that nothing else reads or
        // writes a block being loaded until the handle is done, and the batch names each
        // block once (checked at submit).
        let dst = unsafe { self.device_raw.get_mut(device)? };
        copy(src, dst)
    }

    /// Device bytes `device` -> host bytes `host`.
    fn store(&self, device: Range<usize>, host: Range<usize>) -> Result<()> {
        // SAFETY: `submit`'s caller promised that nothing writes a block being stored
        // until the handle is done.
        let src = unsafe { self.device_raw.get(device)? };
        // SAFETY: the slot is marked written by this batch until the ticket drops, so the
        // tier refuses every access to it and no other job uses it.
        let dst = unsafe { self.host.raw().get_mut(host)? };
        copy(src, dst)
    }
}

/// Runs shorter than this are copied by [`copy_small`], longer ones by `memcpy`.
pub const SMALL_RUN: usize = 4 << 10;

fn copy(src: &[u8], dst: &mut [u8]) -> Result<()> {
    if src.len() != dst.len() {
        return Err(invalid!("copy of {} bytes into {}", src.len(), dst.len()));
    }
    if src.len() < SMALL_RUN {
        copy_small(src, dst);
    } else {
        dst.copy_from_slice(src);
    }
    Ok(())
}

/// `dst.copy_from_slice(src)` in 64-byte moves the compiler inlines. A per-layer block of
/// a 32-layer cache is 32 runs of a few KiB; the C library's `memcpy` took 370 ns per 2
/// KiB call on the development machine (glibc's vector loop, used below its 2112-byte
/// `rep movsb` threshold), so gathering 64 KiB blocks in 2 KiB runs ran at 5.7 GB/s with
/// it and 9.4 with this; from 4 KiB runs on `memcpy` is faster (11.8 against 10.0 GB/s).
fn copy_small(src: &[u8], dst: &mut [u8]) {
    let mut d = dst.chunks_exact_mut(64);
    let mut s = src.chunks_exact(64);
    for (d, s) in (&mut d).zip(&mut s) {
        let mut line = [0u8; 64];
        line.copy_from_slice(s);
        d.copy_from_slice(&line);
    }
    d.into_remainder().copy_from_slice(s.remainder());
}

/// The error a panic in a worker becomes.
fn panicked(payload: &(dyn std::any::Any + Send)) -> KvError {
    let msg = payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned());
    KvError::Invariant(format!("a transfer worker panicked: {}", msg.as_deref().unwrap_or("(no message)")))
}

/// What a part owes when it ends, however it ends (run, panicked, or dropped unrun):
/// release its slots, then report its result (an error if it never ran).
pub struct Ticket {
    done: Arc<Completion>,
    /// `None` only inside `drop`.
    host: Option<Arc<HostMemory>>,
    reads: Vec<u32>,
    writes: Vec<u32>,
    result: Option<Result<()>>,
}

impl Ticket {
    /// The ticket of a part that marked `reads` and `writes` in `host`.
    pub fn new(done: Arc<Completion>, host: Arc<HostMemory>, reads: Vec<u32>, writes: Vec<u32>) -> Self {
        Self { done, host: Some(host), reads, writes, result: None }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(host) = self.host.take() {
            host.release(&self.reads, &self.writes);
        }
        let result = self.result.take().unwrap_or_else(|| Err(invalid!("a transfer was dropped before it ran")));
        self.done.report(result);
    }
}

/// Start worker `i`: it runs the parts `queue` hands it until the queue closes and is
/// empty.
pub fn spawn(i: usize, queue: Arc<Mutex<Receiver<Part>>>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("pykvpool-transfer-{i}")).spawn(move || loop {
        // The lock is held while waiting for a part, never while copying.
        let next = queue.lock().unwrap_or_else(|p| p.into_inner()).recv();
        match next {
            Ok(part) => part.run(),
            Err(_) => break,
        }
    })
}
