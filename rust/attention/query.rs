//! The query as the paths read it: pre-scaled by `scale * log2(e)` (`scaled_query`, and
//! rounded to bf16 with its pairs for a bf16 query), quantized to int8 per row for an
//! int8 query (`int8_query`, `QueryI8`), and each head tile's rows interleaved for the
//! x86 score loops (`interleave_query`). Decode and prefill prepare their queries here.

#[cfg(target_arch = "x86_64")]
use super::isa::{Features, Isa, Supported};

/// A query quantized to int8 per row (one row per (sequence, query head)): symmetric,
/// `s_q = max|q| / 127`, codes `round_half_even(q / s_q)` in `-127..=127`.
#[derive(Clone, Copy)]
pub(crate) struct QueryI8<'a> {
    /// Four codes per `u32` (`d.div_ceil(4)` per row; dimension `4k + r` in byte `r`; a
    /// `head_dim` that is not a multiple of 4 padded by code 0).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub codes: &'a [u32],
    /// Per row: `s_q * scale * log2(e)` (the factor from an exact integer dot product
    /// `sum_i code_i K_i` to the score in log2 units; NaN for a row with a non-finite
    /// value) and `128 * sum_i code_i` (what `vpdpbusd` adds when the K codes are biased
    /// by 128 to make them unsigned). Read only by the VNNI kernel (x86-64).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub rows: &'a [(f32, i32)],
}

/// The query rows (`q.len() / d` rows of `d`, `g` per KV head) with each head tile's
/// rows interleaved as the SIMD paths tile them (`H = min(tile, g - j0)` heads from
/// `j0`): tile `qh .. qh + H` occupies `q[qh * d .. (qh + H) * d]` as `d` groups of `H`
/// (dimension `i` of head `qh + j` at `qh * d + i * H + j`). The score loops then read
/// every head's element at a constant offset from one pointer: with a pointer per head
/// the AVX-512 loop ran out of registers and reloaded the strides from the stack.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn interleave_query(q: &[f32], d: usize, g: usize, tile: usize) -> Vec<f32> {
    let mut out = vec![0f32; q.len()];
    if d == 0 || g == 0 || tile == 0 {
        return out;
    }
    for (group, dst) in q.chunks_exact(g * d).zip(out.chunks_exact_mut(g * d)) {
        for j0 in (0..g).step_by(tile) {
            let h = (g - j0).min(tile);
            let (rows, dst) = (&group[j0 * d..(j0 + h) * d], &mut dst[j0 * d..(j0 + h) * d]);
            // A fixed head count per tile lets the copy run without index checks (an
            // index loop took a quarter of a short call's time, `docs/experiments.md`).
            match h {
                1 => dst.copy_from_slice(rows),
                2 => interleave_tile::<2>(rows, dst),
                3 => interleave_tile::<3>(rows, dst),
                4 => interleave_tile::<4>(rows, dst),
                _ => {
                    for (j, row) in rows.chunks_exact(d).enumerate() {
                        for (i, &x) in row.iter().enumerate() {
                            dst[i * h + j] = x;
                        }
                    }
                }
            }
        }
    }
    out
}

/// `H` rows of `d = rows.len() / H` as `d` groups of `H` (`dst[i * H + j] = row j [i]`).
#[inline]
fn interleave_tile<const H: usize>(rows: &[f32], dst: &mut [f32]) {
    let d = rows.len() / H;
    let rows: [&[f32]; H] = std::array::from_fn(|j| &rows[j * d..(j + 1) * d]);
    for (i, group) in dst.chunks_exact_mut(H).enumerate().take(d) {
        for (x, row) in group.iter_mut().zip(rows) {
            *x = row[i];
        }
    }
}

/// One query row into a 4x layout (the f16-precision and e4m3-table paths): vector `k`,
/// `4 R` elements at `out[at + k * stride ..]`, holds element `4 k + L` of `row` repeated
/// `R` times in its lane `L` (a multiple of 4 elements; a tail of fewer is left as is).
/// Four elements per vector as whole lanes, so each copy is a broadcast and one store (an
/// element at a time took 12% of an L2-resident decode's kernel time).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn repeat_in_lanes<T: Copy, const R: usize>(out: &mut [T], at: usize, stride: usize, row: &[T]) {
    for (k, quad) in row.chunks_exact(4).enumerate() {
        let vector = &mut out[at + k * stride..at + k * stride + 4 * R];
        for (lane, &x) in vector.chunks_exact_mut(R).zip(quad) {
            lane.copy_from_slice(&[x; R]);
        }
    }
}

/// The query times `factor` (`scale * log2(e)`) for the kernels and, with `bf16`, first
/// rounded to bf16, plus its bf16 pairs for the `vdpbf16ps` path (two dimensions per
/// `u32`, even one low, an odd `d` padded by +0; empty without `bf16`). Decode and
/// prefill both prepare their queries with it.
pub(crate) fn scaled_query(q: &[f32], d: usize, factor: f32, bf16: bool) -> (Vec<f32>, Vec<u32>) {
    if !bf16 {
        return (q.iter().map(|&x| x * factor).collect(), Vec::new());
    }
    let b: Vec<u16> = q.iter().map(|&x| bf16_bits(x)).collect();
    let qs = b.iter().map(|&x| f32::from_bits((x as u32) << 16) * factor).collect();
    let pair = |lo: u16, hi: u16| lo as u32 | (hi as u32) << 16;
    let pairs = if d.is_multiple_of(2) {
        // Rows hold whole pairs: one flat pass (vectorised; the per-row form was not).
        b.chunks_exact(2).map(|p| pair(p[0], p[1])).collect()
    } else {
        b.chunks(d.max(1)).flat_map(|row| row.chunks(2).map(|p| pair(p[0], p.get(1).map_or(0, |&x| x)))).collect()
    };
    (qs, pairs)
}

/// `half::bf16::from_f32(x).to_bits()` (nearest even; a NaN keeps its upper bits, made
/// quiet), branch-free so that the query loop vectorises: the `half` call cost about 90
/// us per decode call of 8 x 32 x 128 query values, a third of a short call.
#[inline]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if b & 0x7fff_ffff > 0x7f80_0000 {
        (b >> 16) as u16 | 0x40
    } else {
        rounded
    }
}

/// The int8 query (`Precision { q: I8, .. }`), owned: see [`QueryI8`].
pub(crate) struct QueryI8Buf {
    pub codes: Vec<u32>,
    pub rows: Vec<(f32, i32)>,
}

impl QueryI8Buf {
    /// Rows `r0 .. r0 + n` (each `d.div_ceil(4)` packed codes).
    pub fn rows(&self, r0: usize, n: usize, d: usize) -> QueryI8<'_> {
        let w = d.div_ceil(4);
        QueryI8 { codes: &self.codes[r0 * w..(r0 + n) * w], rows: &self.rows[r0..r0 + n] }
    }
}

/// `q` (rows of `d`) quantized per row to int8 for an int8 query, and the f32 query the
/// paths without `vpdpbusd` read: each code times its row's factor `s_q * factor`, so
/// every path computes the scores of the same quantized query. A row of zeros has
/// `s_q = 0` (codes 0); a row holding a non-finite value gets codes 0 and factor NaN, so
/// its scores are NaN, as the exact path's are.
///
/// Runs as AVX-512 code where the CPU has it (the same arithmetic, 16 lanes instead of
/// SSE2's 4: the baseline copy took 25 us of an 8-sequence decode call on the calling
/// thread, 12 us as AVX-512 code; `docs/experiments.md`, "Decode attention: compute").
pub(crate) fn int8_query(q: &[f32], d: usize, factor: f32) -> (Vec<f32>, QueryI8Buf) {
    #[cfg(target_arch = "x86_64")]
    if Supported::check(Isa::Avx512, Features::cpu()).is_some() {
        // SAFETY: `Supported` found every feature `int8_query_avx512` is compiled for.
        return unsafe { int8_query_avx512(q, d, factor) };
    }
    int8_query_with(q, d, factor)
}

/// [`int8_query`] compiled for the AVX-512 path's features.
///
/// # Safety
/// The CPU must support them ([`Isa::Avx512`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
unsafe fn int8_query_avx512(q: &[f32], d: usize, factor: f32) -> (Vec<f32>, QueryI8Buf) {
    int8_query_with(q, d, factor)
}

/// What [`int8_query`] computes, inlined into each copy.
#[inline(always)]
fn int8_query_with(q: &[f32], d: usize, factor: f32) -> (Vec<f32>, QueryI8Buf) {
    let (d, w) = (d.max(1), d.div_ceil(4));
    let n = q.len() / d;
    // Plain loops over preallocated rows, no per-element push: this runs per call.
    let mut qs = vec![0f32; n * d];
    let mut codes = vec![0u32; n * w];
    let mut rows = vec![(0f32, 0i32); n];
    let mut c = vec![0i8; 4 * w];
    for (((row, qs), words), r) in q.chunks_exact(d).zip(qs.chunks_exact_mut(d)).zip(codes.chunks_exact_mut(w)).zip(&mut rows) {
        // The cache's own int8 quantizer (vectorised): max|q| / 127, half to even.
        // A fold, not `all`: no early exit, so it vectorises.
        let f = if row.iter().fold(true, |a, x| a & x.is_finite()) {
            crate::kv::quant::quantize_row_i8(row, &mut c[..d]) * factor
        } else {
            c.fill(0);
            f32::NAN
        };
        for (x, &k) in qs.iter_mut().zip(&c[..d]) {
            *x = k as f32 * f;
        }
        for (word, b) in words.iter_mut().zip(c.chunks_exact(4)) {
            let b: [i8; 4] = b.try_into().expect("chunks of 4");
            *word = u32::from_le_bytes(b.map(|x| x as u8));
        }
        *r = (f, 128 * c.iter().map(|&k| k as i32).sum::<i32>());
    }
    (qs, QueryI8Buf { codes, rows })
}

#[cfg(test)]
mod tests {
    /// The branch-free rounding is `half`'s on boundaries (ties, the largest finite,
    /// infinities, NaNs, subnormals, both signs) and a dense sample of all f32.
    #[test]
    fn bf16_bits_is_halfs_rounding() {
        let edges = [0u32, 1, 0x7fff, 0x8000, 0x8001, 0x1_8000, 0x7f7f_ffff, 0x7f80_0000, 0x7f80_0001, 0x7fc0_0000, 0x7fff_ffff];
        let sample = (0..=u32::MAX).step_by(9973).chain(edges.iter().flat_map(|&b| [b, b | 0x8000_0000]));
        for b in sample {
            let x = f32::from_bits(b);
            assert_eq!(super::bf16_bits(x), half::bf16::from_f32(x).to_bits(), "{b:#010x}");
        }
    }


    /// The AVX-512 copy of the int8 query is the baseline copy bit for bit (NaN for NaN): head_dims
    /// around the vector widths and not a multiple of 4 (padded codes), rows of zeros,
    /// of one non-finite value, of ties, tiny and huge magnitudes.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn int8_query_on_avx512_is_the_baseline_copy() {
        use super::{int8_query_avx512, int8_query_with, Isa, Supported};
        if Supported::check(Isa::Avx512, crate::attention::isa::Features::cpu()).is_none() {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        for d in [1usize, 3, 4, 15, 16, 17, 63, 64, 65, 128, 130] {
            let rows = 7;
            let mut q: Vec<f32> = (0..rows * d).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.37).collect();
            q[d..2 * d].fill(0.0);
            q[2 * d + d / 2] = f32::NAN;
            q[3 * d] = f32::INFINITY;
            q[4 * d..5 * d].iter_mut().enumerate().for_each(|(i, x)| *x = (i as f32 - 3.0) * 0.5);
            q[5 * d..6 * d].iter_mut().for_each(|x| *x *= 1e-40);
            q[6 * d..7 * d].iter_mut().for_each(|x| *x *= 6e35);
            let (a, ab) = int8_query_with(&q, d, 0.3);
            // SAFETY: the CPU has the AVX-512 path's features (checked above).
            let (b, bb) = unsafe { int8_query_avx512(&q, d, 0.3) };
            // Bits, except that any NaN matches any NaN (Rust does not fix a NaN's bits).
            let same = |x: f32, y: f32| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
            assert!(a.len() == b.len() && a.iter().zip(&b).all(|(&x, &y)| same(x, y)), "d {d}");
            assert_eq!(ab.codes, bb.codes, "d {d}");
            assert!(ab.rows.iter().zip(&bb.rows).all(|(&(f, s), &(g, t))| same(f, g) && s == t), "d {d}");
        }
    }

    /// Every query element lands where the tiles read it: element `i` of head `qh + j`
    /// of a tile starting at `qh` with `H` heads at `qh * d + i * H + j`, with a last
    /// tile of fewer heads and two KV heads: g = 6 in tiles of 4 (heads 0..4, 4..6), of
    /// 3 (0..3, 3..6), of 5 (0..5 by the loop for any width, 5..6), and g = 7 in tiles of
    /// 4 (0..4, 4..7).
    #[test]
    fn interleaved_query_puts_each_element_at_its_tile_offset() {
        let (d, kv) = (3, 2);
        // (g, tile, [(first head, heads)] of each tile).
        let cases = [(6, 4, [(0, 4), (4, 2)]), (6, 3, [(0, 3), (3, 3)]), (6, 5, [(0, 5), (5, 1)]), (7, 4, [(0, 4), (4, 3)])];
        for (g, tile, tiles) in cases {
            let q: Vec<f32> = (0..kv * g * d).map(|x| x as f32).collect();
            let out = super::interleave_query(&q, d, g, tile);
            assert_eq!(out.len(), q.len());
            for k in 0..kv {
                for (j0, h) in tiles {
                    let qh = k * g + j0;
                    for j in 0..h {
                        for i in 0..d {
                            assert_eq!(out[qh * d + i * h + j], q[(qh + j) * d + i], "g {g} tile {tile} kv {k} head {} dim {i}", j0 + j);
                        }
                    }
                }
            }
        }
    }
}
