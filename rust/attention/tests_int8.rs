//! An int8 query (`Precision { q: I8, pv: F32 }`): every path (AVX-512 with `vpdpbusd`
//! where the CPU has avx512_vnni, the others with f32 FMAs on the dequantized quantized
//! query) against the f64 reference of the quantized query, at the bounds of the
//! `vpdpbusd` loads (every chunk tail 1..16, head dims that are not a multiple of 4 or 64,
//! block sizes 1 to 32, the last token of the pool's last block), head groups 1 to 8,
//! splits and windows, with a soft cap; and against the exact query, within the
//! documented bound.


use super::decode::*;
use super::options::Tuning;
use super::isa::*;
use super::options::Kernel;
use super::tables::*;
use super::test_util::{filled, last_block_case, on, refusal, shape, tuned, Lcg, INT8_QUERY};
use super::tests::{reference_window, wide_reference, CAPS};
use super::query::int8_query;
use super::wide::Logits;
use crate::kv::{DType, KvCache};

/// The quantized query as values (code times `max|q| / 127` of its row).
fn quantized(q: &[f32], d: usize) -> Vec<f32> {
    int8_query(q, d, 1.0).0
}

fn query(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Lcg(seed);
    (0..n).map(|_| r.next() * 3.0).collect()
}

/// Every path with an int8 query on `c`, tables `t`, against the f64 reference of the
/// quantized query, within 1e-5 of the output scale (LSE within 1e-5 relative); with a
/// soft cap, the query 4x larger (so that the cap bites) and [`wide_reference`] with the
/// same cap.
#[allow(clippy::too_many_arguments)]
fn compare(
    c: &KvCache,
    hq: usize,
    t: &SeqTables,
    split: Option<usize>,
    kpi: Option<usize>,
    window: Option<usize>,
    sinks: usize,
    cap: Option<f32>,
) {
    compare_on(Features::cpu(), c, hq, t, split, kpi, window, sinks, cap);
}

/// [`compare`] with the routes chosen by `features`.
#[allow(clippy::too_many_arguments)]
fn compare_on(
    features: Features,
    c: &KvCache,
    hq: usize,
    t: &SeqTables,
    split: Option<usize>,
    kpi: Option<usize>,
    window: Option<usize>,
    sinks: usize,
    cap: Option<f32>,
) {
    let d = c.shape().head_dim;
    let mut q = query(t.len() * hq * d, (d * 13 + hq) as u64);
    if cap.is_some() {
        q.iter_mut().for_each(|x| *x *= 4.0);
    }
    let (want, want_lse) = match cap {
        None => reference_window(c, &quantized(&q, d), hq, t, 1.0 / (d as f64).sqrt(), window, sinks),
        Some(_) => wide_reference(c, &quantized(&q, d), hq, t, Logits { scale: 1.0 / (d as f32).sqrt(), soft_cap: cap }, window, sinks),
    };
    let scale_out = want.iter().fold(1e-3f64, |a, x| a.max(x.abs()));
    for isa in Isa::available() {
        let mut out = vec![f32::NAN; q.len()];
        let mut lse = vec![f32::NAN; t.len() * hq];
        let opts = DecodeOptions {
            tuning: tuned(isa, split, kpi),
            precision: INT8_QUERY,
            logits_soft_cap: cap,
            window_left: window,
            sink_tokens: sinks,
            ..Default::default()
        };
        let opts = DecodeOptions { tuning: Tuning { features: Some(features), ..opts.tuning }, ..opts };
        decode_attention(c, 0, &q, hq, t, &mut out, Some(&mut lse), &opts).unwrap();
        for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
            let s = c.shape();
            assert!(
                (o as f64 - w).abs() <= 1e-5 * scale_out,
                "{isa:?} {s:?} hq={hq} split={split:?} win={window:?} cap={cap:?} at {i}: {o} vs {w}"
            );
        }
        for (&o, &w) in lse.iter().zip(&want_lse) {
            assert!(o as f64 == w || (o as f64 - w).abs() <= 1e-5 * w.abs().max(1.0), "{isa:?} lse {o} vs {w}");
        }
    }
}

/// Tables of `lens` running backwards from the pool's last block (always read).
fn tables(lens: &[usize], bs: usize, nb: usize) -> SeqTables {
    let width = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap_or(0);
    let mut table = vec![-1i64; lens.len() * width];
    let mut next = nb as i64 - 1;
    for (i, l) in lens.iter().enumerate() {
        for b in 0..l.div_ceil(bs) {
            table[i * width + b] = next;
            next = (next - 1).rem_euclid(nb as i64);
        }
    }
    let seq_lens: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
    SeqTables::padded(&table, width, &seq_lens, bs, nb).unwrap()
}

#[test]
fn int8_query_rounds_half_even_per_row_and_packs_four_codes() {
    // Row 0: max 127 -> s_q 1: 2.5 -> 2, -3.5 -> -4, 0.5 -> 0; d = 5 pads the second word.
    // Row 1: zeros. Row 2: a NaN.
    let q = [2.5f32, -3.5, 0.5, 127.0, -127.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, f32::NAN, 0.0, 0.0, 0.0];
    let (qs, b) = int8_query(&q, 5, 2.0);
    let w = |c: [i8; 4]| u32::from_le_bytes(c.map(|x| x as u8));
    assert_eq!(b.codes[..2], [w([2, -4, 0, 127]), w([-127, 0, 0, 0])]);
    assert_eq!(b.rows[0], (2.0, 128 * (2 - 4 + 127 - 127)));
    assert_eq!(qs[..5], [4.0, -8.0, 0.0, 254.0, -254.0]);
    assert_eq!((&b.codes[2..4], b.rows[1]), (&[0, 0][..], (0.0, 0)));
    assert!(b.rows[2].0.is_nan() && b.codes[4..] == [0, 0] && qs[10..].iter().all(|x| x.is_nan()));
    // A row whose max is not a code: 1.0 is 127, 0.5 rounds 63.5 to 64 (even).
    let (_, b) = int8_query(&[1.0, 0.5, -0.25, 0.0], 4, 1.0);
    assert_eq!(b.codes[0], w([127, 64, -32, 0]));
}

/// Every chunk tail 1..=16 and more (block sizes 1, 8, 16 and 32, so chunks start at
/// offset 0 and mid-block with splits of one block), head dims with 1-3 rows in the last
/// quad and not multiples of 64, head groups 1, 2, 4 and 8 (and 3, 5: tiles of 1-4 heads).
#[test]
fn int8_query_matches_the_quantized_query_reference_over_the_grid() {
    let heads = [(2, 2), (1, 2), (2, 8), (1, 8), (1, 3), (2, 16), (1, 5), (4, 4)];
    let mut k = 0;
    for d in [1, 2, 3, 4, 5, 7, 64, 65, 66, 67, 80, 128, 129] {
        for bs in [1, 8, 16, 32] {
            let (hkv, hq) = heads[k % heads.len()];
            k += 1;
            let c = filled(shape(bs, hkv, d, 24), DType::I8, (d * 31 + bs) as u64, 1.0);
            let lens: Vec<usize> = if bs == 16 { (1..=17).chain([32, 33, 47]).collect() } else { vec![1, bs, bs + 1, 2 * bs - 1, 3 * bs] };
            let t = tables(&lens, bs, 24);
            compare(&c, hq, &t, None, None, None, 0, None);
            compare(&c, hq, &t, Some(bs), Some(1), None, 0, None);
        }
    }
}

#[test]
fn int8_query_with_windows_and_sinks() {
    for (bs, d, hkv, hq) in [(16, 128, 2, 8), (8, 65, 1, 1), (16, 64, 4, 4), (32, 7, 1, 2)] {
        let c = filled(shape(bs, hkv, d, 40), DType::I8, d as u64, 1.0);
        let t = tables(&[5 * bs + 3, 3 * bs, 2 * bs + 9], bs, 40);
        for (w, sinks) in [(Some(0), 0), (Some(bs + 2), 0), (Some(2 * bs - 1), 3), (None, 4)] {
            compare(&c, hq, &t, None, None, w, sinks, None);
            compare(&c, hq, &t, Some(bs), Some(1), w, sinks, None);
        }
    }
}

/// With a soft cap: the `vpdpbusd` scores (where the CPU has avx512_vnni) and the FMA
/// paths' go through the tile loop's cap, head groups 1 to 8, block sizes 8 to 32 (a
/// tile's chunks two at a time at 32), a head_dim tail, a window with sinks, splits.
#[test]
fn int8_query_with_a_soft_cap() {
    for (bs, d, hkv, hq) in [(16, 128, 2, 8), (8, 65, 1, 1), (32, 64, 2, 4), (16, 7, 1, 5)] {
        let c = filled(shape(bs, hkv, d, 40), DType::I8, (d + bs) as u64, 1.0);
        let t = tables(&[5 * bs + 3, 3 * bs, 2 * bs + 9, 1], bs, 40);
        for cap in CAPS.into_iter().skip(1) {
            compare(&c, hq, &t, None, None, None, 0, cap);
            compare(&c, hq, &t, Some(bs), Some(1), Some(bs + 2), 3, cap);
        }
    }
}

/// The `vpdpbusd` loads at their bounds: the last token of the pool's last block through
/// the last KV head, any head dim tail, partial chunks.
#[test]
fn int8_query_reads_the_last_token_of_the_pools_last_block() {
    for bs in [1, 8, 16, 32] {
        for d in [1, 2, 3, 4, 5, 64, 65, 128] {
            let (c, t, _) = last_block_case(DType::I8, bs, d, 1.0);
            compare(&c, 6, &t, None, None, None, 0, None);
            compare(&c, 6, &t, Some(1), Some(1), None, 0, None);
        }
    }
}

/// The AVX-512 path without `vpdpbusd` keeps the int8 query's semantics: its exact
/// kernel on the dequantized quantized query.
#[test]
#[cfg(target_arch = "x86_64")]
fn int8_query_on_avx512_without_vnni_uses_the_quantized_query() {
    if !Isa::Avx512.supported() {
        eprintln!("SKIPPED an int8 query on AVX-512 without VNNI: this CPU lacks AVX-512");
        return;
    }
    let without = Features::cpu().without(&["avx512vnni"]);
    for (bs, hkv, hq, d) in [(16, 2, 8, 128), (1, 1, 3, 7), (8, 4, 4, 80), (32, 1, 8, 65)] {
        let c = filled(shape(bs, hkv, d, 24), DType::I8, 9, 1.0);
        compare_on(without, &c, hq, &tables(&[1, bs, bs + 1, 2 * bs], bs, 24), None, None, None, 0, None);
    }
}

/// Against the exact query (f64 reference on the stored values): each logit moves by at
/// most `D = scale * (max|q| / 254) * max_t sum_i |K'(t, i)|`, each output by at most
/// `(exp(2 D) - 1) max|V'|`, the LSE by at most `D` (plus f32 rounding, 1e-5 of the
/// output scale). Also on keys 20x larger in a quarter of the channels.
#[test]
fn int8_query_stays_within_the_documented_bound_of_the_exact_query() {
    let (bs, hkv, hq, d) = (16, 2, 8, 128);
    for gain in [1.0f32, 20.0] {
        let mut c = filled(shape(bs, hkv, d, 16), DType::I8, 4, 1.0);
        if gain != 1.0 {
            let mut r = Lcg(8);
            let n = 16 * bs;
            let k: Vec<f32> = (0..n * hkv * d).map(|i| r.next() * if i % 4 == 0 { gain } else { 1.0 }).collect();
            let v: Vec<f32> = (0..n * hkv * d).map(|_| r.next()).collect();
            c.write(0, &k, &v, &(0..n as i64).collect::<Vec<_>>()).unwrap();
        }
        let t = tables(&[100, 256, 17], bs, 16);
        let q = query(3 * hq * d, 3);
        let scale = 1.0 / (d as f64).sqrt();
        let (exact, exact_lse) = reference_window(&c, &q, hq, &t, scale, None, 0);
        let (ks, vs) = c.dequantize(0).unwrap();
        let vmax = vs.iter().fold(0f64, |a, &x| a.max(x.abs() as f64));
        let l1max = ks.chunks(d).map(|k| k.iter().map(|x| x.abs() as f64).sum::<f64>()).fold(0.0, f64::max);
        let scale_out = exact.iter().fold(1e-3f64, |a, x| a.max(x.abs()));
        for isa in Isa::available() {
            let mut out = vec![0f32; q.len()];
            let mut lse = vec![0f32; 3 * hq];
            let opts = DecodeOptions { tuning: on(isa), precision: INT8_QUERY, ..Default::default() };
            decode_attention(&c, 0, &q, hq, &t, &mut out, Some(&mut lse), &opts).unwrap();
            let mut worst = 0f64;
            for row in 0..3 * hq {
                let qmax = q[row * d..(row + 1) * d].iter().fold(0f64, |a, &x| a.max(x.abs() as f64));
                let dl = scale * qmax / 254.0 * l1max;
                let bound = (2.0 * dl).exp_m1() * vmax + 1e-5 * scale_out;
                for x in row * d..(row + 1) * d {
                    let e = (out[x] as f64 - exact[x]).abs();
                    assert!(e <= bound, "{isa:?} gain {gain} row {row}: {e} > {bound}");
                    worst = worst.max(e / bound);
                }
                let el = (lse[row] as f64 - exact_lse[row]).abs();
                assert!(el <= dl + 1e-5 * exact_lse[row].abs().max(1.0), "{isa:?} lse row {row}: {el} > {dl}");
            }
            // The quantization is visible (the test can fail) yet far inside the bound.
            assert!(worst > 0.0 && worst < 0.5, "{isa:?} gain {gain}: worst error / bound {worst}");
        }
    }
}

#[test]
fn int8_query_needs_an_int8_cache_and_leaves_out_untouched() {
    let opts = |isa| DecodeOptions { tuning: on(isa), precision: INT8_QUERY, ..Default::default() };
    check_int8_only_option(|dtype| refusal(INT8_QUERY, Kernel::Decode, dtype), opts, true);
}

/// An option for int8 caches only (`opts` per path): every other cache refused with the
/// message `refusal(dtype)` and `out` untouched; on an int8 cache large logits stay
/// finite and a NaN in the query gives NaN where the exact path does (with `same_values`,
/// the exact path's values everywhere else too).
pub(super) fn check_int8_only_option(refusal: impl Fn(DType) -> String, opts: impl Fn(Isa) -> DecodeOptions, same_values: bool) {
    let t = SeqTables::padded(&[0, 1, 2], 3, &[40], 16, 8).unwrap();
    let q = vec![500f32; 64];
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::E4M3, DType::E5M2] {
        let c = filled(shape(16, 1, 64, 8), dtype, 3, 1.0);
        let mut out = vec![7f32; 64];
        for isa in Isa::available() {
            let e = decode_attention(&c, 0, &q, 1, &t, &mut out, None, &opts(isa)).unwrap_err();
            assert_eq!(e.to_string(), refusal(dtype));
        }
        assert!(out.iter().all(|&x| x == 7.0), "out untouched on error");
    }
    let c = filled(shape(16, 1, 64, 8), DType::I8, 3, 1.0);
    let mut qn = q.clone();
    qn[5] = f32::NAN;
    for isa in Isa::available() {
        let mut out = vec![0f32; 64];
        decode_attention(&c, 0, &q, 1, &t, &mut out, None, &opts(isa)).unwrap();
        assert!(out.iter().all(|x| x.is_finite() && x.abs() <= 1.0 + 1e-5), "{isa:?}");
        let mut exact = vec![0f32; 64];
        let plain = DecodeOptions { tuning: on(isa), ..Default::default() };
        decode_attention(&c, 0, &qn, 1, &t, &mut exact, None, &plain).unwrap();
        decode_attention(&c, 0, &qn, 1, &t, &mut out, None, &opts(isa)).unwrap();
        let same = |a: &f32, b: &f32| if same_values { a == b || (a.is_nan() && b.is_nan()) } else { a.is_nan() == b.is_nan() };
        assert!(out.iter().zip(&exact).all(|(a, b)| same(a, b)), "{isa:?} {out:?} {exact:?}");
    }
}
