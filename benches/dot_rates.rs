//! The compute roofs of the decode kernels' dot-product instructions, measured in one run
//! on one core: 512-bit `vfmadd231ps` (16 FMA), `vpdpbusd` (64 int8 multiply-adds, VNNI)
//! and `vdpbf16ps` (32 bf16 multiply-adds), each as 12 independent chains (enough to
//! cover their latency), and the three interleaved 1:4 as the `int8_scores` decode mixes
//! them (one `vpdpbusd` of q.k per 4 FMAs of p.v).
//!
//! Timing is thread CPU time (`CLOCK_THREAD_CPUTIME_ID`), so time the core spends on other
//! processes of a shared machine is not counted; best of 7 rounds. Prints instructions per
//! nanosecond and the ratio of each to the FMA's (the same-run baseline), which is what
//! `benches/bench_quant.py` takes for the roof of `int8_scores` (its docstring).
//!
//! Run: `cargo bench --bench dot_rates`.

use std::hint::black_box;

const ITERS: u64 = 20_000_000;

fn thread_cpu_s() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Best-of-7 instructions per ns of `f`, which runs `ITERS` rounds of `per` instructions.
fn rate(per: u64, f: impl Fn(u64)) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..7 {
        let t = thread_cpu_s();
        f(ITERS);
        best = best.min(thread_cpu_s() - t);
    }
    (ITERS * per) as f64 / best / 1e9
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,fma")]
    pub fn fma(n: u64) {
        let (m, c) = (_mm512_set1_ps(black_box(0.999_999)), _mm512_set1_ps(black_box(1e-7)));
        let mut a = [_mm512_set1_ps(1.0); 12];
        for _ in 0..n {
            for x in a.iter_mut() {
                *x = _mm512_fmadd_ps(*x, m, c);
            }
        }
        black_box(a);
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    pub fn dpbusd(n: u64) {
        let (u, s) = (_mm512_set1_epi8(black_box(3)), _mm512_set1_epi8(black_box(-2)));
        let mut a = [_mm512_setzero_si512(); 12];
        for _ in 0..n {
            for x in a.iter_mut() {
                *x = _mm512_dpbusd_epi32(*x, u, s);
            }
        }
        black_box(a);
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    pub fn dpbf16(n: u64) {
        // SAFETY: 64 bytes of plain data either way.
        let b: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi16(black_box(0x3f80))) };
        let mut a = [_mm512_setzero_ps(); 12];
        for _ in 0..n {
            for x in a.iter_mut() {
                *x = _mm512_dpbf16_ps(*x, b, b);
            }
        }
        black_box(a);
    }

    /// 2 `vpdpbusd` + 8 FMAs per round (12 chains in all): `int8_scores`' 1:4 mix.
    #[target_feature(enable = "avx512f,avx512vnni,fma")]
    pub fn mix(n: u64) {
        let (u, s) = (_mm512_set1_epi8(black_box(3)), _mm512_set1_epi8(black_box(-2)));
        let (m, c) = (_mm512_set1_ps(black_box(0.999_999)), _mm512_set1_ps(black_box(1e-7)));
        let mut a = [_mm512_setzero_si512(); 2];
        let mut f = [_mm512_set1_ps(1.0); 8];
        for _ in 0..n {
            for x in a.iter_mut() {
                *x = _mm512_dpbusd_epi32(*x, u, s);
            }
            for x in f.iter_mut() {
                *x = _mm512_fmadd_ps(*x, m, c);
            }
        }
        black_box((a, f));
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    {
        let has = |f: &str| pykvpool::attention::cpu_features().contains(&f);
        if !has("avx512f") || !has("fma") {
            println!("SKIPPED: this CPU lacks AVX-512 F / FMA");
            return;
        }
        // SAFETY (every call below): the features each function is compiled for were
        // checked on this CPU just before.
        let fma = rate(12, |n| unsafe { imp::fma(n) });
        println!("vfmadd231ps zmm: {fma:.2} instr/ns (16 FMA each: {:.1} G FMA/s)", fma * 16.0);
        if has("avx512vnni") {
            let d = rate(12, |n| unsafe { imp::dpbusd(n) });
            println!("vpdpbusd zmm:    {d:.2} instr/ns ({:.2}x the FMA's; 64 MAC each: {:.1} G MAC/s)", d / fma, d * 64.0);
            let m = rate(10, |n| unsafe { imp::mix(n) });
            println!("1 vpdpbusd : 4 vfmadd231ps: {m:.2} instr/ns ({:.2}x the FMA's)", m / fma);
        } else {
            println!("SKIPPED vpdpbusd: no avx512_vnni");
        }
        if has("avx512bf16") {
            let b = rate(12, |n| unsafe { imp::dpbf16(n) });
            println!("vdpbf16ps zmm:   {b:.2} instr/ns ({:.2}x the FMA's; 32 MAC each)", b / fma);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    println!("SKIPPED: not x86-64");
}
