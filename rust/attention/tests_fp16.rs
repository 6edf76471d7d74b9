//! f16 query and probabilities (`Precision { q: F16, pv: F16 }`, fp8 caches,
//! [`super::avx512_fp16`]) against the f64 reference on the dequantized values, within the
//! bound the module derives: head_dims 64 to 256, GQA ratios 1 to 8 (head tiles of 1 to 4,
//! items run in groups of KV heads), every chunk tail, windows and sinks whose first key
//! sits inside a block, split items, a soft cap; values at the top of the fp8 range and
//! large queries (the powers of two that keep the f16 sums finite); and the refusals.

use super::decode::{decode_attention, DecodeOptions};
use super::isa::{Features, Isa};
use super::options::{Kernel, Precision};
use super::tables::SeqTables;
use super::test_util::{refusal, tuned, Lcg, F16_PRECISION};
use super::tests::{reference_window, wide_reference, CAPS};
use super::wide::Logits;
use crate::kv::{DType, KvCache, KvShape};

const FP8: [DType; 2] = [DType::E4M3, DType::E5M2];

/// Whether this CPU runs the f16 path (else the switch changes nothing here).
fn f16_here() -> bool {
    Isa::Avx512.supported() && Features::cpu().has("avx512fp16")
}

/// A one-layer cache of `dtype` (block size 16) holding sequences of `lens` tokens on
/// blocks counted down from the pool's last: K uniform in `[-k_amp, k_amp)`, V in
/// `[-1, 1)` (the first write calibrates the fp8 scales to the data's range).
fn case(dtype: DType, d: usize, hkv: usize, lens: &[usize], k_amp: f32, seed: u64) -> (KvCache, SeqTables) {
    let bs = 16;
    let width = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap_or(0).max(1);
    let nblocks = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 1;
    let s = KvShape { num_layers: 1, num_blocks: nblocks, block_size: bs, num_kv_heads: hkv, head_dim: d };
    let row = hkv * d;
    let mut r = Lcg(seed);
    let k: Vec<f32> = (0..nblocks * bs * row).map(|_| k_amp * r.next()).collect();
    let v: Vec<f32> = (0..nblocks * bs * row).map(|_| r.next()).collect();
    let mut c = KvCache::new(s, dtype).unwrap();
    c.write(0, &k, &v, &(0..(nblocks * bs) as i64).collect::<Vec<_>>()).unwrap();
    let mut table = vec![-1i64; lens.len() * width];
    let mut next = nblocks;
    for (i, &len) in lens.iter().enumerate() {
        for b in 0..len.div_ceil(bs) {
            next -= 1;
            table[i * width + b] = next as i64;
        }
    }
    let seq_lens: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
    (c, SeqTables::padded(&table, width, &seq_lens, bs, nblocks).unwrap())
}

/// The module's bound per output row (sequence, query head): scores (log2 units) within
/// `delta = (d / 4 + 2) 2^-11 log2(e) scale max_t sum_i |q_i K_i|` (plus `d 2^-24` of the
/// row's scaled sum, folded in as one more 2^-11 term), so each output within
/// `(2^(2 delta) - 1) max|V|`, plus `P V`'s `18 * 2^-11 max|V|`, plus 1e-5 of the output
/// scale for the f32 steps; the LSE (natural log) within `delta ln 2`.
fn bounds(c: &KvCache, q: &[f32], hq: usize, t: &SeqTables, keys: &dyn Fn(usize) -> Vec<usize>) -> Vec<(f64, f64)> {
    let s = c.shape();
    let (d, g, bs) = (s.head_dim, hq / s.num_kv_heads, s.block_size);
    let (ks, vs) = c.dequantize(0).unwrap();
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = Vec::new();
    for i in 0..t.len() {
        for h in 0..hq {
            let kv = h / g;
            let at = |tok: usize, x: usize| ((t.block(i, tok / bs).unwrap() as usize * bs + tok % bs) * s.num_kv_heads + kv) * d + x;
            let qv = &q[(i * hq + h) * d..][..d];
            let (mut qk, mut vmax) = (0f64, 0f64);
            for tok in keys(i) {
                qk = qk.max((0..d).map(|x| (qv[x] as f64 * ks[at(tok, x)] as f64).abs()).sum());
                vmax = (0..d).fold(vmax, |m, x| m.max(vs[at(tok, x)].abs() as f64));
            }
            let delta = (d as f64 / 4.0 + 3.0) * 2f64.powi(-11) * std::f64::consts::LOG2_E * scale * qk;
            out.push(((2f64.powf(2.0 * delta) - 1.0) * vmax + 18.0 * 2f64.powi(-11) * vmax, delta * std::f64::consts::LN_2));
        }
    }
    out
}

/// One call's options besides the path and the precision.
#[derive(Clone, Copy, Default)]
struct Mode {
    window_left: Option<usize>,
    sinks: usize,
    split: Option<usize>,
    cap: Option<f32>,
}

/// Every path with the exact precision and with [`F16_PRECISION`] against the reference
/// (with a soft cap, [`wide_reference`] with the same cap: the cap is 1-Lipschitz, so the
/// scores' bound holds after it): the exact precision within 1e-5 of the output scale, the
/// f16 one within [`bounds`]. Returns the largest deviation of the f16 precision from the
/// reference over the output scale.
fn compare(c: &KvCache, t: &SeqTables, hq: usize, q_amp: f32, m: Mode, seed: u64) -> f64 {
    let Mode { window_left: wl, sinks, split, cap } = m;
    let s = c.shape();
    let d = s.head_dim;
    let mut r = Lcg(seed);
    let q: Vec<f32> = (0..t.len() * hq * d).map(|_| q_amp * r.next()).collect();
    let (want, want_lse) = match cap {
        None => reference_window(c, &q, hq, t, 1.0 / (d as f64).sqrt(), wl, sinks),
        Some(_) => wide_reference(c, &q, hq, t, Logits { scale: 1.0 / (d as f32).sqrt(), soft_cap: cap }, wl, sinks),
    };
    let keys = |i: usize| {
        let len = t.seq_len(i);
        (0..len).filter(|&k| k < sinks || wl.is_none_or(|w| len - 1 - k <= w)).collect::<Vec<_>>()
    };
    let bound = bounds(c, &q, hq, t, &keys);
    let scale_out = want.iter().fold(1e-3f64, |a, x| a.max(x.abs()));
    let mut worst = 0f64;
    for isa in Isa::available() {
        for fp16 in [false, true] {
            let opts = DecodeOptions {
                tuning: tuned(isa, split, None),
                window_left: wl,
                sink_tokens: sinks,
                logits_soft_cap: cap,
                precision: if fp16 { F16_PRECISION } else { Precision::EXACT },
                ..Default::default()
            };
            let (mut out, mut lse) = (vec![f32::NAN; q.len()], vec![f32::NAN; t.len() * hq]);
            decode_attention(c, 0, &q, hq, t, &mut out, Some(&mut lse), &opts).unwrap();
            let what = format!("{isa:?} {:?} d={d} hq={hq} fp16={fp16} wl={wl:?} sinks={sinks} split={split:?} cap={cap:?}", c.dtype());
            for (row, (b, b_lse)) in bound.iter().enumerate() {
                let tol = if fp16 { b + 1e-5 * scale_out } else { 1e-5 * scale_out };
                for x in 0..d {
                    let (o, w) = (out[row * d + x] as f64, want[row * d + x]);
                    assert!((o - w).abs() <= tol, "{what} row {row} dim {x}: {o} vs {w} (bound {tol})");
                    if fp16 {
                        worst = worst.max((o - w).abs() / scale_out);
                    }
                }
                let (o, w) = (lse[row] as f64, want_lse[row]);
                let tol = if fp16 { b_lse + 1e-5 * w.abs().max(1.0) } else { 1e-5 * w.abs().max(1.0) };
                assert!(o == w || (o - w).abs() <= tol, "{what} lse row {row}: {o} vs {w}");
            }
        }
    }
    worst
}

/// Head dims 64 to 256, GQA ratios 1 to 8, chunk tails 1..16 and several chunks, both
/// fp8 formats, unsplit and split; a sequence of 19 blocks.
#[test]
fn f16_precision_is_within_its_bound_of_the_reference() {
    let lens = [1, 7, 16, 17, 31, 100, 300];
    for dtype in FP8 {
        // (128, 4, 4) and (64, 3, 8): items of more KV heads than one group of query vectors
        // (`avx512_fp16::run`), in groups of 2 and of 2 + 1.
        for (d, hkv, g) in [(64, 2, 1), (128, 2, 2), (128, 1, 3), (128, 2, 4), (192, 1, 4), (256, 1, 2), (128, 1, 8), (128, 4, 4), (64, 3, 8)] {
            let (c, t) = case(dtype, d, hkv, &lens, 1.0, d as u64 + g as u64);
            for split in [None, Some(16)] {
                compare(&c, &t, hkv * g, 2.0, Mode { split, ..Mode::default() }, 3);
            }
        }
    }
}

/// A window whose first visible key sits inside a block (a chunk starting mid-tile, a
/// masked K load) with sinks.
#[test]
fn f16_precision_honours_windows_and_sinks() {
    for dtype in FP8 {
        let (c, t) = case(dtype, 128, 2, &[90, 61, 33], 1.0, 5);
        for (wl, sinks) in [(Some(20), 0), (Some(37), 3), (Some(5), 16)] {
            compare(&c, &t, 8, 2.0, Mode { window_left: wl, sinks, ..Mode::default() }, 7);
        }
        // Items in head groups (g = 4, 4 KV heads: `Work::in_head_groups`) whose window's
        // first key sits inside a block, over 12-16 blocks.
        let (c, t) = case(dtype, 128, 4, &[400, 61], 1.0, 6);
        for (wl, sinks) in [(Some(230), 0), (Some(181), 5)] {
            compare(&c, &t, 16, 2.0, Mode { window_left: wl, sinks, ..Mode::default() }, 8);
        }
    }
}

/// With a soft cap (queries at 12: logits of standard deviation about 4), head tiles of 1
/// to 4 heads, items in head groups, a window starting inside a block with sinks, splits.
#[test]
fn f16_precision_with_a_soft_cap_is_within_its_bound() {
    for dtype in FP8 {
        for (d, hkv, g) in [(64, 2, 1), (128, 2, 3), (128, 4, 4)] {
            let (c, t) = case(dtype, d, hkv, &[1, 17, 90, 300], 1.0, 21 + d as u64);
            for cap in CAPS.into_iter().skip(1) {
                compare(&c, &t, hkv * g, 12.0, Mode { cap, ..Mode::default() }, 23);
                let m = Mode { window_left: Some(37), sinks: 3, split: Some(16), cap };
                compare(&c, &t, hkv * g, 12.0, m, 24);
            }
        }
    }
}

/// Keys and queries at large magnitudes: the codes span the format's range (calibrated
/// scales put the largest key at the top code) and the queries are 1,000x, so without
/// the powers of two the f16 sums would overflow; the result stays within the bound.
#[test]
fn f16_precision_keeps_large_sums_finite() {
    for dtype in FP8 {
        for (k_amp, q_amp) in [(1000.0, 1000.0), (1e-3, 1e4), (30.0, 0.01)] {
            let (c, t) = case(dtype, 128, 1, &[64, 50], k_amp, 9);
            compare(&c, &t, 4, q_amp, Mode::default(), 11);
        }
    }
}

/// Where the f16 path runs, it is taken (the outputs differ from the exact path's) and
/// its typical error on uniform data is far below the bound: under 2e-3 of the output
/// scale.
#[test]
fn f16_precision_runs_where_the_cpu_has_it() {
    if !f16_here() {
        eprintln!("SKIPPED: no avx512fp16");
        return;
    }
    for dtype in FP8 {
        let (c, t) = case(dtype, 128, 2, &[300, 129], 1.0, 13);
        let worst = compare(&c, &t, 8, 2.0, Mode::default(), 17);
        assert!(worst > 0.0 && worst < 2e-3, "{dtype:?}: {worst}");
    }
}

/// Refused on other caches, and on fp8 caches with a bf16 query and f16 probabilities
/// (no such precision); the message names the pair and lists the valid ones, the output
/// is not written.
#[test]
fn f16_precision_needs_an_fp8_cache_and_bf16_with_f16_is_refused() {
    let s = KvShape { num_layers: 1, num_blocks: 2, block_size: 16, num_kv_heads: 1, head_dim: 64 };
    let t = SeqTables::padded(&[0], 1, &[3], 16, 2).unwrap();
    let q = vec![0.5f32; 64];
    let bf16_f16 = Precision { q: DType::BF16, pv: DType::F16 };
    let cases = [
        (DType::F32, F16_PRECISION),
        (DType::F16, F16_PRECISION),
        (DType::BF16, F16_PRECISION),
        (DType::I8, F16_PRECISION),
        (DType::E4M3, bf16_f16),
        (DType::E5M2, bf16_f16),
    ];
    for (dtype, precision) in cases {
        let c = KvCache::new(s, dtype).unwrap();
        let opts = DecodeOptions { precision, ..Default::default() };
        let mut out = vec![7f32; 64];
        let e = decode_attention(&c, 0, &q, 1, &t, &mut out, None, &opts).unwrap_err().to_string();
        assert_eq!(e, refusal(precision, Kernel::Decode, dtype));
        assert!(out.iter().all(|&x| x == 7.0));
    }
    let ok = DecodeOptions { precision: F16_PRECISION, ..Default::default() };
    let mut out = vec![7f32; 64];
    decode_attention(&KvCache::new(s, DType::E5M2).unwrap(), 0, &q, 1, &t, &mut out, None, &ok).unwrap();
}
