//! Completion of a submitted batch: the [`Handle`] the caller keeps and the
//! [`Completion`] the batch's parts report to.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::{KvError, Result};

/// Parts still running and the first error any reported.
#[derive(Debug)]
struct State {
    remaining: usize,
    error: Option<KvError>,
}

/// Shared between a [`Handle`] and the parts of its batch; a part reports once.
#[derive(Debug)]
pub struct Completion {
    state: Mutex<State>,
    done: Condvar,
}

impl Completion {
    /// A completion waiting for `parts` reports (done at once when `parts == 0`).
    pub fn new(parts: usize) -> Arc<Self> {
        Arc::new(Self { state: Mutex::new(State { remaining: parts, error: None }), done: Condvar::new() })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One part is done, with `result`; the first error is kept.
    pub fn report(&self, result: Result<()>) {
        let mut s = self.state();
        if let Err(e) = result {
            s.error.get_or_insert(e);
        }
        s.remaining = s.remaining.saturating_sub(1);
        if s.remaining == 0 {
            self.done.notify_all();
        }
    }
}

/// A submitted batch: ask whether it is done ([`Handle::poll`]) or block until it is
/// ([`Handle::wait`]). Dropping a handle does not cancel the batch: it still completes
/// (at the latest when the engine is dropped, which joins its threads).
#[derive(Debug, Clone)]
pub struct Handle {
    done: Arc<Completion>,
}

impl Handle {
    pub(crate) fn new(done: Arc<Completion>) -> Self {
        Self { done }
    }

    /// A handle already done with `result` (a batch refused before it ran, or an empty
    /// one).
    pub(crate) fn finished(result: Result<()>) -> Self {
        let done = Completion::new(1);
        done.report(result);
        Self { done }
    }

    /// Whether every copy of the batch has finished (successfully or not); never blocks.
    /// Once `true`, the batch's blocks and slots may be used again, and `wait` returns at
    /// once.
    pub fn poll(&self) -> bool {
        self.done.state().remaining == 0
    }

    /// Block until every copy of the batch has finished; then the batch's blocks and
    /// slots may be used again.
    ///
    /// Errors: the batch was refused before anything was copied (`InvalidArgument`: a
    /// block or slot out of range, a slot of another tier or not live, named twice, or in
    /// use by another transfer; sizes that differ), or a copy failed (`InvalidArgument`)
    /// or panicked (`Invariant`, a bug). On a failure after copying started, the other
    /// copies of the batch still ran, and the failed one may have been partly written.
    pub fn wait(&self) -> Result<()> {
        let mut s = self.done.state();
        while s.remaining > 0 {
            s = self.done.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.error.clone().map_or(Ok(()), Err)
    }
}
