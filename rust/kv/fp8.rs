//! The two OCP fp8 formats a cache can store, as one-byte codes with exact conversions by
//! bit manipulation (no table, no libm):
//!
//! - [`E4M3`] (`float8_e4m3fn`): sign, 4 exponent bits (bias 7), 3 mantissa bits; largest
//!   finite 448, smallest normal 2^-6, subnormal step 2^-9; no infinities, codes `0x7f` and
//!   `0xff` are NaN.
//! - [`E5M2`] (`float8_e5m2`): sign, 5 exponent bits (bias 15), 2 mantissa bits, the top
//!   byte of an IEEE binary16; largest finite 57344, smallest normal 2^-14, subnormal step
//!   2^-16; `0x7c` is +inf, `0x7d..=0x7f` NaN.
//!
//! f32 -> fp8 rounds to nearest, ties to even, and **saturates**: every finite or infinite
//! value beyond the largest finite one becomes it (with its sign); NaN stays NaN. fp8 -> f32
//! is exact. Both are checked against all 256 codes in the tests here and, in Python,
//! against `ml_dtypes` (`tests/test_kv_quant.py`).

/// An `float8_e4m3fn` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct E4M3(pub u8);

/// An `float8_e5m2` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct E5M2(pub u8);

/// The format's largest finite value (the calibration target of a scale).
pub const E4M3_MAX: f32 = 448.0;
/// See [`E4M3_MAX`].
pub const E5M2_MAX: f32 = 57344.0;

/// Round `|x|` (finite, `<= max`) to a code of `m` mantissa bits and exponent bias `bias`,
/// nearest even; codes below the smallest normal are subnormal multiples of its step.
#[inline(always)]
fn encode_abs(a: f32, m: u32, bias: i32) -> u8 {
    let min_normal = f32::from_bits(((1 - bias + 127) as u32) << 23);
    if a < min_normal {
        // Subnormal codes are the integers `a / step`, step = 2^(1 - bias - m); the scaling
        // is exact and the integer `2^m` is the smallest normal's code.
        let step_inv = f32::from_bits(((bias - 1 + m as i32 + 127) as u32) << 23);
        return (a * step_inv).round_ties_even() as u8;
    }
    // Round the f32 mantissa to m bits, nearest even (a carry moves into the exponent).
    let drop = 23 - m;
    let b = a.to_bits();
    let r = b + ((1 << (drop - 1)) - 1) + ((b >> drop) & 1);
    let e = (r >> 23) as i32 - 127 + bias;
    ((e as u32) << m | (r >> drop) & ((1 << m) - 1)) as u8
}

impl E4M3 {
    /// Saturating, round to nearest even.
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        let sign = ((x.to_bits() >> 24) & 0x80) as u8;
        let a = x.abs();
        if a.is_nan() {
            return Self(sign | 0x7f);
        }
        // 448 is the largest code (0x7e); anything above it saturates.
        let code = if a >= E4M3_MAX { 0x7e } else { encode_abs(a, 3, 7) };
        Self(sign | code)
    }

    /// Exact.
    #[inline]
    pub fn to_f32(self) -> f32 {
        let (s, e, m) = (self.0 >> 7, (self.0 >> 3) & 0xf, self.0 & 7);
        let mag = if e == 0xf && m == 7 {
            f32::NAN
        } else if e == 0 {
            m as f32 * f32::from_bits((127 - 9) << 23)
        } else {
            f32::from_bits(((e as u32 + 120) << 23) | (m as u32) << 20)
        };
        if s == 1 {
            -mag
        } else {
            mag
        }
    }
}

impl E5M2 {
    /// Saturating (infinities too), round to nearest even.
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        let sign = ((x.to_bits() >> 24) & 0x80) as u8;
        let a = x.abs();
        if a.is_nan() {
            return Self(sign | 0x7e);
        }
        let code = if a >= E5M2_MAX { 0x7b } else { encode_abs(a, 2, 15) };
        Self(sign | code)
    }

    /// Exact: the code is the high byte of a binary16.
    #[inline]
    pub fn to_f32(self) -> f32 {
        half::f16::from_bits((self.0 as u16) << 8).to_f32()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of a code from its fields, written independently of the conversions.
    fn value(code: u8, ebits: u32, mbits: u32) -> f64 {
        let bias = (1i32 << (ebits - 1)) - 1;
        let s = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((code as u32 >> mbits) & ((1 << ebits) - 1)) as i32;
        let m = (code as u32 & ((1 << mbits) - 1)) as f64;
        let frac = m / (1u32 << mbits) as f64;
        s * if e == 0 { frac * 2f64.powi(1 - bias) } else { (1.0 + frac) * 2f64.powi(e - bias) }
    }

    #[test]
    fn e4m3_decodes_every_code_and_round_trips() {
        for c in 0..=255u8 {
            let x = E4M3(c).to_f32();
            if c & 0x7f == 0x7f {
                assert!(x.is_nan(), "{c:#x}");
                assert_eq!(E4M3::from_f32(x).0 & 0x7f, 0x7f);
                continue;
            }
            assert_eq!(x as f64, value(c, 4, 3), "{c:#x}");
            // -0 encodes as 0x80 (the sign survives).
            assert_eq!(E4M3::from_f32(x).0, c, "{c:#x} -> {x}");
        }
        assert_eq!(E4M3(0x7e).to_f32(), 448.0);
        assert_eq!(E4M3(0x01).to_f32(), 2f32.powi(-9));
    }

    #[test]
    fn e5m2_decodes_every_code_and_round_trips() {
        for c in 0..=255u8 {
            let x = E5M2(c).to_f32();
            match c & 0x7f {
                0x7c => assert_eq!(x, if c & 0x80 != 0 { f32::NEG_INFINITY } else { f32::INFINITY }),
                0x7d..=0x7f => assert!(x.is_nan()),
                _ => {
                    assert_eq!(x as f64, value(c, 5, 2), "{c:#x}");
                    assert_eq!(E5M2::from_f32(x).0, c, "{c:#x}");
                }
            }
        }
        assert_eq!(E5M2(0x7b).to_f32(), 57344.0);
    }

    /// Every midpoint between neighbouring codes rounds to the even one, and values just
    /// off the midpoint round to the nearer: the conversion is nearest-even everywhere.
    fn check_rounding(enc: impl Fn(f32) -> u8, dec: impl Fn(u8) -> f32, max_code: u8) {
        for c in 0..max_code {
            let (lo, hi) = (dec(c), dec(c + 1));
            let mid = (lo as f64 + hi as f64) / 2.0;
            let mid32 = mid as f32;
            assert_eq!(mid32 as f64, mid, "midpoint exact in f32");
            let even = if c % 2 == 0 { c } else { c + 1 };
            assert_eq!(enc(mid32), even, "tie between {c:#x} and {:#x}", c + 1);
            assert_eq!(enc(-mid32), 0x80 | even);
            assert_eq!(enc(f32::from_bits(mid32.to_bits() - 1)), c);
            assert_eq!(enc(f32::from_bits(mid32.to_bits() + 1)), c + 1);
        }
    }

    #[test]
    fn rounding_is_nearest_even_and_saturating() {
        check_rounding(|x| E4M3::from_f32(x).0, |c| E4M3(c).to_f32(), 0x7e);
        check_rounding(|x| E5M2::from_f32(x).0, |c| E5M2(c).to_f32(), 0x7b);
        for big in [449.0, 480.0, 1e30, f32::INFINITY] {
            assert_eq!(E4M3::from_f32(big).0, 0x7e);
            assert_eq!(E4M3::from_f32(-big).0, 0xfe);
        }
        for big in [57345.0, 61440.0, 1e30, f32::INFINITY] {
            assert_eq!(E5M2::from_f32(big).0, 0x7b);
            assert_eq!(E5M2::from_f32(-big).0, 0xfb);
        }
        // Below half the smallest subnormal: zero; f32 subnormals too.
        assert_eq!(E4M3::from_f32(2f32.powi(-11)).0, 0);
        assert_eq!(E4M3::from_f32(1e-40).0, 0);
        assert_eq!(E5M2::from_f32(-1e-40).0, 0x80);
    }
}
