//! The token records behind a windowed group's cached blocks, so that their hits are exact.
//!
//! A full group's cached block sits on a cached chain, so a hit checks the whole prefix
//! (every block's parent, extra key and tokens). A windowed group's block has no parent: the
//! blocks before the window are released, and evicted on their own. Its own tokens match
//! a query's, but what came before them is vouched for only by its 128-bit chained key. A
//! colliding key could then serve KV computed after other tokens.
//!
//! The lineage keeps, for every key on the prefix of a cached windowed block, one node:
//! the key before it, the extra key and the block's token ids. A node lives while a cached
//! windowed block (of any windowed group) stands on it or a node names it as its parent
//! (`refs`); identical prefixes share their nodes. A query's *verified depth* is how many
//! of its leading keys have a node whose parent, extra key and tokens are the query's:
//! a windowed block is a hit only below it. A block whose prefix disagrees with a node
//! under one of its keys (a collision) is not cached; neither is one whose new nodes would
//! take the lineage past its budget of token ids (a later miss, never wrong KV).

use rustc_hash::{FxHashMap, FxHashSet};

use super::block_hash::BlockKey;

/// No key of `keys` appears twice.
fn distinct(keys: &[BlockKey]) -> bool {
    keys.len() < 2 || keys.iter().collect::<FxHashSet<_>>().len() == keys.len()
}

#[derive(Clone, Debug)]
struct Node {
    /// The key before it (None for a prompt's first block).
    parent: Option<BlockKey>,
    extra: Option<u64>,
    /// Its block's ids: `slab[at * bs..][..bs]`.
    at: u32,
    refs: u32,
}

/// The nodes of the prefixes of cached windowed blocks (see the module doc).
#[derive(Clone, Debug, Default)]
pub(super) struct Lineage {
    nodes: FxHashMap<BlockKey, Node>,
    /// The nodes' token ids, one block's worth per slot, and the slots free for reuse.
    slab: Vec<u32>,
    free: Vec<u32>,
    bs: usize,
    /// The most token ids the nodes may hold (they hold `bs` each).
    budget: usize,
}

impl Lineage {
    pub(super) fn new(budget: usize, bs: usize) -> Self {
        // Slot indices are u32: the slab never holds more than the budget.
        Self { budget: budget.min(u32::MAX as usize * bs), bs, ..Self::default() }
    }

    fn tokens(&self, n: &Node) -> &[u32] {
        &self.slab[n.at as usize * self.bs..][..self.bs]
    }

    /// A slot holding `ids` (one block's), or None when memory runs out.
    fn store(&mut self, ids: &[u32]) -> Option<u32> {
        if let Some(at) = self.free.pop() {
            self.slab[at as usize * self.bs..][..self.bs].copy_from_slice(ids);
            return Some(at);
        }
        let at = u32::try_from(self.slab.len() / self.bs).ok()?;
        self.slab.try_reserve(self.bs).ok()?;
        self.slab.extend_from_slice(ids);
        Some(at)
    }

    /// Whether the node of `keys[i]` (if any) holds block `i` of the prefix `keys`,
    /// `tokens` (`bs` ids per block), `extra`.
    fn matches(&self, keys: &[BlockKey], tokens: &[u32], extra: Option<u64>, i: usize) -> Option<bool> {
        let bs = self.bs;
        let n = self.nodes.get(&keys[i])?;
        let parent = i.checked_sub(1).map(|j| keys[j]);
        Some(n.parent == parent && n.extra == extra && tokens.get(i * bs..(i + 1) * bs) == Some(self.tokens(n)))
    }

    /// How many leading blocks of the prefix (`keys`, one per full block of `tokens`; at
    /// most `max`) have matching nodes.
    pub(super) fn verified_depth(&self, keys: &[BlockKey], tokens: &[u32], extra: Option<u64>, max: usize) -> usize {
        let n = max.min(keys.len());
        (0..n).find(|&i| self.matches(keys, tokens, extra, i) != Some(true)).unwrap_or(n)
    }

    /// Stand a block on the prefix `keys` (its own key last) of `tokens`, `bs` ids per
    /// block, whose first `*depth` blocks have matching nodes (from [`Self::verified_depth`]
    /// over the whole prompt, kept by the caller across the blocks of one registration):
    /// the missing nodes are made and the block holds the last. Returns false, changing
    /// nothing, when a missing key already has a node (a collision, or a key repeated
    /// within the prefix), past the budget, or when memory runs out.
    pub(super) fn attach(&mut self, keys: &[BlockKey], tokens: &[u32], extra: Option<u64>, depth: &mut usize) -> bool {
        let Some(own) = keys.last().copied() else { return false };
        if *depth < keys.len() {
            if !self.make(keys, tokens, extra, *depth) {
                return false;
            }
            *depth = keys.len();
        } else {
            self.nodes.get_mut(&own).expect("own node").refs += 1;
        }
        true
    }

    /// Make the nodes of blocks `from..` of the prefix, each referencing the one before,
    /// the last one the block standing on it. (A registration usually makes one: the
    /// block after the verified depth.)
    fn make(&mut self, keys: &[BlockKey], tokens: &[u32], extra: Option<u64>, from: usize) -> bool {
        let bs = self.bs;
        let missing = &keys[from..];
        let fits = (self.nodes.len() + missing.len()) * bs <= self.budget && tokens.len() >= keys.len() * bs;
        if !fits || missing.iter().any(|k| self.nodes.contains_key(k)) || !distinct(missing) {
            return false;
        }
        let n = missing.len();
        let slots = self.free.len() + (self.slab.capacity() - self.slab.len()) / bs;
        if self.nodes.try_reserve(n).is_err() || (slots < n && self.slab.try_reserve((n - slots) * bs).is_err()) {
            return false;
        }
        for i in from..keys.len() {
            let at = self.store(&tokens[i * bs..(i + 1) * bs]).expect("room reserved");
            let parent = i.checked_sub(1).map(|j| keys[j]);
            if let Some(p) = parent {
                self.nodes.get_mut(&p).expect("parent node").refs += 1;
            }
            let refs = (i + 1 == keys.len()) as u32;
            self.nodes.insert(keys[i], Node { parent, extra, at, refs });
        }
        true
    }

    /// Drop one reference to the node of `key`, and each node left unreferenced with it,
    /// up the prefix.
    pub(super) fn release(&mut self, key: BlockKey) {
        let mut next = Some(key);
        while let Some(k) = next {
            let Some(n) = self.nodes.get_mut(&k) else { return };
            n.refs -= 1;
            if n.refs > 0 {
                return;
            }
            let n = self.nodes.remove(&k).expect("node");
            self.free.push(n.at);
            next = n.parent;
        }
    }

    pub(super) fn clear(&mut self) {
        self.nodes.clear();
        self.slab.clear();
        self.free.clear();
    }

    /// Check every node's references against the blocks standing on them (`standing`:
    /// the key of each cached block that holds a node); `Err` names the first disagreement.
    pub(super) fn check(&self, standing: impl Iterator<Item = BlockKey>) -> Result<(), String> {
        let mut refs: FxHashMap<BlockKey, u32> = FxHashMap::default();
        for k in standing {
            *refs.entry(k).or_default() += 1;
        }
        for (k, n) in &self.nodes {
            if let Some(p) = n.parent {
                if !self.nodes.contains_key(&p) {
                    return Err(format!("lineage node {k:#x} names a parent {p:#x} it lacks"));
                }
                *refs.entry(p).or_default() += 1;
            }
        }
        for (k, n) in &self.nodes {
            if refs.get(k).copied().unwrap_or(0) != n.refs || n.refs == 0 {
                return Err(format!("lineage node {k:#x} counts {} references, has {:?}", n.refs, refs.get(k)));
            }
        }
        if self.nodes.len() * self.bs > self.budget {
            return Err(format!("lineage holds {} token ids, past its budget {}", self.nodes.len() * self.bs, self.budget));
        }
        // Every slot of the slab is a node's or free, once.
        let mut slots: Vec<u32> = self.nodes.values().map(|n| n.at).chain(self.free.iter().copied()).collect();
        slots.sort_unstable();
        if slots.iter().enumerate().any(|(i, &a)| a as usize != i) || slots.len() * self.bs != self.slab.len() {
            return Err(format!("lineage slab of {} ids: node and free slots {slots:?}", self.slab.len()));
        }
        Ok(())
    }
}
