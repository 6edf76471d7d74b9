//! What the decode and prefill tests share: a seeded generator, cache shapes, caches filled
//! with random K/V, the tables that put a read on the last token of the pool, the
//! options' constructors and the refusal of a precision.

use super::isa::Isa;
use super::options::{Kernel, Precision, Tuning};
use super::tables::SeqTables;
use crate::kv::{DType, KvCache, KvShape};

/// A bf16 query, f32 probabilities: the scores from the query rounded to bf16.
pub(crate) const BF16_QUERY: Precision = Precision { q: DType::BF16, pv: DType::F32 };
/// An int8 query (quantized per row), f32 probabilities.
pub(crate) const INT8_QUERY: Precision = Precision { q: DType::I8, pv: DType::F32 };
/// f16 query and probabilities (decode on fp8 caches).
pub(crate) const F16_PRECISION: Precision = Precision { q: DType::F16, pv: DType::F16 };
/// An f32 query, bf16 probabilities (prefill on bf16 caches).
pub(crate) const BF16_PV: Precision = Precision { q: DType::F32, pv: DType::BF16 };
/// bf16 query and probabilities (prefill on bf16 caches).
pub(crate) const BF16_QUERY_PV: Precision = Precision { q: DType::BF16, pv: DType::BF16 };

/// The tuning that forces path `isa` and chooses the rest.
pub(crate) fn on(isa: Isa) -> Tuning {
    Tuning { isa: Some(isa), ..Tuning::default() }
}

/// The tuning of path `isa` with `split_tokens` and `kv_heads_per_item`.
pub(crate) fn tuned(isa: Isa, split_tokens: Option<usize>, kv_heads_per_item: Option<usize>) -> Tuning {
    Tuning { isa: Some(isa), split_tokens, kv_heads_per_item, features: None }
}

/// The valid `(q_dtype, pv_dtype)` pairs of `kernel` on a `kv` cache, as the refusal lists
/// them (written out here, not read from the table the check uses).
pub(crate) fn valid_pairs(kernel: Kernel, kv: DType) -> &'static str {
    use DType::*;
    match (kernel, kv) {
        (_, F32 | F16) | (Kernel::Prefill, I8) => "(f32, f32)",
        (Kernel::Decode, BF16) => "(f32, f32), (bf16, f32)",
        (Kernel::Decode, I8) => "(f32, f32), (int8, f32)",
        (Kernel::Decode, E4M3 | E5M2) => "(f32, f32), (bf16, f32), (f16, f16)",
        (Kernel::Prefill, BF16) => "(f32, f32), (bf16, f32), (f32, bf16), (bf16, bf16)",
        (Kernel::Prefill, E4M3 | E5M2) => "(f32, f32), (bf16, f32)",
    }
}

/// The whole message refusing precision `p` for `kernel` on a `kv` cache.
pub(crate) fn refusal(p: Precision, kernel: Kernel, kv: DType) -> String {
    let name = match kernel {
        Kernel::Decode => "decode",
        Kernel::Prefill => "prefill",
    };
    format!(
        "q_dtype={} with pv_dtype={} is not a {name} precision for {} caches; valid (q_dtype, pv_dtype) there: {}",
        p.q.name(),
        p.pv.name(),
        kv.name(),
        valid_pairs(kernel, kv)
    )
}

/// A linear congruential generator of floats in `[-1, 1)`: the same data on every run.
pub(crate) struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// A one-layer cache shape.
pub(crate) fn shape(bs: usize, hkv: usize, d: usize, nb: usize) -> KvShape {
    KvShape { num_layers: 1, num_blocks: nb, block_size: bs, num_kv_heads: hkv, head_dim: d }
}

/// A cache with every slot of layer 0 holding random K (times `k_gain`) and V in `[-1, 1)`.
pub(crate) fn filled(shape: KvShape, dtype: DType, seed: u64, k_gain: f32) -> KvCache {
    let mut c = KvCache::new(shape, dtype).unwrap();
    let mut r = Lcg(seed);
    let n = shape.num_blocks * shape.block_size;
    let row = shape.num_kv_heads * shape.head_dim;
    let k: Vec<f32> = (0..n * row).map(|_| k_gain * r.next()).collect();
    let v: Vec<f32> = (0..n * row).map(|_| r.next()).collect();
    let slots: Vec<i64> = (0..n as i64).collect();
    c.write(0, &k, &v, &slots).unwrap();
    c
}

/// A filled cache of 3 blocks of `bs` tokens, 3 KV heads of `d`, and tables of three
/// sequences: the first ends on the last token of the pool's last block, the second one
/// token before the end of that block, the third one token into it. Returns their lengths.
pub(crate) fn last_block_case(dtype: DType, bs: usize, d: usize, k_gain: f32) -> (KvCache, SeqTables, [i64; 3]) {
    let nb = 3;
    let c = filled(shape(bs, 3, d, nb), dtype, (bs * 7 + d) as u64, k_gain);
    let last = nb as i64 - 1;
    let table = [0, last, last, -1, 1, last];
    let lens = [2 * bs as i64, bs as i64 - 1, bs as i64 + 1];
    let t = SeqTables::padded(&table, 2, &lens, bs, nb).unwrap();
    (c, t, lens)
}

/// A kernel's in-register conversion of 8-bit codes against `Elem::to_f32` on all 256
/// codes (NaN codes included): `load(codes, at, n)` returns `width` lanes, the first `n`
/// the codes `at..at + n` divided by `factor` (the kernel's `load_factor`), the rest 0;
/// checked for every `n` in `counts`. -0 must stay -0 (a NaN's sign carries no value).
pub(crate) fn check_every_code<E: crate::kv::Elem>(
    code: impl Fn(u8) -> E,
    width: usize,
    counts: &[usize],
    factor: f32,
    load: impl Fn(&[E], usize, usize) -> Vec<f32>,
) {
    let codes: Vec<E> = (0..=255u8).map(code).collect();
    for at in (0..256).step_by(width) {
        for &n in counts {
            let got = load(&codes, at, n);
            assert_eq!(got.len(), width);
            for (i, &g) in got.iter().enumerate() {
                let want = if i < n { codes[at + i].to_f32() } else { 0.0 };
                let g = g * factor;
                assert!(g == want || (g.is_nan() && want.is_nan()), "{:?} code {}: {g} vs {want}", E::DTYPE, at + i);
                assert!(want.is_nan() || g.is_sign_negative() == want.is_sign_negative(), "sign of code {}", at + i);
            }
        }
    }
}
