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
    pub fn validate(&self) -> crate::Result<()> {
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
        scratch.clear();
        scratch.reserve(16 + 9 + 4 * tokens.len());
        scratch.extend_from_slice(&parent.to_le_bytes());
        match extra {
            None => scratch.push(0),
            Some(x) => {
                scratch.push(1);
                scratch.extend_from_slice(&x.to_le_bytes());
            }
        }
        for t in tokens {
            scratch.extend_from_slice(&t.to_le_bytes());
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
        let mut p = parent;
        out.reserve(tokens.len() / block_size);
        for block in tokens.chunks_exact(block_size) {
            p = self.block_key(p, block, extra, scratch);
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

    #[test]
    fn known_answer_is_stable() {
        // Pinned value: the documented encoding must never change silently.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0u128.to_le_bytes());
        bytes.push(0);
        for t in [1u32, 2, 3, 4] {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        let expect = xxh3_128_with_seed(&bytes, KEY_SEED);
        assert_eq!(keys(BlockHasher::Xxh3, &[1, 2, 3, 4], 4, None), vec![expect]);
        assert_eq!(KEY_SEED, 0x316c_6f6f_7076_6b70);
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
