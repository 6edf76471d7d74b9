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
//! against `ml_dtypes` (`tests/attention/test_kv_quant.py`).

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

/// `x` as a code of `m` mantissa bits and exponent bias `bias`: round to nearest even,
/// saturating to code `sat` (the largest finite, value `max`) from `max` up, infinities
/// included; NaN to `nan`; the sign kept (bit 7).
///
/// Branch-free, so that a loop over it vectorises (the branchy form ran at about half
/// bf16's write rate): every case is computed on the bits and the result selected.
/// - normal: the f32 mantissa rounded to `m` bits, nearest even (a carry moves into the
///   exponent), re-biased;
/// - below the smallest normal: adding `2^(23 - bias + 1 - m)`, a number whose ulp is the
///   subnormal step, rounds `|x|` to a multiple of that step (nearest even, the default
///   rounding mode) and leaves the multiple in the low mantissa bits; the integer `2^m`
///   is the smallest normal's code, so rounding up into it is right too.
///
/// Identical to the branchy reference of the tests on every f32 (`fp8::tests`).
#[inline(always)]
fn encode(x: f32, m: u32, bias: u32, max: f32, sat: u32, nan: u32) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let b = bits & 0x7fff_ffff;
    let drop = 23 - m;
    let r = b.wrapping_add((1 << (drop - 1)) - 1).wrapping_add((b >> drop) & 1);
    let normal = (r >> drop).wrapping_sub((127 - bias) << m);
    let magic = f32::from_bits((127 + 23 + 1 - bias - m) << 23);
    let sub = (f32::from_bits(b) + magic).to_bits().wrapping_sub(magic.to_bits());
    let code = if b < (128 - bias) << 23 { sub } else { normal };
    let code = if b >= max.to_bits() { sat } else { code };
    let code = if b > 0x7f80_0000 { nan } else { code };
    (sign | code) as u8
}

impl E4M3 {
    /// Saturating, round to nearest even; branch-free.
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        // 448 is the largest code (0x7e); anything above it saturates; 0x7f is NaN.
        Self(encode(x, 3, 7, E4M3_MAX, 0x7e, 0x7f))
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
    /// Saturating (infinities too), round to nearest even; branch-free.
    #[inline]
    pub fn from_f32(x: f32) -> Self {
        Self(encode(x, 2, 15, E5M2_MAX, 0x7b, 0x7e))
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

    /// The first version's branchy conversion, kept as the reference of [`encode`].
    fn reference(x: f32, m: u32, bias: i32, max: f32, sat: u8, nan: u8) -> u8 {
        let sign = ((x.to_bits() >> 24) & 0x80) as u8;
        let a = x.abs();
        if a.is_nan() {
            return sign | nan;
        }
        if a >= max {
            return sign | sat;
        }
        let min_normal = f32::from_bits(((1 - bias + 127) as u32) << 23);
        if a < min_normal {
            let step_inv = f32::from_bits(((bias - 1 + m as i32 + 127) as u32) << 23);
            return sign | (a * step_inv).round_ties_even() as u8;
        }
        let drop = 23 - m;
        let b = a.to_bits();
        let r = b + ((1 << (drop - 1)) - 1) + ((b >> drop) & 1);
        let e = (r >> 23) as i32 - 127 + bias;
        sign | ((e as u32) << m | (r >> drop) & ((1 << m) - 1)) as u8
    }

    fn ref_e4m3(x: f32) -> u8 {
        reference(x, 3, 7, E4M3_MAX, 0x7e, 0x7f)
    }

    fn ref_e5m2(x: f32) -> u8 {
        reference(x, 2, 15, E5M2_MAX, 0x7b, 0x7e)
    }

    /// Both conversions against the reference on f32 bit patterns `bits`.
    fn same_as_reference(bits: impl Iterator<Item = u32>) {
        for b in bits {
            let x = f32::from_bits(b);
            assert_eq!(E4M3::from_f32(x).0, ref_e4m3(x), "e4m3 of {x:e} ({b:#010x})");
            assert_eq!(E5M2::from_f32(x).0, ref_e5m2(x), "e5m2 of {x:e} ({b:#010x})");
        }
    }

    /// Every boundary, both signs, with its 64 neighbours each side: each code's value and
    /// the midpoints to its neighbours (ties), the saturation points, the smallest normal
    /// and the subnormal steps of both formats, f32 subnormals, zero, inf, NaNs; plus a
    /// dense sample of all patterns (every 4093rd, a prime stride).
    #[test]
    fn branch_free_encoding_matches_the_reference_on_boundaries_and_a_dense_sample() {
        let mut edges: Vec<f32> = vec![0.0, f32::MIN_POSITIVE, 1e-45, f32::INFINITY, f32::NAN, f32::MAX];
        for c in 0..=255u8 {
            for x in [E4M3(c).to_f32(), E5M2(c).to_f32()] {
                edges.push(x);
            }
            if c < 0x7f {
                let mids = [
                    (E4M3(c).to_f32() as f64 + E4M3(c + 1).to_f32() as f64) / 2.0,
                    (E5M2(c).to_f32() as f64 + E5M2(c + 1).to_f32() as f64) / 2.0,
                ];
                edges.extend(mids.iter().map(|&m| m as f32));
            }
        }
        edges.extend([448.0, 464.0, 480.0, 57344.0, 61440.0, 65536.0, 2f32.powi(-6), 2f32.powi(-14)]);
        edges.extend([2f32.powi(-9), 2f32.powi(-10), 2f32.powi(-16), 2f32.powi(-17), 2f32.powi(-126)]);
        let around = edges.iter().filter(|x| !x.is_nan()).flat_map(|x| {
            let b = x.abs().to_bits();
            (b.saturating_sub(64)..=b.saturating_add(64)).flat_map(|b| [b, b | 0x8000_0000])
        });
        same_as_reference(around);
        same_as_reference([0x7f80_0001, 0x7fc0_0000, 0xffff_ffff, 0xff80_0001, 0x8000_0000].into_iter());
        same_as_reference((0..=u32::MAX).step_by(4093));
    }

    /// All 2^32 patterns (about a minute in release, far longer in debug): `cargo test
    /// --release --lib fp8_encoding_on_every_f32 -- --ignored`.
    #[test]
    #[ignore]
    fn fp8_encoding_on_every_f32() {
        same_as_reference(0..=u32::MAX);
    }

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
