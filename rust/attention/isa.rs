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
        Features::cpu().runs(self)
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

/// Every feature [`cpu_features`] reports and [`Features`] holds, in bit order.
const FEATURE_NAMES: [&str; 14] = [
    "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16", "avx512vnni",
    "avx512vbmi", "avx512fp16", "neon",
];

/// The CPU features the kernels choose their routes by, as a value: [`Features::cpu`] is
/// this CPU's, and [`Features::without`] takes some away, so that a test runs the route a
/// CPU without them takes (no process-wide switch). The field is private: every value
/// holds only features this CPU has, which the `unsafe` dispatch relies on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Features(u16);

impl Features {
    /// This CPU's features.
    pub fn cpu() -> Self {
        static CPU: std::sync::OnceLock<Features> = std::sync::OnceLock::new();
        *CPU.get_or_init(|| {
            let bits = FEATURE_NAMES.iter().enumerate().filter(|(_, f)| cpu_features().contains(f));
            Features(bits.fold(0, |acc, (i, _)| acc | 1 << i))
        })
    }

    /// Whether the feature `name` (as [`cpu_features`] spells it) is in the set.
    pub fn has(self, name: &str) -> bool {
        FEATURE_NAMES.iter().position(|&f| f == name).is_some_and(|i| self.0 & 1 << i != 0)
    }

    /// The set without `names` (unknown names take nothing away).
    pub fn without(self, names: &[&str]) -> Self {
        let gone = FEATURE_NAMES.iter().enumerate().filter(|(_, f)| names.contains(f));
        Features(self.0 & !gone.fold(0, |acc, (i, _)| acc | 1 << i))
    }

    /// Whether these features run the path `isa` (every feature it is compiled for).
    pub fn runs(self, isa: Isa) -> bool {
        let all = |names: &[&str]| names.iter().all(|f| self.has(f));
        match isa {
            Isa::Scalar => true,
            Isa::Avx2 => cfg!(target_arch = "x86_64") && all(&["avx2", "fma", "f16c"]),
            Isa::Avx512 => cfg!(target_arch = "x86_64") && all(&["avx512f", "avx512bw", "avx512vl", "fma", "f16c"]),
            Isa::Neon => cfg!(target_arch = "aarch64") && self.has("neon"),
        }
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
    /// `isa` if `features` (a subset of this CPU's) run its path.
    pub(crate) fn check(isa: Isa, features: Features) -> Option<Self> {
        features.runs(isa).then_some(Self(isa))
    }

    pub(crate) fn isa(self) -> Isa {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_this_cpus_and_only_shrink() {
        let cpu = Features::cpu();
        for name in FEATURE_NAMES {
            assert_eq!(cpu.has(name), cpu_features().contains(&name), "{name}");
            assert!(!cpu.without(&[name]).has(name));
        }
        assert!(!cpu.has("sve") && cpu.without(&["sve"]) == cpu);
        for isa in Isa::ALL {
            assert_eq!(cpu.runs(isa), isa.supported());
        }
        assert!(cpu.without(&FEATURE_NAMES).runs(Isa::Scalar));
        assert!(!cpu.without(&["fma"]).runs(Isa::Avx2) && !cpu.without(&["avx512bw"]).runs(Isa::Avx512));
        assert!(Supported::check(Isa::Avx2, cpu.without(&["avx2"])).is_none());
    }
}
