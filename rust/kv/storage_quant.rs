//! The 8-bit side of [`KvCache`]: quantizing writes (int8 per token, fp8 with per-head
//! scales set or calibrated), setting the fp8 scales, and dequantized copies. The layout
//! is [`super::quant`]'s.

use super::elem::{Elem, ScaleKind};
use super::quant::{calibrate, quantize_fp8, quantize_row_i8};
use super::storage::KvCache;
use crate::error::Result;
use crate::invalid;

impl KvCache {
    /// int8: each token's K (and V) row of each head gets its own scale.
    pub(super) fn write_i8(&mut self, layer: usize, k: &[f32], v: &[f32], slots: &[i64]) {
        let s = self.shape();
        let (bs, d, hk) = (s.block_size, s.head_dim, s.num_kv_heads);
        let row = hk * d;
        let (all, scales) = self.layer_mut::<i8>(layer);
        let mut tmp = vec![0i8; d];
        for (n, &slot) in slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            let (b, t) = (slot as usize / bs, slot as usize % bs);
            let (kb, vb) = all[b * s.block_stride()..][..s.block_stride()].split_at_mut(s.block());
            let sb = &mut scales[b * 2 * hk * bs..][..2 * hk * bs];
            for h in 0..hk {
                let (kt, vt) = (&mut kb[h * s.tile()..][..s.tile()], &mut vb[h * s.tile()..][..s.tile()]);
                let src = n * row + h * d;
                sb[h * bs + t] = quantize_row_i8(&k[src..src + d], &mut tmp);
                for (i, &c) in tmp.iter().enumerate() {
                    kt[i * bs + t] = c;
                }
                sb[(hk + h) * bs + t] = quantize_row_i8(&v[src..src + d], &mut vt[t * d..][..d]);
            }
        }
    }

    /// fp8: calibrate the heads whose scale is still 0 from this write, then store codes.
    pub(super) fn write_fp8<E: Elem>(&mut self, layer: usize, k: &[f32], v: &[f32], slots: &[i64]) {
        let s = self.shape();
        let (bs, d, hk) = (s.block_size, s.head_dim, s.num_kv_heads);
        let row = hk * d;
        let dtype = self.dtype();
        let (all, scales) = self.layer_mut::<E>(layer);
        for (which, x) in [k, v].into_iter().enumerate() {
            for h in 0..hk {
                let sc = &mut scales[which * hk + h];
                if *sc == 0.0 {
                    let rows = slots.iter().enumerate().filter(|(_, &sl)| sl >= 0);
                    let amax = rows.flat_map(|(n, _)| &x[n * row + h * d..][..d]).fold(0f32, |a, &x| a.max(x.abs()));
                    *sc = calibrate(amax, dtype);
                }
            }
        }
        let mut tmp = vec![E::from_f32(0.0); d];
        for (n, &slot) in slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            let (b, t) = (slot as usize / bs, slot as usize % bs);
            let (kb, vb) = all[b * s.block_stride()..][..s.block_stride()].split_at_mut(s.block());
            for h in 0..hk {
                let (kt, vt) = (&mut kb[h * s.tile()..][..s.tile()], &mut vb[h * s.tile()..][..s.tile()]);
                let src = n * row + h * d;
                quantize_fp8(&k[src..src + d], scales[h], &mut tmp);
                for (i, &c) in tmp.iter().enumerate() {
                    kt[i * bs + t] = c;
                }
                quantize_fp8(&v[src..src + d], scales[hk + h], &mut vt[t * d..][..d]);
            }
        }
    }

    /// Set `layer`'s fp8 scales (`num_kv_heads` each for K and V). Codes already stored
    /// are not touched: they are reinterpreted with the new scales. A scale of 0 is
    /// calibrated by the next write with a non-zero value of its head.
    ///
    /// Errors (nothing set): not an fp8 cache, a bad layer, a wrong length, a negative or
    /// non-finite scale.
    pub fn set_fp8_scales(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        if self.dtype().scale_kind() != ScaleKind::PerHead {
            return Err(invalid!("set_fp8_scales needs an fp8 cache, this one stores {}", self.dtype().name()));
        }
        self.check_layer(layer)?;
        let hk = self.shape().num_kv_heads;
        for (name, x) in [("k_scales", k), ("v_scales", v)] {
            if x.len() != hk {
                return Err(invalid!("{name} must hold {hk} scales (one per KV head), got {}", x.len()));
            }
            if let Some(i) = x.iter().position(|s| !(s.is_finite() && *s >= 0.0)) {
                return Err(invalid!("{name}[{i}] = {} must be finite and >= 0", x[i]));
            }
        }
        let (_, scales) = self.layer_mut::<super::elem::E4M3>(layer);
        scales[..hk].copy_from_slice(k);
        scales[hk..].copy_from_slice(v);
        Ok(())
    }

    /// `layer`'s K and V as f32 (codes times scales, or the elements widened) in the
    /// logical order `[num_blocks, block_size, num_kv_heads, head_dim]`.
    pub fn dequantize(&self, layer: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let s = self.shape();
        let (bs, d, hk) = (s.block_size, s.head_dim, s.num_kv_heads);
        let scales = self.scales(layer)?;
        let n = s.num_blocks * bs * hk * d;
        let (mut ko, mut vo) = (vec![0f32; n], vec![0f32; n]);
        crate::with_elem!(self.dtype(), E => {
            let (kc, vc) = self.layer::<E>(layer)?;
            for b in 0..s.num_blocks {
                for h in 0..hk {
                    let at = b * s.block_stride() + h * s.tile();
                    let (kt, vt) = (&kc[at..at + s.tile()], &vc[at..at + s.tile()]);
                    let (ks, vs) = scales.tile(b, h);
                    for t in 0..bs {
                        let o = ((b * bs + t) * hk + h) * d;
                        for i in 0..d {
                            ko[o + i] = kt[i * bs + t].to_f32() * ks.at(t);
                            vo[o + i] = vt[t * d + i].to_f32() * vs.at(t);
                        }
                    }
                }
            }
        });
        Ok((ko, vo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{DType, KvShape};

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs())
    }

    fn shape() -> KvShape {
        KvShape { num_layers: 2, num_blocks: 4, block_size: 3, num_kv_heads: 2, head_dim: 5 }
    }

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + seed).sin() * 3.0).collect()
    }

    #[test]
    fn int8_writes_codes_and_per_token_scales_that_copy_with_their_block() {
        let mut c = KvCache::new(shape(), DType::I8).unwrap();
        let (k, v) = (data(4 * 10, 0.1), data(4 * 10, 1.3));
        c.write(1, &k, &v, &[0, 4, -1, 11]).unwrap();
        let (dk, dv) = c.dequantize(1).unwrap();
        for (n, slot) in [(0usize, 0usize), (1, 4), (3, 11)] {
            for h in 0..2 {
                let src = &k[n * 10 + h * 5..][..5];
                let amax = src.iter().fold(0f32, |a, x| a.max(x.abs()));
                for i in 0..5 {
                    let got = dk[(slot * 2 + h) * 5 + i];
                    assert!((got - src[i]).abs() <= amax / 127.0 * 0.5 * 1.0001, "{got} vs {}", src[i]);
                    assert!((dv[(slot * 2 + h) * 5 + i] - v[n * 10 + h * 5 + i]).abs() <= 3.0 / 127.0);
                }
            }
        }
        // The padding slot's row and every other layer stay zero.
        assert!(c.dequantize(0).unwrap().0.iter().all(|&x| x == 0.0));
        c.copy_blocks(&[(3, 2)]).unwrap(); // block 3 holds slot 11
        let (ck, cv) = c.dequantize(1).unwrap();
        assert_eq!(ck[2 * 30..3 * 30], dk[3 * 30..4 * 30]);
        assert_eq!(cv[2 * 30..3 * 30], dv[3 * 30..4 * 30]);
    }

    #[test]
    fn fp8_calibrates_once_per_head_and_saturates_later() {
        for dt in [DType::E4M3, DType::E5M2] {
            let mut c = KvCache::new(shape(), dt).unwrap();
            let mut k = vec![0f32; 10];
            k[..5].copy_from_slice(&[1.0, -2.0, 0.5, 0.0, 0.25]); // head 1 of K: all zero
            let v = vec![1.0f32; 10];
            c.write(0, &k, &v, &[0]).unwrap();
            let sc = c.scales(0).unwrap().data.to_vec();
            assert_eq!(sc, vec![2.0 / dt.code_max(), 0.0, 1.0 / dt.code_max(), 1.0 / dt.code_max()]);
            // A later, larger K saturates at the calibrated maximum; head 1 calibrates now.
            let k2: Vec<f32> = (0..10).map(|_| 8.0).collect();
            c.write(0, &k2, &v, &[1]).unwrap();
            let (dk, _) = c.dequantize(0).unwrap();
            assert!(close(&[dk[10], dk[15]], &[2.0, 8.0]), "{dt:?}: {} {}", dk[10], dk[15]);
            assert!(close(&dk[..5], &[1.0, -2.0, 0.5, 0.0, 0.25]), "{:?}", &dk[..5]);
            assert!(c.set_fp8_scales(0, &[1.0], &[1.0, 1.0]).is_err());
            assert!(c.set_fp8_scales(0, &[1.0, f32::NAN], &[1.0, 1.0]).is_err());
            assert!(c.set_fp8_scales(0, &[1.0, -1.0], &[1.0, 1.0]).is_err());
            assert!(c.set_fp8_scales(2, &[1.0, 1.0], &[1.0, 1.0]).is_err());
            let want = [sc[0], 8.0 / dt.code_max(), sc[2], sc[3]];
            assert_eq!(c.scales(0).unwrap().data, &want);
            c.set_fp8_scales(1, &[1.0, 2.0], &[3.0, 4.0]).unwrap();
            assert_eq!(c.scales(1).unwrap().data, &[1.0, 2.0, 3.0, 4.0]);
        }
        let mut c = KvCache::new(shape(), DType::I8).unwrap();
        assert!(c.set_fp8_scales(0, &[1.0, 1.0], &[1.0, 1.0]).is_err());
        assert!(c.write(0, &[f32::INFINITY; 10], &[0.0; 10], &[0]).is_err());
        assert!(c.dequantize(0).unwrap().0.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn nbytes_counts_codes_padding_and_scales() {
        let s = shape();
        let per_layer_tokens = s.num_blocks * s.block_size;
        let bpt = |dt| super::super::quant::bytes_per_token(2, 5, dt).unwrap();
        assert_eq!(KvCache::new(s, DType::BF16).unwrap().nbytes(), 2 * per_layer_tokens * bpt(DType::BF16));
        // int8: 240 code bytes -> 256, then 48 scales.
        assert_eq!(KvCache::new(s, DType::I8).unwrap().nbytes(), 2 * (256 + 4 * 48));
        assert_eq!(per_layer_tokens * bpt(DType::I8), 240 + 4 * 48);
        assert_eq!(KvCache::new(s, DType::E4M3).unwrap().nbytes(), 2 * (256 + 16));
    }
}
