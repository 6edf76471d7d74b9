//! One instruction set's f32 vector as the shared SIMD stages see it: [`Lanes`],
//! implemented by [`Avx2`] and [`Avx512`] (x86-64) and `Neon` (aarch64).
//!
//! A value of one of these types proves that the CPU runs its instruction set: only the
//! `unsafe` [`Lanes::assume`] makes one, so the methods are safe. A stage is a generic
//! function over `L: Lanes` marked `#[inline(always)]`, and [`entry`] (over the
//! list of [`paths`]) writes its entry
//! per instruction set with the `#[target_feature]` attribute, so that the stage and every
//! method it calls are compiled into that entry with the instruction set's features.
//! Adding an instruction set to those stages is an implementation here.

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use crate::kv::quant::TileScale;
use crate::kv::Elem;

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
    /// Lane 0 of `v`.
    fn lane0(self, v: Self::V) -> f32;
    /// The path's polynomial `2^x` (exactly 0 below [`super::work::EXP2_ZERO_BELOW`]).
    fn exp2(self, v: Self::V) -> Self::V;

    /// Whether a lane of `v` is above `x` (NaN lanes are not).
    fn any_above(self, v: Self::V, x: f32) -> bool;
    /// The lanes in `m` of `v`, the others 0.
    fn keep(self, m: Self::M, v: Self::V) -> Self::V;

    /// `2^x` of one value by the vector polynomial (no libm call).
    #[inline(always)]
    fn exp2_one(self, x: f32) -> f32 {
        self.lane0(self.exp2(self.splat(x)))
    }
}

/// What the decode tile loop (`simd.rs`) needs besides [`Lanes`]: the cache's
/// elements as f32 vectors, their scales, and the heads' `exp2` and soft cap interleaved.
pub(crate) trait Elements: Lanes {
    /// `P V`'s accumulator vectors per head per pass (3-4 heads; twice as many for 1-2).
    const ACC_VECS: usize;
    /// `W` elements at `p` as f32 (8-bit codes as the path reads them: e4m3 divided by
    /// 2^8, see [`super::work::load_factor`]).
    ///
    /// # Safety
    /// `p .. p + W` is readable.
    unsafe fn widen<E: Elem>(self, p: *const E) -> Self::V;
    /// The first `n <= W` elements at `p` as [`Elements::widen`] reads them, the other
    /// lanes 0.
    ///
    /// # Safety
    /// `p .. p + n` is readable.
    unsafe fn widen_part<E: Elem>(self, p: *const E, n: usize) -> Self::V;
    /// Two runs of `W` elements, at `p` and `p + stride`, as [`Elements::widen`] reads
    /// them (an implementation may widen both at once).
    ///
    /// # Safety
    /// `p .. p + W` and `p + stride .. p + stride + W` are readable.
    #[inline(always)]
    unsafe fn widen_pair<E: Elem>(self, p: *const E, stride: usize) -> [Self::V; 2] {
        // SAFETY: the contract.
        unsafe { [self.widen(p), self.widen(p.add(stride))] }
    }
    /// Whether `t` holds codes that [`Elements::widen`] misreads (AVX-512 reads e4m3's
    /// two NaN codes as numbers and checks each tile instead: see `avx512_cvt.rs`): the
    /// item must then run on another path.
    #[inline(always)]
    fn misreads<E: Elem>(self, t: &[E]) -> bool {
        let _ = t;
        false
    }
    /// The scales of tokens `c0..c0 + n` (`n <= W`; the other lanes 0) of a tile times
    /// the load factor, or `None` for an unscaled cache.
    fn scales<E: Elem>(self, ts: &TileScale, c0: usize, n: usize) -> Option<Self::V>;
    /// Each vector's `exp2`, the polynomial's steps interleaved across them.
    fn exp2_each<const H: usize>(self, x: [Self::V; H]) -> [Self::V; H];
    /// [`super::work::soft_cap`] of each vector (its `exp2` argument clamped to
    /// +-[`super::work::SOFT_CAP_ARG`], a NaN kept).
    fn soft_cap_each<const H: usize>(self, s: [Self::V; H], c: f32) -> [Self::V; H];
}

/// `entry! { $module; [fn name(args) -> R = stage; ...] $isa = $lanes, $features; ... }`
/// writes, per instruction set, `pub(crate) mod $isa` in `$module` (the invoking module's
/// path) holding for each listed stage an entry `unsafe fn name(args) -> R` compiled with
/// `$features` that calls `$module::stage(<$lanes>::assume(), args)` (attributes before
/// `$isa`, such as a `cfg`, go on the module).
macro_rules! entry {
    ($($m:ident)::+; [$($fns:tt)*]) => {};
    ($($m:ident)::+; [$($fns:tt)*] $(#[$meta:meta])* $isa:ident = $lanes:ty, $features:literal; $($rest:tt)*) => {
        entry!(@one [$($m)::+] $(#[$meta])* $isa, $lanes, $features, $($fns)*);
        entry!($($m)::+; [$($fns)*] $($rest)*);
    };
    (@one [$($m:ident)::+] $(#[$meta:meta])* $isa:ident, $lanes:ty, $features:literal,
     $(fn $name:ident $(<$($g:ident: $b:path),*>)? ($($a:ident: $t:ty),*) $(-> $r:ty)? = $stage:ident;)*) => {
        $(#[$meta])*
        pub(crate) mod $isa {
            #[allow(unused_imports)]
            use $($m)::+::*;
            use $($m)::+ as stages;
            $(
                /// The stage on this instruction set.
                ///
                /// # Safety
                /// The CPU must support the features of this entry's `#[target_feature]`.
                #[target_feature(enable = $features)]
                pub(crate) unsafe fn $name $(<$($g: $b),*>)? ($($a: $t),*) $(-> $r)? {
                    // SAFETY: the caller guarantees the features.
                    stages::$stage(unsafe { <$lanes as $crate::attention::lanes::Lanes>::assume() }, $($a),*)
                }
            )*
        }
    };
}
pub(crate) use entry;

/// `paths!(entry! { $module; [stages] })`: [`entry`] over the one list of SIMD paths, each
/// with its [`Lanes`] type and its `#[target_feature]` list.
macro_rules! paths {
    ($m:ident! { $($pre:tt)* }) => {
        $m! {
            $($pre)*
            #[cfg(target_arch = "x86_64")]
            avx512 = crate::attention::lanes::Avx512, "avx512f,avx512bw,avx512vl,fma,f16c";
            #[cfg(target_arch = "x86_64")]
            avx2 = crate::attention::lanes::Avx2, "avx2,fma,f16c";
            #[cfg(target_arch = "aarch64")]
            neon = crate::attention::lanes::Neon, "neon";
        }
    };
}
pub(crate) use paths;

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

    use crate::attention::lanes::{sealed, Elements, Lanes};
    use crate::attention::{avx2_cvt, avx512_cvt};
    use crate::kv::DType;
    use crate::kv::quant::TileScale;
    use crate::kv::Elem;

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
            fn lane0(v: __m256) -> f32 = _mm256_cvtss_f32;
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
        #[inline(always)]
        fn any_above(self, v: __m256, x: f32) -> bool {
            // SAFETY: `self` proves the features.
            unsafe { _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(v, _mm256_set1_ps(x))) != 0 }
        }
        #[inline(always)]
        fn keep(self, m: __m256i, v: __m256) -> __m256 {
            // SAFETY: `self` proves the features.
            unsafe { _mm256_and_ps(v, _mm256_castsi256_ps(m)) }
        }
    }

    impl Elements for Avx2 {
        const ACC_VECS: usize = 2;

        #[inline(always)]
        fn exp2_each<const H: usize>(self, x: [__m256; H]) -> [__m256; H] {
            // SAFETY: `self` proves the features.
            unsafe { avx2_cvt::exp2_each(x) }
        }
        #[inline(always)]
        fn soft_cap_each<const H: usize>(self, s: [__m256; H], c: f32) -> [__m256; H] {
            // SAFETY: `self` proves the features.
            unsafe { avx2_cvt::soft_cap_each(s, c) }
        }
        #[inline(always)]
        unsafe fn widen<E: Elem>(self, p: *const E) -> __m256 {
            // SAFETY: the features (`self`); 8 readable elements (the caller).
            unsafe { avx2_cvt::load_full(p) }
        }
        #[inline(always)]
        unsafe fn widen_part<E: Elem>(self, p: *const E, n: usize) -> __m256 {
            // SAFETY: the features (`self`); n readable elements (the caller).
            unsafe { avx2_cvt::load(std::slice::from_raw_parts(p, n), 0, n) }
        }
        #[inline(always)]
        fn scales<E: Elem>(self, ts: &TileScale, c0: usize, n: usize) -> Option<__m256> {
            // SAFETY: `self` proves the features.
            unsafe { avx2_cvt::scale_vector::<E>(ts, c0, n) }
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
            fn lane0(v: __m512) -> f32 = _mm512_cvtss_f32;
            fn exp2(v: __m512) -> __m512 = avx512_cvt::exp2;
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
        fn any_above(self, v: __m512, x: f32) -> bool {
            // SAFETY: `self` proves the features.
            unsafe { _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, _mm512_set1_ps(x)) != 0 }
        }
        #[inline(always)]
        fn keep(self, m: __mmask16, v: __m512) -> __m512 {
            // SAFETY: `self` proves the features.
            unsafe { _mm512_maskz_mov_ps(m, v) }
        }
        #[inline(always)]
        unsafe fn load_part(self, p: *const f32, m: __mmask16) -> __m512 {
            // SAFETY: as `store_part`.
            unsafe { _mm512_maskz_loadu_ps(m, p) }
        }
    }

    impl Elements for Avx512 {
        const ACC_VECS: usize = 4;

        #[inline(always)]
        fn exp2_each<const H: usize>(self, x: [__m512; H]) -> [__m512; H] {
            // SAFETY: `self` proves the features.
            unsafe { avx512_cvt::exp2_each(x) }
        }
        #[inline(always)]
        fn soft_cap_each<const H: usize>(self, s: [__m512; H], c: f32) -> [__m512; H] {
            // SAFETY: `self` proves the features.
            unsafe { avx512_cvt::soft_cap_each(s, c) }
        }
        #[inline(always)]
        unsafe fn widen<E: Elem>(self, p: *const E) -> __m512 {
            // SAFETY: the features (`self`); 16 readable elements (the caller).
            unsafe { avx512_cvt::load(p, 0xffff) }
        }
        #[inline(always)]
        unsafe fn widen_part<E: Elem>(self, p: *const E, n: usize) -> __m512 {
            // SAFETY: the features (`self`); the first n elements, the ones unmasked, are
            // readable (the caller).
            unsafe { avx512_cvt::load(p, self.first(n)) }
        }
        #[inline(always)]
        unsafe fn widen_pair<E: Elem>(self, p: *const E, stride: usize) -> [__m512; 2] {
            // SAFETY: the features (`self`); both runs readable (the caller).
            unsafe { avx512_cvt::load_pair(p, stride) }
        }
        #[inline(always)]
        fn misreads<E: Elem>(self, t: &[E]) -> bool {
            if E::DTYPE != DType::E4M3 {
                return false;
            }
            // SAFETY: an e4m3 element is its one-byte code (`E4M3` is a transparent `u8`),
            // so the tile's elements are `len` readable bytes; `self` proves the features.
            unsafe { avx512_cvt::e4m3_nan_in(std::slice::from_raw_parts(t.as_ptr().cast::<u8>(), t.len())) }
        }
        #[inline(always)]
        fn scales<E: Elem>(self, ts: &TileScale, c0: usize, n: usize) -> Option<__m512> {
            // SAFETY: `self` proves the features.
            unsafe { avx512_cvt::scale_vector::<E>(ts, c0, self.first(n)) }
        }
    }
}

#[cfg(target_arch = "aarch64")]
pub(crate) use arm::Neon;

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    use crate::attention::lanes::{sealed, Elements, Lanes};
    use crate::attention::neon_cvt::{exp2, load_n, soft_cap, store_n};
    use crate::attention::work::load_factor;
    use crate::kv::quant::TileScale;
    use crate::kv::Elem;

    /// Advanced SIMD: 4 lanes. No masked loads: a partial vector is read and written lane
    /// by lane (`neon_cvt::load_n`).
    #[derive(Clone, Copy)]
    pub(crate) struct Neon(());

    /// A lane set: the first `n` lanes, as a count and as a bit mask.
    #[derive(Clone, Copy)]
    pub(crate) struct First {
        n: usize,
        bits: uint32x4_t,
    }

    impl sealed::Sealed for Neon {}

    /// `a * b + c` in `vfmaq_f32`'s argument order.
    #[inline(always)]
    unsafe fn fma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        // SAFETY: the caller (a `Neon` method) has the features.
        unsafe { vfmaq_f32(c, a, b) }
    }

    impl Lanes for Neon {
        type V = float32x4_t;
        type M = First;
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
            fn lane0(v: float32x4_t) -> f32 = vgetq_lane_f32::<0>;
            fn exp2(v: float32x4_t) -> float32x4_t = exp2;
            unsafe fn load(p: *const f32) -> float32x4_t = vld1q_f32;
            unsafe fn store(p: *mut f32, v: float32x4_t) -> () = vst1q_f32;
        }
        #[inline(always)]
        fn first(self, n: usize) -> First {
            let idx: [u32; 4] = [0, 1, 2, 3];
            // SAFETY: `self` proves the features; idx holds 4 u32.
            let bits = unsafe { vcltq_u32(vld1q_u32(idx.as_ptr()), vdupq_n_u32(n.min(4) as u32)) };
            First { n: n.min(4), bits }
        }
        #[inline(always)]
        fn select(self, m: First, a: float32x4_t, b: float32x4_t) -> float32x4_t {
            // SAFETY: `self` proves the features.
            unsafe { vbslq_f32(m.bits, a, b) }
        }
        #[inline(always)]
        fn keep(self, m: First, v: float32x4_t) -> float32x4_t {
            // SAFETY: `self` proves the features.
            unsafe { vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), m.bits)) }
        }
        #[inline(always)]
        fn any_above(self, v: float32x4_t, x: f32) -> bool {
            // SAFETY: `self` proves the features.
            unsafe { vmaxvq_u32(vcgtq_f32(v, vdupq_n_f32(x))) != 0 }
        }
        #[inline(always)]
        unsafe fn load_part(self, p: *const f32, m: First) -> float32x4_t {
            // SAFETY: lanes < m.n of `p` are readable (the caller); the features (`self`).
            unsafe { load_n(p, m.n) }
        }
        #[inline(always)]
        unsafe fn store_part(self, p: *mut f32, m: First, v: float32x4_t) {
            // SAFETY: lanes < m.n of `p` are writable (the caller); the features (`self`).
            unsafe { store_n(p, v, m.n) }
        }
    }

    impl Elements for Neon {
        const ACC_VECS: usize = 4;

        #[inline(always)]
        unsafe fn widen<E: Elem>(self, p: *const E) -> float32x4_t {
            // SAFETY: 4 readable elements (the caller); the features (`self`).
            unsafe { load_n(p, 4) }
        }
        #[inline(always)]
        unsafe fn widen_part<E: Elem>(self, p: *const E, n: usize) -> float32x4_t {
            // SAFETY: n readable elements (the caller); the features (`self`).
            unsafe { load_n(p, n) }
        }
        #[inline(always)]
        fn exp2_each<const H: usize>(self, mut x: [float32x4_t; H]) -> [float32x4_t; H] {
            for v in x.iter_mut() {
                *v = self.exp2(*v);
            }
            x
        }
        #[inline(always)]
        fn soft_cap_each<const H: usize>(self, mut s: [float32x4_t; H], c: f32) -> [float32x4_t; H] {
            for v in s.iter_mut() {
                // SAFETY: `self` proves the features.
                *v = unsafe { soft_cap(*v, c) };
            }
            s
        }
        #[inline(always)]
        fn scales<E: Elem>(self, ts: &TileScale, c0: usize, n: usize) -> Option<float32x4_t> {
            let f = load_factor(E::DTYPE);
            match ts {
                TileScale::One => None,
                TileScale::Head(s) => Some(self.splat(s * f)),
                TileScale::Token(s) => {
                    let s = &s[c0..c0 + n.min(4)];
                    // SAFETY: `s` holds the lanes read (checked slice); the features.
                    Some(self.mul(unsafe { load_n(s.as_ptr(), s.len()) }, self.splat(f)))
                }
            }
        }
    }
}
