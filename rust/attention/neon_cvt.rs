//! NEON element loads and vector helpers of the shared tile loops ([`super::lanes`]'s
//! `Neon`): any storage dtype as f32 ([`load_n`]: f32 directly, bf16 exactly by a 16-bit
//! shift, binary16 by `fcvtl` ([`f16_to_f32`]), the one-byte codes of the 8-bit caches by
//! [`load_codes`]), the `exp2` polynomial and the soft cap. The conversions are checked here
//! on every bit pattern (under qemu, `tests/aarch64.sh`).
//!
//! NEON has no masked loads: a partial vector (a chunk's last tokens, a `head_dim` tail)
//! is read lane by lane into a zeroed register (a staging copy calls memcpy, and a call in
//! the loops makes LLVM spill the accumulators around it).
//!
//! The 8-bit codes are dequantized in registers as on the x86 paths: int8 by `sxtl` twice
//! and `scvtf`; fp8 e5m2 is the high byte of an f16 (`uxtl`, a 16-bit shift, `fcvtl`);
//! fp8 e4m3 is moved into f16 bit positions (sign << 8, the other seven bits << 7: exact,
//! the value divided by 2^8; the NaN codes OR'd to an f16 NaN) and widened by `fcvtl`.
//! The scales never touch the codes (the kernel multiplies the scores by the K scales
//! and the probabilities by the V scales, times [`super::work::load_factor`]).

use std::arch::aarch64::*;
use std::arch::asm;

use super::work::{EXP2_ZERO_BELOW, SOFT_CAP_ARG};
use crate::kv::{DType, Elem};

/// IEEE binary16 -> binary32 of 4 lanes with `fcvtl`, exact (a conversion ignores
/// FPCR.FZ16, so subnormals survive). Through `asm!` because the intrinsic
/// `vcvt_f32_f16` is stable only since Rust 1.94, after this crate's MSRV.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn f16_to_f32(h: uint16x4_t) -> float32x4_t {
    let r: float32x4_t;
    // SAFETY: fcvtl reads and writes vector registers only (no memory, flags or stack).
    unsafe {
        asm!("fcvtl {0:v}.4s, {1:v}.4h", lateout(vreg) r, in(vreg) h, options(pure, nomem, nostack, preserves_flags))
    };
    r
}

/// The first `n` (0..=4) of 4 one-byte codes at `p` as f32 (the other lanes 0): int8 and
/// e5m2 exactly, e4m3 divided by 2^8, NaN codes as NaN. Four codes are one 32-bit load;
/// fewer are read byte by byte (unrolled: no call in the kernel's loops).
///
/// # Safety
/// `p .. p + n` must lie inside one live allocation of `E`, a one-byte 8-bit code.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) unsafe fn load_codes<E: Elem>(p: *const E, n: usize) -> float32x4_t {
    debug_assert!(std::mem::size_of::<E>() == 1 && E::DTYPE.is_quantized());
    let b = p.cast::<u8>();
    // SAFETY: forwarded to the caller: byte k is read only when k < n.
    let bits = unsafe {
        if n >= 4 {
            std::ptr::read_unaligned(b.cast::<u32>())
        } else {
            let mut x = 0u32;
            if n > 0 {
                x |= *b as u32;
            }
            if n > 1 {
                x |= (*b.add(1) as u32) << 8;
            }
            if n > 2 {
                x |= (*b.add(2) as u32) << 16;
            }
            x
        }
    };
    widen_codes::<E>(vreinterpret_u8_u32(vdup_n_u32(bits)))
}

/// Codes in lanes 0..4 of `x` as f32 (see [`load_codes`]).
#[inline]
#[target_feature(enable = "neon")]
fn widen_codes<E: Elem>(x: uint8x8_t) -> float32x4_t {
    match E::DTYPE {
        DType::I8 => vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(x))))),
        DType::E5M2 => f16_to_f32(vshl_n_u16::<8>(vget_low_u16(vmovl_u8(x)))),
        _ => {
            // e4m3: sign to bit 15, exponent and mantissa to bits 7..14 of an f16 (whose
            // bias is 8 more); the NaN codes (0x7f, 0xff) become 0xffff, an f16 NaN.
            let w = vget_low_u16(vmovl_u8(x));
            let mag = vand_u16(w, vdup_n_u16(0x7f));
            let sign = vshl_n_u16::<8>(vand_u16(w, vdup_n_u16(0x80)));
            let h = vorr_u16(sign, vshl_n_u16::<7>(mag));
            f16_to_f32(vorr_u16(h, vceq_u16(mag, vdup_n_u16(0x7f))))
        }
    }
}

/// Load the first `n` (0..=4) of 4 elements as f32, the rest 0. The partial case uses
/// lane loads, not a staging copy: a call (memcpy, `half`'s conversion) anywhere in the
/// loops would make the register allocator spill the accumulators around it.
///
/// # Safety
/// `p .. p + n` must lie inside one live allocation of `E`.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) unsafe fn load_n<E: Elem>(p: *const E, n: usize) -> float32x4_t {
    // SAFETY: forwarded to the caller: lane k is loaded only when k < n; f16/bf16 are
    // 16-bit plain data.
    unsafe {
        if E::DTYPE.is_quantized() {
            return load_codes(p, n);
        }
        if n >= 4 {
            return match E::DTYPE {
                DType::F32 => vld1q_f32(p.cast()),
                _ => widen16::<E>(vld1_u16(p.cast())),
            };
        }
        // Lanes 0..n (n < 4) of `$x` loaded from `$p`.
        macro_rules! first_lanes {
            ($load:ident, $p:expr, $x:expr) => {{
                let (p, mut x) = ($p, $x);
                // Unrolled: a loop over the lanes costs the f32 kernel twice the spills.
                if n > 0 {
                    x = $load::<0>(p, x);
                }
                if n > 1 {
                    x = $load::<1>(p.add(1), x);
                }
                if n > 2 {
                    x = $load::<2>(p.add(2), x);
                }
                x
            }};
        }
        if E::DTYPE == DType::F32 {
            first_lanes!(vld1q_lane_f32, p.cast::<f32>(), vdupq_n_f32(0.0))
        } else {
            widen16::<E>(first_lanes!(vld1_lane_u16, p.cast::<u16>(), vdup_n_u16(0)))
        }
    }
}

/// f16 or bf16 bits to f32, exactly.
#[inline]
#[target_feature(enable = "neon")]
fn widen16<E: Elem>(x: uint16x4_t) -> float32x4_t {
    match E::DTYPE {
        DType::F16 => f16_to_f32(x),
        _ => vreinterpretq_f32_u32(vshll_n_u16::<16>(x)),
    }
}

/// Store the first `n` (0..=4) lanes of `x`.
///
/// # Safety
/// `p .. p + n` must lie inside one live allocation of f32.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) unsafe fn store_n(p: *mut f32, x: float32x4_t, n: usize) {
    // SAFETY: forwarded to the caller: lane k is stored only when k < n.
    unsafe {
        if n >= 4 {
            vst1q_f32(p, x);
            return;
        }
        if n > 0 {
            vst1q_lane_f32::<0>(p, x);
        }
        if n > 1 {
            vst1q_lane_f32::<1>(p.add(1), x);
        }
        if n > 2 {
            vst1q_lane_f32::<2>(p.add(2), x);
        }
    }
}

/// `2^x` for `x <= LAZY_MAX`; exactly 0 below [`EXP2_ZERO_BELOW`].
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn exp2(x: float32x4_t) -> float32x4_t {
    let zero = vcltq_f32(x, vdupq_n_f32(EXP2_ZERO_BELOW));
    let x = vmaxq_f32(x, vdupq_n_f32(EXP2_ZERO_BELOW));
    let n = vrndnq_f32(x);
    let f = vsubq_f32(x, n);
    let c = super::work::EXP2_TAYLOR;
    let mut r = vdupq_n_f32(c[7]);
    for &ci in c[..7].iter().rev() {
        r = vfmaq_f32(vdupq_n_f32(ci), r, f);
    }
    // 2^n with n in -64..=8 built in the exponent field: always a normal float.
    let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
    let r = vmulq_f32(r, vreinterpretq_f32_s32(e));
    vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(r), zero))
}

/// [`super::work::soft_cap`] of `s`, as the x86 paths': the `exp2` argument clamped to
/// +-[`SOFT_CAP_ARG`], a NaN score kept.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn soft_cap(s: float32x4_t, c: f32) -> float32x4_t {
    let lim = SOFT_CAP_ARG;
    let x = vminq_f32(vmaxq_f32(vmulq_n_f32(s, 2.0 * std::f32::consts::LOG2_E / c), vdupq_n_f32(-lim)), vdupq_n_f32(lim));
    let t = vsubq_f32(vdupq_n_f32(c), vdivq_f32(vdupq_n_f32(2.0 * c), vaddq_f32(exp2(x), vdupq_n_f32(1.0))));
    vbslq_f32(vceqq_f32(s, s), t, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::test_util::check_every_code;
    use crate::attention::work::load_factor;
    use crate::kv::elem::{E4M3, E5M2};

    /// Every binary16 bit pattern widens to the value `half` gives (NaN to a NaN of the
    /// same sign).
    #[test]
    fn f16_widening_is_exact_for_every_bit_pattern() {
        for b in (0u32..=0xffff).step_by(4) {
            let h: [u16; 4] = std::array::from_fn(|i| (b + i as u32) as u16);
            let mut got = [0f32; 4];
            // SAFETY: h and got hold exactly 4 elements.
            unsafe { vst1q_f32(got.as_mut_ptr(), f16_to_f32(vld1_u16(h.as_ptr()))) };
            for (&x, &y) in h.iter().zip(&got) {
                let want = half::f16::from_bits(x).to_f32();
                if want.is_nan() {
                    assert!(y.is_nan() && y.is_sign_negative() == want.is_sign_negative(), "{x:#06x}");
                } else {
                    assert_eq!(y.to_bits(), want.to_bits(), "{x:#06x}: {y} vs {want}");
                }
            }
        }
    }

    /// [`load_codes`] against `Elem::to_f32` on all 256 codes (NaN codes included), 4 at
    /// a time and 1..3 (the other lanes 0).
    fn all_codes<E: Elem>(code: impl Fn(u8) -> E) {
        check_every_code(code, 4, &[0, 1, 2, 3, 4], load_factor(E::DTYPE), |codes, at, n| {
            let mut got = [0f32; 4];
            // SAFETY: codes at..at + n lie inside `codes`; got holds 4 f32.
            unsafe { vst1q_f32(got.as_mut_ptr(), load_codes(codes.as_ptr().add(at), n)) };
            got.to_vec()
        });
    }

    #[test]
    fn register_dequantization_is_exact_on_every_code() {
        all_codes(|c| c as i8);
        all_codes(E4M3);
        all_codes(E5M2);
    }

    /// The vector `exp2` stays within 2 ulp-ish (2e-7 relative) of libm over its range and
    /// is exactly 0 below [`EXP2_ZERO_BELOW`].
    #[test]
    fn exp2_matches_libm() {
        use crate::attention::work::LAZY_MAX;
        for x in [-1e30, -200.0, -126.0, EXP2_ZERO_BELOW - 0.01, f32::NEG_INFINITY] {
            let mut got = [1f32; 4];
            // SAFETY: got holds 4 f32.
            unsafe { vst1q_f32(got.as_mut_ptr(), exp2(vdupq_n_f32(x))) };
            assert_eq!(got[0].to_bits(), 0, "{x}");
        }
        let mut x = EXP2_ZERO_BELOW;
        while x <= LAZY_MAX {
            let mut got = [0f32; 4];
            // SAFETY: got holds 4 f32.
            unsafe { vst1q_f32(got.as_mut_ptr(), exp2(vdupq_n_f32(x))) };
            let want = (x as f64).exp2();
            assert!(((got[0] as f64) - want).abs() <= 2e-7 * want, "{x}: {} vs {want}", got[0]);
            x += 0.037;
        }
    }
}
