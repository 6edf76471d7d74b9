//! The disk tier's bytes: a block file's header and a folder's manifest (the layout is
//! in the [parent module's doc](super)), their encoding and decoding, their checksums,
//! and the stable one-byte code of each [`DType`].
//!
//! Decoding never trusts a byte: a wrong magic, version, dtype code, nonzero reserved byte
//! or (for the manifest) checksum decodes to `None`. The block checksum covers the
//! payload too, so it is checked where the payload is read ([`Header::verifies`]).

use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

use crate::kv::DType;
use crate::prefix_cache::block_hash::BlockKey;

/// The first 8 bytes of every block file.
const BLOCK_MAGIC: [u8; 8] = *b"PKVBLOCK";

/// The first 8 bytes of a folder's manifest.
const MANIFEST_MAGIC: [u8; 8] = *b"PKVDISKM";

/// The on-disk format version, in every block header and in the manifest. A folder of
/// another version is refused, never read or converted.
pub const FORMAT_VERSION: u32 = 1;

/// Bytes of a block file's header (the payload follows it): a block of `n` payload bytes
/// takes `HEADER_BYTES + n` bytes of a tier's capacity.
pub const HEADER_BYTES: usize = 72;

/// Bytes of a folder's manifest file.
pub(super) const MANIFEST_BYTES: usize = 36;

/// Header bytes the block checksum covers (before the payload): all but the checksum.
const FIELD_BYTES: usize = 64;

/// Bytes of the manifest its checksum covers: all but the checksum.
const MANIFEST_FIELDS: usize = 28;

/// What a stored block is, besides its bytes: returned by a hit, so the caller knows how
/// to interpret the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMeta {
    /// Tokens the block holds (its fill), as the caller gave it (not interpreted).
    pub fill: u32,
    /// The storage dtype of the K/V elements in the payload.
    pub dtype: DType,
    /// Payload length in bytes (the header not included).
    pub payload_len: u64,
}

/// The stable code of a dtype in a block header: 1 f32, 2 f16, 3 bf16, 4 int8,
/// 5 fp8 e4m3, 6 fp8 e5m2. Part of the on-disk format: a code is never reused or changed;
/// a new dtype takes the next free code.
pub fn dtype_code(dtype: DType) -> u8 {
    match dtype {
        DType::F32 => 1,
        DType::F16 => 2,
        DType::BF16 => 3,
        DType::I8 => 4,
        DType::E4M3 => 5,
        DType::E5M2 => 6,
    }
}

/// The dtype of a header's code ([`dtype_code`]), or `None` for a code no dtype has.
pub fn dtype_from_code(code: u8) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| dtype_code(d) == code)
}

/// A block file's header, decoded: whose block it is and what its payload must hash to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    /// The model/layout identity of the folder that wrote it.
    pub fingerprint: u128,
    /// The layer group.
    pub group: u32,
    /// The block key.
    pub key: BlockKey,
    /// Fill, dtype and payload length.
    pub meta: BlockMeta,
    /// XXH3-64 of the header's first [`FIELD_BYTES`] bytes followed by the payload.
    pub checksum: u64,
}

impl Header {
    /// The header of `payload` stored as (`group`, `key`) in a folder of `fingerprint`;
    /// `meta.payload_len` must be `payload.len()`.
    pub fn new(fingerprint: u128, group: u32, key: BlockKey, meta: BlockMeta, payload: &[u8]) -> Self {
        let mut h = Header { fingerprint, group, key, meta, checksum: 0 };
        h.checksum = h.checksum_of(payload);
        h
    }

    /// The header's bytes, as written at the start of the file.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[..FIELD_BYTES].copy_from_slice(&self.fields());
        b[FIELD_BYTES..].copy_from_slice(&self.checksum.to_le_bytes());
        b
    }

    /// A header from its bytes, or `None` when they cannot be one (magic, version, dtype
    /// code or reserved bytes wrong). The checksum is not checked here: it needs the payload.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Option<Self> {
        let known = take::<8>(b, 0) == BLOCK_MAGIC && u32::from_le_bytes(take(b, 8)) == FORMAT_VERSION;
        if !known || take::<3>(b, 53) != [0; 3] {
            return None;
        }
        let meta = BlockMeta {
            fill: u32::from_le_bytes(take(b, 48)),
            dtype: dtype_from_code(b[52])?,
            payload_len: u64::from_le_bytes(take(b, 56)),
        };
        Some(Header {
            fingerprint: u128::from_le_bytes(take(b, 12)),
            group: u32::from_le_bytes(take(b, 28)),
            key: u128::from_le_bytes(take(b, 32)),
            meta,
            checksum: u64::from_le_bytes(take(b, FIELD_BYTES)),
        })
    }

    /// Whether `payload` is the one this header was written with (length and checksum).
    pub fn verifies(&self, payload: &[u8]) -> bool {
        payload.len() as u64 == self.meta.payload_len && self.checksum_of(payload) == self.checksum
    }

    /// The fields the checksum covers, encoded.
    fn fields(&self) -> [u8; FIELD_BYTES] {
        let mut b = [0u8; FIELD_BYTES];
        b[0..8].copy_from_slice(&BLOCK_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..28].copy_from_slice(&self.fingerprint.to_le_bytes());
        b[28..32].copy_from_slice(&self.group.to_le_bytes());
        b[32..48].copy_from_slice(&self.key.to_le_bytes());
        b[48..52].copy_from_slice(&self.meta.fill.to_le_bytes());
        b[52] = dtype_code(self.meta.dtype);
        b[56..64].copy_from_slice(&self.meta.payload_len.to_le_bytes());
        b
    }

    /// XXH3-64 of the encoded fields followed by `payload`.
    fn checksum_of(&self, payload: &[u8]) -> u64 {
        let mut hash = Xxh3Default::new();
        hash.update(&self.fields());
        hash.update(payload);
        hash.digest()
    }
}

/// A manifest's bytes: magic, [`FORMAT_VERSION`], the folder's fingerprint and the
/// XXH3-64 of those.
pub(super) fn encode_manifest(fingerprint: u128) -> [u8; MANIFEST_BYTES] {
    let mut b = [0u8; MANIFEST_BYTES];
    b[0..8].copy_from_slice(&MANIFEST_MAGIC);
    b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b[12..28].copy_from_slice(&fingerprint.to_le_bytes());
    let sum = xxh3_64(&b[..MANIFEST_FIELDS]);
    b[MANIFEST_FIELDS..].copy_from_slice(&sum.to_le_bytes());
    b
}

/// The (format version, fingerprint) a manifest's bytes hold, or `None` when they are no
/// manifest (length, magic or checksum wrong).
pub(super) fn decode_manifest(b: &[u8]) -> Option<(u32, u128)> {
    let b: &[u8; MANIFEST_BYTES] = b.try_into().ok()?;
    let sum = u64::from_le_bytes(take(b, MANIFEST_FIELDS));
    if take::<8>(b, 0) != MANIFEST_MAGIC || sum != xxh3_64(&b[..MANIFEST_FIELDS]) {
        return None;
    }
    Some((u32::from_le_bytes(take(b, 8)), u128::from_le_bytes(take(b, 12))))
}

/// The `N` bytes of `b` from `at` (offsets are this file's constants, always in bounds).
fn take<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}
