//! Pins and the logical clock of the prefix cache: hard pins keep blocks out of eviction,
//! soft pins raise their priority under the priority policy, and both lapse when the
//! clock reaches their expiry.

use super::{PrefixCache, IDLE};
use crate::prefix_cache::block_hash::BlockKey;
use crate::error::Result;
use crate::invalid;
use crate::prefix_cache::pins::Pin;
use crate::types::BlockId;

impl PrefixCache {

    /// Pin a cached chain (root first, as returned by [`Self::lookup_in`]).
    pub fn pin(&mut self, chain: &[BlockId], priority: Option<u32>, expires_at: Option<u64>) -> Result<u64> {
        if let Some(t) = expires_at {
            if t <= self.clock {
                return Err(invalid!("expires_at {t} is not after the current clock {}", self.clock));
            }
        }
        let blocks: Vec<(BlockId, BlockKey)> = chain.iter().map(|&b| (b, self.meta[b.index()].key)).collect();
        let id = self.pins.insert(Pin { blocks, priority, expires_at });
        for &b in chain {
            match priority {
                None => {
                    let m = &mut self.meta[b.index()];
                    m.hard_pins += 1;
                    if m.hard_pins == 1 && m.has(IDLE) {
                        self.evictable -= 1;
                        self.dequeue(b);
                    }
                }
                Some(p) => {
                    let queued = self.dequeue(b);
                    self.soft.entry(b.0).or_default().push((id, p));
                    if queued {
                        self.enqueue(b);
                    }
                }
            }
        }
        Ok(id)
    }

    /// Drop pin `id`. Errors with `InvalidArgument` for an unknown or lapsed pin.
    pub fn unpin(&mut self, id: u64) -> Result<()> {
        let pin = self.pins.remove(id).ok_or_else(|| invalid!("unknown pin id {id} (never issued, unpinned or expired)"))?;
        for &(b, key) in &pin.blocks {
            match pin.priority {
                None => {
                    // Hard-pinned blocks are never evicted, so `b` still holds `key`.
                    debug_assert!(self.key_of(b) == Some(key));
                    let m = &mut self.meta[b.index()];
                    m.hard_pins -= 1;
                    if m.hard_pins == 0 && m.has(IDLE) {
                        self.evictable += 1;
                        self.queue_if_leaf(b);
                    }
                }
                Some(_) => {
                    // A soft-pinned block may have been evicted (its soft list was
                    // cleared then) and even reused: match on the pin id.
                    let has = self.soft.get(&b.0).is_some_and(|v| v.iter().any(|&(p, _)| p == id));
                    if has {
                        let queued = self.dequeue(b);
                        if let Some(v) = self.soft.get_mut(&b.0) {
                            v.retain(|&(p, _)| p != id);
                            if v.is_empty() {
                                self.soft.remove(&b.0);
                            }
                        }
                        if queued {
                            self.enqueue(b);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn expire_pins(&mut self) {
        for id in self.pins.expired(self.clock) {
            // Listed just now, so present.
            let _ = self.unpin(id);
        }
    }

    /// End of a successful pool operation: the operation clock advances (unless the
    /// caller drives the clock) and lapsed pins are released.
    #[inline]
    pub fn end_op(&mut self) {
        self.flush_unmapped();
        if let Some(t) = self.tiers.as_deref_mut() {
            t.end_call();
            self.forget_undrained();
        }
        if !self.manual_clock {
            self.clock += 1;
        }
        if !self.pins.is_empty() {
            self.expire_pins();
        }
    }

    /// Drive the clock from the caller's step counter from now on. It never goes back.
    pub fn set_clock(&mut self, t: u64) -> Result<()> {
        if t < self.clock {
            return Err(invalid!("the clock cannot go back from {} to {t}", self.clock));
        }
        self.manual_clock = true;
        self.clock = t;
        self.expire_pins();
        Ok(())
    }

    pub fn num_pins(&self) -> usize {
        self.pins.len()
    }
}
