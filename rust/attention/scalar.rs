//! The portable reference kernel: plain loops, f32 arithmetic in the order of the SIMD
//! paths (per block: scores, running max, rescale, accumulate; the AVX-512 path moves
//! its maximum lazily, which changes the reference point, not the result), so it doubles
//! as their oracle in the Rust tests.
//!
//! 8-bit caches: every K and V value is dequantized (code as f32 times its scale, one f32
//! multiply, exact up to that rounding) before it enters the same f32 arithmetic, so this
//! path is the exact reference on the dequantized values (the SIMD paths dequantize in
//! registers and are tested against it).

use super::work::{soft_cap, Partial, Work};
use crate::kv::Elem;

pub(crate) fn run<E: Elem>(w: &Work<E>, p: &mut Partial) {
    let (bs, d, g) = (w.shape.block_size, w.shape.head_dim, w.g);
    let mut scores = vec![0f32; bs];
    for bi in 0..w.blocks.len() {
        let span = w.span_in(bi);
        let n = span.len();
        for (hi, h) in w.heads.clone().enumerate() {
            let (kt, vt) = w.tiles(bi, h);
            let (ks, vs) = w.tile_scales(bi, h);
            for j in 0..g {
                let qh = hi * g + j;
                let q = &w.q[qh * d..(qh + 1) * d];
                for (t, s) in span.clone().zip(scores.iter_mut()) {
                    let st = ks.at(t);
                    *s = q.iter().enumerate().map(|(i, &x)| x * (kt[i * bs + t].to_f32() * st)).sum();
                }
                if let Some(c) = w.soft_cap {
                    scores[..n].iter_mut().for_each(|s| *s = soft_cap(*s, c));
                }
                let acc = &mut p.acc[qh * d..(qh + 1) * d];
                let vscale = |t: usize| vs.at(span.start + t);
                update(&scores[..n], &mut p.m[qh], &mut p.l[qh], acc, &vt[span.start * d..], d, vscale);
            }
        }
    }
}

/// One online-softmax step over a block's scores (log2 units) and its V tile.
fn update<E: Elem>(scores: &[f32], m: &mut f32, l: &mut f32, acc: &mut [f32], vt: &[E], d: usize, vscale: impl Fn(usize) -> f32) {
    let mx = scores.iter().copied().fold(*m, f32::max);
    let alpha = (*m - mx).exp2();
    *m = mx;
    *l *= alpha;
    acc.iter_mut().for_each(|a| *a *= alpha);
    for (t, &s) in scores.iter().enumerate() {
        let p = (s - mx).exp2();
        *l += p;
        let st = vscale(t);
        for (a, v) in acc.iter_mut().zip(&vt[t * d..(t + 1) * d]) {
            *a += p * (v.to_f32() * st);
        }
    }
}
