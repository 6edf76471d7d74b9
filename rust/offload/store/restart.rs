//! A warm restart of the disk tier: the blocks an earlier run left in the folder, listed
//! with what the tiers need to find them again, and given back their slots.

use super::trailer::{from_trailer, TRAILER_BYTES};
use super::{file_group, TierStore};
use crate::error::Result;
use crate::invalid;
use crate::kv::DType;
use crate::offload::disk::DiskTier;
use crate::prefix_cache::tiers::{TierKey, TierMeta};

impl TierStore {
    /// The blocks the disk tier's folder holds that no slot holds (after a restart, all),
    /// with what the tiers need to find them again; blocks whose payload is not a slot
    /// and a trailer are removed.
    ///
    /// Errors: `Storage` when a file may not be read or removed.
    pub fn restorable(&mut self) -> Result<Vec<(TierKey, TierMeta)>> {
        let Some(w) = &self.disk else { return Ok(Vec::new()) };
        let (slot, dtype, block_size) = (self.host.slot_bytes() as u64, self.dtype, self.block_size);
        let held: rustc_hash::FxHashSet<(u32, u128)> = self.disk_keys.iter().flatten().map(|k| (file_group(*k), k.1)).collect();
        w.run(move |disk| {
            let mut keys: Vec<(u32, u128)> = disk.keys().filter(|k| !held.contains(k)).collect();
            keys.sort_unstable();
            let mut found = Vec::new();
            for (g, k) in keys {
                let key = ((g & 0xff) as u8, k, (g >> 8) as u16);
                let fill = if key.2 == 0 { block_size } else { u32::from(key.2) };
                match read_meta(disk, (g, k), (slot, dtype), fill)? {
                    Some(meta) => found.push((key, meta)),
                    None => {
                        disk.remove(g, k)?;
                    }
                }
            }
            Ok(found)
        })?
    }

    /// Disk slot `slot` holds block `key` (found by [`Self::restorable`]); with `slot`
    /// None, no slot will: its file is removed.
    ///
    /// Errors: `InvalidArgument` for a slot out of range or taken; `Storage` when the
    /// file may not be removed.
    pub fn adopt(&mut self, slot: Option<u32>, key: TierKey) -> Result<()> {
        match slot {
            Some(s) => {
                let j = self.disk_index(s)?;
                if self.disk_keys[j].is_some() {
                    return Err(invalid!("tier store: disk slot {j} holds a block already"));
                }
                self.disk_keys[j] = Some(key);
            }
            None => {
                if let Some(w) = &self.disk {
                    w.send(move |d| d.remove(file_group(key), key.1).map(drop));
                }
            }        }
        Ok(())
    }
}

/// The meta in block (`g`, `k`)'s trailer, when its payload is a slot of `slot` bytes of
/// `dtype` followed by a trailer whose token ids, if any, are the block's `fill`.
fn read_meta(disk: &DiskTier, (g, k): (u32, u128), (slot, dtype): (u64, DType), fill: u32) -> Result<Option<TierMeta>> {
    let most = TRAILER_BYTES as u64 + 4 * u64::from(fill);
    let tail = disk.meta(g, k).filter(|m| m.dtype == dtype).and_then(|m| m.payload_len.checked_sub(slot));
    let Some(tail) = tail.filter(|t| (TRAILER_BYTES as u64..=most).contains(t)) else { return Ok(None) };
    let meta = disk.peek_tail(g, k, tail as usize)?.as_deref().and_then(from_trailer);
    Ok(meta.filter(|m| m.tokens.as_ref().is_none_or(|t| t.len() == fill as usize)))
}
