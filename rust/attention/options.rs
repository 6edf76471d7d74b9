//! What decode and prefill calls share besides the tables: the arithmetic, chosen by
//! dtype ([`Precision`]), the tuning knobs that never change a result ([`Tuning`]) and
//! the logit soft cap's check.
//!
//! Precision is a pair of operand dtypes: the query's in the scores `q K^T` and the
//! probabilities' in `P V`. `(f32, f32)` is exact on every cache; each other pair is
//! opt-in, valid on the caches [`VALID`] lists, and computes the same values on every
//! path (a path with the matching instruction uses it, the others compute the rounded
//! operands with f32 FMAs). The Python docstrings give each pair's error bound.

use super::isa::{Features, Isa, Supported};
use crate::error::Result;
use crate::invalid;
use crate::kv::DType;

/// The two kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Decode,
    Prefill,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::Decode => "decode",
            Kernel::Prefill => "prefill",
        }
    }
}

/// The operand dtypes of a call: `q` for the scores, `pv` for the probabilities of
/// `P V`. `Default` is exact: `(F32, F32)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Precision {
    pub q: DType,
    pub pv: DType,
}

impl Default for Precision {
    fn default() -> Self {
        Precision::EXACT
    }
}

use DType::{BF16, E4M3, E5M2, F16, F32, I8};

/// Every valid `(kernel, q, pv)` with the caches it applies to. `(F32, F32)` is valid on
/// every cache of either kernel and is not listed.
/// - bf16 query: bf16 and fp8 caches (every fp8 code is a bf16), both kernels;
/// - int8 query (quantized per row): int8 caches, decode;
/// - f16 query and probabilities (f16 sums): fp8 caches, decode;
/// - bf16 probabilities, with an f32 or a bf16 query: bf16 caches, prefill.
pub const VALID: &[(Kernel, DType, DType, &[DType])] = &[
    (Kernel::Decode, BF16, F32, &[BF16, E4M3, E5M2]),
    (Kernel::Decode, I8, F32, &[I8]),
    (Kernel::Decode, F16, F16, &[E4M3, E5M2]),
    (Kernel::Prefill, BF16, F32, &[BF16, E4M3, E5M2]),
    (Kernel::Prefill, F32, BF16, &[BF16]),
    (Kernel::Prefill, BF16, BF16, &[BF16]),
];

impl Precision {
    pub const EXACT: Precision = Precision { q: F32, pv: F32 };

    /// From the dtype names (`"f32"`, `"bf16"`, `"f16"`, `"int8"` and their long forms).
    pub fn parse(q: &str, pv: &str) -> Result<Self> {
        let one = |s: &str, what: &str| {
            DType::parse(s)
                .ok()
                .filter(|d| matches!(d, F32 | BF16 | F16 | I8))
                .ok_or_else(|| invalid!("{what} must be one of 'f32', 'bf16', 'f16', 'int8', got {s:?}"))
        };
        Ok(Precision { q: one(q, "q_dtype")?, pv: one(pv, "pv_dtype")? })
    }

    /// Whether this precision is valid for `kernel` on a cache of `kv`; the error lists
    /// the valid ones.
    pub fn check(self, kernel: Kernel, kv: DType) -> Result<()> {
        let valid = |p: Precision| p == Precision::EXACT || VALID.iter().any(|&(k, q, pv, caches)| (k, q, pv) == (kernel, p.q, p.pv) && caches.contains(&kv));
        if valid(self) {
            return Ok(());
        }
        let pairs: Vec<String> = [Precision::EXACT]
            .into_iter()
            .chain(VALID.iter().filter(|v| v.0 == kernel && v.3.contains(&kv)).map(|v| Precision { q: v.1, pv: v.2 }))
            .map(|p| format!("({}, {})", p.q.name(), p.pv.name()))
            .collect();
        Err(invalid!(
            "q_dtype={} with pv_dtype={} is not a {} precision for {} caches; valid (q_dtype, pv_dtype) there: {}",
            self.q.name(),
            self.pv.name(),
            kernel.name(),
            kv.name(),
            pairs.join(", ")
        ))
    }
}

/// Knobs that choose how a call runs, never what it computes (beyond f32 rounding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tuning {
    /// Kernel path; `None` is [`Isa::best`].
    pub isa: Option<Isa>,
    /// Tokens per split (rounded up to whole blocks for decode, to key tiles for
    /// prefill); `Some(0)` never splits, `None` chooses.
    pub split_tokens: Option<usize>,
    /// Decode only: KV heads per work item (must divide the KV head count); `None` is
    /// all of them, which reads each block as one contiguous run.
    pub kv_heads_per_item: Option<usize>,
    /// The CPU features the routes are chosen by: `None` is this CPU's; fewer
    /// ([`Features::without`]) run the routes of a CPU without the others (the tests).
    pub features: Option<Features>,
}

impl Tuning {
    /// [`Self::features`], or this CPU's.
    pub(crate) fn features(&self) -> Features {
        self.features.unwrap_or_else(Features::cpu)
    }

    /// The path to run: the forced one if `features` run it, else the best.
    pub(crate) fn path(&self, features: Features) -> Result<Supported> {
        let isa = self.isa.unwrap_or_else(Isa::best);
        Supported::check(isa, features).ok_or_else(|| invalid!("kernel path {} is not supported by this CPU", isa.name()))
    }
}

/// A logit soft cap must be finite and positive.
pub fn check_soft_cap(cap: Option<f32>) -> Result<()> {
    match cap {
        Some(c) if !(c.is_finite() && c > 0.0) => Err(invalid!("logits_soft_cap must be finite and > 0, got {c}")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_is_valid_everywhere_and_each_listed_pair_only_on_its_caches() {
        for kernel in [Kernel::Decode, Kernel::Prefill] {
            for kv in DType::ALL {
                assert!(Precision::EXACT.check(kernel, kv).is_ok());
                for q in [F32, BF16, F16, I8] {
                    for pv in [F32, BF16, F16, I8] {
                        let listed = VALID.iter().any(|v| (v.0, v.1, v.2) == (kernel, q, pv) && v.3.contains(&kv));
                        let p = Precision { q, pv };
                        assert_eq!(p.check(kernel, kv).is_ok(), listed || p == Precision::EXACT, "{kernel:?} {p:?} {kv:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_error_names_the_valid_pairs() {
        let e = Precision { q: I8, pv: F32 }.check(Kernel::Decode, BF16).unwrap_err().to_string();
        assert!(e.contains("(f32, f32), (bf16, f32)") && e.contains("decode") && e.contains("bf16 cache"), "{e}");
        assert!(Precision::parse("fp8_e4m3", "f32").unwrap_err().to_string().contains("q_dtype"));
        assert!(Precision::parse("f32", "half").is_ok_and(|p| p.pv == F16));
    }

    #[test]
    fn soft_caps_must_be_finite_and_positive() {
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(check_soft_cap(Some(bad)).is_err());
        }
        assert!(check_soft_cap(Some(30.0)).is_ok() && check_soft_cap(None).is_ok());
    }
}
