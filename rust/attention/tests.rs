//! Every supported path against an f64 reference computed from the stored values, at the
//! bounds the unsafe loads rely on: last block of the pool, partial chunks (block sizes
//! not multiple of the vector width, lengths ending mid-block), head dims with a tail.


use super::decode::*;
use super::isa::*;
use super::options::{Kernel, Precision, Tuning};
use super::tables::*;
use super::test_util::{filled, last_block_case, on, refusal, shape, tuned, Lcg, BF16_QUERY};
use super::query::scaled_query;
use super::wide::{self, Logits};
use crate::kv::{DType, KvCache, KvShape};

/// Every storage dtype: the kernels' references run on the dequantized values.
/// Say on the terminal, past the test harness's output capture, that `what` was not
/// tested on this CPU: `cargo test` has no "skipped" state, and a silent early return
/// would read as a pass.
fn skip_loudly(what: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {what}: {why}");
}

fn reference(c: &KvCache, q: &[f32], hq: usize, t: &SeqTables, scale: f64) -> (Vec<f64>, Vec<f64>) {
    reference_window(c, q, hq, t, scale, None, 0)
}

/// f64 decode attention over the keys the query at `len - 1` sees (`p - k <= window_left`
/// or `k < sinks`), K/V read through the checked entries of their blocks only.
pub(super) fn reference_window(
    c: &KvCache,
    q: &[f32],
    hq: usize,
    t: &SeqTables,
    scale: f64,
    window_left: Option<usize>,
    sinks: usize,
) -> (Vec<f64>, Vec<f64>) {
    let s = c.shape();
    let (d, g, bs) = (s.head_dim, hq / s.num_kv_heads, s.block_size);
    // The stored values (8-bit: codes times scales) in the logical order.
    let (ks, vs) = c.dequantize(0).unwrap();
    let logical = [bs * s.num_kv_heads * d, s.num_kv_heads * d, d, 1];
    let (kst, vst) = (logical, logical);
    let mut out = vec![0f64; q.len()];
    let mut lse = vec![f64::NEG_INFINITY; t.len() * hq];
    for i in 0..t.len() {
        let len = t.seq_len(i);
        let keys: Vec<usize> =
            (0..len).filter(|&k| k < sinks || window_left.is_none_or(|w| len - 1 - k <= w)).collect();
        for h in 0..hq {
            let kv = h / g;
            let qv = &q[(i * hq + h) * d..][..d];
            let at = |st: [usize; 4], tok: usize, x: usize| {
                t.block(i, tok / bs).unwrap() as usize * st[0] + (tok % bs) * st[1] + kv * st[2] + x * st[3]
            };
            let logits: Vec<f64> = keys
                .iter()
                .map(|&tok| (0..d).map(|x| qv[x] as f64 * ks[at(kst, tok, x)] as f64).sum::<f64>() * scale)
                .collect();
            if len == 0 {
                continue;
            }
            let mx = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = logits.iter().map(|l| (l - mx).exp()).sum();
            lse[i * hq + h] = mx + z.ln();
            for (&tok, l) in keys.iter().zip(&logits) {
                let p = (l - mx).exp() / z;
                for x in 0..d {
                    out[(i * hq + h) * d + x] += p * vs[at(vst, tok, x)] as f64;
                }
            }
        }
    }
    (out, lse)
}

/// The f64 overflow fallback ([`wide::row`]) on every row: decode attention of `q` with
/// `logits` over the keys the query at `len - 1` sees (`p - k <= window_left` or
/// `k < sinks`): the reference of the calls with a soft cap.
pub(super) fn wide_reference(
    c: &KvCache,
    q: &[f32],
    hq: usize,
    t: &SeqTables,
    logits: Logits,
    window_left: Option<usize>,
    sinks: usize,
) -> (Vec<f64>, Vec<f64>) {
    let s = c.shape();
    let (d, g) = (s.head_dim, hq / s.num_kv_heads);
    let vis = t.select(|_, len, r| visible_keys(len, window_left, sinks, r)).unwrap();
    let mut out = vec![f32::NAN; q.len()];
    let mut lse = vec![f32::NAN; t.len() * hq];
    crate::with_elem!(c.dtype(), E => {
        let (k, v) = c.layer::<E>(0).unwrap();
        let layer = wide::Layer { k, v, scales: c.scales(0).unwrap(), shape: s };
        for i in 0..t.len() {
            for h in 0..hq {
                let row = i * hq + h;
                let (q, out) = (&q[row * d..(row + 1) * d], &mut out[row * d..(row + 1) * d]);
                lse[row] = wide::row(&layer, &vis, i, |_| true, q, h / g, logits, out);
            }
        }
    });
    (out.iter().map(|&x| f64::from(x)).collect(), lse.iter().map(|&x| f64::from(x)).collect())
}

/// The soft-cap dimension: none, one that flattens most logits, one that bends the large
/// ones (with the larger query of [`compare`], logits reach about +-12).
pub(super) const CAPS: [Option<f32>; 3] = [None, Some(1.5), Some(30.0)];

/// One call's options besides the path.
#[derive(Clone, Copy, Debug, Default)]
struct Mode {
    split: Option<usize>,
    kpi: Option<usize>,
    /// Exact, or [`BF16_QUERY`] (bf16 and fp8 caches).
    precision: Precision,
    cap: Option<f32>,
    /// CPU features the routes are chosen without (a CPU that lacks them).
    without: &'static [&'static str],
}

impl Mode {
    /// Exact and uncapped, with `split` tokens per split and `kpi` KV heads per item.
    fn split(split: Option<usize>, kpi: Option<usize>) -> Mode {
        Mode { split, kpi, ..Mode::default() }
    }
}

fn check(shape: KvShape, dtype: DType, hq: usize, lens: &[usize], m: Mode) {
    let c = filled(shape, dtype, (shape.head_dim * 31 + hq) as u64, 1.0);
    let bs = shape.block_size;
    // Tables run backwards from the pool's last block, so the last block is always read.
    let width = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap_or(0);
    let mut table = vec![-1i64; lens.len() * width];
    let mut next = shape.num_blocks as i64 - 1;
    for (i, l) in lens.iter().enumerate() {
        for b in 0..l.div_ceil(bs) {
            table[i * width + b] = next;
            next = (next - 1).rem_euclid(shape.num_blocks as i64);
        }
    }
    let seq_lens: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
    let t = SeqTables::padded(&table, width, &seq_lens, bs, shape.num_blocks).unwrap();
    compare(&c, hq, &t, m);
}

/// The query rounded to bf16 (nearest even), as a bf16 query precision uses it.
fn bf16_rounded(q: &[f32]) -> Vec<f32> {
    q.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect()
}

/// Every supported path on `c` and tables `t` against the f64 reference, within 1e-5 of
/// the output scale (the LSE within 1e-5 relative). With a bf16 query the reference uses
/// the bf16-rounded query (the precision's semantics). With a soft cap the query is 4x
/// larger (logits of standard deviation about 4) so that the cap bites, the scalar path
/// is held to [`wide_reference`] with the same cap and every other path to the scalar
/// one.
fn compare(c: &KvCache, hq: usize, t: &SeqTables, m: Mode) {
    let (shape, dtype) = (c.shape(), c.dtype());
    let mut r = Lcg(7);
    let amp = if m.cap.is_some() { 12.0 } else { 3.0 };
    let q: Vec<f32> = (0..t.len() * hq * shape.head_dim).map(|_| r.next() * amp).collect();
    let qr = if m.precision.q == DType::BF16 { bf16_rounded(&q) } else { q.clone() };
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let (mut want, mut want_lse) = match m.cap {
        None => reference(c, &qr, hq, t, 1.0 / (shape.head_dim as f64).sqrt()),
        Some(_) => wide_reference(c, &qr, hq, t, Logits { scale, soft_cap: m.cap }, None, 0),
    };
    let scale_out = want.iter().fold(1e-3f64, |a, x| a.max(x.abs()));
    let mut against = "reference";
    for isa in Isa::available() {
        let mut out = vec![f32::NAN; q.len()];
        let mut lse = vec![f32::NAN; t.len() * hq];
        let tuning = Tuning { features: Some(Features::cpu().without(m.without)), ..tuned(isa, m.split, m.kpi) };
        let opts = DecodeOptions { tuning, precision: m.precision, logits_soft_cap: m.cap, ..Default::default() };
        decode_attention(c, 0, &q, hq, t, &mut out, Some(&mut lse), &opts).unwrap();
        let what = format!("{isa:?} {dtype:?} {shape:?} hq={hq} {m:?} against the {against}");
        for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
            assert!((o as f64 - w).abs() <= 1e-5 * scale_out, "{what} at {i}: {o} vs {w}");
        }
        for (&o, &w) in lse.iter().zip(&want_lse) {
            assert!(o as f64 == w || (o as f64 - w).abs() <= 1e-5 * w.abs().max(1.0), "{what} lse {o} vs {w}");
        }
        if m.cap.is_some() && isa == Isa::Scalar {
            // `Isa::available` lists the scalar path first (`neon_is_the_best_path_on_aarch64_only`).
            want = out.iter().map(|&x| f64::from(x)).collect();
            want_lse = lse.iter().map(|&x| f64::from(x)).collect();
            against = "scalar path";
        }
    }
}

#[test]
fn all_paths_match_reference_over_shapes() {
    for dtype in DType::ALL {
        for (bs, hkv, hq, d) in [(16, 2, 8, 128), (1, 1, 1, 64), (8, 4, 4, 80), (32, 1, 8, 96), (5, 2, 6, 7), (17, 1, 3, 256)] {
            let s = shape(bs, hkv, d, 40);
            check(s, dtype, hq, &[1, bs, bs + 1, 3 * bs - 1, 0], Mode::default());
        }
    }
}

/// The kernel's test grid: every head dim and block size, GQA ratios 1 to 8 with 1 to 8 KV
/// heads, every dtype, lengths 1, one block, one past it and two blocks, unsplit and one
/// block per split (then merged by log-sum-exp), without and with a soft cap (the 8-bit
/// caches' AVX-512 variants among the paths: e4m3 byte tables at block size 16).
#[test]
fn all_paths_match_reference_over_the_issue_grid() {
    let heads = [(1, 1), (2, 4), (1, 8), (8, 8), (2, 6), (1, 3), (4, 8), (1, 5), (1, 7), (2, 16), (4, 4), (8, 16)];
    let mut k = 0;
    for dtype in DType::ALL {
        for d in [64, 80, 96, 128, 256] {
            for bs in [1, 8, 16, 32] {
                let (hkv, hq) = heads[k % heads.len()];
                k += 1;
                let s = shape(bs, hkv, d, 24);
                let lens = [1, bs, bs + 1, 2 * bs];
                for cap in CAPS {
                    check(s, dtype, hq, &lens, Mode { cap, ..Mode::default() });
                    check(s, dtype, hq, &lens, Mode { cap, ..Mode::split(Some(bs), Some(1)) });
                }
            }
        }
    }
}

/// The unsafe loads at their bounds: a sequence ends on the last token of the pool's last
/// block, read through the last KV head (whose V tile ends the layer's slice), with token
/// chunks and head dims that end mid-vector; others end one token before the end of that
/// block or one token into it.
#[test]
fn last_token_of_the_pools_last_block_is_read() {
    for dtype in DType::ALL {
        for (bs, d) in [(5, 7), (17, 13), (3, 20), (16, 64), (33, 6), (1, 1)] {
            let (c, t, _) = last_block_case(dtype, bs, d, 1.0);
            for (split, kpi) in [(None, None), (Some(1), Some(1))] {
                compare(&c, 6, &t, Mode::split(split, kpi));
            }
        }
    }
}

#[test]
fn empty_batch_is_a_no_op() {
    let c = filled(shape(16, 2, 64, 4), DType::F32, 5, 1.0);
    let t = SeqTables::padded(&[], 0, &[], 16, 4).unwrap();
    for isa in Isa::available() {
        let opts = DecodeOptions { tuning: on(isa), ..Default::default() };
        decode_attention(&c, 0, &[], 4, &t, &mut [], Some(&mut []), &opts).unwrap();
    }
}

/// The x86 paths are offered exactly when the CPU has their features; where it lacks
/// AVX-512 (or `vdpbf16ps`), every test here ran the other paths only, and this test says
/// so on the terminal.
#[test]
fn x86_paths_follow_the_cpu_features_and_missing_ones_are_reported() {
    let has = |fs: &[&str]| fs.iter().all(|f| cpu_features().contains(f));
    #[cfg(target_arch = "x86_64")]
    {
        assert_eq!(Isa::Avx2.supported(), has(&["avx2", "fma", "f16c"]));
        assert_eq!(Isa::Avx512.supported(), has(&["avx512f", "avx512bw", "avx512vl", "fma", "f16c"]));
        assert_eq!(Isa::available().contains(&Isa::Avx512), Isa::Avx512.supported());
        if !Isa::Avx512.supported() {
            skip_loudly("AVX-512 kernel path", "this CPU lacks avx512f/avx512bw/avx512vl; the kernel tests ran the other paths");
        } else if !has(&["avx512bf16"]) {
            skip_loudly("vdpbf16ps scores (a bf16 query on AVX-512)", "this CPU lacks avx512_bf16; tested as on such CPUs");
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        assert!(!has(&["avx512f"]));
        skip_loudly("AVX2 and AVX-512 kernel paths", "not an x86-64 CPU");
    }
}

/// On aarch64 the NEON path is supported and chosen (`tests/aarch64.sh` requires this test
/// to pass, so an emulated run that never reached NEON fails); elsewhere it is reported as
/// unsupported, never silently replaced.
#[test]
fn neon_is_the_best_path_on_aarch64_only() {
    assert_eq!(Isa::available().first(), Some(&Isa::Scalar));
    assert_eq!(Isa::Neon.supported(), cfg!(target_arch = "aarch64"), "{:?}", cpu_features());
    if cfg!(target_arch = "aarch64") {
        assert_eq!(Isa::best(), Isa::Neon);
    }
}

#[test]
fn split_and_head_grouping_agree() {
    let s = shape(16, 4, 64, 64);
    for (split, kpi) in [(Some(0), Some(1)), (Some(16), Some(2)), (Some(40), None), (None, Some(4))] {
        for cap in CAPS {
            check(s, DType::F32, 8, &[300, 1, 17, 0], Mode { cap, ..Mode::split(split, kpi) });
        }
    }
}

#[test]
fn invalid_arguments_are_errors() {
    let c = filled(shape(4, 2, 8, 4), DType::F32, 1, 1.0);
    let t = SeqTables::padded(&[0, 1], 2, &[5], 4, 4).unwrap();
    let q = vec![0f32; 4 * 8];
    let mut out = vec![0f32; 4 * 8];
    let ok = DecodeOptions::default();
    assert!(decode_attention(&c, 0, &q, 4, &t, &mut out, None, &ok).is_ok());
    assert!(decode_attention(&c, 1, &q, 4, &t, &mut out, None, &ok).is_err());
    assert!(decode_attention(&c, 0, &q, 3, &t, &mut out, None, &ok).is_err());
    assert!(decode_attention(&c, 0, &q[1..], 4, &t, &mut out, None, &ok).is_err());
    assert!(decode_attention(&c, 0, &q, 4, &t, &mut out, Some(&mut [0.0; 3]), &ok).is_err());
    let bad = DecodeOptions { scale: Some(f32::NAN), ..Default::default() };
    assert!(decode_attention(&c, 0, &q, 4, &t, &mut out, None, &bad).is_err());
    let bad = DecodeOptions { tuning: Tuning { kv_heads_per_item: Some(3), ..Tuning::default() }, ..Default::default() };
    assert!(decode_attention(&c, 0, &q, 4, &t, &mut out, None, &bad).is_err());
    assert!(Isa::parse("sve").is_err());
    assert_eq!(Isa::ALL.map(|i| Isa::parse(i.name()).ok()), Isa::ALL.map(Some));
    // A path of the other architecture is an error, not a fallback.
    let foreign = if cfg!(target_arch = "aarch64") { Isa::Avx2 } else { Isa::Neon };
    let bad = DecodeOptions { tuning: on(foreign), ..Default::default() };
    assert!(decode_attention(&c, 0, &q, 4, &t, &mut out, None, &bad).is_err());
}

/// Logits in the thousands, without a cap and with one (whose `exp2` argument is then
/// clamped: every logit at `+-cap`).
#[test]
fn large_logits_stay_finite() {
    let c = filled(shape(16, 1, 64, 8), DType::F32, 3, 1.0);
    let t = SeqTables::padded(&[0, 1, 2], 3, &[40], 16, 8).unwrap();
    let q = vec![500f32; 64];
    for cap in CAPS {
        for isa in Isa::available() {
            let mut out = vec![0f32; 64];
            let opts = DecodeOptions { tuning: on(isa), logits_soft_cap: cap, ..Default::default() };
            decode_attention(&c, 0, &q, 1, &t, &mut out, None, &opts).unwrap();
            assert!(out.iter().all(|x| x.is_finite() && x.abs() <= 1.0 + 1e-5), "{isa:?} cap {cap:?}");
        }
    }
}

/// A soft cap of 0, negative, NaN or infinite is refused on every path, the output left
/// untouched; the smallest positive one is taken.
#[test]
fn soft_caps_that_are_not_finite_and_positive_are_refused() {
    let c = filled(shape(4, 2, 8, 4), DType::F32, 1, 1.0);
    let t = SeqTables::padded(&[0, 1], 2, &[5], 4, 4).unwrap();
    let q = vec![0.5f32; 4 * 8];
    for isa in Isa::available() {
        let mut out = vec![7f32; 4 * 8];
        for bad in [0.0, -0.0, -1.5, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let opts = DecodeOptions { tuning: on(isa), logits_soft_cap: Some(bad), ..Default::default() };
            let e = decode_attention(&c, 0, &q, 4, &t, &mut out, None, &opts).unwrap_err().to_string();
            assert_eq!(e, format!("logits_soft_cap must be finite and > 0, got {bad}"), "{isa:?}");
        }
        assert!(out.iter().all(|&x| x == 7.0), "{isa:?}: out untouched on error");
        let tiny = DecodeOptions { tuning: on(isa), logits_soft_cap: Some(f32::MIN_POSITIVE), ..Default::default() };
        decode_attention(&c, 0, &q, 4, &t, &mut out, None, &tiny).unwrap();
        assert!(out.iter().all(|x| x.is_finite()), "{isa:?}");
    }
}

#[test]
fn plan_splits_long_sequences_only() {
    let bs = 16;
    let table = |lens: &[usize]| {
        let width = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap_or(0);
        let t: Vec<i64> = (0..lens.len() * width).map(|i| (i % 4096) as i64).collect();
        let l: Vec<i64> = lens.iter().map(|&x| x as i64).collect();
        let t = SeqTables::padded(&t, width, &l, bs, 4096).unwrap();
        (t.select_all().unwrap(), lens.len())
    };
    let plan = |(v, n): (super::tables::Visible, usize), groups, threads, split| plan(&v, n, bs, groups, threads, split);
    // One 32768-token sequence on 2 threads: 8 splits of 256 blocks, covering it exactly.
    let items = plan(table(&[32768]), 1, 2, None);
    assert_eq!(items.len(), 8);
    assert_eq!(items.iter().map(|i| i.ntok).sum::<usize>(), 32768);
    // Eight equal sequences: each is already a quarter of a thread's share.
    assert_eq!(plan(table(&[4096; 8]), 1, 2, None).len(), 8);
    // Uneven lengths: the long ones are cut, the short ones are not.
    let items = plan(table(&[4096, 300, 300, 300]), 1, 2, None);
    assert!(items.iter().filter(|i| i.seq == 0).count() > 1);
    assert_eq!(items.iter().filter(|i| i.seq == 1).count(), 1);
    // Never split; explicit split size; empty sequence gets one empty item.
    assert_eq!(plan(table(&[32768, 0]), 2, 2, Some(0)).len(), 4);
    assert_eq!(plan(table(&[100]), 1, 1, Some(32)).len(), 4);
    assert_eq!(plan(table(&[0]), 1, 1, None)[0].ntok, 0);
}

/// The AVX-512 path moves its running maximum lazily (only when a score passes it by
/// more than 8 in log2 units): block maxima that rise by just under and just over that
/// step, fall, and jump by 100 must all give the reference result.
#[test]
fn rising_scores_move_the_lazy_maximum() {
    let (bs, d, nb) = (16, 16, 8);
    let s = shape(bs, 1, d, nb);
    let mut c = KvCache::new(s, DType::F32).unwrap();
    // With q = 1 and scale 1/4, token t's logit in log2 units is 4 a log2(e) for K = a.
    let block_max = [0.0f64, 7.9, 16.1, 16.0, 23.9, 20.0, 120.0, 119.0];
    let n = nb * bs;
    let mut k = vec![0f32; n * d];
    let mut v = vec![0f32; n * d];
    for t in 0..n {
        let a = (block_max[t / bs] - 0.37 * (t % bs) as f64) / (4.0 * std::f64::consts::LOG2_E);
        k[t * d..(t + 1) * d].fill(a as f32);
        for x in 0..d {
            v[t * d + x] = ((t * 7 + x * 3) as f32 * 0.1).sin();
        }
    }
    c.write(0, &k, &v, &(0..n as i64).collect::<Vec<_>>()).unwrap();
    let table: Vec<i64> = (0..nb as i64).collect();
    for len in [n, n - 5, 3 * bs + 1, 2 * bs] {
        let t = SeqTables::padded(&table, nb, &[len as i64], bs, nb).unwrap();
        let q = vec![1f32; d];
        let (want, want_lse) = reference(&c, &q, 1, &t, 0.25);
        let scale_out = want.iter().fold(1e-3f64, |a, x| a.max(x.abs()));
        for isa in Isa::available() {
            let (mut out, mut lse) = (vec![f32::NAN; d], vec![f32::NAN; 1]);
            let opts = DecodeOptions { tuning: on(isa), scale: Some(0.25), ..Default::default() };
            decode_attention(&c, 0, &q, 1, &t, &mut out, Some(&mut lse), &opts).unwrap();
            for (&o, &w) in out.iter().zip(&want) {
                assert!((o as f64 - w).abs() <= 1e-5 * scale_out, "{isa:?} len {len}: {o} vs {w}");
            }
            assert!((lse[0] as f64 - want_lse[0]).abs() <= 1e-5 * want_lse[0].abs().max(1.0), "{isa:?} len {len} lse");
        }
    }
}


/// The AVX-512 path without `vdpbf16ps` (a CPU with AVX-512 F/BW/VL but no BF16) keeps
/// the bf16 query's semantics: its exact kernel on the rounded query.
#[test]
fn bf16_query_on_avx512_without_bf16_uses_the_rounded_query() {
    if !Isa::Avx512.supported() {
        skip_loudly("a bf16 query on AVX-512 without vdpbf16ps", "this CPU lacks AVX-512");
        return;
    }
    for (bs, hkv, hq, d) in [(16, 2, 8, 128), (1, 1, 3, 7), (8, 4, 4, 80), (32, 1, 8, 65)] {
        let m = Mode { precision: BF16_QUERY, without: &["avx512bf16"], ..Mode::default() };
        check(shape(bs, hkv, d, 24), DType::BF16, hq, &[1, bs, bs + 1, 2 * bs], m);
    }
}

/// A bf16 query (`Precision { q: BF16, .. }`): every path (AVX-512 with `vdpbf16ps` where
/// the CPU has avx512_bf16, the others with f32 FMAs on the rounded query) against the f64
/// reference of the bf16-rounded query, over the kernel's test grid, unsplit and one
/// block per split, without and with a soft cap (the `vdpbf16ps` scores go through the
/// same tile loop, which caps them).
#[test]
fn bf16_query_matches_the_rounded_query_reference_over_the_issue_grid() {
    let heads = [(1, 1), (2, 4), (1, 8), (8, 8), (2, 6), (1, 3), (4, 8), (1, 5), (1, 7), (2, 16), (4, 4), (8, 16)];
    let mut k = 0;
    for d in [64, 80, 96, 128, 256, 7, 65] {
        for bs in [1, 8, 16, 32] {
            let (hkv, hq) = heads[k % heads.len()];
            k += 1;
            let s = shape(bs, hkv, d, 24);
            let lens = [1, bs, bs + 1, 2 * bs, 2 * bs - 1];
            for cap in CAPS {
                let m = Mode { precision: BF16_QUERY, cap, ..Mode::default() };
                check(s, DType::BF16, hq, &lens, m);
                check(s, DType::BF16, hq, &lens, Mode { split: Some(bs), kpi: Some(1), ..m });
            }
        }
    }
}

/// The `vdpbf16ps` loads at their bounds: the last token of the pool's last block through
/// the last KV head, block sizes 1, 8, 16 (the one-load pair path) and 32, odd head dims
/// (the last row paired with zero) and even ones, partial chunks.
#[test]
fn bf16_query_reads_the_last_token_of_the_pools_last_block() {
    for bs in [1, 8, 16, 32] {
        for d in [1, 2, 3, 7, 64, 65, 128] {
            let (c, t, _) = last_block_case(DType::BF16, bs, d, 1.0);
            for (split, kpi) in [(None, None), (Some(1), Some(1))] {
                compare(&c, 6, &t, Mode { precision: BF16_QUERY, ..Mode::split(split, kpi) });
            }
        }
    }
}

/// A bf16 query is refused on f32 and f16 caches (the message names the pair and lists
/// the valid ones) and stays finite on large logits on a bf16 cache.
#[test]
fn bf16_query_needs_a_bf16_cache_and_stays_finite_on_large_logits() {
    let t = SeqTables::padded(&[0, 1, 2], 3, &[40], 16, 8).unwrap();
    let q = vec![500f32; 64];
    let opts = |isa| DecodeOptions { tuning: on(isa), precision: BF16_QUERY, ..Default::default() };
    for dtype in [DType::F32, DType::F16] {
        let c = filled(shape(16, 1, 64, 8), dtype, 3, 1.0);
        let mut out = vec![7f32; 64];
        for isa in Isa::available() {
            let e = decode_attention(&c, 0, &q, 1, &t, &mut out, None, &opts(isa)).unwrap_err().to_string();
            assert_eq!(e, refusal(BF16_QUERY, Kernel::Decode, dtype));
            assert!(e.starts_with("q_dtype=bf16 with pv_dtype=f32 is not a decode precision for"), "{e}");
        }
        assert!(out.iter().all(|&x| x == 7.0), "out untouched on error");
    }
    let c = filled(shape(16, 1, 64, 8), DType::BF16, 3, 1.0);
    for isa in Isa::available() {
        let mut out = vec![0f32; 64];
        decode_attention(&c, 0, &q, 1, &t, &mut out, None, &opts(isa)).unwrap();
        assert!(out.iter().all(|x| x.is_finite() && x.abs() <= 1.0 + 1e-5), "{isa:?}");
    }
}

/// The two query forms the paths read agree: `q_bf16` pairs are the rounded query's bits
/// (odd `head_dim`: last pair completed by +0), `q` is the rounded query times the factor.
#[test]
fn bf16_query_pairs_hold_the_rounded_query() {
    let q = [1.0f32, -2.5, 3.0e-3, 1.0 + 1.0 / 256.0, 7.0, 1.0 + 3.0 / 256.0];
    let (qs, pairs) = scaled_query(&q, 3, 0.5, true);
    let bits = |x: f32| half::bf16::from_f32(x).to_bits() as u32;
    assert_eq!(pairs, [bits(1.0) | bits(-2.5) << 16, bits(3.0e-3), bits(1.0) | bits(7.0) << 16, bits(1.0 + 4.0 / 256.0)]);
    // 1 + 1/256 is a tie between 1 and 1 + 1/128: nearest even is 1; 1 + 3/256 rounds up.
    assert_eq!(qs[3], 0.5);
    assert_eq!(qs[5], 0.5 * (1.0 + 4.0 / 256.0));
    let (qs, pairs) = scaled_query(&q, 3, 0.5, false);
    assert!(pairs.is_empty() && qs[3] == 0.5 * (1.0 + 1.0 / 256.0));
}

/// The x86 paths' vector `exp2` (AVX-512 and AVX2): within 2e-7 of libm from
/// [`EXP2_ZERO_BELOW`] to `LAZY_MAX`, exactly +0 below it (so no probability is ever
/// subnormal).
#[cfg(target_arch = "x86_64")]
#[test]
fn x86_exp2_is_zero_below_its_bound_and_matches_libm_above() {
    use super::work::{EXP2_ZERO_BELOW, LAZY_MAX};
    use std::arch::x86_64::*;
    let mut xs: Vec<f32> = vec![f32::NEG_INFINITY, -1e30, -200.0, -126.0, -64.5, EXP2_ZERO_BELOW - 1e-5];
    let mut x = EXP2_ZERO_BELOW;
    while x <= LAZY_MAX {
        xs.push(x);
        x += 0.037;
    }
    // `exp2` of each x on one path (lane 0 of a broadcast), checked against libm.
    let check = |isa: &str, exp2_lane0: &dyn Fn(f32) -> f32| {
        for &x in &xs {
            let g = exp2_lane0(x);
            if x < EXP2_ZERO_BELOW {
                assert_eq!(g.to_bits(), 0, "{isa} exp2({x})");
            } else {
                let want = (x as f64).exp2();
                assert!(g.is_normal() && ((g as f64) - want).abs() <= 2e-7 * want, "{isa} exp2({x}) = {g}, want {want}");
            }
        }
    };
    if Isa::Avx512.supported() {
        // SAFETY: the CPU has the AVX-512 path's features (checked just above).
        check("AVX-512", &|x| unsafe { _mm512_cvtss_f32(super::avx512_cvt::exp2(_mm512_set1_ps(x))) });
    } else {
        skip_loudly("the AVX-512 exp2 check", "this CPU lacks AVX-512");
    }
    if Isa::Avx2.supported() {
        // SAFETY: the CPU has the AVX2 path's features (checked just above).
        check("AVX2", &|x| unsafe { _mm256_cvtss_f32(super::avx2_cvt::exp2(_mm256_set1_ps(x))) });
    } else {
        skip_loudly("the AVX2 exp2 check", "this CPU lacks AVX2");
    }
}
