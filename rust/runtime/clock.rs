//! The clocks the machine probes time their sweeps by ([`super::probe`]).
//!
//! On a shared virtual machine the hypervisor takes the virtual CPU away now and then
//! (steal time: seen here at up to a quarter of a probe's wall time in busy phases, none
//! in quiet ones). A wall-clock rate counts those pauses as slowness of the machine; a
//! thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`) leaves them out, as it does time the OS
//! gave another process, while a thread stalled on memory keeps counting. So
//! [`Clock::Cpu`] rates are what the hardware did while it ran the probe, comparable with
//! kernel calls timed the same way, and [`Clock::Wall`] rates are what a caller waited for.

use crate::error::Result;
use crate::invalid;

/// How a probe times a sweep run by a pool of threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Elapsed time from the sweep's start to its last thread's end.
    Wall,
    /// The CPU seconds of the thread that spent the most on the sweep (each thread's
    /// share summed over the pieces it ran).
    Cpu,
}

impl Clock {
    /// `"wall"` or `"cpu"`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "wall" => Ok(Clock::Wall),
            "cpu" if cfg!(unix) => Ok(Clock::Cpu),
            "cpu" => Err(invalid!("clock \"cpu\" needs a per-thread CPU clock, which this platform lacks")),
            _ => Err(invalid!("clock must be \"wall\" or \"cpu\", got {s:?}")),
        }
    }
}

/// The calling thread's CPU time in seconds (0 where the platform has no such clock:
/// [`Clock::parse`] refuses [`Clock::Cpu`] there).
pub fn thread_cpu_seconds() -> f64 {
    #[cfg(unix)]
    {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `t` is a valid, writable timespec; the clock id is a constant Linux and
        // the BSDs define. On failure `t` keeps its zeros.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
    }
    #[cfg(not(unix))]
    {
        0.0
    }
}

/// The largest per-thread total of `(thread index, CPU seconds)` pieces of work: a pool
/// thread that ran two pieces spent their sum. Pieces run outside a pool (index `None`)
/// count as one thread of their own.
pub fn slowest_thread(pieces: impl IntoIterator<Item = (Option<usize>, f64)>) -> f64 {
    let mut per: Vec<(Option<usize>, f64)> = Vec::new();
    for (thread, secs) in pieces {
        match per.iter_mut().find(|(t, _)| *t == thread) {
            Some((_, total)) => *total += secs,
            None => per.push((thread, secs)),
        }
    }
    per.into_iter().map(|(_, s)| s).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_knows_wall_and_cpu_only() {
        assert_eq!(Clock::parse("wall").unwrap(), Clock::Wall);
        assert_eq!(Clock::parse("cpu").is_ok(), cfg!(unix));
        for bad in ["", "Wall", "thread", "cpu "] {
            assert!(Clock::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn slowest_thread_sums_each_threads_pieces() {
        assert_eq!(slowest_thread([]), 0.0);
        assert_eq!(slowest_thread([(Some(0), 1.0), (Some(1), 1.5), (Some(0), 1.0)]), 2.0);
        assert_eq!(slowest_thread([(None, 0.5), (Some(0), 0.25), (None, 0.25)]), 0.75);
    }

    #[cfg(unix)]
    #[test]
    fn thread_cpu_time_advances_with_work_not_with_sleep() {
        let t0 = thread_cpu_seconds();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = thread_cpu_seconds() - t0;
        let t1 = thread_cpu_seconds();
        let mut x = 0u64;
        while thread_cpu_seconds() - t1 < 0.02 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(slept < 0.02, "50 ms asleep counted {slept} s of CPU time");
        assert!(thread_cpu_seconds() - t1 >= 0.02);
    }
}
