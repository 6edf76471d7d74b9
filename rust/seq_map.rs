//! The pool's live sequences: a dense slab of entries plus an id -> slot index.
//!
//! A batched decode step visits every running sequence twice (plan, then apply). With the
//! entries in a hash map, the second visit either hashed every id again or swept the whole
//! map; here the plan hashes each id once, keeps the slot, and the apply pass reaches the
//! entry by that slot. Entries live contiguously, so a step walks one array instead of
//! hash buckets. Removal swaps the last entry into the hole (slots are not stable across
//! removals: hold one only within a call).

use std::ops::Index;

use rustc_hash::FxHashMap;

use crate::types::SeqId;

/// Live sequences keyed by [`SeqId`], stored densely.
#[derive(Clone, Debug)]
pub struct SeqMap<V> {
    ids: Vec<SeqId>,
    entries: Vec<V>,
    index: FxHashMap<SeqId, u32>,
}

impl<V> Default for SeqMap<V> {
    fn default() -> Self {
        Self { ids: Vec::new(), entries: Vec::new(), index: FxHashMap::default() }
    }
}

impl<V> SeqMap<V> {
    #[inline]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    #[inline]
    pub fn contains_key(&self, seq: &SeqId) -> bool {
        self.index.contains_key(seq)
    }

    /// Slot of `seq`, valid until the next insert or removal.
    #[inline]
    pub fn slot(&self, seq: &SeqId) -> Option<u32> {
        self.index.get(seq).copied()
    }

    #[inline]
    pub fn get(&self, seq: &SeqId) -> Option<&V> {
        let i = *self.index.get(seq)?;
        self.entries.get(i as usize)
    }

    #[inline]
    pub fn get_mut(&mut self, seq: &SeqId) -> Option<&mut V> {
        let i = *self.index.get(seq)?;
        self.entries.get_mut(i as usize)
    }

    /// The entry at a slot from [`Self::slot`].
    #[inline]
    pub fn at_mut(&mut self, slot: u32) -> Option<&mut V> {
        self.entries.get_mut(slot as usize)
    }

    /// Insert or replace; returns the previous entry.
    pub fn insert(&mut self, seq: SeqId, v: V) -> Option<V> {
        if let Some(&i) = self.index.get(&seq) {
            return Some(std::mem::replace(&mut self.entries[i as usize], v));
        }
        // Sequence counts are bounded by memory far below u32::MAX entries of this size.
        self.index.insert(seq, self.entries.len() as u32);
        self.ids.push(seq);
        self.entries.push(v);
        None
    }

    pub fn remove(&mut self, seq: &SeqId) -> Option<V> {
        let i = self.index.remove(seq)? as usize;
        self.ids.swap_remove(i);
        let v = self.entries.swap_remove(i);
        if let Some(&moved) = self.ids.get(i) {
            self.index.insert(moved, i as u32);
        }
        Some(v)
    }

    pub fn keys(&self) -> impl Iterator<Item = &SeqId> + '_ {
        self.ids.iter()
    }

    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.entries.iter()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&SeqId, &V)> + '_ {
        self.ids.iter().zip(&self.entries)
    }
}

impl<V> Index<&SeqId> for SeqMap<V> {
    type Output = V;

    /// Panics on an unknown id, like `HashMap`'s index: callers check ids first.
    fn index(&self, seq: &SeqId) -> &V {
        match self.get(seq) {
            Some(v) => v,
            None => panic!("unknown {seq}"),
        }
    }
}

impl<'a, V> IntoIterator for &'a SeqMap<V> {
    type Item = (&'a SeqId, &'a V);
    type IntoIter = std::iter::Zip<std::slice::Iter<'a, SeqId>, std::slice::Iter<'a, V>>;

    fn into_iter(self) -> Self::IntoIter {
        self.ids.iter().zip(&self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_keeps_every_slot_right() {
        let mut m = SeqMap::default();
        for i in 0..10u64 {
            assert!(m.insert(SeqId(i), i * 10).is_none());
        }
        assert_eq!(m.insert(SeqId(3), 33), Some(30));
        // Remove the first, a middle one and the last: each swap must re-point the index.
        for gone in [0u64, 5, 9] {
            assert_eq!(m.remove(&SeqId(gone)).map(|v| v % 10), Some(0));
            assert!(m.remove(&SeqId(gone)).is_none());
        }
        assert_eq!(m.len(), 7);
        for i in [1u64, 2, 3, 4, 6, 7, 8] {
            let want = if i == 3 { 33 } else { i * 10 };
            assert_eq!(m.get(&SeqId(i)), Some(&want));
            let s = m.slot(&SeqId(i)).unwrap();
            assert_eq!(m.at_mut(s).copied(), Some(want));
            assert_eq!(m[&SeqId(i)], want);
        }
        let mut keys: Vec<u64> = m.keys().map(|s| s.0).collect();
        keys.sort_unstable();
        assert_eq!(keys, [1, 2, 3, 4, 6, 7, 8]);
        assert_eq!(m.iter().count(), m.values().count());
        assert!(m.at_mut(7).is_none());
    }
}
