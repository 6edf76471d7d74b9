//! Decode with sliding windows and attention sinks on logical positions: every path
//! against the f64 reference over the visible keys, with every other slot of the cache
//! poisoned (NaN K and V, as a released block reused by another sequence) and the holes of
//! the tables given as a pad or as the ids of poisoned blocks; the FlashInfer form with
//! `kv_page_start` gives the same bits; a needed block that is missing is an error.

use super::decode::{decode_attention, DecodeOptions};
use super::isa::Isa;
use super::tables::SeqTables;
use super::test_util::{shape, tuned, Lcg};
use super::tests::reference_window;
use crate::kv::{DType, KvCache};

/// How the holes of a table are filled.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Holes {
    /// `-1`, as `block_tables(pad=-1)` exports them.
    Pad,
    /// Ids of blocks holding only NaN (a released block reused elsewhere).
    Poisoned,
}

/// Whether the decode query of a sequence of `len` tokens sees key `k`.
fn visible(len: usize, k: usize, wl: Option<usize>, sinks: usize) -> bool {
    k < sinks || wl.is_none_or(|w| len - 1 - k <= w)
}

/// Number of poisoned blocks at the end of the pool.
const POISON: usize = 3;

/// A windowed batch: the cache (NaN everywhere but at visible keys), the padded tables and
/// their FlashInfer form (sink pages, then the window run from `kv_page_start`, which
/// starts one poisoned page early when there is room: a stored page the window left).
struct Case {
    cache: KvCache,
    padded: SeqTables,
    paged: SeqTables,
}

/// `(bs, hkv, d)`: block size, KV heads, head dim.
fn case(dtype: DType, (bs, hkv, d): (usize, usize, usize), lens: &[usize], wl: Option<usize>, sinks: usize, holes: Holes) -> Case {
    let needed = |len: usize, b: usize| (b * bs..((b + 1) * bs).min(len)).any(|k| visible(len, k, wl, sinks));
    let nvis: usize = lens.iter().map(|&l| (0..l.div_ceil(bs)).filter(|&b| needed(l, b)).count()).sum();
    let nb = nvis + POISON;
    let width = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap_or(0);
    let (mut table, mut slots) = (vec![-1i64; lens.len() * width], Vec::new());
    let (mut indptr, mut indices, mut last, mut starts) = (vec![0i64], Vec::new(), Vec::new(), Vec::new());
    let mut next = 0i64;
    for (i, &len) in lens.iter().enumerate() {
        let nblocks = len.div_ceil(bs);
        for b in 0..nblocks {
            table[i * width + b] = if needed(len, b) {
                slots.extend((b * bs..((b + 1) * bs).min(len)).filter(|&k| visible(len, k, wl, sinks)).map(|k| next * bs as i64 + (k % bs) as i64));
                next += 1;
                next - 1
            } else if holes == Holes::Pad {
                -1
            } else {
                (nvis + b % POISON) as i64
            };
        }
        // FlashInfer: the sink pages, then the run from the first window block (one
        // poisoned page earlier when that block is past the sinks).
        let sink_blocks = sinks.div_ceil(bs).min(nblocks);
        let first = (0..nblocks).find(|&b| b >= sink_blocks && needed(len, b)).unwrap_or(nblocks);
        let start = if first > sink_blocks { first - 1 } else { sink_blocks };
        for b in (0..sink_blocks).chain(start..nblocks) {
            indices.push(if b == start && start < first { nvis as i64 } else { table[i * width + b] });
        }
        indptr.push(indices.len() as i64);
        last.push(if len == 0 { 0 } else { (len - 1) % bs + 1 } as i64);
        starts.push(start as i64);
    }
    let s = shape(bs, hkv, d, nb);
    let mut cache = KvCache::new(s, dtype).unwrap();
    let row = hkv * d;
    let all: Vec<i64> = (0..(nb * bs) as i64).collect();
    let nan = vec![f32::NAN; all.len() * row];
    cache.write(0, &nan, &nan, &all).unwrap();
    let mut r = Lcg((bs * 131 + d) as u64);
    let k: Vec<f32> = (0..slots.len() * row).map(|_| 2.0 * r.next()).collect();
    let v: Vec<f32> = (0..slots.len() * row).map(|_| r.next()).collect();
    cache.write(0, &k, &v, &slots).unwrap();
    let seq_lens: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
    let padded = SeqTables::padded(&table, width, &seq_lens, bs, nb).unwrap();
    let paged = SeqTables::flashinfer_windowed(&indptr, &indices, &last, Some(&starts), sinks, bs, nb).unwrap();
    assert_eq!((0..lens.len()).map(|i| paged.seq_len(i)).collect::<Vec<_>>(), lens, "logical lengths from the pages");
    Case { cache, padded, paged }
}

/// Every path, split and head grouping on `c` against the f64 reference over the visible
/// keys; the FlashInfer form gives the same bits as the padded one.
fn compare(c: &Case, hq: usize, wl: Option<usize>, sinks: usize) {
    let s = c.cache.shape();
    let mut r = Lcg(11);
    let n = c.padded.len();
    let q: Vec<f32> = (0..n * hq * s.head_dim).map(|_| r.next() * 2.0).collect();
    let (want, want_lse) = reference_window(&c.cache, &q, hq, &c.padded, 1.0 / (s.head_dim as f64).sqrt(), wl, sinks);
    let scale_out = want.iter().fold(1e-3f64, |a, x| a.max(x.abs()));
    for isa in Isa::available() {
        for (split, kpi) in [(None, None), (Some(1), Some(1)), (Some(2 * s.block_size + 1), None)] {
            let opts = DecodeOptions { tuning: tuned(isa, split, kpi), window_left: wl, sink_tokens: sinks, ..Default::default() };
            let run = |t: &SeqTables| {
                let (mut out, mut lse) = (vec![f32::NAN; q.len()], vec![f32::NAN; n * hq]);
                decode_attention(&c.cache, 0, &q, hq, t, &mut out, Some(&mut lse), &opts).unwrap();
                (out, lse)
            };
            let (out, lse) = run(&c.padded);
            let what = format!("{isa:?} {:?} {s:?} hq={hq} wl={wl:?} sinks={sinks} split={split:?}", c.cache.dtype());
            for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
                assert!(o.is_finite() && (o as f64 - w).abs() <= 1e-5 * scale_out, "{what} at {i}: {o} vs {w}");
            }
            for (&o, &w) in lse.iter().zip(&want_lse) {
                assert!(o as f64 == w || (o as f64 - w).abs() <= 1e-5 * w.abs().max(1.0), "{what} lse {o} vs {w}");
            }
            let (out2, lse2) = run(&c.paged);
            assert!(out.iter().zip(&out2).chain(lse.iter().zip(&lse2)).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: paged");
        }
    }
}

/// Windows on and off block boundaries (0, 1, one block minus one, one block, two blocks
/// and a bit, longer than every sequence), sinks of 0 to 2 blocks, block sizes 1 to 64,
/// GQA, ragged lengths from 1 to past the window, every dtype, holes as pads and as
/// poisoned blocks.
#[test]
fn windows_and_sinks_read_only_visible_keys_on_every_path() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (bs, hkv, hq, d) in [(1, 1, 3, 7), (3, 2, 6, 16), (16, 2, 8, 64), (64, 1, 4, 33)] {
            for wl in [None, Some(0), Some(1), Some(bs - 1), Some(bs), Some(2 * bs + 3), Some(100 * bs)] {
                for sinks in [0, 1, bs, 2 * bs] {
                    let holes = if (bs + sinks) % 2 == 0 { Holes::Pad } else { Holes::Poisoned };
                    let lens = [1, 2, bs, 3 * bs + 2, 7 * bs + 5, 5 * bs];
                    let c = case(dtype, (bs, hkv, d), &lens, wl, sinks, holes);
                    compare(&c, hq, wl, sinks);
                }
            }
        }
    }
}

/// Both kinds of holes on one shape, every window/sink pair (the grid above alternates
/// them).
#[test]
fn pads_and_poisoned_blocks_both_stay_unread() {
    for holes in [Holes::Pad, Holes::Poisoned] {
        for (wl, sinks) in [(Some(5), 0), (Some(16), 3), (Some(31), 16), (Some(40), 32)] {
            let c = case(DType::BF16, (16, 2, 64), &[200, 17, 64, 100], wl, sinks, holes);
            compare(&c, 4, wl, sinks);
        }
    }
}

/// A block the window needs that is missing (a pad, a page before `kv_page_start`) is an
/// error naming the table, and nothing is written.
#[test]
fn a_hole_inside_the_window_is_an_error() {
    let c = case(DType::F32, (4, 1, 8), &[30], Some(9), 2, Holes::Pad);
    let q = vec![0.5f32; 8];
    let mut out = vec![7f32; 8];
    // Keys 20..30 and 0..2 are stored (blocks 0, 5, 6, 7; the pages add a poisoned block
    // 4). A window of 18 keys needs block 3.
    let wider = DecodeOptions { window_left: Some(17), sink_tokens: 2, ..Default::default() };
    let e = decode_attention(&c.cache, 0, &q, 1, &c.padded, &mut out, None, &wider).unwrap_err().to_string();
    assert!(e.contains("block_tables[0, 3]"), "{e}");
    let e = decode_attention(&c.cache, 0, &q, 1, &c.paged, &mut out, None, &wider).unwrap_err().to_string();
    assert!(e.contains("kv_page_start"), "{e}");
    let more_sinks = DecodeOptions { window_left: Some(9), sink_tokens: 5, ..Default::default() };
    assert!(decode_attention(&c.cache, 0, &q, 1, &c.padded, &mut out, None, &more_sinks).is_err());
    assert!(out.iter().all(|&x| x == 7.0));
    let ok = DecodeOptions { window_left: Some(9), sink_tokens: 2, ..Default::default() };
    decode_attention(&c.cache, 0, &q, 1, &c.padded, &mut out, None, &ok).unwrap();
    assert!(out.iter().all(|x| x.is_finite()));
}
