//! The transfer engine: batched, asynchronous copies of whole blocks between a device
//! region (a `KvCache`) and a host tier, on the engine's own threads (a small fixed
//! number, not the kernels' rayon pool), never touching Python.
//!
//! ```text
//! Batch::new(Arc<KvCache>) .store(block, slot) .load(slot, block) ...
//!     -> unsafe { engine.submit(&mut host, batch) } -> Handle (poll / wait)
//! ```
//!
//! # Ownership
//!
//! A submitted batch is checked whole on the caller's thread (blocks and slots in range,
//! slots live in the tier, named once, sizes equal), its slots are marked in use, and it
//! is split into at most `threads` parts. Each part holds `Arc`s of the device region and
//! of the tier's memory, so both outlive every copy even if the caller drops the cache,
//! the tier or the handle; the part drops them before it reports done. Copies run with
//! no lock held.
//!
//! # The rule callers follow
//!
//! The host side is enforced: until a batch is done, the tier refuses to read a slot it
//! writes and to write or free a slot it uses, and another batch may not store into
//! them. The device side is the caller's promise (`submit` is `unsafe`; the pool keeps
//! it with its block pins): until the handle is done,
//!
//! - a block being **stored** (device -> host) must not be written (it may be read);
//! - a block being **loaded** (host -> device) must not be read or written.
//!
//! # Failures
//!
//! A refused batch copies nothing and its handle fails (`InvalidArgument`). A worker
//! panic fails the handle of the part it ran (`Invariant`) and the worker goes on.
//! Dropping a handle does not cancel its batch; dropping the engine runs every batch
//! already submitted to its end and joins the threads.
//!
//! Files: `batch.rs` (the batch, its checks and parts), `worker.rs` (the threads and
//! the copies), `handle.rs`, `region.rs` (`DeviceRegion`, implemented for `KvCache`),
//! `pack.rs` (the same copies on the calling thread, and the slot byte order).

mod batch;
mod handle;
mod pack;
mod region;
mod worker;

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::Result;
use crate::invalid;
use crate::offload::host::HostTier;

pub use batch::{Batch, Job, MIN_PART_BYTES};
pub use handle::Handle;
pub use pack::{foreign_codes, pack, unpack};
pub use region::{slot_bytes_for, DeviceRegion, KvRegion};

/// Most worker threads an engine may have.
pub const MAX_TRANSFER_THREADS: usize = 64;

/// Worker threads that copy submitted batches.
pub struct TransferEngine {
    queue: Option<Sender<worker::Part>>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TransferEngine({} threads)", self.workers.len())
    }
}

impl TransferEngine {
    /// An engine with `threads` worker threads (named `pykvpool-transfer-<i>`). A batch
    /// runs on up to `threads` of them at once (one part per [`MIN_PART_BYTES`]).
    ///
    /// Errors (`InvalidArgument`): `threads` outside `1..=MAX_TRANSFER_THREADS`, or the
    /// system refused a thread (none is left running).
    pub fn new(threads: usize) -> Result<Self> {
        if !(1..=MAX_TRANSFER_THREADS).contains(&threads) {
            return Err(invalid!("threads must be in 1..={MAX_TRANSFER_THREADS}, got {threads}"));
        }
        let (tx, rx) = channel();
        let rx = Arc::new(Mutex::new(rx));
        let mut engine = Self { queue: Some(tx), workers: Vec::with_capacity(threads) };
        for i in 0..threads {
            // On an error `engine` drops: its queue closes and the started threads join.
            let w = worker::spawn(i, rx.clone()).map_err(|e| invalid!("threads: cannot start transfer thread {i}: {e}"))?;
            engine.workers.push(w);
        }
        Ok(engine)
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Start copying `batch` between its device region and `host`; returns at once.
    ///
    /// Never fails itself: a refused batch (see [`Handle::wait`]) returns a handle that
    /// is already done with the error, having copied and marked nothing. An empty batch
    /// is done at once.
    ///
    /// # Safety
    ///
    /// Until the returned handle is done ([`Handle::poll`] returned `true` or
    /// [`Handle::wait`] returned, on any clone of it), nothing but this batch may write
    /// the device bytes of a block it stores, nor read or write those of a block it
    /// loads: no kernel, no cache write, no other batch. (The host slots need no promise:
    /// the tier enforces their rule.)
    pub unsafe fn submit(&self, host: &mut HostTier, batch: Batch) -> Handle {
        if batch.is_empty() {
            return Handle::finished(Ok(()));
        }
        let (parts, done) = match batch::plan(batch, host, self.threads()) {
            Ok(p) => p,
            Err(e) => return Handle::finished(Err(e)),
        };
        for part in parts {
            if let Some(q) = &self.queue {
                // A send fails only with every worker gone; the part then drops unrun
                // and its ticket fails the handle.
                let _ = q.send(part);
            }
        }
        Handle::new(done)
    }
}

impl Drop for TransferEngine {
    /// Close the queue, let the workers finish every part already queued, join them.
    fn drop(&mut self) {
        drop(self.queue.take());
        for w in self.workers.drain(..) {
            // A worker catches the panics of its copies; an error here has nothing left
            // to report to.
            let _ = w.join();
        }
    }
}
