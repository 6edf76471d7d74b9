//! Chained 128-bit block keys for prefix caching.
//!
//! A full block's key identifies its content *and* everything before it, so equal keys at
//! equal positions mean a shared prefix. Keys are stable across processes, platforms and
//! runs (fixed seed, explicit little-endian encoding), so a trace can record them and a
//! later run can replay them.
//!
//! # Encoding (stable; changing it is a breaking change)
//!
//! ```text
//! bytes(block) = parent_key   as 16 bytes little-endian   (ROOT_PARENT = 0 for block 0)
//!             || 0x00                                     (no extra key)
//!              | 0x01 || extra_key as 8 bytes little-endian
//!             || token_id     as 4 bytes little-endian, for each token of the block
//! key(block)   = XXH3-128(bytes(block), seed = KEY_SEED)
//! ```
//!
//! The extra key (an adapter id, a tenant salt, a multimodal input hash folded to 64
//! bits) enters every block of a sequence, so two tenants never share a block.
//!
//! XXH3-128 is not cryptographic: a caller who lets untrusted tenants share a pool should
//! salt them apart with the extra key, and keep token verification on (the default), which
//! makes a collision a cache miss instead of wrong KV.
//!
//! [`BlockHasher::Truncated`] keeps only the low bits of the key; tests use it to force
//! collisions and check that verification turns each one into a miss.

use xxhash_rust::xxh3::xxh3_128_with_seed;

/// A block key. Mooncake-style traces give 64-bit block ids, zero-extended.
pub type BlockKey = u128;

/// Parent key of the first block of every sequence.
pub const ROOT_PARENT: BlockKey = 0;

/// Seed of the key hash: the ASCII bytes `pkvpool1` read as a little-endian u64.
pub const KEY_SEED: u64 = u64::from_le_bytes(*b"pkvpool1");

/// How block bytes become a key.
#[derive(Clone, Copy, Debug, Default)]
pub enum BlockHasher {
    /// XXH3-128 of the encoding above (the default).
    #[default]
    Xxh3,
    /// XXH3-128 keeping only the low `bits` bits (1..=128): forces collisions in tests.
    Truncated { bits: u8 },
    /// Any function of the encoded bytes (tests, or a caller's own scheme).
    Custom(fn(&[u8]) -> BlockKey),
}

impl BlockHasher {
    /// Reject a truncation width outside `1..=128`.
    pub fn validate(&self) -> crate::error::Result<()> {
        match *self {
            BlockHasher::Truncated { bits } if bits == 0 || bits > 128 => {
                Err(crate::invalid!("hash bits must be in 1..=128, got {bits}"))
            }
            _ => Ok(()),
        }
    }

    #[inline]
    fn finish(&self, bytes: &[u8]) -> BlockKey {
        match *self {
            BlockHasher::Xxh3 => xxh3_128_with_seed(bytes, KEY_SEED),
            BlockHasher::Truncated { bits } => {
                let k = xxh3_128_with_seed(bytes, KEY_SEED);
                if bits >= 128 {
                    k
                } else {
                    k & ((1u128 << bits) - 1)
                }
            }
            BlockHasher::Custom(f) => f(bytes),
        }
    }

    /// The key of one block given its parent's key, its token ids and the extra key.
    /// `scratch` is reused between calls to avoid allocating.
    #[inline]
    pub fn block_key(&self, parent: BlockKey, tokens: &[u32], extra: Option<u64>, scratch: &mut Vec<u8>) -> BlockKey {
        let head = if extra.is_some() { 25 } else { 17 };
        let len = head + 4 * tokens.len();
        // Written in place (no per-byte pushes): the token loop compiles to a copy.
        scratch.clear();
        scratch.resize(len, 0);
        scratch[..16].copy_from_slice(&parent.to_le_bytes());
        match extra {
            None => scratch[16] = 0,
            Some(x) => {
                scratch[16] = 1;
                scratch[17..25].copy_from_slice(&x.to_le_bytes());
            }
        }
        for (dst, t) in scratch[head..].chunks_exact_mut(4).zip(tokens) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        self.finish(scratch)
    }

    /// Keys of every *full* block of `tokens` (a partial tail gets no key), chained from
    /// `parent`, appended to `out`.
    pub fn chain_keys(
        &self,
        parent: BlockKey,
        tokens: &[u32],
        block_size: usize,
        extra: Option<u64>,
        out: &mut Vec<BlockKey>,
        scratch: &mut Vec<u8>,
    ) {
        // The encoding has the same length for every block of the chain: lay out the
        // header once, then overwrite the parent key and the tokens per block.
        let head = if extra.is_some() { 25 } else { 17 };
        scratch.clear();
        scratch.resize(head + 4 * block_size, 0);
        if let Some(x) = extra {
            scratch[16] = 1;
            scratch[17..25].copy_from_slice(&x.to_le_bytes());
        }
        let mut p = parent;
        out.reserve(tokens.len() / block_size);
        for block in tokens.chunks_exact(block_size) {
            scratch[..16].copy_from_slice(&p.to_le_bytes());
            for (dst, t) in scratch[head..].chunks_exact_mut(4).zip(block) {
                dst.copy_from_slice(&t.to_le_bytes());
            }
            p = self.finish(scratch);
            out.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(h: BlockHasher, tokens: &[u32], bs: usize, extra: Option<u64>) -> Vec<BlockKey> {
        let mut out = Vec::new();
        h.chain_keys(ROOT_PARENT, tokens, bs, extra, &mut out, &mut Vec::new());
        out
    }

    /// Known answers computed by an independent implementation of the encoding above: the
    /// reference C xxHash (0.8.4) through the `xxhash` Python package (4.1.0), with
    ///
    /// ```python
    /// import struct, xxhash
    /// SEED = int.from_bytes(b"pkvpool1", "little")
    /// def keys(tokens, bs, extra=None):
    ///     parent, out = 0, []
    ///     for i in range(len(tokens) // bs):
    ///         data = parent.to_bytes(16, "little")
    ///         data += b"\x00" if extra is None else b"\x01" + struct.pack("<Q", extra)
    ///         data += struct.pack(f"<{bs}I", *tokens[i * bs:(i + 1) * bs])
    ///         parent = xxhash.xxh3_128_intdigest(data, seed=SEED)
    ///         out.append(parent)
    ///     return out
    /// ```
    ///
    /// Cases: a 33-byte block; a chain of three with an extra key; 273-byte blocks (XXH3's
    /// long-input path); the largest token id and extra key with a partial tail.
    #[test]
    fn known_answers_from_an_independent_implementation() {
        // (tokens, block size, extra key, expected keys)
        type Case = (Vec<u32>, usize, Option<u64>, Vec<BlockKey>);
        let cases: [Case; 4] = [
            (vec![1, 2, 3, 4], 4, None, vec![0x0a7b2856bd016172aed92d8c21087734]),
            (
                (0..12).collect(),
                4,
                Some(3),
                vec![
                    0x3ba4791f1c28c8242eb49234b78af273,
                    0xf88d4c21b538498ccf521bbb746ef882,
                    0x4d708dacd56d3b95c607060e184b06e2,
                ],
            ),
            ((0..128).collect(), 64, None, vec![0xe9ad33ab22c58da200e8316d914d0250, 0xc7bd8a43e2da1ef79e8fd14cb094adb6]),
            (
                [vec![u32::MAX; 16], vec![7; 3]].concat(),
                16,
                Some(u64::MAX),
                vec![0x7f6665c18e6e185e8b3973fa828abfbd],
            ),
        ];
        for (tokens, bs, extra, want) in cases {
            assert_eq!(keys(BlockHasher::Xxh3, &tokens, bs, extra), want, "block size {bs}, extra {extra:?}");
            let mut p = ROOT_PARENT;
            for (block, &w) in tokens.chunks_exact(bs).zip(&want) {
                p = BlockHasher::Xxh3.block_key(p, block, extra, &mut Vec::new());
                assert_eq!(p, w, "block_key agrees with chain_keys");
            }
        }
    }

    #[test]
    fn chain_keys_equal_block_by_block_keys() {
        for extra in [None, Some(3)] {
            let tokens: Vec<u32> = (0..40).collect();
            let chained = keys(BlockHasher::Xxh3, &tokens, 8, extra);
            let mut p = ROOT_PARENT;
            for (i, block) in tokens.chunks_exact(8).enumerate() {
                p = BlockHasher::Xxh3.block_key(p, block, extra, &mut Vec::new());
                assert_eq!(chained[i], p);
            }
        }
    }

    #[test]
    fn chaining_and_extra_key_separate_prefixes() {
        let a = keys(BlockHasher::Xxh3, &[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, None);
        assert_eq!(a.len(), 2, "the partial tail has no key");
        let b = keys(BlockHasher::Xxh3, &[0, 2, 3, 4, 5, 6, 7, 8], 4, None);
        assert_ne!(a[1], b[1], "same block tokens, different prefix");
        let c = keys(BlockHasher::Xxh3, &[1, 2, 3, 4], 4, Some(7));
        assert_ne!(a[0], c[0]);
        assert_ne!(c, keys(BlockHasher::Xxh3, &[1, 2, 3, 4], 4, Some(8)));
        // Extra key 0 is not the same as no extra key.
        assert_ne!(a[0], keys(BlockHasher::Xxh3, &[1, 2, 3, 4], 4, Some(0))[0]);
    }

    #[test]
    fn truncation_bounds() {
        assert!(BlockHasher::Truncated { bits: 0 }.validate().is_err());
        assert!(BlockHasher::Truncated { bits: 129 }.validate().is_err());
        let full = keys(BlockHasher::Xxh3, &[5; 8], 8, None)[0];
        assert_eq!(keys(BlockHasher::Truncated { bits: 128 }, &[5; 8], 8, None)[0], full);
        assert_eq!(keys(BlockHasher::Truncated { bits: 1 }, &[5; 8], 8, None)[0], full & 1);
    }
}
