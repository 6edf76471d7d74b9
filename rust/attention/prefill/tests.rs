//! Every supported path of the prefill kernel against an f64 reference computed from the
//! stored values, over masks, block sizes, head dims with tails, GQA ratios, splits, and
//! the unsafe loads' bounds (the last block of the pool, read through its last KV head).

use super::*;
use crate::attention::isa::Isa;
use crate::attention::decode::{decode_attention, DecodeOptions};
use crate::attention::test_util::{filled, last_block_case, on, refusal, shape, Lcg, BF16_PV, BF16_QUERY, BF16_QUERY_PV, F16_PRECISION, INT8_QUERY};
use crate::attention::tests::CAPS;

/// The layer's stored K and V as f64 (8-bit: codes times scales), in the logical order
/// `[num_blocks, block_size, num_kv_heads, head_dim]`.
fn stored(c: &KvCache) -> (Vec<f64>, Vec<f64>) {
    let (k, v) = c.dequantize(0).unwrap();
    (k.iter().map(|&x| x as f64).collect(), v.iter().map(|&x| x as f64).collect())
}

/// Index of element `x` of KV head `h` of token `tok` of sequence `i` (its block's entry
/// checked), in [`stored`]'s K or V.
fn at(c: &KvCache, _value: bool, t: &SeqTables, i: usize, tok: usize, h: usize, x: usize) -> usize {
    let s = c.shape();
    let (bs, hk, d) = (s.block_size, s.num_kv_heads, s.head_dim);
    ((t.block(i, tok / bs).unwrap() as usize * bs + tok % bs) * hk + h) * d + x
}

struct Call<'a> {
    q: &'a [f32],
    hq: usize,
    indptr: &'a [i64],
    positions: Option<&'a [i64]>,
}

/// f64 attention under the mask by its rule ([`Mask::visible`]).
fn reference(c: &KvCache, call: &Call, t: &SeqTables, opts: &PrefillOptions) -> (Vec<f64>, Vec<f64>, f64) {
    let s = c.shape();
    let (d, g) = (s.head_dim, call.hq / s.num_kv_heads);
    let scale = opts.scale.unwrap_or(1.0 / (d as f32).sqrt()) as f64;
    let mut out = vec![0f64; call.q.len()];
    let mut lse = vec![f64::NEG_INFINITY; call.q.len() / d.max(1)];
    let mut lmax = 0f64;
    let (kf, vf) = stored(c);
    for i in 0..t.len() {
        let len = t.seq_len(i);
        let (a, b) = (call.indptr[i] as usize, call.indptr[i + 1] as usize);
        for r in a..b {
            let p = call.positions.map_or((len - (b - a) + r - a) as u64, |p| p[r] as u64);
            let keys: Vec<usize> = (0..len).filter(|&k| opts.mask.visible(p, k as u64)).collect();
            for h in 0..call.hq {
                let row = r * call.hq + h;
                let q = &call.q[row * d..][..d];
                let q: Vec<f64> = if opts.precision.q == DType::BF16 {
                    q.iter().map(|&x| half::bf16::from_f32(x).to_f32() as f64).collect()
                } else {
                    q.iter().map(|&x| x as f64).collect()
                };
                let logits: Vec<f64> = keys
                    .iter()
                    .map(|&k| {
                        let x = (0..d).map(|x| q[x] * kf[at(c, false, t, i, k, h / g, x)]).sum::<f64>() * scale;
                        opts.logits_soft_cap.map_or(x, |cap| cap as f64 * (x / cap as f64).tanh())
                    })
                    .collect();
                if keys.is_empty() {
                    continue;
                }
                let mx = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                lmax = lmax.max(logits.iter().map(|x| x.abs()).fold(0.0, f64::max));
                let z: f64 = logits.iter().map(|l| (l - mx).exp()).sum();
                lse[row] = mx + z.ln();
                for (&k, l) in keys.iter().zip(&logits) {
                    let w = (l - mx).exp() / z;
                    for x in 0..d {
                        out[row * d + x] += w * vf[at(c, true, t, i, k, h / g, x)];
                    }
                }
            }
        }
    }
    (out, lse, lmax)
}

/// Every available path (and, with an opt-in precision on AVX-512, the route of a CPU
/// without avx512_bf16) against the reference.
fn compare(c: &KvCache, call: &Call, t: &SeqTables, opts: &PrefillOptions) {
    let (want, want_lse, lmax) = reference(c, call, t, opts);
    let oscale = want.iter().fold(1e-30f64, |a, x| a.max(x.abs()));
    // f32 arithmetic: 1e-5 of the output scale plus the rounding of large logits.
    let Precision { q: q_dtype, pv: pv_dtype } = opts.precision;
    let mut tol = oscale * (1e-5 + 4e-7 * lmax) * if q_dtype == DType::BF16 { 4.0 } else { 1.0 };
    if pv_dtype == DType::BF16 {
        // Each probability rounded to bf16: the output moves by at most 2^-9 max|V|
        // (the cache's V values are in -1..1).
        tol += 2f64.powi(-9);
    }
    for isa in Isa::available() {
        for no_dot in [false, true] {
            if no_dot && !(opts.precision != Precision::EXACT && isa == Isa::Avx512) {
                continue;
            }
            let features = if no_dot { Features::cpu().without(&["avx512bf16"]) } else { Features::cpu() };
            let o = PrefillOptions { tuning: Tuning { isa: Some(isa), features: Some(features), ..opts.tuning }, ..opts.clone() };
            let mut out = vec![f32::NAN; call.q.len()];
            let mut lse = vec![f32::NAN; want_lse.len()];
            let qs = Queries { q: call.q, num_q_heads: call.hq, qo_indptr: call.indptr, positions: call.positions };
            prefill_attention(c, 0, &qs, t, &mut out, Some(&mut lse), &o).unwrap();
            for (i, (&got, &w)) in out.iter().zip(&want).enumerate() {
                assert!((got as f64 - w).abs() <= tol, "{isa:?} {opts:?} out[{i}] = {got} vs {w} (tol {tol:e})");
            }
            for (i, (&got, &w)) in lse.iter().zip(&want_lse).enumerate() {
                let ok = if w == f64::NEG_INFINITY { got == f32::NEG_INFINITY } else { (got as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()) };
                assert!(ok, "{isa:?} {opts:?} lse[{i}] = {got} vs {w}");
            }
        }
    }
}

fn masks() -> Vec<Mask> {
    vec![
        Mask { causal: true, ..Mask::default() },
        Mask { causal: false, ..Mask::default() },
        Mask { causal: true, chunk_size: Some(7), ..Mask::default() },
        Mask { causal: true, window_left: Some(9), sink_tokens: 3, ..Mask::default() },
        Mask { causal: true, chunk_size: Some(20), window_left: Some(30), sink_tokens: 2 },
    ]
}

fn random_q(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Lcg(seed);
    (0..n).map(|_| r.next()).collect()
}

#[test]
fn all_paths_match_reference_over_masks_shapes_and_dtypes() {
    for dtype in DType::ALL {
        for (bs, hkv, g, d) in [(16, 2, 4, 64), (5, 1, 3, 13), (1, 2, 1, 8), (64, 1, 8, 32), (7, 3, 2, 20)] {
            let nb = 40usize.div_ceil(bs) * 3 + 2;
            let c = filled(shape(bs, hkv, d, nb), dtype, (bs * 31 + d) as u64, 2.0);
            let per = 40usize.div_ceil(bs);
            // Ragged lengths on and off block boundaries, a fork sharing sequence 0's
            // blocks (with no query), a sequence with as many queries as keys.
            let len1 = (2 * bs).min(per * bs);
            let lens = [40i64, len1 as i64, 40, 3];
            let table: Vec<i64> = (0..per)
                .chain(per..2 * per)
                .chain(0..per)
                .chain(2 * per..3 * per)
                .map(|b| b as i64)
                .collect();
            let t = SeqTables::padded(&table, per, &lens, bs, nb).unwrap();
            let counts = [17i64, (len1 / 2) as i64, 0, 3];
            let indptr: Vec<i64> = std::iter::once(0).chain(counts.iter().scan(0, |a, &x| { *a += x; Some(*a) })).collect();
            let hq = hkv * g;
            let q = random_q(indptr[4] as usize * hq * d, 7 + bs as u64);
            let call = Call { q: &q, hq, indptr: &indptr, positions: None };
            for mask in masks() {
                for split in [None, Some(64)] {
                    let tuning = Tuning { split_tokens: split, ..Tuning::default() };
                    compare(&c, &call, &t, &PrefillOptions { mask, tuning, ..Default::default() });
                }
            }
        }
    }
}

/// Explicit positions with soft caps and the bf16 precisions (a bf16 query, bf16
/// probabilities, both) on a bf16 cache, and a bf16 query on the fp8 caches (f32 FMAs on
/// the rounded query on every path).
#[test]
fn soft_cap_positions_and_bf16_precisions() {
    let t = SeqTables::padded(&(0..12).collect::<Vec<i64>>(), 6, &[90, 50], 16, 12).unwrap();
    let indptr = [0i64, 5, 9];
    let pos = [3i64, 0, 89, 1000, 40, 7, 7, 49, 0];
    let q = random_q(9 * 4 * 64, 11);
    let call = Call { q: &q, hq: 4, indptr: &indptr, positions: Some(&pos) };
    let c = filled(shape(16, 2, 64, 12), DType::BF16, 3, 2.0);
    let exact = Precision::EXACT;
    for mask in masks() {
        let cases = [(None, BF16_QUERY), (Some(2.5), exact), (Some(30.0), BF16_QUERY), (None, BF16_PV), (None, BF16_QUERY_PV), (Some(2.5), BF16_QUERY_PV)];
        for (cap, precision) in cases {
            let opts = PrefillOptions { mask, logits_soft_cap: cap, precision, scale: Some(0.3), ..Default::default() };
            compare(&c, &call, &t, &opts);
        }
    }
    for dtype in [DType::E4M3, DType::E5M2] {
        let c = filled(shape(16, 2, 64, 12), dtype, 3, 2.0);
        for mask in masks() {
            for cap in [None, Some(2.5)] {
                let opts = PrefillOptions { mask, logits_soft_cap: cap, precision: BF16_QUERY, scale: Some(0.3), ..Default::default() };
                compare(&c, &call, &t, &opts);
            }
        }
    }
}

/// A cache where only the keys some query sees hold data (K times 2, V in -1..1) and every
/// other slot is NaN (a released block reused elsewhere), and the padded table: blocks
/// without such a key are holes, `-1` or (`poison`) the ids of NaN blocks.
fn poisoned(dtype: DType, (bs, hkv, d): (usize, usize, usize), lens: &[usize], call: &Call, mask: &Mask, poison: bool) -> (KvCache, SeqTables) {
    let seen = |i: usize, k: usize| (call.indptr[i]..call.indptr[i + 1]).any(|r| mask.visible(call.positions.unwrap()[r as usize] as u64, k as u64));
    let width = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap_or(0);
    let mut table = vec![-1i64; lens.len() * width];
    let (mut slots, mut next) = (Vec::new(), 0i64);
    let mut holes = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        for b in 0..len.div_ceil(bs) {
            let keys: Vec<usize> = (b * bs..((b + 1) * bs).min(len)).filter(|&k| seen(i, k)).collect();
            if keys.is_empty() {
                holes.push(i * width + b);
                continue;
            }
            slots.extend(keys.iter().map(|k| next * bs as i64 + (k % bs) as i64));
            table[i * width + b] = next;
            next += 1;
        }
    }
    let nb = next as usize + 3;
    for (j, &h) in holes.iter().enumerate() {
        table[h] = if poison { next + (j % 3) as i64 } else { -1 };
    }
    let mut c = KvCache::new(shape(bs, hkv, d, nb), dtype).unwrap();
    let all: Vec<i64> = (0..(nb * bs) as i64).collect();
    let nan = vec![f32::NAN; all.len() * hkv * d];
    c.write(0, &nan, &nan, &all).unwrap();
    let (k, v) = (random_q(slots.len() * hkv * d, 5), random_q(slots.len() * hkv * d, 6));
    c.write(0, &k.iter().map(|x| 2.0 * x).collect::<Vec<_>>(), &v, &slots).unwrap();
    let seq_lens: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
    (c, SeqTables::padded(&table, width, &seq_lens, bs, nb).unwrap())
}

/// Windows and sinks over sparse tables: every path (with the bf16 packs, `vdpbf16ps` on
/// and off), splits, a chunk of queries and queries far apart (the keys between their
/// windows are holes too) give the reference, so no slot outside the visible keys was
/// read; a hole a query needs is an error.
#[test]
fn windows_read_only_keys_some_query_sees() {
    let masks = [
        (Mask { causal: true, window_left: Some(9), sink_tokens: 3, ..Mask::default() }, false),
        (Mask { causal: true, window_left: Some(0), ..Mask::default() }, true),
        (Mask { causal: true, chunk_size: Some(20), window_left: Some(30), sink_tokens: 2 }, true),
        (Mask { causal: false, window_left: Some(12), sink_tokens: 17, ..Mask::default() }, false),
    ];
    let lens = [300usize, 90];
    let pos: Vec<i64> = (280..300).chain([4, 60, 89]).collect();
    let indptr = [0i64, 20, 23];
    for dtype in [DType::F32, DType::BF16] {
        for (bs, d) in [(1, 8), (5, 13), (16, 64), (64, 32)] {
            let q = random_q(23 * 4 * d, 3);
            let call = Call { q: &q, hq: 4, indptr: &indptr, positions: Some(&pos) };
            for (mask, poison) in masks {
                let (c, t) = poisoned(dtype, (bs, 2, d), &lens, &call, &mask, poison);
                for split in [None, Some(64)] {
                    for bf16 in [false, dtype == DType::BF16] {
                        let precision = if bf16 { BF16_QUERY_PV } else { Precision::EXACT };
                        let tuning = Tuning { split_tokens: split, ..Tuning::default() };
                        compare(&c, &call, &t, &PrefillOptions { mask, tuning, precision, ..Default::default() });
                    }
                }
                if poison {
                    continue; // a stale id is a block of the pool: only a pad is refused
                }
                let wider = Mask { window_left: mask.window_left.map(|w| w + bs + 1), ..mask };
                let mut out = vec![7f32; q.len()];
                let qs = Queries { q: &q, num_q_heads: 4, qo_indptr: &indptr, positions: Some(&pos) };
                let e = prefill_attention(&c, 0, &qs, &t, &mut out, None, &PrefillOptions { mask: wider, ..Default::default() });
                assert!(e.is_err_and(|e| e.to_string().contains("block_tables")) && out.iter().all(|&x| x == 7.0), "{mask:?} bs {bs}");
            }
        }
    }
}

/// The unsafe loads at their bounds: sequences ending on the last token of the pool's
/// last block, read through the last KV head, with tiles and head dims ending mid-vector.
#[test]
fn last_token_of_the_pools_last_block_is_read() {
    for dtype in DType::ALL {
        for (bs, d) in [(5, 7), (17, 13), (16, 64), (33, 6), (1, 1), (64, 130)] {
            let (c, t, lens) = last_block_case(dtype, bs, d, 2.0);
            let nq = [lens[0].min(3), lens[1].min(2), lens[2]];
            let indptr = [0, nq[0], nq[0] + nq[1], nq[0] + nq[1] + nq[2]];
            let q = random_q(indptr[3] as usize * 6 * d, 5);
            let call = Call { q: &q, hq: 6, indptr: &indptr, positions: None };
            // The bf16 precisions where the cache takes them: both on bf16, the query on fp8.
            let rounded = match dtype {
                DType::BF16 => Some(BF16_QUERY_PV),
                DType::E4M3 | DType::E5M2 => Some(BF16_QUERY),
                _ => None,
            };
            for mask in masks() {
                for precision in std::iter::once(Precision::EXACT).chain(rounded) {
                    compare(&c, &call, &t, &PrefillOptions { mask, precision, ..Default::default() });
                }
            }
        }
    }
}

/// Decode and prefill with one query per sequence agree on every path, without and with a
/// soft cap (then at scale 1: logits of standard deviation about 5, which both caps
/// bend), on an f32 cache and on the 8-bit ones.
#[test]
fn one_query_per_sequence_is_decode() {
    let table: Vec<i64> = (0..80).map(|i| i % 64).collect();
    let q = random_q(3 * 8 * 64, 2);
    let (mut o1, mut o2) = (vec![0f32; q.len()], vec![0f32; q.len()]);
    let (mut l1, mut l2) = (vec![0f32; 3 * 8], vec![0f32; 3 * 8]);
    // Decode: one row per sequence. Prefill: the same plus an empty sequence between.
    let t3 = SeqTables::padded(&table[..60], 20, &[300, 17, 64], 16, 64).unwrap();
    let table4: Vec<i64> = table[..40].iter().chain(&table[..20]).chain(&table[40..60]).copied().collect();
    let t4 = SeqTables::padded(&table4, 20, &[300, 17, 0, 64], 16, 64).unwrap();
    let qs = Queries { q: &q, num_q_heads: 8, qo_indptr: &[0, 1, 2, 2, 3], positions: None };
    for dtype in [DType::F32, DType::I8, DType::E4M3] {
        let c = filled(shape(16, 2, 64, 64), dtype, 9, 2.0);
        for cap in CAPS {
            let scale = cap.map(|_| 1.0);
            // With a cap, prefill takes libm's tanh, decode `c - 2c / (2^x + 1)`, whose
            // error near 0 is a few f32 steps of `c` (`work::soft_cap`): up to 2.4e-6
            // relative at c = 30 here.
            let tol = if cap.is_some() { 1e-5 } else { 1e-6 };
            for isa in Isa::available() {
                let dopts = DecodeOptions { tuning: on(isa), scale, logits_soft_cap: cap, ..Default::default() };
                decode_attention(&c, 0, &q, 8, &t3, &mut o1, Some(&mut l1), &dopts).unwrap();
                let mask = Mask { causal: true, ..Mask::default() };
                let opts = PrefillOptions { mask, tuning: on(isa), scale, logits_soft_cap: cap, ..Default::default() };
                prefill_attention(&c, 0, &qs, &t4, &mut o2, Some(&mut l2), &opts).unwrap();
                for (a, b) in o1.iter().zip(&o2).chain(l1.iter().zip(&l2)) {
                    assert!((a - b).abs() <= tol * (1.0 + a.abs()), "{isa:?} {dtype:?} cap {cap:?}: {a} vs {b}");
                }
            }
        }
    }
}

#[test]
fn empty_and_invalid_calls() {
    let c = filled(shape(16, 2, 8, 4), DType::F32, 5, 2.0);
    let t = SeqTables::padded(&[0, 1], 2, &[20], 16, 4).unwrap();
    let ok = PrefillOptions::default();
    let run = |indptr: &[i64], q: &[f32], pos: Option<&[i64]>, opts: &PrefillOptions| {
        let mut out = vec![0f32; q.len()];
        let qs = Queries { q, num_q_heads: 4, qo_indptr: indptr, positions: pos };
        prefill_attention(&c, 0, &qs, &t, &mut out, None, opts)
    };
    run(&[0, 0], &[], None, &ok).unwrap();
    let q = vec![0.5f32; 2 * 4 * 8];
    run(&[0, 2], &q, None, &ok).unwrap();
    assert!(run(&[0, 3], &q, None, &ok).is_err()); // rows do not match q
    assert!(run(&[1, 2], &q, None, &ok).is_err()); // does not start at 0
    assert!(run(&[0, 2, 2], &q, None, &ok).is_err()); // two sequences, one table
    assert!(run(&[0, 2], &q, Some(&[0]), &ok).is_err());
    assert!(run(&[0, 2], &q, Some(&[0, -1]), &ok).is_err());
    let bad = [
        PrefillOptions { scale: Some(f32::NAN), ..Default::default() },
        PrefillOptions { logits_soft_cap: Some(0.0), ..Default::default() },
        PrefillOptions { logits_soft_cap: Some(f32::INFINITY), ..Default::default() },
        PrefillOptions { mask: Mask { causal: true, chunk_size: Some(0), ..Mask::default() }, ..Default::default() },
        PrefillOptions { mask: Mask { causal: false, chunk_size: Some(4), ..Mask::default() }, ..Default::default() },
        PrefillOptions { tuning: Tuning { kv_heads_per_item: Some(1), ..Tuning::default() }, ..Default::default() },
    ];
    for o in bad {
        assert!(run(&[0, 2], &q, None, &o).is_err(), "{o:?}");
    }
    // No bf16 or other rounded precision on an f32 cache: the message names the pair and
    // the valid ones.
    for precision in [BF16_QUERY, BF16_PV, BF16_QUERY_PV, INT8_QUERY, F16_PRECISION] {
        let e = run(&[0, 2], &q, None, &PrefillOptions { precision, ..Default::default() }).unwrap_err().to_string();
        assert_eq!(e, refusal(precision, Kernel::Prefill, DType::F32));
    }
    let q21 = vec![0.5f32; 21 * 4 * 8];
    assert!(run(&[0, 21], &q21, None, &ok).is_err()); // more default queries than keys
    run(&[0, 21], &q21, Some(&[5; 21]), &ok).unwrap();
}

/// Timing of work-item sizes and paths on shape (a) of `benches/bench_prefill.py` (one
/// sequence): `cargo test --release --lib prefill::tests::timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn timing_rows_per_item() {
    let (bs, hkv, d, len, nq) = (16, 8, 128, 4608, 512);
    let nb = len / bs;
    let c = filled(shape(bs, hkv, d, nb), DType::F32, 1, 2.0);
    let t = SeqTables::padded(&(0..nb as i64).collect::<Vec<_>>(), nb, &[len as i64], bs, nb).unwrap();
    let q = random_q(nq * 32 * d, 3);
    let indptr = [0i64, nq as i64];
    let mut out = vec![0f32; q.len()];
    let qs = Queries { q: &q, num_q_heads: 32, qo_indptr: &indptr, positions: None };
    let flops = 4.0 * d as f64 * 32.0 * (len - nq..len).map(|p| p as f64 + 1.0).sum::<f64>();
    for round in 0..5 {
        for rows in [120, 192, 288, 384] {
            let opts = PrefillOptions { mask: Mask { causal: true, ..Mask::default() }, rows_per_item: Some(rows), ..Default::default() };
            let t0 = std::time::Instant::now();
            prefill_attention(&c, 0, &qs, &t, &mut out, None, &opts).unwrap();
            let s = t0.elapsed().as_secs_f64();
            println!("round {round} rows {rows}: {s:.3} s, {:.1} GFLOP/s", flops / s / 1e9);
        }
    }
}
