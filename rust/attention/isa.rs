//! The kernel paths ([`Isa`]), what this CPU supports ([`cpu_features`]), and
//! `Supported`, the proof of that check the `unsafe` dispatch relies on.

use crate::error::Result;
use crate::invalid;

/// A kernel implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    Scalar,
    Neon,
    Avx2,
    Avx512,
}

impl Isa {
    /// Every path, fastest last among those of one architecture (x86-64 and aarch64 never
    /// both support one, so the order across them does not matter).
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Neon, Isa::Avx2, Isa::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|i| i.name() == s)
            .ok_or_else(|| invalid!("unknown kernel path {s:?}; known: scalar, neon, avx2, avx512"))
    }

    /// Whether this CPU can run the path.
    pub fn supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => ["avx2", "fma", "f16c"].iter().all(|f| cpu_features().contains(f)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                ["avx512f", "avx512bw", "avx512vl", "fma", "f16c"].iter().all(|f| cpu_features().contains(f))
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => cpu_features().contains(&"neon"),
            // Paths of another architecture.
            _ => false,
        }
    }

    /// Supported paths, fastest last.
    pub fn available() -> Vec<Isa> {
        Self::ALL.into_iter().filter(|i| i.supported()).collect()
    }

    /// The fastest supported path.
    pub fn best() -> Isa {
        *Self::available().last().unwrap_or(&Isa::Scalar)
    }
}

/// SIMD features of this CPU that the kernels and probes care about.
pub fn cpu_features() -> &'static [&'static str] {
    static FEATURES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    FEATURES.get_or_init(|| {
        #[allow(unused_mut)]
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            macro_rules! probe {
                ($($f:tt),*) => { $( if std::arch::is_x86_feature_detected!($f) { v.push($f); } )* };
            }
            probe!("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16", "avx512vnni", "avx512vbmi", "avx512fp16");
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            v.push("neon");
        }
        v
    })
}

/// A kernel path this CPU runs: only [`Supported::check`] makes one (the field is
/// private to this module), so holding one proves the check that the `unsafe`
/// dispatch of [`super::decode`] relies on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Supported(Isa);

impl Supported {
    /// `isa` if this CPU has every feature its path is compiled for.
    pub(crate) fn check(isa: Isa) -> Option<Self> {
        isa.supported().then_some(Self(isa))
    }

    pub(crate) fn isa(self) -> Isa {
        self.0
    }
}

/// Makes the AVX-512 path run a bf16 query (`Precision { q: BF16, .. }`) with f32 FMAs on
/// the rounded query, as on a CPU without avx512_bf16. A process-wide switch: only the
/// test `bf16_query_on_avx512_without_bf16_uses_the_rounded_query` turns it on, holding
/// its `BF16_SWITCH` exclusively, and turns it off again even when it fails.
#[cfg(test)]
pub(crate) static AVX512_WITHOUT_BF16: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
