//! The element types a KV cache holds (f32, f16, bf16): [`DType`] names one at run time,
//! [`Elem`] is one at compile time, and [`with_elem!`](crate::with_elem) turns the first into the second.

use crate::error::Result;
use crate::invalid;

/// Storage element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Self::F32),
            "f16" | "float16" | "half" => Ok(Self::F16),
            "bf16" | "bfloat16" => Ok(Self::BF16),
            _ => Err(invalid!("dtype must be 'f32', 'f16' or 'bf16', got {s:?}")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }
}

/// A storage element: converts from f32 with round-to-nearest-even and back exactly.
///
/// Sealed: implemented for exactly `f32`, `half::f16` and `half::bf16`, and no other
/// crate can add a type. Unsafe code relies on it ([`cast`] and the kernels' raw SIMD
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

mod sealed {
    /// The private supertrait of [`super::Elem`]: only this module can implement it.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
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
        }
    };
}
