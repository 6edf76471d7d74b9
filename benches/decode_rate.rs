//! The decode kernel on a cache that stays in L2: how fast each path's loop (softmax, the
//! score -> V hand-over, bookkeeping and the per-code work) runs with memory out of the
//! picture, to set beside the same path's rate from memory.
//!
//! Per decode path and g = 1 and 4 query heads per KV head: one sequence, one KV head,
//! head_dim 128, blocks of 16 tokens in a scattered order, `decode_attention` on one
//! thread (the kernels' pool set to 1, no split), over `SHORT` and over `LONG` tokens;
//! both keep the codes in L2 (at most 1 MiB for bf16). divan counts the K and V codes a
//! call reads (`2 x 128` per token) as its items. The marginal rate, which leaves out a
//! call's fixed cost (plan, buffers, merge), is the codes between the two lengths over
//! the time between their calls: `(LONG - SHORT) x 256 / (t_long - t_short)`, from the
//! two benches' medians.
//!
//! Run: `cargo bench --bench decode_rate [-- --sample-count N] [-- FILTER]` (divan). A path
//! whose opt-in instructions this CPU lacks registers no timing (divan warns).

use std::hint::black_box;

use divan::counter::ItemsCount;
use divan::Bencher;
use pykvpool::attention::{decode_attention, DecodeOptions, Precision, SeqTables, Tuning};
use pykvpool::{DType, KvCache, KvShape};

const D: usize = 128;
const BS: usize = 16;
const SHORT: usize = 1024;
const LONG: usize = 2048;

/// A decode path: name (as the rows of `benches/RESULTS.md`, named after the options that
/// chose them before the precision pair: `bf16_scores` is a bf16 query, `int8_scores` an
/// int8 one), cache dtype, precision.
struct Path {
    name: &'static str,
    dtype: DType,
    precision: Precision,
}

const EXACT: Precision = Precision::EXACT;
const BF16_QUERY: Precision = Precision { q: DType::BF16, pv: DType::F32 };
const INT8_QUERY: Precision = Precision { q: DType::I8, pv: DType::F32 };

const PATHS: [Path; 8] = [
    Path { name: "bf16", dtype: DType::BF16, precision: EXACT },
    Path { name: "int8", dtype: DType::I8, precision: EXACT },
    Path { name: "fp8_e4m3", dtype: DType::E4M3, precision: EXACT },
    Path { name: "fp8_e5m2", dtype: DType::E5M2, precision: EXACT },
    Path { name: "bf16+bf16_scores", dtype: DType::BF16, precision: BF16_QUERY },
    Path { name: "fp8_e4m3+bf16_scores", dtype: DType::E4M3, precision: BF16_QUERY },
    Path { name: "fp8_e5m2+bf16_scores", dtype: DType::E5M2, precision: BF16_QUERY },
    Path { name: "int8_scores", dtype: DType::I8, precision: INT8_QUERY },
];

/// A deterministic generator of floats in [-1, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// A one-KV-head cache of `LONG` tokens of random K and V, and tables of one sequence
/// of `len` tokens on its blocks in a scattered order (stride 7 modulo the block count).
fn case(dtype: DType, len: usize) -> (KvCache, SeqTables) {
    let nb = LONG / BS;
    let s = KvShape { num_layers: 1, num_blocks: nb, block_size: BS, num_kv_heads: 1, head_dim: D };
    let mut r = Lcg(7);
    let k: Vec<f32> = (0..nb * BS * D).map(|_| 2.0 * r.next()).collect();
    let v: Vec<f32> = (0..nb * BS * D).map(|_| r.next()).collect();
    let mut c = KvCache::new(s, dtype).expect("cache");
    c.write(0, &k, &v, &(0..(nb * BS) as i64).collect::<Vec<_>>()).expect("write");
    let table: Vec<i64> = (0..nb).map(|b| ((b * 7) % nb) as i64).collect();
    let t = SeqTables::padded(&table, nb, &[len as i64], BS, nb).expect("tables");
    (c, t)
}

fn main() {
    pykvpool::runtime::threads::set_num_threads(1).expect("threads");
    divan::main();
}

/// The path's options, or `None` (with a note) where this CPU lacks what it needs.
fn options(name: &str) -> Option<(&'static Path, DecodeOptions)> {
    let p = PATHS.iter().find(|p| p.name == name).expect("a path of PATHS");
    let needs: &[&str] = match p.precision.q {
        DType::BF16 => &["avx512bf16", "avx512vbmi"],
        DType::I8 => &["avx512vnni"],
        _ => &[],
    };
    let feats = pykvpool::attention::cpu_features();
    if let Some(f) = needs.iter().find(|f| !feats.contains(f)) {
        eprintln!("decode_rate: {name} needs {f}; skipped");
        return None;
    }
    let opts = DecodeOptions {
        tuning: Tuning { split_tokens: Some(0), ..Tuning::default() },
        precision: p.precision,
        ..Default::default()
    };
    Some((p, opts))
}

/// One call of path `name` at `g` query heads over `len` tokens, counted in K+V codes.
fn decode(bencher: Bencher, name: &str, g: usize, len: usize) {
    let Some((p, opts)) = options(name) else { return };
    let mut r = Lcg(11);
    let q: Vec<f32> = (0..g * D).map(|_| r.next()).collect();
    let mut out = vec![0f32; g * D];
    let (c, t) = case(p.dtype, len);
    bencher.counter(ItemsCount::new(len * 2 * D)).bench_local(|| {
        decode_attention(&c, 0, black_box(&q), g, &t, &mut out, None, &opts).expect("decode");
        black_box(&out);
    });
}

const NAMES: [&str; PATHS.len()] = {
    let mut n = [""; PATHS.len()];
    let mut i = 0;
    while i < PATHS.len() {
        n[i] = PATHS[i].name;
        i += 1;
    }
    n
};

/// `SHORT` (1,024) tokens.
#[divan::bench(args = NAMES, consts = [1, 4])]
fn tokens_1024<const G: usize>(bencher: Bencher, name: &str) {
    decode(bencher, name, G, SHORT);
}

/// `LONG` (2,048) tokens.
#[divan::bench(args = NAMES, consts = [1, 4])]
fn tokens_2048<const G: usize>(bencher: Bencher, name: &str) {
    decode(bencher, name, G, LONG);
}
