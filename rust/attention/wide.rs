//! The overflow fallback: an output row that came out of the f32 paths not finite is
//! computed again here in f64.
//!
//! Every path keeps an unnormalised `P V` sum in f32 (the weights relative to the
//! running maximum are at most 1, so the sum over `n` keys can reach `n * max|V|`), and
//! scores `scale * q . k` in f32: finite inputs whose answer is finite (four keys with
//! `V = 1e38`, a score past `f32::MAX`) can overflow there. Rather than slow every call
//! with a wider accumulator, the callers check each finished row (a pass over values
//! already in cache) and send only the rows that are not finite here. In f64 the scores
//! (at most `d * f32::MAX^2`, about 1e79 for the largest head_dim) and the sums (at most
//! `2^31 * f32::MAX`) cannot overflow, and the normalised output, a convex combination of
//! finite values, rounds to a finite f32. A row whose inputs hold a non-finite value (a
//! raw write through a view, a NaN code) stays not finite, as its answer is.

use super::tables::Visible;
use crate::kv::quant::Scales;
use crate::kv::{Elem, KvShape};

/// One layer's K and V as the kernels read them.
pub(crate) struct Layer<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    pub scales: Scales<'a>,
    pub shape: KvShape,
}

/// How one row's logits are made from `q . k` (natural-log units).
#[derive(Clone, Copy)]
pub(crate) struct Logits {
    pub scale: f32,
    pub soft_cap: Option<f32>,
}

impl Logits {
    fn of(self, dot: f64) -> f64 {
        let x = f64::from(self.scale) * dot;
        match self.soft_cap {
            Some(c) => f64::from(c) * (x / f64::from(c)).tanh(),
            None => x,
        }
    }
}

/// Whether every value of `row` is finite: one pass the compiler vectorises.
#[inline]
pub(crate) fn all_finite(row: &[f32]) -> bool {
    row.iter().fold(true, |ok, x| ok & x.is_finite())
}

/// Recompute one output row in f64: query `q` (raw, `head_dim` values) against KV head
/// `h` of sequence `seq`'s keys in `vis` for which `sees(position)` holds. Writes the
/// normalised output into `out` and returns the row's natural-log sum of `exp(logit)`
/// (`-inf`, with a zero row, when it sees no key).
#[allow(clippy::too_many_arguments)]
pub(crate) fn row<E: Elem>(
    layer: &Layer<E>,
    vis: &Visible,
    seq: usize,
    sees: impl Fn(usize) -> bool,
    q: &[f32],
    h: usize,
    logits: Logits,
    out: &mut [f32],
) -> f32 {
    let (bs, d) = (layer.shape.block_size, layer.shape.head_dim);
    // Every visible key as (block id, slot); one closure so both passes walk the same set.
    let sees = &sees;
    let keys = || {
        vis.runs(seq).iter().flat_map(move |r| {
            (r.tok0..r.tok1).filter(move |&t| sees(t)).map(move |t| (vis.blocks()[r.at + t / bs - r.first_block(bs)] as usize, t % bs))
        })
    };
    let logit = |b: usize, t: usize| {
        let at = b * layer.shape.block_stride() + h * layer.shape.tile();
        let st = f64::from(layer.scales.tile(b, h).0.at(t));
        let dot: f64 = (0..d).map(|i| f64::from(q[i]) * (f64::from(layer.k[at + i * bs + t].to_f32()) * st)).sum();
        logits.of(dot)
    };
    let mx = keys().map(|(b, t)| logit(b, t)).fold(f64::NEG_INFINITY, f64::max);
    if mx == f64::NEG_INFINITY {
        out.fill(0.0);
        return f32::NEG_INFINITY;
    }
    let mut acc = vec![0f64; d];
    let mut sum = 0f64;
    for (b, t) in keys() {
        let w = (logit(b, t) - mx).exp();
        sum += w;
        let at = b * layer.shape.block_stride() + h * layer.shape.tile() + t * d;
        let sv = f64::from(layer.scales.tile(b, h).1.at(t));
        for (a, x) in acc.iter_mut().zip(&layer.v[at..at + d]) {
            *a += w * (f64::from(x.to_f32()) * sv);
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = (a / sum) as f32;
    }
    (mx + sum.ln()) as f32
}
