//! The trailer a disk block's payload ends with: what the tiers need to find the block
//! again after a restart (format in the module doc of `offload::store`).

use crate::prefix_cache::tiers::TierMeta;

/// Bytes a disk block's payload holds after the slot's bytes (module doc).
pub const TRAILER_BYTES: usize = 40;
const TRAILER_MAGIC: &[u8; 8] = b"PKVTIER1";

/// `meta` as the trailer of a disk block's payload.
pub(super) fn trailer(meta: &TierMeta) -> [u8; TRAILER_BYTES] {
    let mut t = [0u8; TRAILER_BYTES];
    t[..8].copy_from_slice(TRAILER_MAGIC);
    t[8] = u8::from(meta.parent.is_some()) | u8::from(meta.extra.is_some()) << 1;
    t[12..16].copy_from_slice(&meta.hits.to_le_bytes());
    t[16..32].copy_from_slice(&meta.parent.unwrap_or(0).to_le_bytes());
    t[32..40].copy_from_slice(&meta.extra.unwrap_or(0).to_le_bytes());
    t
}

/// The meta a trailer holds; None for bytes that are no trailer.
pub(super) fn from_trailer(t: &[u8]) -> Option<TierMeta> {
    if t.len() != TRAILER_BYTES || &t[..8] != TRAILER_MAGIC || t[8] > 3 || t[9..12] != [0; 3] {
        return None;
    }
    let parent = (t[8] & 1 != 0).then(|| u128::from_le_bytes(t[16..32].try_into().unwrap_or_default()));
    let extra = (t[8] & 2 != 0).then(|| u64::from_le_bytes(t[32..40].try_into().unwrap_or_default()));
    Some(TierMeta { parent, extra, hits: u32::from_le_bytes(t[12..16].try_into().unwrap_or_default()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trailer_round_trips_and_anything_else_is_refused() {
        for meta in [
            TierMeta::default(),
            TierMeta { parent: Some(u128::MAX), extra: Some(u64::MAX), hits: u32::MAX },
            TierMeta { parent: Some(0), extra: None, hits: 3 },
        ] {
            let t = trailer(&meta);
            assert_eq!(from_trailer(&t), Some(meta));
            let mut bad = t;
            bad[0] ^= 1;
            assert_eq!(from_trailer(&bad), None, "magic");
            let mut bad = t;
            bad[8] = 4;
            assert_eq!(from_trailer(&bad), None, "flags");
            let mut bad = t;
            bad[10] = 1;
            assert_eq!(from_trailer(&bad), None, "reserved bytes");
            assert_eq!(from_trailer(&t[1..]), None, "length");
        }
    }
}
