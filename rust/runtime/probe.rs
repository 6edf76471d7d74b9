//! Machine probes that give the kernel's benchmark its ceilings, measured in the same run:
//!
//! - [`read_bandwidth`]: bytes/s of a multi-accumulator SIMD sum over a buffer far larger
//!   than the last-level cache, allocated like the KV cache ([`AlignedBuf`], 2 MiB
//!   huge pages) and read by the same rayon pool, each thread streaming one contiguous
//!   share. This is what decode attention can at best reach.
//! - [`read_bandwidth_of`]: the same sweep over memory that already exists, such as a KV
//!   cache's own buffer. On a virtual machine the read rate of a buffer depends on where
//!   its pages landed (measured here: fresh 128 MiB buffers at 2 threads read anywhere
//!   from 45 to 100 GB/s, run to run), so the kernel's fair yardstick is its own pages.
//! - [`peak_flops`]: f32 FLOP/s of independent FMA chains held in registers (no memory
//!   traffic), per the widest vector unit available.
//!
//! Both report the best of several repetitions: interference on a shared machine only
//! ever slows a run down. Each times its sweeps by a [`Clock`]: the wall clock, or the
//! slowest thread's CPU time (which leaves out the time a virtual CPU was taken away).

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

use super::clock::{slowest_thread, thread_cpu_seconds, Clock};
use crate::kv::aligned::AlignedBuf;
use crate::error::Result;
use crate::invalid;
#[cfg(target_arch = "x86_64")]
use crate::attention::Isa;

/// Default probe buffer: 8x a 32 MiB L3, so the sum streams from DRAM.
pub const DEFAULT_PROBE_BYTES: usize = 256 << 20;
const REPS: usize = 7;

/// Wrapping sum of the native-endian 32-bit words of `x` (a last partial word is
/// zero-padded), using the widest available SIMD with 8 independent accumulators so the
/// loop is bound by loads, not by add latency. Integer adds: any bit pattern is a valid
/// input (a KV cache's f16/bf16 bytes read as f32 could be denormals), and the result is
/// exact whatever the order, which makes every path testable against the plain loop.
pub fn sum_words(x: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if Isa::Avx512.supported() {
            // SAFETY: avx512f checked just above.
            return unsafe { sum_avx512(x) };
        }
        if Isa::Avx2.supported() {
            // SAFETY: avx2 checked just above.
            return unsafe { sum_avx2(x) };
        }
    }
    sum_words_scalar(x)
}

fn sum_words_scalar(x: &[u8]) -> u32 {
    let mut acc = [0u32; 16];
    let chunks = x.chunks_exact(64);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, w) in acc.iter_mut().zip(c.chunks_exact(4)) {
            *a = a.wrapping_add(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
        }
    }
    let mut s = acc.iter().fold(0u32, |s, &a| s.wrapping_add(a));
    for w in tail.chunks(4) {
        let mut b = [0u8; 4];
        b[..w.len()].copy_from_slice(w);
        s = s.wrapping_add(u32::from_ne_bytes(b));
    }
    s
}

macro_rules! sum_kernel {
    ($name:ident, $feat:literal, $vec:ty, $bytes:expr, $zero:ident, $load:ident, $add:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name(x: &[u8]) -> u32 {
            use std::arch::x86_64::*;
            let mut acc = [$zero(); 8];
            let chunks = x.chunks_exact(8 * $bytes);
            let tail = sum_words_scalar(chunks.remainder());
            for c in chunks {
                for (u, a) in acc.iter_mut().enumerate() {
                    // SAFETY: `c` holds 8 vectors; vector u covers c[u * bytes..(u + 1) * bytes].
                    *a = $add(*a, unsafe { $load(c.as_ptr().add(u * $bytes).cast::<$vec>()) });
                }
            }
            let mut lanes = [0u32; $bytes / 4];
            let s = acc.iter().fold($zero(), |s, &a| $add(s, a));
            // SAFETY: `lanes` holds exactly one vector.
            unsafe { std::ptr::copy_nonoverlapping((&s as *const $vec).cast::<u32>(), lanes.as_mut_ptr(), lanes.len()) };
            lanes.iter().fold(tail, |s, &l| s.wrapping_add(l))
        }
    };
}
sum_kernel!(sum_avx512, "avx512f", __m512i, 64, _mm512_setzero_si512, _mm512_loadu_si512, _mm512_add_epi32);
sum_kernel!(sum_avx2, "avx2", __m256i, 32, _mm256_setzero_si256, _mm256_loadu_si256, _mm256_add_epi32);

const MAX_PASSES: usize = 1000;

/// Read bandwidth in bytes/s over a fresh buffer of `nbytes` (default
/// [`DEFAULT_PROBE_BYTES`]) with `threads` threads (default: the kernel's pool): best of
/// `passes` (default 7) sweeps, timed by `clock`.
pub fn read_bandwidth(nbytes: Option<usize>, threads: Option<usize>, passes: Option<usize>, clock: Clock) -> Result<f64> {
    let nbytes = nbytes.unwrap_or(DEFAULT_PROBE_BYTES);
    // Every byte is touched: a size beyond the machine's memory would get the process
    // killed instead of an error.
    let max = max_probe_bytes();
    if !(1 << 20..=max).contains(&nbytes) {
        return Err(invalid!("nbytes must be in 1 MiB..={max} bytes (half the physical memory, at most 1 TiB), got {nbytes}"));
    }
    let passes = check_passes(passes)?;
    let pool = crate::runtime::threads::pool_with(threads)?;
    let mut buf = AlignedBuf::zeroed(nbytes)?;
    let share = share_of(nbytes, pool.current_num_threads());
    {
        let bytes = &mut buf.as_mut_slice()[..nbytes];
        // First touch from the threads that will read (fault in pages; NUMA locality).
        pool.install(|| bytes.par_chunks_mut(share).for_each(|c| c.fill(1)));
    }
    Ok(time_reads(&buf.as_slice()[..nbytes], &pool, share, passes, clock))
}

/// Largest fresh probe buffer: half the physical memory, at most 1 TiB (1 TiB when the
/// memory size is unknown).
fn max_probe_bytes() -> usize {
    #[cfg(unix)]
    // SAFETY: sysconf only reads system configuration; any argument is allowed.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    #[cfg(not(unix))]
    let (pages, page) = (-1i64, -1i64);
    let phys = usize::try_from(pages).ok().zip(usize::try_from(page).ok()).and_then(|(n, p)| n.checked_mul(p));
    phys.filter(|&b| b > 0).map_or(1 << 40, |b| (b / 2).min(1 << 40))
}

/// Read bandwidth in bytes/s over memory that already exists (a KV cache's own buffer:
/// the same pages the kernel reads, which on a virtual machine need not stream as fast
/// as a fresh allocation), best of `passes` (default 7) sweeps with `threads` threads,
/// timed by `clock`.
pub fn read_bandwidth_of(bytes: &[u8], threads: Option<usize>, passes: Option<usize>, clock: Clock) -> Result<f64> {
    if bytes.len() < 1 << 20 {
        return Err(invalid!("the cache must hold at least 1 MiB to be probed, got {} bytes", bytes.len()));
    }
    let passes = check_passes(passes)?;
    let pool = crate::runtime::threads::pool_with(threads)?;
    let share = share_of(bytes.len(), pool.current_num_threads());
    Ok(time_reads(bytes, &pool, share, passes, clock))
}

pub(crate) fn check_passes(passes: Option<usize>) -> Result<usize> {
    match passes.unwrap_or(REPS) {
        p @ 1..=MAX_PASSES => Ok(p),
        p => Err(invalid!("passes must be in 1..={MAX_PASSES}, got {p}")),
    }
}

/// Bytes per thread: one contiguous run each, a multiple of the SIMD loop's 512 bytes.
fn share_of(len: usize, threads: usize) -> usize {
    len.div_ceil(threads.max(1)).next_multiple_of(4096)
}

fn time_reads(x: &[u8], pool: &rayon::ThreadPool, share: usize, passes: usize, clock: Clock) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..passes {
        let (sums, secs) = timed(pool, clock, || x.par_chunks(share).map(|c| on_clock(clock, || sum_words(c))).collect());
        black_box(sums.iter().fold(0u32, |a, &s| a.wrapping_add(s)));
        best = best.min(secs);
    }
    x.len() as f64 / best
}

/// `f`'s result (`work` run on the pool: each piece's value with its thread and CPU
/// seconds, see [`on_clock`]) and its seconds by `clock`; never zero.
fn timed<R: Send>(pool: &rayon::ThreadPool, clock: Clock, work: impl FnOnce() -> Vec<(R, Option<usize>, f64)> + Send) -> (Vec<R>, f64) {
    let t = Instant::now();
    let pieces = pool.install(work);
    let wall = t.elapsed().as_secs_f64();
    let secs = match clock {
        Clock::Wall => wall,
        Clock::Cpu => slowest_thread(pieces.iter().map(|&(_, th, s)| (th, s))),
    };
    (pieces.into_iter().map(|(r, _, _)| r).collect(), secs.max(1e-9))
}

/// A piece of a probe's work: its value, the pool thread that ran it and its CPU seconds
/// (read only for [`Clock::Cpu`]).
fn on_clock<R>(clock: Clock, f: impl FnOnce() -> R) -> (R, Option<usize>, f64) {
    let t0 = if clock == Clock::Cpu { thread_cpu_seconds() } else { 0.0 };
    let r = f();
    let secs = if clock == Clock::Cpu { thread_cpu_seconds() - t0 } else { 0.0 };
    (r, rayon::current_thread_index(), secs)
}

/// Peak f32 FLOP/s (2 per FMA lane) with `threads` threads (default: the kernel's pool),
/// best of 3 runs timed by `clock`.
pub fn peak_flops(threads: Option<usize>, clock: Clock) -> Result<f64> {
    let pool = crate::runtime::threads::pool_with(threads)?;
    let nt = pool.current_num_threads();
    const ITERS: u64 = 20_000_000;
    let mut best = f64::INFINITY;
    let mut flops = 0f64;
    for _ in 0..3 {
        let (f, secs) = timed(&pool, clock, || (0..nt).into_par_iter().map(|_| on_clock(clock, || fma_loop(ITERS))).collect());
        best = best.min(secs);
        flops = f.iter().sum();
    }
    Ok(flops / best)
}

/// Run `iters` rounds of 12 independent FMA chains; returns the FLOPs done.
fn fma_loop(iters: u64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if Isa::Avx512.supported() {
            // SAFETY: avx512f and fma checked just above.
            return unsafe { fma_avx512(iters) };
        }
        if Isa::Avx2.supported() {
            // SAFETY: avx2 and fma checked just above.
            return unsafe { fma_avx2(iters) };
        }
    }
    let mut a = [1f32; 12];
    for _ in 0..iters {
        for x in a.iter_mut() {
            *x = x.mul_add(0.999_999, 1e-7);
        }
    }
    black_box(a);
    (iters * 12 * 2) as f64
}

macro_rules! fma_kernel {
    ($name:ident, $feat:literal, $lanes:expr, $set1:ident, $fma:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feat)]
        unsafe fn $name(iters: u64) -> f64 {
            use std::arch::x86_64::*;
            let (m, c) = ($set1(black_box(0.999_999)), $set1(black_box(1e-7)));
            let mut a = [$set1(1.0); 12];
            for _ in 0..iters {
                for x in a.iter_mut() {
                    *x = $fma(*x, m, c);
                }
            }
            black_box(a);
            (iters * 12 * $lanes * 2) as f64
        }
    };
}
fma_kernel!(fma_avx512, "avx512f,fma", 16, _mm512_set1_ps, _mm512_fmadd_ps);
fma_kernel!(fma_avx2, "avx2,fma", 8, _mm256_set1_ps, _mm256_fmadd_ps);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sum_path_matches_the_word_loop_including_tails() {
        for n in [0usize, 1, 3, 4, 63, 64, 255, 256, 511, 512, 513, 4099, 100_000] {
            let x: Vec<u8> = (0..n).map(|i| (i * 131 % 251) as u8).collect();
            let mut want = 0u32;
            for w in x.chunks(4) {
                let mut b = [0u8; 4];
                b[..w.len()].copy_from_slice(w);
                want = want.wrapping_add(u32::from_ne_bytes(b));
            }
            assert_eq!(sum_words_scalar(&x), want, "scalar n={n}");
            assert_eq!(sum_words(&x), want, "best path n={n}");
            #[cfg(target_arch = "x86_64")]
            {
                if Isa::Avx2.supported() {
                    // SAFETY: avx2 checked just above.
                    assert_eq!(unsafe { sum_avx2(&x) }, want, "avx2 n={n}");
                }
                if Isa::Avx512.supported() {
                    // SAFETY: avx512f checked just above.
                    assert_eq!(unsafe { sum_avx512(&x) }, want, "avx512 n={n}");
                }
            }
        }
    }

    #[test]
    fn probes_return_positive_rates_and_reject_bad_sizes() {
        for clock in [Clock::Wall, Clock::Cpu] {
            assert!(read_bandwidth(Some(4 << 20), Some(1), Some(2), clock).unwrap() > 0.0);
            assert!(read_bandwidth(Some(1000), None, None, clock).is_err());
            assert!(read_bandwidth(Some(4 << 20), None, Some(0), clock).is_err());
            let mem = vec![7u8; 3 << 20];
            assert!(read_bandwidth_of(&mem, Some(2), Some(1), clock).unwrap() > 0.0);
            assert!(read_bandwidth_of(&mem[..1000], None, None, clock).is_err());
        }
        assert!(fma_loop(10) > 0.0);
    }
}
