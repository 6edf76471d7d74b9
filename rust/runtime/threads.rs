//! The rayon thread pool shared by the attention kernel and the bandwidth probe.
//!
//! A dedicated pool (not rayon's global one) so the thread count can change at run time:
//! [`set_num_threads`] swaps in a new pool; calls already running keep the old one until
//! they finish. The first use reads `PYKVPOOL_NUM_THREADS`, else uses every CPU the
//! process may run on.

use std::sync::{Arc, Mutex};

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::error::Result;
use crate::invalid;

/// Environment variable giving the initial thread count.
pub const ENV_THREADS: &str = "PYKVPOOL_NUM_THREADS";
/// Upper bound on threads, to catch typos like `set_num_threads(10**6)`.
pub const MAX_THREADS: usize = 1024;

static POOL: Mutex<Option<Arc<ThreadPool>>> = Mutex::new(None);

fn build(n: usize) -> Result<Arc<ThreadPool>> {
    if n == 0 || n > MAX_THREADS {
        return Err(invalid!("threads must be in 1..={MAX_THREADS}, got {n}"));
    }
    ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("pykvpool-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|e| invalid!("cannot start {n} threads: {e}"))
}

/// Initial thread count: `PYKVPOOL_NUM_THREADS` when set to a valid count, else the
/// available parallelism. An invalid value is ignored rather than failing every call.
fn default_threads() -> usize {
    std::env::var(ENV_THREADS)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| (1..=MAX_THREADS).contains(&n))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The current pool, created on first use.
pub fn pool() -> Result<Arc<ThreadPool>> {
    let mut guard = POOL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = guard.as_ref() {
        return Ok(p.clone());
    }
    let p = build(default_threads())?;
    *guard = Some(p.clone());
    Ok(p)
}

/// A pool with `threads` threads when given (a temporary one if it differs from the
/// current count), else the current pool.
pub fn pool_with(threads: Option<usize>) -> Result<Arc<ThreadPool>> {
    let current = pool()?;
    match threads {
        Some(n) if n != current.current_num_threads() => build(n),
        _ => Ok(current),
    }
}

/// Replace the pool with one of `n` threads.
pub fn set_num_threads(n: usize) -> Result<()> {
    let p = build(n)?;
    *POOL.lock().unwrap_or_else(|p| p.into_inner()) = Some(p);
    Ok(())
}

/// Run `worker` as `min(threads, items)` workers at once, the calling thread one of them
/// and pool threads the others (each takes items from a shared counter until none are
/// left, so a worker that starts late finds less or nothing to do), or once on the
/// calling thread alone when one worker is all the work can use (a one-thread pool, or
/// at most one item): handing a call to a pool thread and waiting for it costs two thread
/// switches, 30-100 us on a shared machine, more than a small decode's whole kernel time.
/// [`inline`] says which. The caller works while the pool's threads wake instead of
/// sleeping until they finish: 8 sequences of 1 token at 2 threads took 70 us where the
/// pool alone took 89 (medians; `docs/experiments.md`, "Decode attention: work and
/// scheduling").
pub fn run_workers(pool: &ThreadPool, items: usize, worker: impl Fn() + Sync) {
    if inline(pool, items) {
        worker();
    } else {
        let helpers = pool.current_num_threads().min(items) - 1;
        pool.in_place_scope(|s| {
            for _ in 0..helpers {
                s.spawn(|_| worker());
            }
            worker();
        });
    }
}

/// Whether `items` pieces of work run on the calling thread: the pool has one thread
/// or there is at most one piece.
pub fn inline(pool: &ThreadPool, items: usize) -> bool {
    pool.current_num_threads() == 1 || items <= 1
}

/// Threads of the current pool.
pub fn num_threads() -> Result<usize> {
    Ok(pool()?.current_num_threads())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_validated_and_temporary_pools_have_their_size() {
        assert!(set_num_threads(0).is_err());
        assert!(set_num_threads(MAX_THREADS + 1).is_err());
        assert_eq!(pool_with(Some(3)).unwrap().current_num_threads(), 3);
        assert!(num_threads().unwrap() >= 1);
    }

    #[test]
    fn run_workers_inline_for_one_thread_or_one_item_else_on_the_caller_and_pool_threads() {
        let caller = std::thread::current().id();
        let one = pool_with(Some(1)).unwrap();
        let ran = Mutex::new(Vec::new());
        run_workers(&one, 5, || ran.lock().unwrap().push(std::thread::current().id()));
        assert_eq!(*ran.lock().unwrap(), vec![caller]);
        let two = pool_with(Some(2)).unwrap();
        ran.lock().unwrap().clear();
        run_workers(&two, 1, || ran.lock().unwrap().push(std::thread::current().id()));
        assert_eq!(*ran.lock().unwrap(), vec![caller]);
        ran.lock().unwrap().clear();
        // As many workers as threads (or items, if fewer): the caller once, the others on
        // pool threads (a pool thread that wakes first may run two of them in turn: the
        // second then finds the shared counter done, as a late broadcast job would).
        for (threads, items, workers) in [(2, 2, 2), (2, 5, 2), (3, 2, 2), (3, 9, 3)] {
            let pool = pool_with(Some(threads)).unwrap();
            ran.lock().unwrap().clear();
            run_workers(&pool, items, || ran.lock().unwrap().push(std::thread::current().id()));
            let ids = ran.lock().unwrap().clone();
            assert_eq!(ids.len(), workers, "{threads} threads, {items} items");
            assert_eq!(ids.iter().filter(|&&t| t == caller).count(), 1, "{threads} threads, {items} items");
        }
    }
}
