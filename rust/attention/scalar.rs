//! The portable reference kernel: plain loops, f32 arithmetic in the order of the SIMD
//! paths (per block: scores, running max, rescale, accumulate; the AVX-512 path moves
//! its maximum lazily, which changes the reference point, not the result), so it doubles
//! as their oracle in the Rust tests.

use super::work::{Partial, Work};
use crate::kv::Elem;

pub(crate) fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    let (bs, d, g) = (w.shape.block_size, w.shape.head_dim, w.g);
    let mut scores = vec![0f32; bs];
    for bi in 0..w.blocks.len() {
        let span = w.span_in(bi);
        let n = span.len();
        for (hi, h) in w.heads.clone().enumerate() {
            let (kt, vt) = w.tiles(bi, h);
            for j in 0..g {
                let qh = hi * g + j;
                let q = &w.q[qh * d..(qh + 1) * d];
                for (t, s) in span.clone().zip(scores.iter_mut()) {
                    *s = q.iter().enumerate().map(|(i, &x)| x * kt[i * bs + t].to_f32()).sum();
                }
                let acc = &mut p.acc[qh * d..(qh + 1) * d];
                update(&scores[..n], &mut p.m[qh], &mut p.l[qh], acc, &vt[span.start * d..], d);
            }
        }
    }
}

/// One online-softmax step over a block's scores (log2 units) and its V tile.
fn update<E: Elem>(scores: &[f32], m: &mut f32, l: &mut f32, acc: &mut [f32], vt: &[E], d: usize) {
    let mx = scores.iter().copied().fold(*m, f32::max);
    let alpha = (*m - mx).exp2();
    *m = mx;
    *l *= alpha;
    acc.iter_mut().for_each(|a| *a *= alpha);
    for (t, &s) in scores.iter().enumerate() {
        let p = (s - mx).exp2();
        *l += p;
        for (a, v) in acc.iter_mut().zip(&vt[t * d..(t + 1) * d]) {
            *a += p * v.to_f32();
        }
    }
}
