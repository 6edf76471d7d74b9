//! A warm restart of the disk tier: the blocks an earlier run left in the folder, listed
//! with what the tiers need to find them again, and given back their slots.

use super::trailer::{from_trailer, TRAILER_BYTES};
use super::{file_group, TierStore};
use crate::error::Result;
use crate::invalid;
use crate::prefix_cache::tiers::{TierKey, TierMeta};

impl TierStore {
    /// The blocks the disk tier's folder holds that no slot holds (after a restart, all),
    /// with what the tiers need to find them again; blocks whose payload is not a slot
    /// and a trailer are removed.
    ///
    /// Errors: `Storage` when a file may not be read or removed.
    pub fn restorable(&mut self) -> Result<Vec<(TierKey, TierMeta)>> {
        let Some(w) = &self.disk else { return Ok(Vec::new()) };
        let (want, dtype) = ((self.host.slot_bytes() + TRAILER_BYTES) as u64, self.dtype);
        let held: rustc_hash::FxHashSet<(u32, u128)> = self.disk_keys.iter().flatten().map(|k| (file_group(*k), k.1)).collect();
        w.run(move |disk| {
            let mut keys: Vec<(u32, u128)> = disk.keys().filter(|k| !held.contains(k)).collect();
            keys.sort_unstable();
            let mut found = Vec::new();
            for (g, k) in keys {
                let fits = disk.meta(g, k).is_some_and(|m| m.payload_len == want && m.dtype == dtype);
                let meta = if fits { disk.peek_tail(g, k, TRAILER_BYTES)?.as_deref().and_then(from_trailer) } else { None };
                match meta {
                    Some(meta) => found.push((((g & 0xff) as u8, k, (g >> 8) as u16), meta)),
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
