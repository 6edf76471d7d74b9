//! KV storage owned by Rust: per layer K and V for `num_blocks` blocks of `block_size`
//! token slots x `num_kv_heads` heads x `head_dim` elements, in f32, f16, bf16 or 8-bit
//! codes (int8, fp8 e4m3/e5m2) with f32 scales, in one huge-page-advised allocation
//! ([`crate::kv::aligned`]).
//!
//! # Physical layout (what the kernel reads)
//!
//! Per layer, block-major: block `b`'s K (all heads) then its V (all heads), then block
//! `b + 1`, so a work item that reads every head of a block reads one contiguous run of
//! `2 * num_kv_heads * block_size * head_dim` elements (128 KiB in f32 for 8 heads of
//! 16 x 128), not two half-length streams: runs of 32, 64 and 128 KiB read at 61-63%,
//! 67-68% and 75% of the probe (`docs/experiments.md`, "Layout"). Inside a block, KV head-major;
//! inside a (block, head) tile:
//!
//! - K is **dimension-major**, `[head_dim][block_size]`: one load gives consecutive tokens
//!   of one dimension, so a SIMD lane holds a token and `q . k` is a chain of
//!   broadcast-FMAs with no per-token horizontal sum;
//! - V is **token-major**, `[block_size][head_dim]`: `acc += p_t * v_t` runs along `d`.
//!
//! `benches/bench_layout.py` measured the alternatives; see `docs/experiments.md`, "Layout".
//!
//! The 8-bit dtypes keep this layout for their one-byte codes; each layer's scales follow
//! its codes in the same region ([`super::quant`] documents where and in what order).
//! A layer's region is `ScaleLayout::layer_bytes` rounded up to 4 KiB.//!
//! # Logical view
//!
//! Both arrays are exposed with the logical shape `[num_blocks, block_size, num_kv_heads,
//! head_dim]` (element strides from [`KvCache::key_strides`] / [`KvCache::value_strides`]),
//! so `key[b, t, h, i]` is dimension `i` of head `h` of the token in slot
//! `b * block_size + t`, whatever the physical order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::aligned::AlignedBuf;
use super::elem::{DType, Elem, ScaleKind};
use super::quant::{ScaleLayout, Scales};
use crate::error::Result;
use crate::invalid;
use crate::pool::MAX_BLOCK_SIZE;

/// Shape of a cache; every index computation goes through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Elements of one (block, head) tile: `head_dim * block_size`.
    #[inline]
    pub fn tile(&self) -> usize {
        self.head_dim * self.block_size
    }

    /// Elements of one block (all heads).
    #[inline]
    pub fn block(&self) -> usize {
        self.num_kv_heads * self.tile()
    }

    /// Elements from one block's K (or V) to the next block's: K and V alternate.
    #[inline]
    pub fn block_stride(&self) -> usize {
        2 * self.block()
    }

    /// Elements of one layer's K (or V).
    #[inline]
    pub fn layer(&self) -> usize {
        self.num_blocks * self.block()
    }

    /// Elements a layer's K (or V) slice spans from its first element: every block
    /// but the last takes a block stride, the last one block.
    #[inline]
    pub fn layer_span(&self) -> usize {
        (2 * self.num_blocks - 1) * self.block()
    }
}

/// Where the bytes of block `b` of layer `l` sit in a cache's storage, as offsets affine
/// in `l` and `b`: its codes (K tiles of every KV head, then V's: one run) at
/// `l * region_bytes + b * codes_step`, and its int8 scales (K's then V's: one run, empty
/// for the other dtypes) at `l * region_bytes + scales_offset + b * scales_len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockGeometry {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub region_bytes: usize,
    pub codes_step: usize,
    pub codes_len: usize,
    pub scales_offset: usize,
    pub scales_len: usize,
}

impl BlockGeometry {
    /// The codes and scales runs of block `block` of `layer`.
    ///
    /// Errors (`InvalidArgument`): `layer` or `block` out of range.
    pub fn block_bytes(&self, layer: usize, block: usize) -> Result<[std::ops::Range<usize>; 2]> {
        if layer >= self.num_layers {
            return Err(invalid!("layer {layer} out of range 0..{}", self.num_layers));
        }
        if block >= self.num_blocks {
            return Err(invalid!("block {block} out of range 0..{}", self.num_blocks));
        }
        let base = layer * self.region_bytes;
        let codes = base + block * self.codes_step;
        let scales = if self.scales_len == 0 { 0..0 } else {
            let at = base + self.scales_offset + block * self.scales_len;
            at..at + self.scales_len
        };
        Ok([codes..codes + self.codes_len, scales])
    }

    /// Bytes of one block across all layers (codes and int8 scales).
    pub fn slot_bytes(&self) -> usize {
        self.num_layers * (self.codes_len + self.scales_len)
    }
}

/// Rounding of each K or V region, in bytes, so every region starts cache-line and page
/// aligned inside the 2 MiB-aligned buffer.
const REGION_ALIGN: usize = 4096;

/// The KV cache: `num_layers` regions (blocks of K then V, alternating) in one aligned
/// buffer.
#[derive(Debug)]
pub struct KvCache {
    shape: KvShape,
    dtype: DType,
    scales: ScaleLayout,
    region_bytes: usize,
    buf: AlignedBuf,
    /// Whether codes may have been written other than by [`Self::write`] and
    /// [`Self::copy_blocks`] ([`Self::note_raw_writes`]); shared with the regions the
    /// transfer engine copies through ([`Self::raw_flag`]).
    raw_writes: Arc<AtomicBool>,
}

impl KvCache {
    /// Allocate a zeroed cache.
    ///
    /// Errors: any size of zero, `block_size > 65536`, or a total beyond the address space.
    pub fn new(shape: KvShape, dtype: DType) -> Result<Self> {
        let KvShape { num_layers, num_blocks, block_size, num_kv_heads, head_dim } = shape;
        if num_layers == 0 || num_blocks == 0 || block_size == 0 || num_kv_heads == 0 || head_dim == 0 {
            return Err(invalid!("every KvCache dimension must be >= 1, got {shape:?}"));
        }
        if block_size > MAX_BLOCK_SIZE || head_dim > 1 << 16 || num_kv_heads > 1 << 16 {
            return Err(invalid!("block_size, head_dim and num_kv_heads must be <= 65536"));
        }
        let scales = ScaleLayout::new(num_blocks, block_size, num_kv_heads, head_dim, dtype);
        let region = scales.and_then(|l| l.layer_bytes().checked_next_multiple_of(REGION_ALIGN));
        let total = region.and_then(|r| r.checked_mul(num_layers));
        let (Some(scales), Some(region_bytes), Some(total)) = (scales, region, total) else {
            return Err(invalid!("KvCache of {shape:?} does not fit in memory"));
        };
        // Elements must stay addressable as i64 slots and by numpy's signed strides.
        if num_blocks.checked_mul(block_size).is_none_or(|s| s > i64::MAX as usize / 2) {
            return Err(invalid!("num_blocks * block_size is too large"));
        }
        let buf = AlignedBuf::zeroed(total)?;
        Ok(Self { shape, dtype, scales, region_bytes, buf, raw_writes: Arc::new(AtomicBool::new(false)) })
    }

    pub fn shape(&self) -> KvShape {
        self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of K plus V over all layers: codes, the padding before a layer's scales and
    /// the scales (`num_layers * ScaleLayout::layer_bytes`; without the padding of each
    /// layer's region to 4 KiB). Unquantized: exactly the elements' bytes.
    pub fn nbytes(&self) -> usize {
        self.shape.num_layers * self.scales.layer_bytes()
    }

    /// Where each layer's scales sit.
    pub fn scale_layout(&self) -> ScaleLayout {
        self.scales
    }

    /// The cache's storage: every layer's region (its K and V codes, scales and the
    /// padding of each to 4 KiB), `nbytes()` plus under 4 KiB per layer.
    pub fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[..self.shape.num_layers * self.region_bytes]
    }

    pub fn huge_pages(&self) -> bool {
        self.buf.huge_pages()
    }

    /// The storage's pointer and length in bytes ([`AlignedBuf::raw_parts`]): the transfer
    /// engine's device region.
    pub fn raw_parts(&self) -> (std::ptr::NonNull<u8>, usize) {
        self.buf.raw_parts()
    }

    /// Addresses of the whole allocation (every layer, padding included): fixed for the
    /// cache's life, so a caller can tell whether another buffer aliases it.
    pub fn address_range(&self) -> std::ops::Range<usize> {
        let start = self.buf.as_ptr() as usize;
        start..start + self.buf.len()
    }

    /// Element strides of the logical `[num_blocks, block_size, num_kv_heads, head_dim]`
    /// view of K (dimension-major tiles), from the first element of [`Self::layer`]'s K.
    pub fn key_strides(&self) -> [usize; 4] {
        let s = &self.shape;
        [s.block_stride(), 1, s.tile(), s.block_size]
    }

    /// Element strides of the logical view of V (token-major tiles).
    pub fn value_strides(&self) -> [usize; 4] {
        let s = &self.shape;
        [s.block_stride(), s.head_dim, s.tile(), 1]
    }

    pub(crate) fn check_layer(&self, layer: usize) -> Result<()> {
        if layer >= self.shape.num_layers {
            return Err(invalid!("layer {layer} out of range 0..{}", self.shape.num_layers));
        }
        Ok(())
    }

    /// Byte offset of the first element of `layer`'s K (`which = 0`) or V (`which = 1`).
    fn region(&self, layer: usize, which: usize) -> usize {
        layer * self.region_bytes + which * self.shape.block() * self.dtype.size()
    }

    /// Raw pointer to the first element of K (`value = false`) or V of `layer`, for
    /// building zero-copy views. Valid while `self` lives; the buffer never moves. A view
    /// that may write through it must be preceded by [`Self::note_raw_writes`].
    pub fn layer_ptr(&self, layer: usize, value: bool) -> Result<*const u8> {
        self.check_layer(layer)?;
        Ok(self.buf.as_slice()[self.region(layer, value as usize)..].as_ptr())
    }

    /// Record that the codes may be written other than by [`Self::write`] and
    /// [`Self::copy_blocks`] (a writable view on [`Self::layer_ptr`]), and so may hold
    /// codes those never make: e4m3's NaN codes (writes refuse non-finite input and
    /// saturate to +-448). The AVX-512 decode path checks an e4m3 cache's tiles for NaN
    /// codes only once this was called. Sticky for the cache's life.
    pub fn note_raw_writes(&self) {
        self.raw_writes.store(true, Ordering::Release);
    }

    /// Whether [`Self::note_raw_writes`] was ever called.
    pub fn raw_writes(&self) -> bool {
        self.raw_writes.load(Ordering::Acquire)
    }

    /// K and V of `layer` as typed slices of `shape.layer_span()` elements, to be indexed
    /// with [`KvShape::block_stride`] between blocks (each slice also covers the other's
    /// blocks, which sit in between).
    pub fn layer<E: Elem>(&self, layer: usize) -> Result<(&[E], &[E])> {
        self.check_layer(layer)?;
        if E::DTYPE != self.dtype {
            return Err(invalid!("cache holds {}, not {}", self.dtype.name(), E::DTYPE.name()));
        }
        let n = self.shape.layer_span();
        let bytes = self.buf.as_slice();
        let k = &bytes[self.region(layer, 0)..][..n * self.dtype.size()];
        let v = &bytes[self.region(layer, 1)..][..n * self.dtype.size()];
        Ok((cast(k), cast(v)))
    }

    /// `layer`'s scales as the kernels read them (empty data when unquantized).
    pub fn scales(&self, layer: usize) -> Result<Scales<'_>> {
        self.check_layer(layer)?;
        let at = self.region(layer, 0) + self.scales.offset;
        let data = cast::<f32>(&self.buf.as_slice()[at..][..4 * self.scales.count]);
        Ok(Scales { kind: self.scales.kind, data, num_kv_heads: self.shape.num_kv_heads, block_size: self.shape.block_size })
    }

    /// Where block `block` of `layer` sits in [`Self::bytes`]: its codes (K tiles of every
    /// KV head, then V's: one run) and its int8 scales (K's then V's: one run; empty for
    /// the other dtypes, whose few per-layer scales are not per block).
    pub fn block_bytes(&self, layer: usize, block: usize) -> Result<[std::ops::Range<usize>; 2]> {
        self.block_geometry().block_bytes(layer, block)
    }

    /// Where every block's bytes sit ([`BlockGeometry`]): the arithmetic of
    /// [`Self::block_bytes`], kept apart from the cache.
    pub fn block_geometry(&self) -> BlockGeometry {
        let (s, size) = (&self.shape, self.dtype.size());
        let per_token = self.scales.kind == ScaleKind::PerToken;
        BlockGeometry {
            num_layers: s.num_layers,
            num_blocks: s.num_blocks,
            region_bytes: self.region_bytes,
            codes_step: s.block_stride() * size,
            codes_len: 2 * s.block() * size,
            scales_offset: self.scales.offset,
            scales_len: if per_token { 2 * s.num_kv_heads * s.block_size * 4 } else { 0 },
        }
    }

    /// The flag behind [`Self::raw_writes`], for a region that copies into the cache on
    /// another thread and must note raw writes as the cache would.
    pub(crate) fn raw_flag(&self) -> Arc<AtomicBool> {
        self.raw_writes.clone()
    }

    /// Raw pointer to `layer`'s first scale (see [`super::quant`]), for zero-copy views.
    pub fn scales_ptr(&self, layer: usize) -> Result<*const u8> {
        self.check_layer(layer)?;
        Ok(self.buf.as_slice()[self.region(layer, 0) + self.scales.offset..].as_ptr())
    }

    /// The whole of `layer` (K and V blocks alternating), `2 * shape.layer()` elements,
    /// and its `ScaleLayout::count` scales.
    pub(super) fn layer_mut<E: Elem>(&mut self, layer: usize) -> (&mut [E], &mut [f32]) {
        let n = 2 * self.shape.layer() * self.dtype.size();
        let at = self.region(layer, 0);
        let (codes, rest) = self.buf.as_mut_slice()[at..].split_at_mut(self.scales.offset);
        (cast_mut(&mut codes[..n]), cast_mut(&mut rest[..4 * self.scales.count]))
    }

    /// Store the K and V of `slots.len()` tokens (`k`, `v`: f32 `[tokens, num_kv_heads,
    /// head_dim]`, row-major) at their slots in `layer`, rounding to the storage dtype
    /// (round to nearest even); 8-bit dtypes quantize as [`super::quant`] describes.
    /// Slot -1 is padding and skipped.
    ///
    /// Errors (nothing written): bad layer, length mismatch, a slot outside
    /// `-1..num_blocks * block_size`, a non-finite value for an 8-bit dtype.
    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32], slots: &[i64]) -> Result<()> {
        self.check_layer(layer)?;
        let s = self.shape;
        let row = s.num_kv_heads * s.head_dim;
        let want = slots.len().checked_mul(row).ok_or_else(|| invalid!("too many slots"))?;
        if k.len() != want || v.len() != want {
            return Err(invalid!(
                "k and v must hold {} tokens x {} heads x {} dims = {want} values, got {} and {}",
                slots.len(),
                s.num_kv_heads,
                s.head_dim,
                k.len(),
                v.len()
            ));
        }
        let capacity = (s.num_blocks * s.block_size) as i64;
        if let Some(&bad) = slots.iter().find(|&&x| x < -1 || x >= capacity) {
            return Err(invalid!("slot {bad} outside -1..{capacity}"));
        }
        if self.dtype.is_quantized() {
            for (name, x) in [("k", k), ("v", v)] {
                if let Some(i) = x.iter().position(|x| !x.is_finite()) {
                    return Err(invalid!("{name}[{i}] = {} is not finite: a {} cache stores finite values only", x[i], self.dtype.name()));
                }
            }
        }
        match self.dtype {
            DType::I8 => self.write_i8(layer, k, v, slots),
            DType::E4M3 => self.write_fp8::<super::elem::E4M3>(layer, k, v, slots),
            DType::E5M2 => self.write_fp8::<super::elem::E5M2>(layer, k, v, slots),
            _ => crate::with_elem!(self.dtype, E => self.write_typed::<E>(layer, k, v, slots)),
        }
        Ok(())
    }

    fn write_typed<E: Elem>(&mut self, layer: usize, k: &[f32], v: &[f32], slots: &[i64]) {
        let s = self.shape;
        let row = s.num_kv_heads * s.head_dim;
        let (all, _) = self.layer_mut::<E>(layer);
        for (n, &slot) in slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            let (b, t) = (slot as usize / s.block_size, slot as usize % s.block_size);
            let (kb, vb) = all[b * s.block_stride()..][..s.block_stride()].split_at_mut(s.block());
            for h in 0..s.num_kv_heads {
                let tile = h * s.tile();
                let src = n * row + h * s.head_dim;
                let (kt, vt) = (&mut kb[tile..][..s.tile()], &mut vb[tile..][..s.tile()]);
                for i in 0..s.head_dim {
                    kt[i * s.block_size + t] = E::from_f32(k[src + i]);
                }
                for (dst, &x) in vt[t * s.head_dim..][..s.head_dim].iter_mut().zip(&v[src..src + s.head_dim]) {
                    *dst = E::from_f32(x);
                }
            }
        }
    }

    /// Copy whole blocks `src -> dst` in every layer, K and V, pair by pair in order
    /// (the copy-on-write pairs of `BlockPool.step`).
    ///
    /// Errors (nothing copied): a block id outside `0..num_blocks`.
    pub fn copy_blocks(&mut self, pairs: &[(i64, i64)]) -> Result<()> {
        let nb = self.shape.num_blocks as i64;
        if let Some(p) = pairs.iter().find(|(s, d)| !(0..nb).contains(s) || !(0..nb).contains(d)) {
            return Err(invalid!("pairs: copy pair {p:?} outside block range 0..{nb}"));
        }
        // K and V of a block are one run of `block_stride` elements; an int8 block's
        // scales one run of `2 * num_kv_heads * block_size` f32.
        let block_bytes = self.shape.block_stride() * self.dtype.size();
        let scale_bytes = if self.scales.kind == ScaleKind::PerToken { 8 * self.shape.num_kv_heads * self.shape.block_size } else { 0 };
        for layer in 0..self.shape.num_layers {
            let base = self.region(layer, 0);
            let region = &mut self.buf.as_mut_slice()[base..base + self.scales.layer_bytes()];
            for &(s, d) in pairs {
                let (s, d) = (s as usize, d as usize);
                region.copy_within(s * block_bytes..(s + 1) * block_bytes, d * block_bytes);
                let at = self.scales.offset;
                region.copy_within(at + s * scale_bytes..at + (s + 1) * scale_bytes, at + d * scale_bytes);
            }
        }
        Ok(())
    }
}

fn check_cast<E: Elem>(bytes: &[u8]) {
    assert_eq!(std::mem::size_of::<E>(), E::DTYPE.size(), "Elem {:?} has the wrong size", E::DTYPE);
    // Regions start REGION_ALIGN-aligned in a 2 MiB-aligned buffer and hold whole elements.
    assert!((bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<E>()) && bytes.len().is_multiple_of(std::mem::size_of::<E>()));
}

fn cast<E: Elem>(bytes: &[u8]) -> &[E] {
    check_cast::<E>(bytes);
    // SAFETY: alignment and length checked above; every Elem (f32, f16, bf16, i8 and the
    // fp8 codes) is plain old data for which any bit pattern is a valid value; the
    // lifetime is the input's.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len() / std::mem::size_of::<E>()) }
}

fn cast_mut<E: Elem>(bytes: &mut [u8]) -> &mut [E] {
    check_cast::<E>(bytes);
    // SAFETY: as in `cast`, with the exclusive borrow carried over.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / std::mem::size_of::<E>()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> KvShape {
        KvShape { num_layers: 2, num_blocks: 5, block_size: 3, num_kv_heads: 2, head_dim: 4 }
    }

    /// Logical read through the documented strides.
    fn at<E: Elem>(x: &[E], st: [usize; 4], b: usize, t: usize, h: usize, i: usize) -> f32 {
        x[b * st[0] + t * st[1] + h * st[2] + i * st[3]].to_f32()
    }

    #[test]
    fn write_reads_back_through_strides_in_every_dtype() {
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let mut c = KvCache::new(shape(), dt).unwrap();
            let s = c.shape();
            // Last slot of the pool (the bound of the unsafe cast) and a padding slot.
            let slots = [0i64, -1, (s.num_blocks * s.block_size - 1) as i64, 7];
            let row = s.num_kv_heads * s.head_dim;
            let k: Vec<f32> = (0..slots.len() * row).map(|x| x as f32 * 0.5).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            c.write(1, &k, &v, &slots).unwrap();
            crate::with_elem!(dt, E => {
                let (ks, vs) = c.layer::<E>(1).unwrap();
                for (n, &slot) in slots.iter().enumerate().filter(|(_, &x)| x >= 0) {
                    let (b, t) = (slot as usize / 3, slot as usize % 3);
                    for h in 0..2 {
                        for i in 0..4 {
                            let want = E::from_f32(k[n * row + h * 4 + i]).to_f32();
                            assert_eq!(at(ks, c.key_strides(), b, t, h, i), want);
                            assert_eq!(at(vs, c.value_strides(), b, t, h, i), -want);
                        }
                    }
                }
                // Layer 0 untouched.
                assert!(c.layer::<E>(0).unwrap().0.iter().all(|x| x.to_f32() == 0.0));
            });
        }
    }

    #[test]
    fn bad_input_is_rejected_before_any_write() {
        let mut c = KvCache::new(shape(), DType::F32).unwrap();
        let k = vec![1.0f32; 8];
        assert!(c.write(0, &k, &k, &[15]).is_err());
        assert!(c.write(0, &k, &k, &[-2]).is_err());
        assert!(c.write(2, &k, &k, &[0]).is_err());
        assert!(c.write(0, &k[..7], &k, &[0]).is_err());
        assert!(c.layer::<half::f16>(0).is_err());
        assert!(c.layer::<f32>(0).unwrap().0.iter().all(|&x| x == 0.0));
        assert!(c.copy_blocks(&[(0, 5)]).is_err());
        assert!(KvCache::new(KvShape { head_dim: 0, ..shape() }, DType::F32).is_err());
        assert!(KvCache::new(KvShape { num_blocks: usize::MAX / 2, ..shape() }, DType::F32).is_err());
    }

    #[test]
    fn copy_blocks_copies_all_layers_k_and_v() {
        let mut c = KvCache::new(shape(), DType::BF16).unwrap();
        let k: Vec<f32> = (0..24).map(|x| x as f32).collect();
        for layer in 0..2 {
            c.write(layer, &k, &k, &[12, 13, 14]).unwrap(); // block 4, the last one
        }
        c.copy_blocks(&[(4, 0), (0, 2)]).unwrap();
        for layer in 0..2 {
            let (ks, vs) = c.layer::<half::bf16>(layer).unwrap();
            let (blk, stride) = (c.shape().block(), c.shape().block_stride());
            for b in [0, 2] {
                assert_eq!(&ks[b * stride..][..blk], &ks[4 * stride..][..blk]);
                assert_eq!(&vs[b * stride..][..blk], &vs[4 * stride..][..blk]);
            }
        }
    }

    /// Only `note_raw_writes` marks a cache as possibly holding codes its writes never
    /// make; its own writes and block copies do not, and the mark stays.
    #[test]
    fn raw_writes_are_noted_only_when_told_and_stay() {
        let mut c = KvCache::new(shape(), DType::E4M3).unwrap();
        assert!(!c.raw_writes());
        let row = shape().num_kv_heads * shape().head_dim;
        let k: Vec<f32> = (0..row).map(|x| x as f32 - 3.0).collect();
        c.write(0, &k, &k, &[4]).unwrap();
        c.copy_blocks(&[(1, 2)]).unwrap();
        let _ = c.layer_ptr(1, true).unwrap();
        assert!(!c.raw_writes());
        c.note_raw_writes();
        assert!(c.raw_writes());
        c.write(0, &k, &k, &[5]).unwrap();
        assert!(c.raw_writes());
    }
}
