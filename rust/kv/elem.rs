//! The element types a KV cache holds (f32, f16, bf16, and the 8-bit codes int8, fp8 e4m3
//! and e5m2): [`DType`] names one at run time, [`Elem`] is one at compile time, and
//! [`with_elem!`](crate::with_elem) turns the first into the second.
//!
//! For the 8-bit types an element is a *code*: [`Elem::to_f32`] is the code's value
//! before its scale (the integer for int8, the fp8 number for fp8), [`Elem::from_f32`]
//! the code of an already scaled value (int8: round half to even, clamped to +-127; fp8:
//! [`super::fp8`]'s saturating nearest-even conversion). Where the scales live and how
//! they are computed is [`super::quant`]'s.

pub use super::fp8::{E4M3, E5M2};
use crate::error::Result;
use crate::invalid;

/// Storage element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// Symmetric int8, one f32 scale per (token, KV head) for K and for V.
    I8,
    /// fp8 `float8_e4m3fn`, one f32 scale per (layer, KV head) for K and for V.
    E4M3,
    /// fp8 `float8_e5m2`, scaled as [`DType::E4M3`].
    E5M2,
}

/// How the codes of a dtype are scaled ([`super::quant`] places the scales).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleKind {
    /// Unquantized: no scales.
    None,
    /// One f32 per (block, K or V, KV head, token slot), computed by every write.
    PerToken,
    /// One f32 per (layer, K or V, KV head), set by the caller or calibrated.
    PerHead,
}

impl DType {
    /// Every storage dtype, in the order their names are listed to users.
    pub const ALL: [DType; 6] = [Self::F32, Self::F16, Self::BF16, Self::I8, Self::E4M3, Self::E5M2];

    /// A dtype from its name ([`DType::name`]) or an accepted alias, case-insensitively.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" | "half" => Ok(Self::F16),
            "bf16" | "bfloat16" => Ok(Self::BF16),
            "int8" | "i8" => Ok(Self::I8),
            "fp8_e4m3" | "float8_e4m3fn" | "e4m3" => Ok(Self::E4M3),
            "fp8_e5m2" | "float8_e5m2" | "e5m2" => Ok(Self::E5M2),
            _ => {
                let names: Vec<String> = Self::ALL.iter().map(|d| format!("'{}'", d.name())).collect();
                Err(invalid!("dtype must be one of {}, got {s:?}", names.join(", ")))
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::I8 => "int8",
            Self::E4M3 => "fp8_e4m3",
            Self::E5M2 => "fp8_e5m2",
        }
    }

    /// How the codes are scaled.
    pub fn scale_kind(self) -> ScaleKind {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => ScaleKind::None,
            Self::I8 => ScaleKind::PerToken,
            Self::E4M3 | Self::E5M2 => ScaleKind::PerHead,
        }
    }

    /// Whether elements are scaled 8-bit codes.
    pub fn is_quantized(self) -> bool {
        self.scale_kind() != ScaleKind::None
    }

    /// The code a scale maps `max|x|` of a row (int8) or head (fp8) to: 127, 448 or 57344.
    pub fn code_max(self) -> f32 {
        match self {
            Self::I8 => 127.0,
            Self::E4M3 => super::fp8::E4M3_MAX,
            Self::E5M2 => super::fp8::E5M2_MAX,
            Self::F32 | Self::F16 | Self::BF16 => 1.0,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::I8 | Self::E4M3 | Self::E5M2 => 1,
        }
    }
}

/// A storage element: converts from f32 with round-to-nearest-even and back exactly.
///
/// Sealed: implemented for exactly `f32`, `half::f16`, `half::bf16`, `i8`, [`E4M3`] and
/// [`E5M2`], and no other
/// crate can add a type. Unsafe code relies on it (`cast` and the kernels' raw SIMD
/// loads): every implementor is plain old data (any bit pattern is a value, no padding)
/// of `DTYPE.size()` bytes, and `DTYPE` names its layout.
pub trait Elem: sealed::Sealed + Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    #[inline]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Elem for half::f16 {
    const DTYPE: DType = DType::F16;
    #[inline]
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

impl Elem for half::bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline]
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

impl Elem for i8 {
    const DTYPE: DType = DType::I8;
    /// Clamped to +-127 (-128 is never produced), rounded half to even; NaN gives 0.
    /// Rounding adds and subtracts 1.5 * 2^23 (exact for `|x| <= 127`, in the default
    /// rounding mode) instead of `round_ties_even`, which is a libm call without SSE4.1
    /// and would keep the write loop from vectorising.
    #[inline]
    fn from_f32(x: f32) -> Self {
        const MAGIC: f32 = 12_582_912.0;
        ((x.clamp(-127.0, 127.0) + MAGIC) - MAGIC) as i8
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self as f32
    }
}

impl Elem for E4M3 {
    const DTYPE: DType = DType::E4M3;
    #[inline]
    fn from_f32(x: f32) -> Self {
        E4M3::from_f32(x)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        E4M3::to_f32(self)
    }
}

impl Elem for E5M2 {
    const DTYPE: DType = DType::E5M2;
    #[inline]
    fn from_f32(x: f32) -> Self {
        E5M2::from_f32(x)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        E5M2::to_f32(self)
    }
}

mod sealed {
    /// The private supertrait of [`super::Elem`]: only this module can implement it.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for i8 {}
    impl Sealed for super::E4M3 {}
    impl Sealed for super::E5M2 {}
}

/// Call `$body` with `$E` bound to the element type of `$dtype`.
#[macro_export]
macro_rules! with_elem {
    ($dtype:expr, $E:ident => $body:expr) => {
        match $dtype {
            $crate::kv::elem::DType::F32 => {
                type $E = f32;
                $body
            }
            $crate::kv::elem::DType::F16 => {
                type $E = half::f16;
                $body
            }
            $crate::kv::elem::DType::BF16 => {
                type $E = half::bf16;
                $body
            }
            $crate::kv::elem::DType::I8 => {
                type $E = i8;
                $body
            }
            $crate::kv::elem::DType::E4M3 => {
                type $E = $crate::kv::elem::E4M3;
                $body
            }
            $crate::kv::elem::DType::E5M2 => {
                type $E = $crate::kv::elem::E5M2;
                $body
            }
        }
    };
}
