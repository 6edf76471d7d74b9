//! `int8_pv`: on the AVX-512 path with `vpdpbusd`, `P V` on probabilities quantized to 8
//! bits per (chunk, query head) — checked against the closed form of that quantization on
//! data whose probabilities are known exactly, and against the f32 `P V` (f64 reference)
//! within the documented `(16 / 510) max|V'|` over a grid of head groups, block sizes,
//! chunk tails, splits, windows and sinks, with and without `int8_scores`; every other
//! path and head_dim keeps the f32 `P V` (within 1e-5 of the reference).

use super::decode::*;
use super::isa::*;
use super::query::int8_query;
use super::tables::*;
use super::test_util::{filled, shape, Lcg};
use super::tests_int8::{check_int8_only_option, shared};
use super::tests::reference_window;
use crate::kv::{DType, KvCache};

/// Whether `isa` runs `int8_pv` on integers (else it keeps the f32 `P V`). Every test
/// here holds [`shared`]: one `int8_scores` test hides VNNI for the process while it runs.
#[cfg(target_arch = "x86_64")]
fn integer_pv(isa: Isa, d: usize) -> bool {
    isa == Isa::Avx512 && super::avx512_vnni::supported() && d.is_multiple_of(64)
}

/// No path off x86-64 runs `P V` on integers.
#[cfg(not(target_arch = "x86_64"))]
fn integer_pv(_: Isa, _: usize) -> bool {
    false
}

fn opts(isa: Isa, int8_scores: bool) -> DecodeOptions {
    DecodeOptions { isa: Some(isa), int8_pv: true, int8_scores, ..Default::default() }
}

/// Keys all 0 (every probability 1), V row `t` = `m_t * u` with `max|u| = 1`, so every
/// token stores the codes `round(127 u)` with the scale `m_t / 127`, and a chunk's
/// quantized probabilities are `round_half_even(255 m_t / max m)` in closed form. The
/// `m_t` put `255 m_t / max m` 0.3 or 0.7 past an integer (no tie, nothing near one).
#[test]
fn int8_pv_quantizes_each_chunks_probabilities_by_its_largest() {
    let _shared = shared();
    let (bs, d, nb) = (16, 128, 2);
    let mut r = Lcg(5);
    let u: Vec<f32> = (0..d).map(|i| if i == 3 { -1.0 } else { 0.9 * r.next() }).collect();
    // Two chunks: 16 tokens then 13 (a partial group of 4 at the end).
    let len = 29;
    let m: Vec<f32> = (0..len).map(|t| if t % 16 == 0 { 127.0 } else { 127.0 * ((t * 37 % 200) as f32 + 20.3 + 0.4 * (t % 2) as f32) / 255.0 }).collect();
    for g in [1, 4] {
        let mut c = KvCache::new(shape(bs, 1, d, nb), DType::I8).unwrap();
        let k = vec![0f32; nb * bs * d];
        let v: Vec<f32> = (0..nb * bs).flat_map(|t| {
            let mt = if t < len { m[t] } else { 0.0 };
            u.iter().map(move |&x| x * mt)
        }).collect();
        c.write(0, &k, &v, &(0..(nb * bs) as i64).collect::<Vec<_>>()).unwrap();
        let (_, vd) = c.dequantize(0).unwrap();
        let t = SeqTables::padded(&[0, 1], 2, &[len as i64], bs, nb).unwrap();
        let q: Vec<f32> = (0..g * d).map(|i| i as f32 * 0.01).collect();
        // The closed form: per chunk, step = max s / 255 over the V scales s_t.
        let scale = |t: usize| vd[t * d + 3].abs() as f64 / 127.0;
        let mut want = vec![0f64; d];
        for chunk in [0..16, 16..len] {
            let top = chunk.clone().map(scale).fold(0.0, f64::max);
            for tok in chunk {
                let x = scale(tok) * 255.0 / top;
                assert!((x - x.floor() - 0.5).abs() > 0.1, "no near-tie: {x}");
                let code = x.round();
                for i in 0..d {
                    want[i] += code * top / 255.0 * (vd[tok * d + i] as f64 / scale(tok)) / len as f64;
                }
            }
        }
        let (exact, _) = reference_window(&c, &q, g, &t, 1.0 / (d as f64).sqrt(), None, 0);
        let tol = 1e-5 * exact.iter().fold(0f64, |a, x| a.max(x.abs()));
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; g * d];
            decode_attention(&c, 0, &q, g, &t, &mut out, None, &opts(isa, false)).unwrap();
            let quantized = integer_pv(isa, d);
            for (i, &o) in out.iter().enumerate() {
                let w = if quantized { want[i % d] } else { exact[i] };
                assert!((o as f64 - w).abs() <= tol, "{isa:?} g={g} dim {i}: {o} vs {w} (exact {})", exact[i]);
            }
            if quantized {
                let moved = (0..d).map(|i| (want[i] - exact[i]).abs()).fold(0.0, f64::max);
                assert!(moved > 5.0 * tol, "the quantization is visible: {moved} against {tol}");
            }
        }
    }
}

/// Against the f32 `P V` (the f64 reference on the same scores: the exact query, or
/// with `int8_scores` the quantized one): each output within `(16 / 510) max|V'|` plus
/// 1e-5 of the output scale, the LSE (the softmax sum is untouched) within 1e-5.
fn within_bound(c: &KvCache, hq: usize, t: &SeqTables, split: Option<usize>, window: Option<usize>, sinks: usize) {
    let d = c.shape().head_dim;
    let mut r = Lcg((d * 31 + hq) as u64);
    let q: Vec<f32> = (0..t.len() * hq * d).map(|_| r.next() * 3.0).collect();
    let (_, vd) = c.dequantize(0).unwrap();
    let vmax = vd.iter().fold(0f64, |a, &x| a.max(x.abs() as f64));
    for int8_scores in [false, true] {
        let qr = if int8_scores { int8_query(&q, d, 1.0).0 } else { q.clone() };
        let (want, want_lse) = reference_window(c, &qr, hq, t, 1.0 / (d as f64).sqrt(), window, sinks);
        let scale_out = want.iter().fold(1e-3f64, |a, x| a.max(x.abs()));
        for isa in Isa::available() {
            let o = DecodeOptions { split_tokens: split, window_left: window, sink_tokens: sinks, ..opts(isa, int8_scores) };
            let mut out = vec![f32::NAN; q.len()];
            let mut lse = vec![f32::NAN; t.len() * hq];
            decode_attention(c, 0, &q, hq, t, &mut out, Some(&mut lse), &o).unwrap();
            let bound = if integer_pv(isa, d) { 16.0 / 510.0 * vmax } else { 0.0 } + 1e-5 * scale_out;
            for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
                let s = c.shape();
                let e = (o as f64 - w).abs();
                assert!(e <= bound, "{isa:?} {s:?} hq={hq} split={split:?} win={window:?} sc={int8_scores} at {i}: {o} vs {w}");
            }
            for (&o, &w) in lse.iter().zip(&want_lse) {
                assert!(o as f64 == w || (o as f64 - w).abs() <= 1e-5 * w.abs().max(1.0), "{isa:?} lse {o} vs {w}");
            }
        }
    }
}

/// Head groups 1-5 and 8 (tiles of 1-4 heads; one head takes two segments per pass when
/// head_dim is a multiple of 128, one otherwise), block sizes 1, 8, 16 and 32 (chunk
/// tails 1-16, partial groups of 4), head dims 64, 128, 192 and 256 and, kept on the f32
/// `P V`, 80; splits of one block; windows and sinks.
#[test]
fn int8_pv_stays_within_the_documented_bound_over_the_grid() {
    let _shared = shared();
    let grid = [
        (16, 128, 2, 1),
        (16, 128, 2, 4),
        (16, 64, 2, 1),
        (16, 192, 1, 1),
        (16, 64, 1, 3),
        (8, 128, 1, 5),
        (32, 256, 1, 2),
        (1, 64, 2, 8),
        (16, 80, 1, 4),
    ];
    for (bs, d, hkv, g) in grid {
        let nb = 64usize.div_ceil(bs).max(8) * 2;
        let c = filled(shape(bs, hkv, d, nb), DType::I8, (bs + d + g) as u64, 1.0);
        let lens: Vec<usize> = vec![1, 13, 3 * bs + 5, 60];
        let width = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap();
        let mut table = vec![-1i64; lens.len() * width];
        let mut next = nb as i64 - 1;
        for (i, l) in lens.iter().enumerate() {
            for b in 0..l.div_ceil(bs) {
                table[i * width + b] = next;
                next -= 1;
            }
        }
        let sl: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
        let t = SeqTables::padded(&table, width, &sl, bs, nb).unwrap();
        within_bound(&c, hkv * g, &t, None, None, 0);
        within_bound(&c, hkv * g, &t, Some(bs), None, 0);
        within_bound(&c, hkv * g, &t, None, Some(20), 3);
    }
}

/// On normal data the error is far inside the bound, yet visible where the path runs.
#[test]
fn int8_pv_errors_on_normal_data_are_far_below_the_bound() {
    let _shared = shared();
    let (bs, hkv, g, d) = (16, 2, 4, 128);
    let c = filled(shape(bs, hkv, d, 32), DType::I8, 9, 1.0);
    let t = SeqTables::padded(&(0..32).collect::<Vec<i64>>(), 16, &[256, 250], bs, 32).unwrap();
    let mut r = Lcg(4);
    let q: Vec<f32> = (0..2 * hkv * g * d).map(|_| r.next() * 3.0).collect();
    let (want, _) = reference_window(&c, &q, hkv * g, &t, 1.0 / (d as f64).sqrt(), None, 0);
    let (_, vd) = c.dequantize(0).unwrap();
    let vmax = vd.iter().fold(0f64, |a, &x| a.max(x.abs() as f64));
    for isa in Isa::available().into_iter().filter(|&i| integer_pv(i, d)) {
        let mut out = vec![0f32; q.len()];
        decode_attention(&c, 0, &q, hkv * g, &t, &mut out, None, &opts(isa, false)).unwrap();
        let worst = out.iter().zip(&want).map(|(&o, &w)| (o as f64 - w).abs()).fold(0.0, f64::max);
        let bound = 16.0 / 510.0 * vmax;
        assert!(worst > 1e-6 && worst < bound / 20.0, "{isa:?}: worst {worst}, bound {bound}");
    }
}

/// Refused for other caches (`out` untouched); large logits (one dominant token per
/// chunk) stay finite; a NaN in the query gives NaN where the exact path does.
#[test]
fn int8_pv_needs_an_int8_cache_and_keeps_nan() {
    let _shared = shared();
    check_int8_only_option("int8_pv needs an int8 cache", |isa| opts(isa, false), false);
}
