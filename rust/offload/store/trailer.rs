//! The trailer a disk block's payload ends with: what the tiers need to find the block
//! again after a restart, its token ids included (format in the module doc of
//! `offload::store`).

use crate::prefix_cache::tiers::TierMeta;

/// Bytes of the fixed part of a trailer, the payload's last bytes (module doc).
pub const TRAILER_BYTES: usize = 48;
const TRAILER_MAGIC: &[u8; 8] = b"PKVTIER2";
/// Flag bits: parent present, extra key present, token ids present.
const PARENT: u8 = 1;
const EXTRA: u8 = 2;
const TOKENS: u8 = 4;

/// Most bytes a disk block's payload takes: a slot of `slot_bytes`, the token ids of a
/// block of `block_size` tokens and the fixed part.
pub fn most_payload_bytes(slot_bytes: usize, block_size: u32) -> usize {
    slot_bytes.saturating_add(4 * block_size as usize).saturating_add(TRAILER_BYTES)
}

/// Bytes `meta`'s trailer takes: its token ids (4 bytes each) and the fixed part.
pub(super) fn trailer_bytes(meta: &TierMeta) -> usize {
    meta.tokens.as_ref().map_or(0, |t| 4 * t.len()) + TRAILER_BYTES
}

/// Appends `meta`'s trailer to `out`: its token ids, then the fixed part.
pub(super) fn push_trailer(out: &mut Vec<u8>, meta: &TierMeta) {
    let tokens = meta.tokens.as_deref().unwrap_or_default();
    out.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    let mut t = [0u8; TRAILER_BYTES];
    t[..8].copy_from_slice(TRAILER_MAGIC);
    let flag = |present: bool, bit: u8| if present { bit } else { 0 };
    t[8] = flag(meta.parent.is_some(), PARENT) | flag(meta.extra.is_some(), EXTRA) | flag(meta.tokens.is_some(), TOKENS);
    t[12..16].copy_from_slice(&meta.hits.to_le_bytes());
    t[16..32].copy_from_slice(&meta.parent.unwrap_or(0).to_le_bytes());
    t[32..40].copy_from_slice(&meta.extra.unwrap_or(0).to_le_bytes());
    t[40..44].copy_from_slice(&(tokens.len() as u32).to_le_bytes());
    out.extend_from_slice(&t);
}

/// The token ids a fixed trailer says precede it; None for bytes that are no trailer.
fn token_count(fixed: &[u8]) -> Option<usize> {
    let ok = fixed.len() == TRAILER_BYTES
        && &fixed[..8] == TRAILER_MAGIC
        && fixed[8] <= PARENT | EXTRA | TOKENS
        && fixed[9..12] == [0; 3]
        && fixed[44..] == [0; 4];
    let n = u32::from_le_bytes(fixed.get(40..44)?.try_into().ok()?) as usize;
    (ok && (fixed[8] & TOKENS != 0 || n == 0)).then_some(n)
}

/// The meta a whole trailer (token ids and fixed part) holds; None for bytes that are no
/// trailer or a trailer of another length.
pub(super) fn from_trailer(tail: &[u8]) -> Option<TierMeta> {
    let fixed = tail.get(tail.len().checked_sub(TRAILER_BYTES)?..)?;
    let n = token_count(fixed)?;
    if tail.len() != 4 * n + TRAILER_BYTES {
        return None;
    }
    let word = |at: usize| -> [u8; 4] { tail[at..at + 4].try_into().unwrap_or_default() };
    let flags = fixed[8];
    let tokens = (flags & TOKENS != 0).then(|| (0..n).map(|i| u32::from_le_bytes(word(4 * i))).collect());
    let parent = (flags & PARENT != 0).then(|| u128::from_le_bytes(fixed[16..32].try_into().unwrap_or_default()));
    let extra = (flags & EXTRA != 0).then(|| u64::from_le_bytes(fixed[32..40].try_into().unwrap_or_default()));
    let hits = u32::from_le_bytes(fixed[12..16].try_into().unwrap_or_default());
    Some(TierMeta { parent, extra, hits, tokens })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(meta: &TierMeta) -> Vec<u8> {
        let mut out = Vec::new();
        push_trailer(&mut out, meta);
        assert_eq!(out.len(), trailer_bytes(meta));
        out
    }

    #[test]
    fn a_trailer_round_trips_and_anything_else_is_refused() {
        for meta in [
            TierMeta::default(),
            TierMeta { parent: Some(u128::MAX), extra: Some(u64::MAX), hits: u32::MAX, tokens: Some([7, u32::MAX, 0].into()) },
            TierMeta { parent: Some(0), extra: None, hits: 3, tokens: None },
            TierMeta { parent: None, extra: None, hits: 0, tokens: Some([].into()) },
        ] {
            let t = encoded(&meta);
            let fixed = &t[t.len() - TRAILER_BYTES..];
            assert_eq!(token_count(fixed), Some(meta.tokens.as_ref().map_or(0, |t| t.len())));
            assert_eq!(from_trailer(&t), Some(meta.clone()));
            let at = t.len() - TRAILER_BYTES;
            for (byte, what) in [(0, "magic"), (9, "reserved bytes"), (44, "reserved bytes")] {
                let mut bad = t.clone();
                bad[at + byte] ^= 1;
                assert_eq!(from_trailer(&bad), None, "{what}");
            }
            let mut bad = t.clone();
            bad[at + 8] = 8;
            assert_eq!(from_trailer(&bad), None, "flags");
            assert_eq!(from_trailer(&t[1..]), None, "length");
            let mut longer = vec![0; 4];
            longer.extend_from_slice(&t);
            assert_eq!(from_trailer(&longer), None, "a token more than the count");
        }
        // A count without the tokens flag is refused.
        let mut t = encoded(&TierMeta::default());
        t[40] = 1;
        assert_eq!(token_count(&t), None);
    }
}
