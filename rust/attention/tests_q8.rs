//! The 8-bit caches (int8, fp8 e4m3, fp8 e5m2) on every path (scalar, AVX2, AVX-512,
//! NEON under qemu) against the f64 reference on the dequantized values, within 1e-5 of
//! the output scale: every tail length 1..16 of a chunk, GQA ratios 1, 2, 4 and 8, block
//! sizes 1 to 64, unsplit and split, and windows with sinks whose first visible key sits
//! inside a block (a chunk that starts mid-tile reads the scales of its own tokens), and
//! with a soft cap. The keys no query sees hold large values, so reading one would move
//! the output.

use super::decode::{decode_attention, DecodeOptions};
use super::options::Tuning;
use super::isa::{Features, Isa};
use super::tables::SeqTables;
use super::test_util::{shape, tuned, Lcg};
use super::tests::{reference_window, wide_reference, CAPS};
use super::wide::Logits;
use crate::kv::{DType, KvCache, KvShape};

const Q8: [DType; 3] = [DType::I8, DType::E4M3, DType::E5M2];

/// Whether the decode query of a sequence of `len` tokens sees key `k`.
fn visible(len: usize, k: usize, wl: Option<usize>, sinks: usize) -> bool {
    k < sinks || wl.is_none_or(|w| len - 1 - k <= w)
}

/// A cache of `dtype` holding sequences of `lens` tokens on consecutive blocks counted
/// down from the pool's last, visible keys random in [-1, 1), the others (and every
/// slot past a sequence's end) 40; returns the cache and its tables.
fn case(s: KvShape, dtype: DType, lens: &[usize], wl: Option<usize>, sinks: usize, seed: u64) -> (KvCache, SeqTables) {
    let bs = s.block_size;
    let width = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap_or(0);
    let mut table = vec![-1i64; lens.len() * width];
    let row = s.num_kv_heads * s.head_dim;
    let nslots = s.num_blocks * bs;
    let mut k = vec![40f32; nslots * row];
    let mut v = vec![40f32; nslots * row];
    let mut r = Lcg(seed);
    let mut next = s.num_blocks;
    for (i, &len) in lens.iter().enumerate() {
        for b in 0..len.div_ceil(bs) {
            next -= 1;
            table[i * width + b] = next as i64;
            for key in (b * bs..((b + 1) * bs).min(len)).filter(|&key| visible(len, key, wl, sinks)) {
                let slot = next * bs + key % bs;
                for x in 0..row {
                    k[slot * row + x] = 2.0 * r.next();
                    v[slot * row + x] = r.next();
                }
            }
        }
    }
    let mut c = KvCache::new(s, dtype).unwrap();
    c.write(0, &k, &v, &(0..nslots as i64).collect::<Vec<_>>()).unwrap();
    let seq_lens: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
    (c, SeqTables::padded(&table, width, &seq_lens, bs, s.num_blocks).unwrap())
}

/// Every available path, with `splits` (split tokens, KV heads per item), against the
/// f64 reference over the visible keys; with a soft cap `cap`, the query 4x larger (so
/// that the cap bites) against [`wide_reference`] with the same cap.
fn compare(c: &KvCache, t: &SeqTables, hq: usize, wl: Option<usize>, sinks: usize, splits: &[(Option<usize>, Option<usize>)], cap: Option<f32>) {
    compare_on(Features::cpu(), c, t, hq, wl, sinks, splits, cap);
}

/// [`compare`] with the routes chosen by `features`.
#[allow(clippy::too_many_arguments)]
fn compare_on(
    features: Features,
    c: &KvCache,
    t: &SeqTables,
    hq: usize,
    wl: Option<usize>,
    sinks: usize,
    splits: &[(Option<usize>, Option<usize>)],
    cap: Option<f32>,
) {
    let s = c.shape();
    let n = t.len();
    let mut r = Lcg(17);
    let amp = if cap.is_some() { 8.0 } else { 2.0 };
    let q: Vec<f32> = (0..n * hq * s.head_dim).map(|_| r.next() * amp).collect();
    let (want, want_lse) = match cap {
        None => reference_window(c, &q, hq, t, 1.0 / (s.head_dim as f64).sqrt(), wl, sinks),
        Some(_) => wide_reference(c, &q, hq, t, Logits { scale: 1.0 / (s.head_dim as f32).sqrt(), soft_cap: cap }, wl, sinks),
    };
    let scale_out = want.iter().fold(1e-3f64, |a, x| a.max(x.abs()));
    for isa in Isa::available() {
        for &(split, kpi) in splits {
            let tuning = Tuning { features: Some(features), ..tuned(isa, split, kpi) };
            let opts = DecodeOptions { tuning, logits_soft_cap: cap, window_left: wl, sink_tokens: sinks, ..Default::default() };
            let (mut out, mut lse) = (vec![f32::NAN; q.len()], vec![f32::NAN; n * hq]);
            decode_attention(c, 0, &q, hq, t, &mut out, Some(&mut lse), &opts).unwrap();
            let what = format!("{isa:?} {:?} {s:?} hq={hq} wl={wl:?} sinks={sinks} split={split:?} kpi={kpi:?} cap={cap:?}", c.dtype());
            for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
                assert!((o as f64 - w).abs() <= 1e-5 * scale_out, "{what} at {i}: {o} vs {w}");
            }
            for (&o, &w) in lse.iter().zip(&want_lse) {
                assert!(o as f64 == w || (o as f64 - w).abs() <= 1e-5 * w.abs().max(1.0), "{what} lse {o} vs {w}");
            }
        }
    }
}

/// Every chunk tail (lengths 1..=16, so the last chunk of 4, 8 or 16 lanes holds 1..16
/// tokens) at GQA ratios 1, 2, 4 and 8 and block sizes 1 to 64, head dims with and
/// without a vector tail, unsplit, one block per split and one KV head per item.
#[test]
fn every_tail_and_gqa_ratio_match_the_dequantized_reference() {
    let splits = [(None, None), (Some(1), Some(1))];
    let mut k = 0;
    for dtype in Q8 {
        for g in [1, 2, 4, 8] {
            for bs in [1, 3, 8, 16, 17, 64] {
                let d = [64, 7, 128, 40][k % 4];
                let hkv = 1 + k % 2;
                k += 1;
                let lens: Vec<usize> = (1..=16).chain([bs + 1, 2 * bs + 5]).collect();
                let nb = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 1;
                let (c, t) = case(shape(bs, hkv, d, nb), dtype, &lens, None, 0, (bs * 13 + g) as u64);
                compare(&c, &t, hkv * g, None, 0, &splits, None);
            }
        }
    }
}

/// Windows on and off block boundaries and sinks: the first visible key of a window
/// starts a chunk inside its block, whose int8 scales are read from that token on.
#[test]
fn windows_and_sinks_read_the_scales_of_their_own_tokens() {
    let splits = [(None, None), (Some(1), Some(1)), (Some(37), None)];
    for dtype in Q8 {
        for (bs, hkv, g, d) in [(1, 1, 3, 7), (5, 2, 2, 16), (16, 2, 4, 64), (64, 1, 8, 33)] {
            for wl in [Some(0), Some(1), Some(bs - 1), Some(bs + 2), Some(3 * bs + 7)] {
                for sinks in [0, 1, bs + 3] {
                    let lens: [usize; 6] = [1, 2, bs, 3 * bs + 2, 7 * bs + 5, 70];
                    let nb = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 1;
                    let (c, t) = case(shape(bs, hkv, d, nb), dtype, &lens, wl, sinks, (bs * 7 + d) as u64);
                    compare(&c, &t, hkv * g, wl, sinks, &splits, None);
                }
            }
        }
    }
}

/// The AVX-512 8-bit fast paths at their bounds: whole-vector `P V` (head_dim a multiple
/// of 64; 128 dimensions per pass for 1-2 heads per tile) and full-chunk K loads (16
/// lanes), for every head count per tile (GQA ratios 1..=8: tiles of 1-4 heads), lengths
/// 1..=33 (a full chunk, a partial one, both), block sizes around 16, with windows
/// starting inside a block; head_dim 48 and 80 take the masked fallback beside them.
#[test]
fn whole_vector_and_full_chunk_paths_match_at_their_bounds() {
    let splits = [(None, None), (Some(1), Some(1))];
    for dtype in Q8 {
        for g in 1..=8 {
            for (bs, d) in [(16, 128), (16, 64), (5, 128), (32, 192), (16, 48), (64, 80)] {
                let lens: Vec<usize> = (1..=33).collect();
                let nb = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 1;
                let seed = (g * 31 + bs * 7 + d) as u64;
                let (c, t) = case(shape(bs, 1, d, nb), dtype, &lens, None, 0, seed);
                compare(&c, &t, g, None, 0, &splits, None);
                if g % 3 == 1 {
                    let (c, t) = case(shape(bs, 1, d, nb), dtype, &lens, Some(bs + 2), 1, seed + 1);
                    compare(&c, &t, g, Some(bs + 2), 1, &splits, None);
                }
            }
        }
    }
}

/// Blocks of more than 16 tokens with rows a multiple of 64: the AVX-512 path takes a
/// tile's chunks two at a time (one softmax reference point and one pass of `P V` over
/// both), a last odd chunk alone. Block sizes with an even and an odd count of chunks and
/// a partial one (32, 48, 40), windows and sinks that start a pair anywhere in a tile, tiles
/// of 1, 2, 4 and 4 + 1 query heads, every length up to three blocks.
#[test]
fn pairs_of_chunks_in_a_tile_match_the_dequantized_reference() {
    let splits = [(None, None), (Some(1), Some(1)), (Some(37), None)];
    for dtype in Q8 {
        for (bs, d, g) in [(32, 64, 1), (48, 128, 2), (40, 64, 4), (32, 128, 5)] {
            let lens: Vec<usize> = (1..=3 * bs).step_by(7).chain([bs, bs + 16, 2 * bs - 1]).collect();
            let nb = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 1;
            let seed = (bs * 5 + d + g) as u64;
            let (c, t) = case(shape(bs, 2, d, nb), dtype, &lens, None, 0, seed);
            compare(&c, &t, 2 * g, None, 0, &splits, None);
            for (wl, sinks) in [(Some(5), 0), (Some(bs + 9), 1), (Some(2 * bs - 17), bs / 2 + 3)] {
                let (c, t) = case(shape(bs, 2, d, nb), dtype, &lens, wl, sinks, seed + 1);
                compare(&c, &t, 2 * g, wl, sinks, &splits, None);
            }
        }
    }
}

/// The AVX-512 e4m3 f16 route (CPUs without avx512vbmi) where this CPU takes the byte
/// tables: block size 16, head_dim 64 and 128, tiles of 1-4 heads, partial and full
/// chunks, a window with a sink.
#[cfg(target_arch = "x86_64")]
#[test]
fn e4m3_without_the_byte_tables_matches_the_reference() {
    let without = Features::cpu().without(&["avx512vbmi"]);
    let splits = [(None, None), (Some(1), Some(1))];
    for g in [1, 2, 3, 4, 5] {
        for d in [64, 128] {
            let lens: Vec<usize> = (1..=33).step_by(4).chain([16, 32, 70]).collect();
            let nb = lens.iter().map(|l| l.div_ceil(16)).sum::<usize>() + 1;
            let seed = (g * 17 + d) as u64;
            let (c, t) = case(shape(16, 2, d, nb), DType::E4M3, &lens, None, 0, seed);
            compare_on(without, &c, &t, 2 * g, None, 0, &splits, None);
            let (c, t) = case(shape(16, 2, d, nb), DType::E4M3, &lens, Some(19), 1, seed + 1);
            compare_on(without, &c, &t, 2 * g, Some(19), 1, &splits, None);
        }
    }
}

/// e4m3 at block size 16 (the byte tables where the CPU has VBMI) with items of more KV
/// heads than one group of lane-query vectors (`Work::in_head_groups`: groups of 2 at
/// g = 4, d = 128, the last one short with 5 heads; of 1 at g = 8; none at g = 2, whose
/// vectors weigh no more than the tiles), unsplit and one KV head per item, with windows
/// (one of 21 keys, one of 150 whose first key sits inside a block) and a sequence of 19
/// blocks.
#[test]
fn e4m3_items_of_many_kv_heads_run_in_groups() {
    let splits = [(None, None), (Some(16), Some(1))];
    for (hkv, g) in [(4, 4), (5, 4), (3, 8), (5, 2)] {
        let lens: Vec<usize> = vec![1, 16, 33, 70, 300];
        let nb = lens.iter().map(|l| l.div_ceil(16)).sum::<usize>() + 1;
        let (c, t) = case(shape(16, hkv, 128, nb), DType::E4M3, &lens, None, 0, (hkv * 7 + g) as u64);
        compare(&c, &t, hkv * g, None, 0, &splits, None);
        for (i, wl) in [21, 150].into_iter().enumerate() {
            let seed = (hkv * 7 + g + 1 + i) as u64;
            let (c, t) = case(shape(16, hkv, 128, nb), DType::E4M3, &lens, Some(wl), 2, seed);
            compare(&c, &t, hkv * g, Some(wl), 2, &splits, None);
        }
    }
}

/// With a soft cap (keys at 2x, the query 4x larger: logits of standard deviation about
/// 5), on every 8-bit cache: the AVX-512 whole-vector `P V` and full-chunk K loads
/// (head_dim 128 and 64, block size 16: the e4m3 byte tables where the CPU has VBMI),
/// pairs of chunks (block size 32, 48), the masked fallback (head_dim 7, block size 5),
/// tiles of 1 to 4 + 1 heads, windows with sinks and splits.
#[test]
fn soft_caps_on_8bit_caches_match_the_capped_reference() {
    let splits = [(None, None), (Some(1), Some(1))];
    for dtype in Q8 {
        for (bs, d, g) in [(16, 128, 1), (16, 64, 4), (32, 64, 2), (48, 128, 5), (5, 7, 3)] {
            let lens: Vec<usize> = (1..=3 * bs).step_by(7).chain([bs, 2 * bs - 1]).collect();
            let nb = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 1;
            let seed = (bs * 3 + d + g) as u64;
            let (c, t) = case(shape(bs, 2, d, nb), dtype, &lens, None, 0, seed);
            let (cw, tw) = case(shape(bs, 2, d, nb), dtype, &lens, Some(bs + 3), 2, seed + 1);
            for cap in CAPS.into_iter().skip(1) {
                compare(&c, &t, 2 * g, None, 0, &splits, cap);
                compare(&cw, &tw, 2 * g, Some(bs + 3), 2, &splits, cap);
            }
        }
    }
}
