//! The FMA issue-rate loop `dot_rates` divides by: 512-bit `vfmadd231ps`, 12 independent
//! chains (more than its latency times its throughput).

use std::arch::x86_64::*;
use std::hint::black_box;

/// `n` rounds of 12 independent 512-bit FMA chains (`12 n` instructions).
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
