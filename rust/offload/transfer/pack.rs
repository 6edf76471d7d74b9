//! Gather a block of a [`KvCache`] into slot bytes and scatter them back, on the calling
//! thread (the engine does the same on its own threads, run by run).
//!
//! # Slot byte order
//!
//! A slot holds one block's bytes of every layer, layer by layer, each layer's bytes
//! exactly as the cache stores them ([`KvCache::block_bytes`]):
//!
//! ```text
//! layer 0: codes  K tiles of KV heads 0..H, each [head_dim][block_size],
//!                 then V tiles of KV heads 0..H, each [block_size][head_dim]
//!                 (2 * H * block_size * head_dim * dtype.size() bytes)
//!          scales int8 only: K's [H][block_size] f32, then V's (8 * H * block_size bytes)
//! layer 1: ...
//! ```
//!
//! Elements and scales keep the host's byte order. fp8 caches keep one scale per (layer,
//! K or V, KV head), which belongs to no block: a slot holds the codes only, and its
//! values are the source cache's only under the same scales (always so within one cache;
//! another cache of the same shape needs the same `KvCache::set_fp8_scales`).

use super::region::{cache_bytes_mut, slot_bytes_for, DeviceRegion};
use crate::error::{vec_for, Result};
use crate::invalid;
use crate::kv::{DType, KvCache};

/// Copy block `block` of `cache` into `out`, in the slot byte order (module doc).
///
/// Errors (`InvalidArgument`, `out` unchanged): `block` out of range, `out.len()` not
/// [`slot_bytes_for`]`(cache)`.
pub fn pack(cache: &KvCache, block: usize, out: &mut [u8]) -> Result<()> {
    let runs = checked_runs(cache, block, out.len(), "out")?;
    let bytes = cache.bytes();
    let mut at = 0;
    for r in runs {
        let src = bytes.get(r.clone()).ok_or_else(|| invalid!("block {block}: run {r:?} outside the cache"))?;
        out[at..at + src.len()].copy_from_slice(src);
        at += src.len();
    }
    Ok(())
}

/// Copy slot bytes `slot` (as [`pack`] made them) into block `block` of `cache`, every
/// layer. Codes a cache write never makes (an fp8 NaN or infinity, int8's -128) mark the
/// cache (`KvCache::note_raw_writes`), so the kernels check for them.
///
/// Errors (`InvalidArgument`, the cache unchanged): `block` out of range, `slot.len()`
/// not [`slot_bytes_for`]`(cache)`.
pub fn unpack(slot: &[u8], cache: &mut KvCache, block: usize) -> Result<()> {
    let runs = checked_runs(cache, block, slot.len(), "slot")?;
    let dtype = cache.dtype();
    let foreign = code_chunks(cache, slot).any(|codes| foreign_codes(dtype, codes));
    let bytes = cache_bytes_mut(cache);
    let mut at = 0;
    for r in runs {
        let dst = bytes.get_mut(r.clone()).ok_or_else(|| invalid!("block {block}: run {r:?} outside the cache"))?;
        dst.copy_from_slice(&slot[at..at + dst.len()]);
        at += dst.len();
    }
    if foreign {
        cache.note_raw_writes();
    }
    Ok(())
}

/// `block`'s runs in `cache`, once `len` (the length of the caller's `what`) is checked
/// to be the slot's.
fn checked_runs(cache: &KvCache, block: usize, len: usize, what: &str) -> Result<Vec<std::ops::Range<usize>>> {
    let want = slot_bytes_for(cache);
    if len != want {
        return Err(invalid!("{what} must hold {want} bytes (one block of this cache), got {len}"));
    }
    let mut runs = vec_for(2 * cache.shape().num_layers, "runs")?;
    cache.block_runs(block, &mut runs)?;
    Ok(runs)
}

/// The code bytes of each layer in slot bytes of `cache`'s layout (int8's scales left
/// out).
fn code_chunks<'a>(cache: &KvCache, slot: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    let (codes, layer) = match cache.block_bytes(0, 0) {
        Ok([c, s]) => (c.len(), c.len() + s.len()),
        Err(_) => (0, slot.len().max(1)),
    };
    slot.chunks(layer.max(1)).map(move |c| &c[..codes.min(c.len())])
}

/// Whether `codes` hold a code a write of `dtype` never makes: fp8 e4m3's NaN
/// (`0x7f`, `0xff`), fp8 e5m2's infinities and NaNs (exponent all ones), int8's -128.
/// The unquantized dtypes store whatever was written.
pub fn foreign_codes(dtype: DType, codes: &[u8]) -> bool {
    match dtype {
        DType::E4M3 => codes.iter().any(|&b| b & 0x7f == 0x7f),
        DType::E5M2 => codes.iter().any(|&b| b & 0x7c == 0x7c),
        DType::I8 => codes.contains(&0x80),
        DType::F32 | DType::F16 | DType::BF16 => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_codes_are_the_ones_writes_never_make() {
        assert!(foreign_codes(DType::E4M3, &[0, 0xff]) && foreign_codes(DType::E4M3, &[0x7f]));
        assert!(!foreign_codes(DType::E4M3, &[0x7e, 0xfe, 0x80]));
        assert!(foreign_codes(DType::E5M2, &[0x7c]) && foreign_codes(DType::E5M2, &[0xfd]));
        assert!(!foreign_codes(DType::E5M2, &[0x7b, 0xfb]));
        assert!(foreign_codes(DType::I8, &[1, 0x80]) && !foreign_codes(DType::I8, &[0x81, 0x7f]));
        assert!(!foreign_codes(DType::F16, &[0xff; 4]));
    }
}
