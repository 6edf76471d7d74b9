//! A bf16 query (`Precision { q: BF16, pv: F32 }`) on fp8 caches (e4m3, e5m2): every path
//! (AVX-512 with `vdpbf16ps` on the codes widened to bf16 where the CPU has avx512_bf16
//! and avx512vbmi, the others with f32 FMAs on the rounded query) against the f64
//! reference of the bf16-rounded query on the dequantized values, within 1e-5 of the
//! output scale: fp8 codes are exact in bf16, so the query's rounding is the precision's
//! only one. At the bounds of the loads: tail lengths 1..16, odd head dims and ones that
//! are not a multiple of 32 or 64, g = 1, 2, 4, 8, block sizes 1, 8, 16 (the one-load pair
//! path) and 32, splits, windows and sinks; and with a soft cap.

use super::decode::{decode_attention, DecodeOptions};
use super::options::Tuning;
use super::isa::{Features, Isa};
use super::options::Kernel;
use super::tables::SeqTables;
use super::test_util::{filled, last_block_case, on, refusal, shape, tuned, Lcg, BF16_QUERY};
use super::tests::{reference_window, wide_reference, CAPS};
use super::wide::Logits;
use crate::kv::{DType, KvCache};

const FP8: [DType; 2] = [DType::E4M3, DType::E5M2];

/// The options of one call (path set per path).
#[derive(Clone, Copy, Default)]
struct Mode {
    split: Option<usize>,
    kpi: Option<usize>,
    window_left: Option<usize>,
    sinks: usize,
    cap: Option<f32>,
    /// CPU features the routes are chosen without (a CPU that lacks them).
    without: &'static [&'static str],
}

/// Every path with a bf16 query on `c` and `t` against the f64 reference of the rounded
/// query over the keys each query sees (with a soft cap: [`wide_reference`] with the same
/// cap, the query 4x larger so that the cap bites).
fn compare(c: &KvCache, hq: usize, t: &SeqTables, m: Mode, seed: u64) {
    let d = c.shape().head_dim;
    let mut r = Lcg(seed);
    let amp = if m.cap.is_some() { 12.0 } else { 3.0 };
    let q: Vec<f32> = (0..t.len() * hq * d).map(|_| r.next() * amp).collect();
    let qr: Vec<f32> = q.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect();
    let (want, want_lse) = match m.cap {
        None => reference_window(c, &qr, hq, t, 1.0 / (d as f64).sqrt(), m.window_left, m.sinks),
        Some(_) => wide_reference(c, &qr, hq, t, Logits { scale: 1.0 / (d as f32).sqrt(), soft_cap: m.cap }, m.window_left, m.sinks),
    };
    let scale_out = want.iter().fold(1e-3f64, |a, x| a.max(x.abs()));
    for isa in Isa::available() {
        let (mut out, mut lse) = (vec![f32::NAN; q.len()], vec![f32::NAN; t.len() * hq]);
        let opts = DecodeOptions {
            precision: BF16_QUERY,
            logits_soft_cap: m.cap,
            window_left: m.window_left,
            sink_tokens: m.sinks,
            tuning: Tuning { features: Some(Features::cpu().without(m.without)), ..tuned(isa, m.split, m.kpi) },
            ..Default::default()
        };
        decode_attention(c, 0, &q, hq, t, &mut out, Some(&mut lse), &opts).unwrap();
        let what = format!("{isa:?} {:?} {:?} hq={hq} split={:?} window={:?} cap={:?}", c.dtype(), c.shape(), m.split, m.window_left, m.cap);
        for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
            assert!((o as f64 - w).abs() <= 1e-5 * scale_out, "{what} at {i}: {o} vs {w}");
        }
        for (&o, &w) in lse.iter().zip(&want_lse) {
            assert!(o as f64 == w || (o as f64 - w).abs() <= 1e-5 * w.abs().max(1.0), "{what} lse {o} vs {w}");
        }
    }
}

/// Tables of `lens` running backwards from the pool's last block (always read).
fn tables(nb: usize, bs: usize, lens: &[usize]) -> SeqTables {
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
fn fp8_bf16_query_matches_the_rounded_query_reference_at_every_tail() {
    let lens: Vec<usize> = (1..=16).chain([31, 33, 40]).collect();
    let mut k = 0;
    for dt in FP8 {
        for d in [1, 2, 3, 7, 33, 64, 65, 96, 128, 130] {
            for bs in [1, 8, 16, 32] {
                let (hkv, g) = [(1, 1), (2, 2), (1, 4), (2, 8)][k % 4];
                k += 1;
                let c = filled(shape(bs, hkv, d, 40usize.div_ceil(bs) * lens.len()), dt, (d * 7 + bs) as u64, 1.0);
                let t = tables(c.shape().num_blocks, bs, &lens);
                compare(&c, hkv * g, &t, Mode::default(), 3);
                compare(&c, hkv * g, &t, Mode { split: Some(bs), kpi: Some(1), ..Default::default() }, 4);
            }
        }
    }
}

#[test]
fn fp8_bf16_query_over_every_head_group_and_larger_keys() {
    for dt in FP8 {
        for g in [1, 2, 3, 4, 5, 8] {
            // Keys 3x larger: logits up to about 100 (f32 keeps 1e-5 of the output scale),
            // far enough from 0 that the lazy maximum moves.
            let c = filled(shape(16, 2, 128, 24), dt, g as u64, 3.0);
            let t = tables(24, 16, &[1, 17, 100, 190]);
            compare(&c, 2 * g, &t, Mode::default(), g as u64);
        }
    }
}

#[test]
fn fp8_bf16_query_reads_the_last_token_of_the_pools_last_block() {
    for dt in FP8 {
        for bs in [1, 8, 16, 32] {
            for d in [1, 2, 3, 7, 64, 65, 128] {
                let (c, t, _) = last_block_case(dt, bs, d, 1.0);
                compare(&c, 6, &t, Mode::default(), 5);
                compare(&c, 6, &t, Mode { split: Some(1), kpi: Some(1), ..Default::default() }, 6);
            }
        }
    }
}

/// Windows start inside their first block (the chunk's first token at any lane), sinks add
/// a second run.
#[test]
fn fp8_bf16_query_with_windows_and_sinks() {
    for dt in FP8 {
        for (bs, wl, sinks) in [(16, 5, 0), (16, 20, 3), (8, 0, 1), (32, 40, 17), (1, 3, 2)] {
            let lens = [1, 7, 16, 37, 90];
            let c = filled(shape(bs, 2, 72, 100usize.div_ceil(bs) * lens.len()), dt, bs as u64, 1.0);
            let t = tables(c.shape().num_blocks, bs, &lens);
            for split in [None, Some(bs)] {
                compare(&c, 8, &t, Mode { split, window_left: Some(wl), sinks, ..Default::default() }, 7);
            }
        }
    }
}

/// With a soft cap: the fp8 `vdpbf16ps` scores (block sizes 8, 16 and 32, a tile's chunks
/// two at a time at 32; g = 1 to 8) and the FMA paths' go through the tile loop's cap,
/// with windows, sinks and splits.
#[test]
fn fp8_bf16_query_with_a_soft_cap() {
    for dt in FP8 {
        for (bs, d, hkv, g) in [(16, 128, 2, 1), (16, 64, 1, 4), (32, 65, 2, 2), (8, 128, 1, 8)] {
            let lens = [1, 7, 16, 37, 90];
            let c = filled(shape(bs, hkv, d, 100usize.div_ceil(bs) * lens.len()), dt, (bs + d) as u64, 1.0);
            let t = tables(c.shape().num_blocks, bs, &lens);
            for cap in CAPS.into_iter().skip(1) {
                compare(&c, hkv * g, &t, Mode { cap, ..Default::default() }, 12);
                compare(&c, hkv * g, &t, Mode { cap, split: Some(bs), kpi: Some(1), window_left: Some(20), sinks: 3, without: &[] }, 13);
            }
        }
    }
}

/// On a CPU with avx512_bf16 but no avx512vbmi (no byte permutes) the AVX-512 path runs
/// its exact kernel on the rounded query: the same semantics, checked the same way.
#[cfg(target_arch = "x86_64")]
#[test]
fn fp8_bf16_query_without_vbmi_uses_the_exact_kernel_on_the_rounded_query() {
    for dt in FP8 {
        for (bs, d) in [(16, 128), (8, 65), (1, 3)] {
            let (c, t, _) = last_block_case(dt, bs, d, 1.0);
            compare(&c, 6, &t, Mode { without: &["avx512vbmi"], ..Default::default() }, 9);
            compare(&c, 6, &t, Mode { split: Some(1), kpi: Some(1), without: &["avx512vbmi"], ..Default::default() }, 10);
        }
    }
}

/// Refused with the message that names the pair and lists the valid ones for the cache.
#[test]
fn bf16_query_refuses_f32_f16_and_int8_caches_and_leaves_out_untouched() {
    let t = SeqTables::padded(&[0, 1, 2], 3, &[40], 16, 8).unwrap();
    let q = vec![0.5f32; 64];
    for dtype in [DType::F32, DType::F16, DType::I8] {
        let c = filled(shape(16, 1, 64, 8), dtype, 3, 1.0);
        let mut out = vec![7f32; 64];
        for isa in Isa::available() {
            let opts = DecodeOptions { tuning: on(isa), precision: BF16_QUERY, ..Default::default() };
            let e = decode_attention(&c, 0, &q, 1, &t, &mut out, None, &opts).unwrap_err().to_string();
            assert_eq!(e, refusal(BF16_QUERY, Kernel::Decode, dtype));
        }
        assert!(out.iter().all(|&x| x == 7.0), "out untouched on error");
    }
}
