//! The pool's live sequences: a dense slab of entries plus an id -> slot index.
//!
//! A batched decode step visits every running sequence twice (plan, then apply). With the
//! entries in a hash map, the second visit either hashed every id again or swept the whole
//! map; here the plan hashes each id once, keeps the slot, and the apply pass reaches the
//! entry by that slot. Entries live contiguously, so a step walks one array instead of
//! hash buckets. Removal swaps the last entry into the hole (slots are not stable across
//! removals: hold one only within a call).
//!
//! In front of the hash index sits a direct-mapped hint table (Fibonacci hashing of the
//! id, one slot per bucket, at most a quarter full). A hint is only a guess, confirmed by
//! `ids[slot] == id`, so a stale or overwritten hint costs a fall back to the hash index,
//! never a wrong answer. A decode step resolves every running id; the hint answers with
//! two dependent loads where the hash probe takes a multiply, a control-group scan and
//! a key comparison (`cargo bench --bench core_step`, see `benches/RESULTS.md`).

use std::ops::Index;

use rustc_hash::FxHashMap;

use crate::types::SeqId;

/// Live sequences keyed by [`SeqId`], stored densely.
#[derive(Clone, Debug)]
pub struct SeqMap<V> {
    ids: Vec<SeqId>,
    entries: Vec<V>,
    index: FxHashMap<SeqId, u32>,
    /// `hint[bucket(id)]`: the slot `id` had when it was last inserted or moved; empty,
    /// or a power of two at least `4 * len` long.
    hint: Vec<u32>,
    /// `64 - log2(hint.len())`: the bucket is the top bits of the Fibonacci product.
    shift: u32,
}

impl<V> Default for SeqMap<V> {
    fn default() -> Self {
        Self { ids: Vec::new(), entries: Vec::new(), index: FxHashMap::default(), hint: Vec::new(), shift: 64 }
    }
}

/// 2^64 / golden ratio: consecutive ids land in well-spread buckets.
const FIB: u64 = 0x9E37_79B9_7F4A_7C15;
const MIN_HINTS: usize = 64;

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
        self.slot(seq).is_some()
    }

    #[inline]
    fn bucket(&self, seq: SeqId) -> usize {
        // shift is 64 only while the table is empty; checked_shr then gives None.
        seq.0.wrapping_mul(FIB).checked_shr(self.shift).unwrap_or(0) as usize
    }

    /// Slot of `seq`, valid until the next insert or removal.
    #[inline]
    pub fn slot(&self, seq: &SeqId) -> Option<u32> {
        if let Some(&s) = self.hint.get(self.bucket(*seq)) {
            if self.ids.get(s as usize) == Some(seq) {
                return Some(s);
            }
        }
        self.index.get(seq).copied()
    }

    #[inline]
    pub fn get(&self, seq: &SeqId) -> Option<&V> {
        let i = self.slot(seq)?;
        self.entries.get(i as usize)
    }

    #[inline]
    pub fn get_mut(&mut self, seq: &SeqId) -> Option<&mut V> {
        let i = self.slot(seq)?;
        self.entries.get_mut(i as usize)
    }

    /// Point `seq`'s bucket at `slot`, growing (and refilling) the table first when the
    /// entries would fill more than a quarter of it.
    fn set_hint(&mut self, seq: SeqId, slot: u32) {
        if 4 * self.ids.len() > self.hint.len() {
            let n = (4 * self.ids.len()).next_power_of_two().max(MIN_HINTS);
            self.shift = 64 - n.trailing_zeros();
            self.hint = vec![u32::MAX; n];
            for (i, &id) in self.ids.iter().enumerate() {
                let b = self.bucket(id);
                self.hint[b] = i as u32;
            }
        }
        let b = self.bucket(seq);
        if let Some(h) = self.hint.get_mut(b) {
            *h = slot;
        }
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
        let slot = self.entries.len() as u32;
        self.index.insert(seq, slot);
        self.ids.push(seq);
        self.entries.push(v);
        self.set_hint(seq, slot);
        None
    }

    pub fn remove(&mut self, seq: &SeqId) -> Option<V> {
        let i = self.index.remove(seq)? as usize;
        self.ids.swap_remove(i);
        let v = self.entries.swap_remove(i);
        if let Some(&moved) = self.ids.get(i) {
            self.index.insert(moved, i as u32);
            self.set_hint(moved, i as u32);
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

    /// Inserts and removals of dense, strided and scattered ids against a `HashMap`:
    /// every lookup agrees, whatever the hint table holds (stale, overwritten, regrown).
    #[test]
    fn hinted_lookups_agree_with_a_plain_map() {
        use std::collections::HashMap;
        let mut m = SeqMap::default();
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..20_000u64 {
            let r = rnd();
            let id = match r % 3 {
                0 => r >> 40 & 1023,           // dense window: buckets never collide
                1 => (r >> 40 & 255) << 32,    // strided: identical low bits
                _ => r,                        // scattered
            };
            if rnd() % 5 < 3 {
                assert_eq!(m.insert(SeqId(id), round), model.insert(id, round));
            } else {
                assert_eq!(m.remove(&SeqId(id)), model.remove(&id));
            }
            let probe = [id, id ^ 1, rnd() >> 40 & 1023];
            for p in probe {
                assert_eq!(m.get(&SeqId(p)), model.get(&p), "id {p} after round {round}");
                assert_eq!(m.contains_key(&SeqId(p)), model.contains_key(&p));
                if let Some(s) = m.slot(&SeqId(p)) {
                    assert_eq!(m.keys().nth(s as usize), Some(&SeqId(p)));
                }
            }
        }
        assert_eq!(m.len(), model.len());
        for (id, v) in &model {
            assert_eq!(m.get_mut(&SeqId(*id)), Some(&mut v.clone()));
        }
    }
}
