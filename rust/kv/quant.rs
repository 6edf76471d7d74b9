//! Scales of the 8-bit caches: where they live ([`ScaleLayout`]), how a kernel reads them
//! ([`Scales`], [`TileScale`]) and how a write computes them ([`quantize_row_i8`],
//! [`calibrate`]).
//!
//! # Layout (the contract of every kernel path)
//!
//! Codes use exactly the tile layout of the unquantized dtypes (one byte per element):
//! per layer, block-major, each block's K tiles (all KV heads) then its V tiles; a K tile
//! `[head_dim][block_size]`, a V tile `[block_size][head_dim]` (see [`super::storage`]).
//!
//! The scales of a layer follow its codes in the same region, at the first 64-byte
//! boundary after them (`ScaleLayout::offset` bytes from the layer's first code), as f32:
//!
//! - **int8** (`ScaleKind::PerToken`): `[num_blocks][2][num_kv_heads][block_size]` -- per
//!   block its K scales (head-major, one per token slot) then its V scales, so the scales
//!   of a (block, head) tile are `block_size` consecutive f32 (64 bytes for 16 tokens)
//!   and a block's are one run of `2 * num_kv_heads * block_size` f32 that
//!   `copy_blocks` moves with the block's codes. Value = code x scale; scale =
//!   `max|x| / 127` over the token's `head_dim` values, 0 for an all-zero row.
//! - **fp8** (`ScaleKind::PerHead`): `[2][num_kv_heads]` -- the layer's K scales then its
//!   V scales. Value = fp8(code) x scale. A scale of 0 means "not set yet": the next write
//!   to the layer that holds a non-zero value of that head sets it to `max|x| / fp8 max`
//!   over that write's tokens (codes written under a zero scale are all 0, so setting it
//!   later reinterprets nothing). `KvCache::set_fp8_scales` sets them explicitly.
//!
//! A slot never written has zero codes and (int8) a zero scale: it reads as 0, as an
//! unquantized cache's does.

use super::elem::{DType, Elem, ScaleKind};

/// Where a layer's scales sit in its region and how many there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleLayout {
    pub kind: ScaleKind,
    /// Bytes from the layer's first code to its first scale (64-byte aligned).
    pub offset: usize,
    /// f32 scales of one layer.
    pub count: usize,
}

impl ScaleLayout {
    /// The layout of a layer of `[num_blocks, block_size, num_kv_heads, head_dim]` in
    /// `dtype`; `None` when the sizes overflow.
    pub fn new(num_blocks: usize, block_size: usize, num_kv_heads: usize, head_dim: usize, dtype: DType) -> Option<Self> {
        let prod = |xs: &[usize]| xs.iter().try_fold(1usize, |a, &x| a.checked_mul(x));
        let codes = prod(&[2, num_blocks, block_size, num_kv_heads, head_dim, dtype.size()])?;
        let kind = dtype.scale_kind();
        let count = match kind {
            ScaleKind::None => 0,
            ScaleKind::PerToken => prod(&[2, num_blocks, num_kv_heads, block_size])?,
            ScaleKind::PerHead => 2 * num_kv_heads,
        };
        let offset = if count == 0 { codes } else { codes.checked_next_multiple_of(64)? };
        offset.checked_add(4 * count)?;
        Some(Self { kind, offset, count })
    }

    /// Bytes of one layer: codes, padding to the scales, scales.
    pub fn layer_bytes(&self) -> usize {
        self.offset + 4 * self.count
    }

}

/// Bytes one token slot takes in one layer, K and V, codes and per-token scales (the
/// per-layer fp8 scales and the padding are not per token):
/// `2 * num_kv_heads * (head_dim * dtype.size() + 4 if int8)`.
pub fn bytes_per_token(num_kv_heads: usize, head_dim: usize, dtype: DType) -> Option<usize> {
    let scale = if dtype.scale_kind() == ScaleKind::PerToken { 4 } else { 0 };
    head_dim.checked_mul(dtype.size())?.checked_add(scale)?.checked_mul(num_kv_heads)?.checked_mul(2)
}

/// The scale of K or V of one (block, head) tile, by token slot.
#[derive(Clone, Copy, Debug)]
pub enum TileScale<'a> {
    /// Unquantized: every value is its element.
    One,
    /// fp8: one scale for the tile (the layer's, of this head).
    Head(f32),
    /// int8: `block_size` scales, one per token slot.
    Token(&'a [f32]),
}

impl TileScale<'_> {
    /// The scale of token slot `t`.
    #[inline(always)]
    pub fn at(&self, t: usize) -> f32 {
        match self {
            Self::One => 1.0,
            Self::Head(s) => *s,
            Self::Token(s) => s[t],
        }
    }
}

/// A layer's scales as a kernel reads them.
#[derive(Clone, Copy, Debug)]
pub struct Scales<'a> {
    pub kind: ScaleKind,
    /// The layer's `ScaleLayout::count` f32 (empty when unquantized).
    pub data: &'a [f32],
    pub num_kv_heads: usize,
    pub block_size: usize,
}

impl<'a> Scales<'a> {
    /// K and V scales of KV head `h` in block `b` (slicing is checked).
    #[inline(always)]
    pub fn tile(&self, b: usize, h: usize) -> (TileScale<'a>, TileScale<'a>) {
        let (hk, bs) = (self.num_kv_heads, self.block_size);
        match self.kind {
            ScaleKind::None => (TileScale::One, TileScale::One),
            ScaleKind::PerHead => (TileScale::Head(self.data[h]), TileScale::Head(self.data[hk + h])),
            ScaleKind::PerToken => {
                let at = b * 2 * hk * bs + h * bs;
                (TileScale::Token(&self.data[at..at + bs]), TileScale::Token(&self.data[at + hk * bs..][..bs]))
            }
        }
    }
}

/// The scale that maps `amax` to the largest code `code_max`: `amax / code_max`, one ulp
/// lower where `code_max * scale` would round past `f32::MAX` (an `amax` within a few ulps
/// of it), so that every code dequantizes to a finite value. The lower scale moves `amax`'s
/// code by about `code_max * 2^-24`, which the clamp to `code_max` absorbs: the error bound
/// of half a scale step holds for every finite input.
#[inline]
pub fn scale_for(amax: f32, code_max: f32) -> f32 {
    let mut scale = amax / code_max;
    while (scale * code_max).is_infinite() {
        scale = f32::from_bits(scale.to_bits() - 1);
    }
    scale
}

/// Quantize one int8 row: `scale = max|x| / 127` ([`scale_for`]), `codes =
/// round_half_even(x / scale)` clamped to +-127 (0 and scale 0 for an all-zero row). `x`
/// must be finite. Returns the scale; the loops are plain so the compiler vectorises them.
#[inline]
pub fn quantize_row_i8(x: &[f32], codes: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    if amax == 0.0 {
        codes.fill(0);
        return 0.0;
    }
    let scale = scale_for(amax, 127.0);
    if scale == 0.0 {
        // `amax` under 127 times the smallest subnormal: `0 / 0` is NaN, which
        // `from_f32` makes 0 (the bit trick below would not).
        for (c, &v) in codes.iter_mut().zip(x) {
            *c = i8::from_f32(v / scale);
        }
        return scale;
    }
    // `i8::from_f32` for finite input, with the rounded value's integer read from its
    // bits (`1.5 * 2^23 + k` holds `k` in its low mantissa bits) instead of a
    // float-to-int conversion, which x86-64's baseline has only per element: this loop
    // vectorises (the conversion took half of an int8 query's quantization).
    const MAGIC: f32 = 12_582_912.0;
    for (c, &v) in codes.iter_mut().zip(x) {
        let y = (v / scale).clamp(-127.0, 127.0) + MAGIC;
        *c = (y.to_bits() as i32 - MAGIC.to_bits() as i32) as i8;
    }
    scale
}

/// The calibrated fp8 scale for values of largest magnitude `amax`: `amax / fp8 max`
/// ([`scale_for`]).
#[inline]
pub fn calibrate(amax: f32, dtype: DType) -> f32 {
    scale_for(amax, dtype.code_max())
}

/// Codes of `x / scale` (0 codes for a zero scale, whose values are all 0).
#[inline]
pub fn quantize_fp8<E: Elem>(x: &[f32], scale: f32, codes: &mut [E]) {
    if scale == 0.0 {
        codes.fill(E::from_f32(0.0));
        return;
    }
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = E::from_f32(v / scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest finite values keep finite codes times scales (int8 and both fp8
    /// formats), within half a scale step.
    #[test]
    fn largest_finite_values_dequantize_finite() {
        for x in [f32::MAX, -f32::MAX, f32::from_bits(f32::MAX.to_bits() - 3)] {
            let mut c = [0i8; 3];
            let s = quantize_row_i8(&[x, 1.0, x / 2.0], &mut c);
            let back = c[0] as f32 * s;
            assert!(back.is_finite() && (back - x).abs() <= s / 2.0, "{x}: {back} scale {s}");
            for dt in [DType::E4M3, DType::E5M2] {
                let s = calibrate(x.abs(), dt);
                assert!((s * dt.code_max()).is_finite() && s > 0.0, "{dt:?} {x}");
            }
        }
        assert_eq!(scale_for(127.0, 127.0), 1.0);
    }

    #[test]
    fn int8_rows_hit_127_and_round_half_even() {
        let x = [0.5f32, -1.0, 127.0, 2.5, -2.5, 0.0];
        let mut c = [0i8; 6];
        let s = quantize_row_i8(&x, &mut c);
        assert_eq!(s, 1.0);
        assert_eq!(c, [0, -1, 127, 2, -2, 0]);
        assert_eq!(quantize_row_i8(&[0.0, -0.0], &mut c[..2]), 0.0);
        assert_eq!(&c[..2], &[0, 0]);
        let x = [-3.0f32, 1.0];
        let s = quantize_row_i8(&x, &mut c[..2]);
        assert_eq!((s, c[0], c[1]), (3.0 / 127.0, -127, 42));
    }

    /// Every code is the specification's `round_half_even(x / scale)` clamped to +-127
    /// (0 for the `0 / 0` of a row whose scale underflows to 0), on rows of random
    /// magnitudes from subnormal to near `f32::MAX`, with ties and both signs.
    #[test]
    fn int8_codes_follow_the_specification_at_every_magnitude() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
        let mut c = [0i8; 67];
        for trial in 0..4000 {
            let exp = rng.random_range(-149..=127);
            let row: Vec<f32> = (0..67)
                .map(|i| match (trial + i) % 9 {
                    0 => 0.0,
                    1 => (rng.random_range(-254..=254) as f32 + 0.5) * 2f32.powi(exp.clamp(-140, 100)),
                    _ => rng.random_range(-1.0f32..1.0) * 2f32.powi(exp),
                })
                .filter(|x: &f32| x.is_finite())
                .collect();
            let n = row.len();
            let s = quantize_row_i8(&row, &mut c[..n]);
            let amax = row.iter().fold(0f32, |a, &v| a.max(v.abs()));
            assert_eq!(s, amax / 127.0);
            for (i, &x) in row.iter().enumerate() {
                let want = if amax == 0.0 { 0 } else { (x / s).round_ties_even().clamp(-127.0, 127.0) as i8 };
                assert_eq!(c[i], want, "trial {trial}, x {x:e}, scale {s:e}");
            }
        }
        // A scale that underflows to 0: non-zeros saturate, zeros (0 / 0) give 0.
        let tiny = f32::from_bits(1);
        assert_eq!(quantize_row_i8(&[tiny, 0.0, -tiny], &mut c[..3]), 0.0);
        assert_eq!(&c[..3], &[127, 0, -127]);
    }

    #[test]
    fn layouts_count_codes_padding_and_scales() {
        let sh = |dt| ScaleLayout::new(3, 5, 2, 3, dt).unwrap();
        let i8l = sh(DType::I8);
        assert_eq!((i8l.offset, i8l.count), (192, 60)); // 180 code bytes -> 192
        assert_eq!(i8l.layer_bytes(), 192 + 240);
        let f8 = sh(DType::E4M3);
        assert_eq!((f8.offset, f8.count), (192, 4));
        let bf = sh(DType::BF16);
        assert_eq!((bf.offset, bf.count), (360, 0));
        assert_eq!(bytes_per_token(8, 128, DType::I8), Some(2 * 8 * 132));
        assert_eq!(bytes_per_token(8, 128, DType::E5M2), Some(2 * 8 * 128));
        assert_eq!(bytes_per_token(usize::MAX, 2, DType::F32), None);
    }
}
