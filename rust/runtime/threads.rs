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
}
