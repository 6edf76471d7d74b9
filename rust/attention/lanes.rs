//! One instruction set's f32 vector as the shared SIMD stages see it: [`Lanes`],
//! implemented by [`Avx2`] and [`Avx512`] (x86-64) and `Neon` (aarch64).
//!
//! A value of one of these types proves that the CPU runs its instruction set: only the
//! `unsafe` [`Lanes::assume`] makes one, so the methods are safe. A stage is a generic
//! function over `L: Lanes` marked `#[inline(always)]`, and [`entry`] writes its entry
//! per instruction set with the `#[target_feature]` attribute, so that the stage and every
//! method it calls are compiled into that entry with the instruction set's features.
//! Adding an instruction set to those stages is an implementation here.

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

mod sealed {
    pub trait Sealed {}
}

/// The f32 vector of one instruction set. Sealed: the stages' `unsafe` code trusts
/// `W` and the masks' lanes.
pub(crate) trait Lanes: Copy + sealed::Sealed {
    /// A vector of `W` f32.
    type V: Copy;
    /// A set of lanes (a prefix of the vector: see [`Lanes::first`]).
    type M: Copy;
    /// Lanes per vector.
    const W: usize;
    /// Register tile of the prefill micro-kernels: rows, and vectors per row.
    const ROWS: usize;
    const VECS: usize;

    /// The proof that this CPU runs the instruction set.
    ///
    /// # Safety
    /// The CPU must support every feature of the type's `#[target_feature]` list.
    unsafe fn assume() -> Self;
    fn splat(self, x: f32) -> Self::V;
    /// The lanes `< n` (all of them for `n >= W`).
    fn first(self, n: usize) -> Self::M;
    /// # Safety
    /// `p` is readable for `W` f32.
    unsafe fn load(self, p: *const f32) -> Self::V;
    /// # Safety
    /// `p` is writable for `W` f32.
    unsafe fn store(self, p: *mut f32, v: Self::V);
    /// The lanes in `m` read from `p`, the others 0 (and not accessed).
    ///
    /// # Safety
    /// The lanes in `m` of `p` are readable.
    unsafe fn load_part(self, p: *const f32, m: Self::M) -> Self::V;
    /// The lanes in `m` of `v` written to `p`, the others not accessed.
    ///
    /// # Safety
    /// The lanes in `m` of `p` are writable.
    unsafe fn store_part(self, p: *mut f32, m: Self::M, v: Self::V);
    /// Lanes in `m` from `a`, the others from `b`.
    fn select(self, m: Self::M, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c`, one rounding.
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    fn hmax(self, v: Self::V) -> f32;
    fn hsum(self, v: Self::V) -> f32;
    /// The path's polynomial `2^x` (exactly 0 below [`super::work::EXP2_ZERO_BELOW`]).
    fn exp2(self, v: Self::V) -> Self::V;

    /// `2^x` of one value by the vector polynomial (no libm call).
    #[inline(always)]
    fn exp2_one(self, x: f32) -> f32 {
        self.hmax(self.exp2(self.splat(x)))
    }
}

/// Writes `pub(crate) mod $isa` holding, for each `fn name(args) -> R = stage;`, an entry
/// `unsafe fn name(args) -> R` compiled with `$features` that calls
/// `stage(<$lanes>::assume(), args)` of the module that invokes it.
macro_rules! entry {
    ($(#[$meta:meta])* $isa:ident, $lanes:ty, $features:literal, $(fn $name:ident($($a:ident: $t:ty),*) $(-> $r:ty)? = $stage:ident;)*) => {
        $(#[$meta])*
        pub(crate) mod $isa {
            #[allow(unused_imports)]
            use super::*;
            $(
                /// The stage on this instruction set.
                ///
                /// # Safety
                /// The CPU must support the features of this entry's `#[target_feature]`.
                #[target_feature(enable = $features)]
                pub(crate) unsafe fn $name($($a: $t),*) $(-> $r)? {
                    // SAFETY: the caller guarantees the features.
                    super::$stage(unsafe { <$lanes as $crate::attention::lanes::Lanes>::assume() }, $($a),*)
                }
            )*
        }
    };
}
pub(crate) use entry;

/// Methods of a [`Lanes`] impl that call one function with their arguments:
/// `[unsafe] fn name(args) -> R = function;`.
macro_rules! calls {
    () => {};
    (fn $name:ident($($a:ident: $t:ty),*) -> $r:ty = $f:path; $($rest:tt)*) => {
        #[inline(always)]
        fn $name(self, $($a: $t),*) -> $r {
            // SAFETY: `self` proves that the CPU has the function's features.
            unsafe { $f($($a),*) }
        }
        calls!($($rest)*);
    };
    (unsafe fn $name:ident($($a:ident: $t:ty),*) -> $r:ty = $f:path; $($rest:tt)*) => {
        #[inline(always)]
        unsafe fn $name(self, $($a: $t),*) -> $r {
            // SAFETY: `self` proves the features; the pointer's lanes are the caller's.
            unsafe { $f($($a),*) }
        }
        calls!($($rest)*);
    };
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{sealed, Lanes};
    use crate::attention::{avx2_cvt, avx512};

    /// AVX2 + FMA + F16C: 8 lanes.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2(());

    /// AVX-512 F/BW/VL + FMA + F16C: 16 lanes.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512(());

    impl sealed::Sealed for Avx2 {}
    impl sealed::Sealed for Avx512 {}

    impl Lanes for Avx2 {
        type V = __m256;
        type M = __m256i;
        const W: usize = 8;
        const ROWS: usize = 4;
        const VECS: usize = 2;

        unsafe fn assume() -> Self {
            Avx2(())
        }
        calls! {
            fn splat(x: f32) -> __m256 = _mm256_set1_ps;
            fn add(a: __m256, b: __m256) -> __m256 = _mm256_add_ps;
            fn sub(a: __m256, b: __m256) -> __m256 = _mm256_sub_ps;
            fn mul(a: __m256, b: __m256) -> __m256 = _mm256_mul_ps;
            fn max(a: __m256, b: __m256) -> __m256 = _mm256_max_ps;
            fn fma(a: __m256, b: __m256, c: __m256) -> __m256 = _mm256_fmadd_ps;
            fn hmax(v: __m256) -> f32 = avx2_cvt::hmax;
            fn hsum(v: __m256) -> f32 = avx2_cvt::hsum;
            fn exp2(v: __m256) -> __m256 = avx2_cvt::exp2;
            unsafe fn load(p: *const f32) -> __m256 = _mm256_loadu_ps;
            unsafe fn store(p: *mut f32, v: __m256) -> () = _mm256_storeu_ps;
            // `vmaskmovps` does not access masked-off lanes.
            unsafe fn load_part(p: *const f32, m: __m256i) -> __m256 = _mm256_maskload_ps;
            unsafe fn store_part(p: *mut f32, m: __m256i, v: __m256) -> () = _mm256_maskstore_ps;
        }
        #[inline(always)]
        fn first(self, n: usize) -> __m256i {
            // SAFETY: `self` proves the features.
            unsafe { _mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(8) as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
        }
        #[inline(always)]
        fn select(self, m: __m256i, a: __m256, b: __m256) -> __m256 {
            // SAFETY: `self` proves the features.
            unsafe { _mm256_blendv_ps(b, a, _mm256_castsi256_ps(m)) }
        }
    }

    impl Lanes for Avx512 {
        type V = __m512;
        type M = __mmask16;
        const W: usize = 16;
        const ROWS: usize = 6;
        const VECS: usize = 4;

        unsafe fn assume() -> Self {
            Avx512(())
        }
        calls! {
            fn splat(x: f32) -> __m512 = _mm512_set1_ps;
            fn add(a: __m512, b: __m512) -> __m512 = _mm512_add_ps;
            fn sub(a: __m512, b: __m512) -> __m512 = _mm512_sub_ps;
            fn mul(a: __m512, b: __m512) -> __m512 = _mm512_mul_ps;
            fn max(a: __m512, b: __m512) -> __m512 = _mm512_max_ps;
            fn fma(a: __m512, b: __m512, c: __m512) -> __m512 = _mm512_fmadd_ps;
            fn hmax(v: __m512) -> f32 = _mm512_reduce_max_ps;
            fn hsum(v: __m512) -> f32 = _mm512_reduce_add_ps;
            fn exp2(v: __m512) -> __m512 = avx512::exp2;
            unsafe fn load(p: *const f32) -> __m512 = _mm512_loadu_ps;
            unsafe fn store(p: *mut f32, v: __m512) -> () = _mm512_storeu_ps;
            // Masked-off lanes are not accessed (fault suppression).
            unsafe fn store_part(p: *mut f32, m: __mmask16, v: __m512) -> () = _mm512_mask_storeu_ps;
        }
        #[inline(always)]
        fn first(self, n: usize) -> __mmask16 {
            if n >= 16 {
                0xffff
            } else {
                (1u16 << n) - 1
            }
        }
        #[inline(always)]
        fn select(self, m: __mmask16, a: __m512, b: __m512) -> __m512 {
            // SAFETY: `self` proves the features.
            unsafe { _mm512_mask_mov_ps(b, m, a) }
        }
        #[inline(always)]
        unsafe fn load_part(self, p: *const f32, m: __mmask16) -> __m512 {
            // SAFETY: as `store_part`.
            unsafe { _mm512_maskz_loadu_ps(m, p) }
        }
    }
}

#[cfg(target_arch = "aarch64")]
pub(crate) use arm::Neon;

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    use super::{sealed, Lanes};
    use crate::attention::neon;

    /// Advanced SIMD: 4 lanes. A lane set is its count (no masked loads: a partial vector
    /// goes through a stack copy).
    #[derive(Clone, Copy)]
    pub(crate) struct Neon(());

    impl sealed::Sealed for Neon {}

    /// `a * b + c` in `vfmaq_f32`'s argument order.
    #[inline(always)]
    unsafe fn fma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        // SAFETY: the caller (a `Neon` method) has the features.
        unsafe { vfmaq_f32(c, a, b) }
    }

    impl Lanes for Neon {
        type V = float32x4_t;
        type M = usize;
        const W: usize = 4;
        const ROWS: usize = 4;
        const VECS: usize = 4;

        unsafe fn assume() -> Self {
            Neon(())
        }
        calls! {
            fn splat(x: f32) -> float32x4_t = vdupq_n_f32;
            fn add(a: float32x4_t, b: float32x4_t) -> float32x4_t = vaddq_f32;
            fn sub(a: float32x4_t, b: float32x4_t) -> float32x4_t = vsubq_f32;
            fn mul(a: float32x4_t, b: float32x4_t) -> float32x4_t = vmulq_f32;
            fn max(a: float32x4_t, b: float32x4_t) -> float32x4_t = vmaxq_f32;
            fn fma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t = fma;
            fn hmax(v: float32x4_t) -> f32 = vmaxvq_f32;
            fn hsum(v: float32x4_t) -> f32 = vaddvq_f32;
            fn exp2(v: float32x4_t) -> float32x4_t = neon::exp2;
            unsafe fn load(p: *const f32) -> float32x4_t = vld1q_f32;
            unsafe fn store(p: *mut f32, v: float32x4_t) -> () = vst1q_f32;
        }
        #[inline(always)]
        fn first(self, n: usize) -> usize {
            n.min(4)
        }
        #[inline(always)]
        fn select(self, n: usize, a: float32x4_t, b: float32x4_t) -> float32x4_t {
            let idx: [u32; 4] = [0, 1, 2, 3];
            // SAFETY: `self` proves the features; idx holds 4 u32.
            unsafe { vbslq_f32(vcltq_u32(vld1q_u32(idx.as_ptr()), vdupq_n_u32(n as u32)), a, b) }
        }
        #[inline(always)]
        unsafe fn load_part(self, p: *const f32, n: usize) -> float32x4_t {
            let mut x = [0f32; 4];
            // SAFETY: lanes < n <= 4 of `p` are readable (the caller); x holds 4.
            unsafe {
                if n == 4 {
                    return vld1q_f32(p);
                }
                std::ptr::copy_nonoverlapping(p, x.as_mut_ptr(), n);
                vld1q_f32(x.as_ptr())
            }
        }
        #[inline(always)]
        unsafe fn store_part(self, p: *mut f32, n: usize, v: float32x4_t) {
            let mut x = [0f32; 4];
            // SAFETY: lanes < n <= 4 of `p` are writable (the caller); x holds 4.
            unsafe {
                if n == 4 {
                    return vst1q_f32(p, v);
                }
                vst1q_f32(x.as_mut_ptr(), v);
                std::ptr::copy_nonoverlapping(x.as_ptr(), p, n);
            }
        }
    }
}
