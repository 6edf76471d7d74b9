//! The disk tier on a thread of its own: a [`DiskWorker`] owns a [`DiskTier`] and runs the
//! store's operations on it one at a time, in the order they were sent. Writes are sent
//! and not waited for ([`DiskWorker::send`]), so a pool call that demotes blocks to disk
//! returns while they are written; reads wait ([`DiskWorker::run`]) and, coming after the
//! writes sent before them, see them. The queue holds at most a bounded number of
//! operations: a sender blocks while it is full, so the bytes waiting are bounded too.
//!
//! While its queue is empty the thread makes spare files ahead of the next puts
//! ([`DiskTier::make_spare`], one at a time, checking the queue between two), so a burst
//! of demotions into free capacity does not create files.
//!
//! A failure of an operation nobody waits for is kept and reported by the next
//! [`DiskWorker::take_error`]. Dropping the worker runs the queue to its end and joins the
//! thread; a process killed meanwhile loses the writes still queued (each block is
//! written whole or not at all, see `DiskTier`).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::{KvError, Result};
use crate::invalid;
use crate::offload::disk::DiskTier;

type Op = Box<dyn FnOnce(&mut DiskTier) + Send>;

/// A [`DiskTier`] behind its own thread.
pub struct DiskWorker {
    queue: Option<SyncSender<Op>>,
    thread: Option<JoinHandle<()>>,
    error: Arc<Mutex<Option<KvError>>>,
}

impl std::fmt::Debug for DiskWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DiskWorker")
    }
}

impl DiskWorker {
    /// Start the thread (`pykvpool-disk`) that owns `disk`, with a queue of `depth`
    /// operations (at least 1), for blocks of `payload_len` bytes of which the tier holds
    /// at most `capacity_blocks` (the bounds of the spares it makes ahead).
    ///
    /// Errors (`InvalidArgument`): the system refused a thread.
    pub fn new(disk: DiskTier, depth: usize, payload_len: u64, capacity_blocks: usize) -> Result<Self> {
        let (tx, rx) = sync_channel::<Op>(depth.max(1));
        let thread = std::thread::Builder::new()
            .name("pykvpool-disk".into())
            .spawn(move || serve(disk, rx, (payload_len, capacity_blocks)))
            .map_err(|e| invalid!("disk tier: cannot start its thread: {e}"))?;
        Ok(Self { queue: Some(tx), thread: Some(thread), error: Arc::default() })
    }

    /// Queue `f` and return at once (blocking only while the queue is full); a failure
    /// it returns is kept for [`Self::take_error`].
    pub fn send(&self, f: impl FnOnce(&mut DiskTier) -> Result<()> + Send + 'static) {
        let error = self.error.clone();
        let op: Op = Box::new(move |d| {
            if let Err(e) = f(d) {
                error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            }
        });
        if let Some(q) = &self.queue {
            if q.send(op).is_err() {
                self.keep(KvError::Invariant("disk tier: its thread is gone".into()));
            }
        }
    }

    /// Queue `f` after everything sent before and wait for its result.
    ///
    /// Errors: `Invariant` when the thread is gone (a panic in an operation).
    pub fn run<R: Send + 'static>(&self, f: impl FnOnce(&mut DiskTier) -> R + Send + 'static) -> Result<R> {
        let (tx, rx) = std::sync::mpsc::channel();
        let op: Op = Box::new(move |d| {
            let _ = tx.send(f(d));
        });
        let gone = || KvError::Invariant("disk tier: its thread is gone".into());
        self.queue.as_ref().ok_or_else(gone)?.send(op).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())
    }

    /// The first failure of an operation nobody waited for, since the last call.
    pub fn take_error(&self) -> Option<KvError> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn keep(&self, e: KvError) {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
    }
}

/// The thread: run each operation in turn until the queue closes; while none waits, make
/// a spare file, or wait when there is nothing to make (or making one failed: it is
/// tried again after the next operation).
fn serve(mut disk: DiskTier, rx: Receiver<Op>, (payload_len, capacity_blocks): (u64, usize)) {
    loop {
        let op = match rx.try_recv() {
            Ok(op) => op,
            Err(TryRecvError::Empty) if matches!(disk.make_spare(payload_len, capacity_blocks), Ok(true)) => continue,
            Err(TryRecvError::Empty) => match rx.recv() {
                Ok(op) => op,
                Err(_) => return,
            },
            Err(TryRecvError::Disconnected) => return,
        };
        op(&mut disk);
    }
}

impl Drop for DiskWorker {
    /// Run the queue to its end, then join the thread (the tier closes with it).
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
