//! A batch of copy jobs between one device region and one host tier ([`Batch`]), and its
//! checks and split into parts for the workers ([`plan`]).

use std::ops::Range;
use std::sync::Arc;

use super::handle::Completion;
use super::region::DeviceRegion;
use super::worker::{Part, Planned, Ticket};
use crate::error::{vec_for, Result};
use crate::invalid;
use crate::offload::host::{HostTier, Slot};

/// A part gets at least this many bytes of copies before the batch is split further (a
/// handoff to another thread costs tens of microseconds: 4 MiB take about 400 us).
pub const MIN_PART_BYTES: usize = 4 << 20;

/// One copy of a whole block between the device and a host slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Job {
    /// Device block `block` -> host slot `slot` (offload on eviction).
    Store { block: usize, slot: Slot },
    /// Host slot `slot` -> device block `block` (a prefix hit).
    Load { slot: Slot, block: usize },
}

impl Job {
    fn block(&self) -> usize {
        match *self {
            Self::Store { block, .. } | Self::Load { block, .. } => block,
        }
    }

    fn slot(&self) -> &Slot {
        match self {
            Self::Store { slot, .. } | Self::Load { slot, .. } => slot,
        }
    }
}

/// Copy jobs between one device region and the host tier given at submit, run as one
/// unit: the handle is done when all are. Each device block and each slot may appear in
/// one job of a batch only.
pub struct Batch {
    device: Arc<dyn DeviceRegion>,
    jobs: Vec<Job>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("jobs", &self.jobs).finish_non_exhaustive()
    }
}

impl Batch {
    /// An empty batch on `device` (e.g. an `Arc<KvCache>`), which the engine keeps alive
    /// until the batch is done.
    pub fn new<D: DeviceRegion>(device: Arc<D>) -> Self {
        Self { device, jobs: Vec::new() }
    }

    /// [`Self::new`] on a region already behind `dyn`.
    pub fn from_dyn(device: Arc<dyn DeviceRegion>) -> Self {
        Self { device, jobs: Vec::new() }
    }

    /// Add a store: device block `block` -> host slot `slot`.
    pub fn store(&mut self, block: usize, slot: Slot) -> &mut Self {
        self.jobs.push(Job::Store { block, slot });
        self
    }

    /// Add a load: host slot `slot` -> device block `block`.
    pub fn load(&mut self, slot: Slot, block: usize) -> &mut Self {
        self.jobs.push(Job::Load { slot, block });
        self
    }

    /// The jobs, in the order added.
    pub fn jobs(&self) -> &[Job] {
        &self.jobs
    }

    /// Number of jobs.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether the batch has no job.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

/// Check `batch` against `host`, mark its slots in use and split it into at most
/// `threads` parts reporting to `done` (made for that many parts).
///
/// Errors (nothing marked): the checks of [`super::Handle::wait`]'s "refused" case.
pub fn plan(batch: Batch, host: &mut HostTier, threads: usize) -> Result<(Vec<Part>, Arc<Completion>)> {
    let Batch { device, jobs } = batch;
    let slot_bytes = device.slot_bytes();
    if slot_bytes != host.slot_bytes() {
        return Err(invalid!("batch: a device block takes {slot_bytes} bytes, a host slot {}", host.slot_bytes()));
    }
    let Checked { runs, jobs: planned } = check_jobs(device.as_ref(), host, &jobs, slot_bytes)?;
    unique(&planned.iter().map(|p| p.slot).collect::<Vec<_>>(), "slot")?;
    unique(&jobs.iter().map(Job::block).collect::<Vec<_>>(), "block")?;
    let (reads, writes) = split_uses(&planned);
    host.memory().acquire(&reads, &writes)?;
    // Marked: from here on nothing fails, so the raw-code flags can move.
    let raw = device.raw_writes();
    for p in &planned {
        if !p.load {
            host.set_raw_codes(p.slot, raw);
        } else if host.raw_codes(p.slot) {
            device.note_raw_writes();
        }
    }
    let n = parts_for(threads, jobs.len(), slot_bytes);
    let done = Completion::new(n);
    let runs: Arc<[Range<usize>]> = runs.into();
    let mut parts = Vec::with_capacity(n);
    for chunk in chunks(planned, n) {
        let (r, w) = split_uses(&chunk);
        let ticket = Ticket::new(done.clone(), host.memory().clone(), r, w);
        parts.push(Part::new(device.clone(), host.memory().clone(), runs.clone(), chunk, ticket));
    }
    Ok((parts, done))
}

/// A batch's jobs as the workers run them, and all their runs.
struct Checked {
    runs: Vec<Range<usize>>,
    jobs: Vec<Planned>,
}

/// Check every job and list its runs.
///
/// Errors: a slot not live in `host`, a block out of range, runs outside the region or
/// not `slot_bytes` long.
fn check_jobs(device: &dyn DeviceRegion, host: &HostTier, jobs: &[Job], slot_bytes: usize) -> Result<Checked> {
    let (_, mem_len) = device.memory();
    let mut planned = vec_for(jobs.len(), "batch")?;
    let mut runs = Vec::new();
    for (n, job) in jobs.iter().enumerate() {
        let slot = host.check(job.slot()).map_err(|e| invalid!("batch job {n}: {e}"))?;
        let block = job.block();
        if block >= device.num_blocks() {
            return Err(invalid!("batch job {n}: block {block} out of range 0..{}", device.num_blocks()));
        }
        let first = runs.len();
        device.block_runs(block, &mut runs).map_err(|e| invalid!("batch job {n}: {e}"))?;
        if n == 0 {
            // Every block has as many runs as the first: room for all, or an error.
            let more = (runs.len() - first).saturating_mul(jobs.len() - 1);
            runs.try_reserve_exact(more).map_err(|_| invalid!("batch: cannot allocate the runs of {} jobs", jobs.len()))?;
        }
        let mine = &runs[first..];
        if let Some(r) = mine.iter().find(|r| r.start > r.end || r.end > mem_len) {
            return Err(invalid!("batch job {n}: block {block}'s run {r:?} lies outside the region's {mem_len} bytes"));
        }
        let total: usize = mine.iter().map(|r| r.len()).sum();
        if total != slot_bytes {
            return Err(invalid!("batch job {n}: block {block}'s runs hold {total} bytes, not the slot's {slot_bytes}"));
        }
        planned.push(Planned { load: matches!(job, Job::Load { .. }), slot, runs: first..runs.len() });
    }
    Ok(Checked { runs, jobs: planned })
}

/// `Ok` when no value of `xs` repeats.
fn unique(xs: &[usize], what: &str) -> Result<()> {
    let mut sorted = xs.to_vec();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(invalid!("batch: {what} {} appears in more than one job", w[0])),
        None => Ok(()),
    }
}

/// Slots `jobs` read (loads) and write (stores).
fn split_uses(jobs: &[Planned]) -> (Vec<u32>, Vec<u32>) {
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    for j in jobs {
        // Slot indices are below the tier's capacity, at most `u32::MAX`.
        if j.load { &mut reads } else { &mut writes }.push(j.slot as u32);
    }
    (reads, writes)
}

/// Parts for `jobs` copies of `slot_bytes`: one per [`MIN_PART_BYTES`], at most one per
/// thread and per job, at least one.
fn parts_for(threads: usize, jobs: usize, slot_bytes: usize) -> usize {
    let by_bytes = jobs.saturating_mul(slot_bytes).div_ceil(MIN_PART_BYTES);
    threads.min(jobs).min(by_bytes).max(1)
}

/// `items` in `n` consecutive chunks of near-equal length.
fn chunks(mut items: Vec<Planned>, n: usize) -> Vec<Vec<Planned>> {
    let mut out = Vec::with_capacity(n);
    for k in (1..=n).rev() {
        let take = items.len().div_ceil(k);
        let rest = items.split_off(take.min(items.len()));
        out.push(std::mem::replace(&mut items, rest));
    }
    out
}
