//! Pins: caller-held retention of a cached prefix, with an optional expiry in logical time.
//!
//! A *hard* pin (no priority) keeps every block of the prefix out of eviction under every
//! policy: a system prompt stays resident. A *soft* pin with a priority only matters
//! under [`crate::prefix_cache::eviction::EvictionPolicy::Priority`], where idle blocks with a lower
//! priority go first (a block's priority is the highest of its live soft pins). Either kind
//! lapses when the pool's clock reaches `expires_at`.

use std::collections::{BTreeMap, BTreeSet};

use crate::prefix_cache::block_hash::BlockKey;
use crate::types::BlockId;

/// One pin: the blocks it covers (root first) and their keys at pin time.
#[derive(Clone, Debug)]
pub struct Pin {
    pub blocks: Vec<(BlockId, BlockKey)>,
    /// `None`: hard pin. `Some(p)`: soft retention priority `p`.
    pub priority: Option<u32>,
    pub expires_at: Option<u64>,
}

/// Live pins by id and their expiry index.
#[derive(Clone, Debug, Default)]
pub struct PinTable {
    pins: BTreeMap<u64, Pin>,
    expiry: BTreeSet<(u64, u64)>,
    next_id: u64,
}

impl PinTable {
    /// Record a pin and return its id (ids start at 1 and are never reused).
    pub fn insert(&mut self, pin: Pin) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        if let Some(t) = pin.expires_at {
            self.expiry.insert((t, id));
        }
        self.pins.insert(id, pin);
        id
    }

    pub fn remove(&mut self, id: u64) -> Option<Pin> {
        let pin = self.pins.remove(&id)?;
        if let Some(t) = pin.expires_at {
            self.expiry.remove(&(t, id));
        }
        Some(pin)
    }

    /// Ids of pins whose expiry is at or before `now`, earliest first (not removed).
    pub fn expired(&self, now: u64) -> Vec<u64> {
        self.expiry.range(..=(now, u64::MAX)).map(|&(_, id)| id).collect()
    }

    pub fn len(&self) -> usize {
        self.pins.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pins.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &Pin)> {
        self.pins.iter().map(|(&id, p)| (id, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_index_follows_inserts_and_removals() {
        let mut t = PinTable::default();
        let pin = |e| Pin { blocks: vec![(BlockId(0), 1)], priority: None, expires_at: e };
        let a = t.insert(pin(Some(5)));
        let b = t.insert(pin(None));
        let c = t.insert(pin(Some(3)));
        assert_eq!(t.expired(2), Vec::<u64>::new());
        assert_eq!(t.expired(5), vec![c, a]);
        t.remove(c);
        assert_eq!(t.expired(10), vec![a]);
        assert!(t.iter().any(|(id, _)| id == b));
        assert_eq!(t.len(), 2);
    }
}
