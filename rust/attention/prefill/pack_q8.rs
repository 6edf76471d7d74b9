//! The key-tile pack of the 8-bit caches: codes dequantized straight into the f32 packs
//! in one pass (value = code as f32 times its scale, one f32 multiply: the scalar
//! reference's value, bit for bit).
//!
//! - int8: K rows (one dimension, `n` tokens) times the tokens' scales, V rows times
//!   their token's scale, in plain slice loops the compiler can vectorise;
//! - fp8: one table per item of the 256 code values times the head's K (and V) scale
//!   ([`Lut`], rebuilt only when the scales change), so each element is one table load;
//!   the exact bit conversion with its branches runs 512 times per item instead of once
//!   per element.
//!
//! The pack runs once per key tile of an item and feeds all its rows (up to `ROWS`), so
//! it is a few percent of the micro-kernels' time: on `benches/bench_prefill.py`'s
//! shapes (one thread, AVX-512 and AVX2) 8-bit was within noise of bf16 per query token
//! both with this pack and with the earlier convert-then-scale one.

use std::any::TypeId;

use super::plan::TW;
use crate::kv::elem::{E4M3, E5M2};
use crate::kv::quant::TileScale;
use crate::kv::Elem;

/// Where the tokens `c0..c0 + n` of one (block, head) tile go: key `o` of the K pack
/// (`[d][TW]`) and of the V pack (`[TW][d]`).
pub(super) struct Dst<'a> {
    pub kp: &'a mut [f32],
    pub vp: &'a mut [f32],
    pub o: usize,
    pub c0: usize,
    pub n: usize,
    pub bs: usize,
    pub d: usize,
}

/// int8: `kt` `[d][bs]` and `vt` `[bs][d]` codes with their per-token scales `ks`, `vs`
/// (`bs` each).
pub(super) fn int8(kt: &[i8], vt: &[i8], ks: &[f32], vs: &[f32], t: Dst) {
    let Dst { kp, vp, o, c0, n, bs, d } = t;
    let s = &ks[c0..c0 + n];
    for i in 0..d {
        let src = &kt[i * bs + c0..i * bs + c0 + n];
        let dst = &mut kp[i * TW + o..i * TW + o + n];
        for j in 0..n {
            dst[j] = src[j] as f32 * s[j];
        }
    }
    for (j, &s) in vs[c0..c0 + n].iter().enumerate() {
        let src = &vt[(c0 + j) * d..(c0 + j + 1) * d];
        let dst = &mut vp[(o + j) * d..(o + j + 1) * d];
        for x in 0..d {
            dst[x] = src[x] as f32 * s;
        }
    }
}

/// The values of the 256 fp8 codes times a head's K scale and V scale.
pub(super) struct Lut {
    /// The (K, V) scale bits the tables hold, `None` before the first fill.
    of: Option<(u32, u32)>,
    k: [f32; 256],
    v: [f32; 256],
}

impl Lut {
    pub fn new() -> Self {
        Self { of: None, k: [0.0; 256], v: [0.0; 256] }
    }

    /// Tables for the format whose code `b` is `code(b)`, at scales `(ks, vs)`.
    fn fill<C: Elem>(&mut self, code: impl Fn(u8) -> C, (ks, vs): (f32, f32)) {
        if self.of == Some((ks.to_bits(), vs.to_bits())) {
            return;
        }
        for b in 0..=255u8 {
            let x = code(b).to_f32();
            self.k[b as usize] = x * ks;
            self.v[b as usize] = x * vs;
        }
        self.of = Some((ks.to_bits(), vs.to_bits()));
    }
}

/// fp8 codes (`byte` gives a code's bits, `code` the inverse) at the head's scales.
pub(super) fn fp8<C: Elem>(kt: &[C], vt: &[C], byte: impl Fn(C) -> u8, code: impl Fn(u8) -> C, scales: (f32, f32), lut: &mut Lut, t: Dst) {
    lut.fill(code, scales);
    let Dst { kp, vp, o, c0, n, bs, d } = t;
    for i in 0..d {
        let src = &kt[i * bs + c0..i * bs + c0 + n];
        let dst = &mut kp[i * TW + o..i * TW + o + n];
        for j in 0..n {
            dst[j] = lut.k[byte(src[j]) as usize];
        }
    }
    let src = &vt[c0 * d..(c0 + n) * d];
    let dst = &mut vp[o * d..(o + n) * d];
    for x in 0..n * d {
        dst[x] = lut.v[byte(src[x]) as usize];
    }
}

/// An 8-bit tile's tokens into the f32 packs, by its type.
pub(super) fn codes<E: Elem>(kt: &[E], vt: &[E], (ks, vs): (TileScale, TileScale), t: Dst, lut: &mut Lut) {
    match (ks, vs) {
        (TileScale::Token(a), TileScale::Token(b)) => match (same::<E, i8>(kt), same::<E, i8>(vt)) {
            (Some(k), Some(v)) => int8(k, v, a, b, t),
            _ => unreachable!("per-token scales belong to int8"),
        },
        (TileScale::Head(a), TileScale::Head(b)) => {
            if let (Some(k), Some(v)) = (same::<E, E4M3>(kt), same::<E, E4M3>(vt)) {
                fp8(k, v, |c| c.0, E4M3, (a, b), lut, t)
            } else if let (Some(k), Some(v)) = (same::<E, E5M2>(kt), same::<E, E5M2>(vt)) {
                fp8(k, v, |c| c.0, E5M2, (a, b), lut, t)
            } else {
                unreachable!("per-head scales belong to fp8")
            }
        }
        _ => unreachable!("8-bit tiles have scales"),
    }
}

/// `src` as a slice of `T` when `E` is `T`.
#[inline(always)]
pub(super) fn same<E: 'static, T: 'static>(src: &[E]) -> Option<&[T]> {
    // SAFETY: the type ids are equal, so E and T are the same type.
    (TypeId::of::<E>() == TypeId::of::<T>()).then(|| unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<T>(), src.len()) })
}
