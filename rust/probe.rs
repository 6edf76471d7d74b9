//! Machine probes that give the kernel's benchmark its ceilings, measured in the same run:
//!
//! - [`read_bandwidth`]: bytes/s of a multi-accumulator SIMD sum over a buffer far larger
//!   than the last-level cache, allocated like the KV cache ([`AlignedBuf`], 2 MiB
//!   huge pages) and read by the same rayon pool, each thread streaming one contiguous
//!   share. This is what decode attention can at best reach.
//! - [`peak_flops`]: f32 FLOP/s of independent FMA chains held in registers (no memory
//!   traffic), per the widest vector unit available.
//!
//! Both report the best of several repetitions: interference on a shared machine only
//! ever slows a run down.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

use crate::aligned::AlignedBuf;
use crate::error::Result;
use crate::invalid;
use crate::kernel::Isa;

/// Default probe buffer: 8x a 32 MiB L3, so the sum streams from DRAM.
pub const DEFAULT_PROBE_BYTES: usize = 256 << 20;
const REPS: usize = 7;

/// Sum of `x` (as f32), using the widest available SIMD with 8 independent accumulators
/// so the loop is bound by loads, not by add latency.
pub fn sum_f32(x: &[f32]) -> f32 {
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
    let mut acc = [0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        acc.iter_mut().zip(c).for_each(|(a, &v)| *a += v);
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); 8];
    let chunks = x.chunks_exact(128);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (u, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 128 f32; lane block u covers c[16u..16u + 16].
            *a = _mm512_add_ps(*a, unsafe { _mm512_loadu_ps(c.as_ptr().add(16 * u)) });
        }
    }
    let s = acc.iter().fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a));
    _mm512_reduce_add_ps(s) + tail
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 8];
    let chunks = x.chunks_exact(64);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (u, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 64 f32; lane block u covers c[8u..8u + 8].
            *a = _mm256_add_ps(*a, unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * u)) });
        }
    }
    let mut lanes = [0f32; 8];
    let s = acc.iter().fold(_mm256_setzero_ps(), |s, &a| _mm256_add_ps(s, a));
    // SAFETY: lanes holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), s) };
    lanes.iter().sum::<f32>() + tail
}

/// Read bandwidth in bytes/s over `nbytes` (default [`DEFAULT_PROBE_BYTES`]) with
/// `threads` threads (default: the kernel's pool).
pub fn read_bandwidth(nbytes: Option<usize>, threads: Option<usize>) -> Result<f64> {
    let nbytes = nbytes.unwrap_or(DEFAULT_PROBE_BYTES);
    if !(1 << 20..=1 << 40).contains(&nbytes) {
        return Err(invalid!("probe size must be in 1 MiB..=1 TiB, got {nbytes} bytes"));
    }
    let pool = crate::threads::pool_with(threads)?;
    let mut buf = AlignedBuf::zeroed(nbytes)?;
    let n = nbytes / 4;
    let share = n.div_ceil(pool.current_num_threads()).next_multiple_of(1024);
    {
        let bytes = buf.as_mut_slice();
        // First touch from the threads that will read (fault in pages; NUMA locality).
        pool.install(|| bytes.par_chunks_mut(share * 4).for_each(|c| c.fill(1)));
    }
    let x: &[f32] = {
        let b = buf.as_slice();
        // SAFETY: the buffer is 2 MiB-aligned, we read n * 4 <= len bytes, and every bit
        // pattern is a valid f32.
        unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), n) }
    };
    let mut best = f64::INFINITY;
    for _ in 0..REPS {
        let t = Instant::now();
        let s: f32 = pool.install(|| x.par_chunks(share).map(sum_f32).sum());
        black_box(s);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok((n * 4) as f64 / best)
}

/// Peak f32 FLOP/s (2 per FMA lane) with `threads` threads (default: the kernel's pool).
pub fn peak_flops(threads: Option<usize>) -> Result<f64> {
    let pool = crate::threads::pool_with(threads)?;
    let nt = pool.current_num_threads();
    const ITERS: u64 = 20_000_000;
    let mut best = f64::INFINITY;
    let mut flops_per_thread = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let f: Vec<f64> = pool.install(|| (0..nt).into_par_iter().map(|_| fma_loop(ITERS)).collect());
        best = best.min(t.elapsed().as_secs_f64());
        flops_per_thread = f[0];
    }
    Ok(flops_per_thread * nt as f64 / best)
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
    fn sum_matches_scalar_including_tails() {
        for n in [0usize, 1, 63, 64, 127, 128, 129, 1000] {
            let x: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
            assert_eq!(sum_f32(&x), x.iter().sum::<f32>(), "n={n}");
        }
    }

    #[test]
    fn probes_return_positive_rates_and_reject_bad_sizes() {
        assert!(read_bandwidth(Some(4 << 20), Some(1)).unwrap() > 0.0);
        assert!(read_bandwidth(Some(1000), None).is_err());
        assert!(fma_loop(10) > 0.0);
    }
}
