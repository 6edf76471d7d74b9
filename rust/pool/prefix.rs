//! Automatic prefix caching in the block pool: admission by token ids or by block keys,
//! appending token ids, pins, the clock, metrics and events.
//!
//! Rules (vLLM's, made exact and deterministic):
//!
//! - Admitting a prompt reuses the longest cached chain of its *full* blocks (refcounts
//!   up, idle blocks revived) and allocates the rest. At least one prompt token is always
//!   left to compute, so a fully cached prompt gives back its last block (or, with
//!   `cow_partial_hit`, a copy of it with all but the final token). The call returns the
//!   number of cached tokens and the slots of the tokens to compute.
//! - Full blocks of the prompt are registered at admission (their KV is computed in the
//!   same step); blocks filled later by [`BlockPool::append_tokens`] when they fill. A
//!   block is registered only when the block before it in the sequence is cached (the
//!   chain is intact) and its key is not taken; otherwise it simply stays uncached.
//! - Cached blocks are immutable: writing into a partly valid cached block (after a
//!   truncation) copies it first (a copy-on-write pair).
//! - A cached block records how many tokens of KV it holds: `block_size`, or fewer for a
//!   block-key prompt's partly filled last block. A lookup matches a block only with the
//!   fill it asks for, so a partial block never satisfies a full-block lookup (as in
//!   vLLM, which caches full blocks only); it can match only the partial last block of a
//!   keyed prompt of the same key chain and length, where the last-token rule recomputes
//!   it. A partial block is never a parent, never a copy-on-write source and never pinned.
//! - Sequences added or grown without token ids (`add_sequence`, `append`, `step`) work as
//!   without caching; blocks whose token ids the pool never saw are never cached.
//!
//! Every call checks and counts first and mutates only when it will succeed.

use std::borrow::Cow;

use crate::prefix_cache::block_hash::{BlockKey, ROOT_PARENT};
use crate::prefix_cache::cursor::TokenCursor;
use crate::pool::block_table::{blocks_for, BlockTable};
use crate::error::{KvError, Result};
use crate::invalid;
use crate::pool::{BlockPool, SeqEntry};
use crate::prefix_cache::{CacheConfig, CacheEvent, CacheStats, PrefixCache};
use crate::types::{BlockId, SeqId};

/// What an admission looks up: token ids (keys computed here; owned ids become the
/// sequence's cursor without a copy) or block keys.
enum Prompt<'a> {
    Tokens { tokens: Cow<'a, [u32]>, extra: Option<u64> },
    Keys { keys: &'a [BlockKey], len: usize },
}

impl BlockPool {
    /// A pool with automatic prefix caching.
    pub fn with_prefix_cache(num_blocks: usize, block_size: usize, cfg: CacheConfig) -> Result<Self> {
        let mut pool = Self::new(num_blocks, block_size)?;
        pool.cache = Some(Box::new(PrefixCache::new(num_blocks, block_size, cfg)?));
        Ok(pool)
    }

    pub fn prefix_cache(&self) -> Option<&PrefixCache> {
        self.cache.as_deref()
    }

    fn cache_ref(&self) -> Result<&PrefixCache> {
        self.cache.as_deref().ok_or_else(|| invalid!("prefix caching is off for this pool"))
    }

    fn cache_mut(&mut self) -> Result<&mut PrefixCache> {
        self.cache.as_deref_mut().ok_or_else(|| invalid!("prefix caching is off for this pool"))
    }

    /// Keys of the full blocks of `tokens` under this pool's hasher.
    pub fn block_keys(&self, tokens: &[u32], extra: Option<u64>) -> Result<Vec<BlockKey>> {
        let hasher = self.cache_ref()?.hasher();
        let mut keys = Vec::new();
        hasher.chain_keys(ROOT_PARENT, tokens, self.block_size, extra, &mut keys, &mut Vec::new());
        Ok(keys)
    }

    /// Cached tokens an admission of `tokens` would get now (no state change).
    pub fn cached_prefix_len(&self, tokens: &[u32], extra: Option<u64>) -> Result<usize> {
        let keys = self.block_keys(tokens, extra)?;
        let hit = self.cache_ref()?.lookup(&keys, Some(tokens), extra).blocks.len();
        Ok(hit * self.block_size)
    }

    /// Admit `seq` with its prompt token ids. Returns the number of cached tokens; the
    /// slots of the remaining tokens are appended to `slots`. A copy-on-write partial hit
    /// is not taken (use [`Self::add_sequence_tokens_cow`] to get the copy pairs).
    pub fn add_sequence_tokens(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        extra_key: Option<u64>,
        slots: &mut Vec<i64>,
    ) -> Result<usize> {
        self.admit(seq, Prompt::Tokens { tokens: Cow::Borrowed(tokens), extra: extra_key }, slots, None)
    }

    /// [`Self::add_sequence_tokens`] that may take a copy-on-write partial hit (when the
    /// pool's config enables it): the `(src, dst)` pair goes to `cow`, and the caller
    /// copies the block before computing.
    pub fn add_sequence_tokens_cow(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        extra_key: Option<u64>,
        slots: &mut Vec<i64>,
        cow: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<usize> {
        self.admit(seq, Prompt::Tokens { tokens: Cow::Borrowed(tokens), extra: extra_key }, slots, Some(cow))
    }

    /// [`Self::add_sequence_tokens_cow`] taking the token ids by value (they become the
    /// sequence's record without a copy).
    pub fn add_sequence_tokens_vec(
        &mut self,
        seq: SeqId,
        tokens: Vec<u32>,
        extra_key: Option<u64>,
        slots: &mut Vec<i64>,
        cow: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<usize> {
        self.admit(seq, Prompt::Tokens { tokens: Cow::Owned(tokens), extra: extra_key }, slots, Some(cow))
    }

    /// Admit `seq` from a trace that gives block keys instead of tokens (Mooncake's
    /// `hash_ids`): one key per block of the `prompt_len`-token prompt, the last one
    /// possibly for a partial block. Keys are trusted as chained content ids: equal keys
    /// mean equal content, prefix and fill. Returns the number of cached tokens. A keyed
    /// partial last block is cached with its fill: it matches only a later partial last
    /// block of the same fill (never a full-block lookup), and the sequence's first append
    /// copies it (cached blocks are immutable).
    pub fn add_sequence_block_keys(
        &mut self,
        seq: SeqId,
        keys: &[BlockKey],
        prompt_len: usize,
        slots: &mut Vec<i64>,
    ) -> Result<usize> {
        let want = blocks_for(prompt_len, self.block_size);
        if keys.len() != want {
            return Err(invalid!(
                "{} block keys for a prompt of {prompt_len} tokens: expected ceil({prompt_len}/{}) = {want}",
                keys.len(),
                self.block_size
            ));
        }
        self.admit(seq, Prompt::Keys { keys, len: prompt_len }, slots, None)
    }

    fn admit(
        &mut self,
        seq: SeqId,
        prompt: Prompt<'_>,
        slots: &mut Vec<i64>,
        cow: Option<&mut Vec<(BlockId, BlockId)>>,
    ) -> Result<usize> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSequence(seq.0));
        }
        let bs = self.block_size;
        let cache = self.cache_ref()?;
        let (keys, owned, extra, len) = match prompt {
            Prompt::Tokens { tokens, extra } => {
                let mut keys = Vec::new();
                cache.hasher().chain_keys(ROOT_PARENT, &tokens, bs, extra, &mut keys, &mut Vec::new());
                let len = tokens.len();
                (keys, Some(tokens), extra, len)
            }
            Prompt::Keys { keys, len } => (keys.to_vec(), None, None, len),
        };
        let tokens = owned.as_deref();
        Self::checked_len(0, len)?;
        // Token ids key their full blocks only; a keyed prompt's last key stands for its
        // last block, full or not.
        let last_fill = if tokens.is_some() { bs } else { len - blocks_for(len, bs).saturating_sub(1) * bs };
        let found = cache.lookup_filled(&keys, tokens, extra, last_fill);
        let h = found.blocks.len();
        // Leave at least one token to compute.
        let max_cached = len.saturating_sub(1);
        let used = h.min(max_cached / bs);
        let cow_src = match (&cow, cache.config().cow_partial_hit) {
            (Some(_), true) if h > used && max_cached > used * bs => Some(found.blocks[used]),
            _ => None,
        };
        let cached_tokens = if cow_src.is_some() { max_cached } else { used * bs };
        let need = blocks_for(len, bs) - used;
        let reserved = found.blocks[..used]
            .iter()
            .chain(cow_src.as_ref())
            .filter(|&&b| cache.is_evictable(b, &self.alloc))
            .count();
        let avail = self.num_free_blocks() - reserved;
        if need > avail {
            return Err(KvError::PoolExhausted { requested: need, free: avail });
        }

        // Commit: nothing below fails except through a bug.
        let cache = self.cache.as_deref_mut().ok_or_else(|| invalid!("prefix caching is off"))?;
        for &b in &found.blocks[..used] {
            cache.acquire(b, &mut self.alloc);
        }
        for &b in &found.blocks[used..] {
            match cow_src {
                // Held while the rest is allocated, so it cannot be evicted under the copy.
                Some(src) if src == b => cache.acquire(b, &mut self.alloc),
                _ => cache.touch_hit(b),
            }
        }
        let stamp = self.stamp();
        // Sized up front: the table would otherwise reallocate ~log2(n) times as it grows.
        let mut held = Vec::with_capacity(blocks_for(len, bs));
        held.extend_from_slice(&found.blocks[..used]);
        let mut table = BlockTable::with_blocks(held, used * bs, stamp);
        let first_new = slots.len();
        let mut no_cow = Vec::new();
        let r = self.grow(&mut table, len - used * bs, slots, &mut no_cow);
        debug_assert!(no_cow.is_empty());
        if let Err(e) = r {
            for b in table.take_blocks().into_iter().rev().chain(cow_src) {
                self.release_block(b);
            }
            return Err(e);
        }
        if let Some(src) = cow_src {
            let dst = table.blocks()[used];
            if let Some(out) = cow {
                out.push((src, dst));
            }
            self.cow_copies += 1;
            // The copied tokens are not computed: drop their slots.
            slots.drain(first_new..first_new + (cached_tokens - used * bs));
            self.release_block(src);
        }
        // Register the prompt's blocks past the hit (full ones for token ids; every keyed
        // block for block keys, the last one with its fill).
        let registrable = if tokens.is_some() { keys.len() } else { keys.len().min(table.blocks().len()) };
        self.register_chain(&table, &keys, used, registrable, tokens, extra, len);
        if let Some(c) = self.cache.as_deref_mut() {
            c.record_query(keys.len(), h, len, cached_tokens, found.collision, cow_src.is_some());
            c.record_group_hits(&[used]);
        }
        let cursor = owned.map(|t| Box::new(TokenCursor { tokens: t.into_owned(), keys, extra }));
        self.seqs.insert(seq, SeqEntry { table, mark: 0, cursor });
        self.end_op();
        Ok(cached_tokens)
    }

    /// Register blocks `from..to` of `table` under `keys`, each as the child of the one
    /// before, stopping at the first that cannot be (broken chain, key taken). `len` is
    /// the sequence's token count: block `i` holds `min(block_size, len - i * block_size)`.
    #[allow(clippy::too_many_arguments)]
    fn register_chain(
        &mut self,
        table: &BlockTable,
        keys: &[BlockKey],
        from: usize,
        to: usize,
        tokens: Option<&[u32]>,
        extra: Option<u64>,
        len: usize,
    ) {
        let bs = self.block_size;
        let Some(cache) = self.cache.as_deref_mut() else { return };
        let blocks = table.blocks();
        for i in from..to {
            let parent = if i == 0 {
                None
            } else {
                let p = blocks[i - 1];
                // Past the first block the parent is the one registered just before.
                if i == from && (cache.key_of(p) != Some(keys[i - 1]) || cache.filled(p) != Some(bs)) {
                    return;
                }
                Some(p)
            };
            let b = blocks[i];
            let filled = bs.min(len - i * bs);
            if cache.is_cached(b) {
                // Already the cached block for this key (and fill): the chain goes on
                // through it.
                if cache.key_of(b) == Some(keys[i]) && cache.filled(b) == Some(filled) {
                    continue;
                }
                return;
            }
            if filled < bs && i + 1 < to {
                return; // only a last block may be partly filled (a parent is full)
            }
            let tok = tokens.map(|t| &t[i * bs..i * bs + filled]);
            if !cache.register_in(0, b, keys[i], parent, extra, tok, filled) {
                return;
            }
        }
    }

    /// Append token ids to `seq`: new slots go to `slots`, copy-on-write pairs to `cow`.
    /// Each block that fills is registered in the cache (when the sequence was admitted
    /// with token ids and its chain is intact).
    pub fn append_tokens(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        slots: &mut Vec<i64>,
        cow: &mut Vec<(BlockId, BlockId)>,
    ) -> Result<()> {
        let hasher = self.cache_ref()?.hasher();
        let (need, _) = self.blocks_needed_for(self.table(seq)?, tokens.len(), &[])?;
        self.ensure_available(need)?;
        let mut entry = self.seqs.remove(&seq).ok_or(KvError::UnknownSequence(seq.0))?;
        let r = self.grow(&mut entry.table, tokens.len(), slots, cow);
        if r.is_ok() {
            if let Some(cur) = entry.cursor.as_mut() {
                let first = cur.push_tokens(tokens, self.block_size, hasher);
                let to = cur.keys.len();
                let len = cur.tokens.len();
                self.register_chain(&entry.table, &cur.keys, first, to, Some(&cur.tokens), cur.extra, len);
            }
        }
        self.seqs.insert(seq, entry);
        r?;
        self.end_op();
        Ok(())
    }

    /// Hard-pin (`priority` None: never evicted) or soft-pin (retention `priority` under the
    /// priority policy) the cached prefix of `tokens` (its full blocks), until `unpin` or
    /// until the clock reaches `expires_at`. Errors if the prefix is not fully cached.
    pub fn pin_prefix_tokens(
        &mut self,
        tokens: &[u32],
        extra_key: Option<u64>,
        priority: Option<u32>,
        expires_at: Option<u64>,
    ) -> Result<u64> {
        let keys = self.block_keys(tokens, extra_key)?;
        self.pin_chain(&keys, Some(tokens), extra_key, priority, expires_at)
    }

    /// [`Self::pin_prefix_tokens`] for a prefix given as block keys, each standing for a
    /// full block (a partly filled keyed block cannot be pinned).
    pub fn pin_prefix_keys(&mut self, keys: &[BlockKey], priority: Option<u32>, expires_at: Option<u64>) -> Result<u64> {
        self.pin_chain(keys, None, None, priority, expires_at)
    }

    fn pin_chain(
        &mut self,
        keys: &[BlockKey],
        tokens: Option<&[u32]>,
        extra: Option<u64>,
        priority: Option<u32>,
        expires_at: Option<u64>,
    ) -> Result<u64> {
        if keys.is_empty() {
            return Err(invalid!("a pin needs at least one full block ({} tokens)", self.block_size));
        }
        let cache = self.cache_mut()?;
        let found = cache.lookup(keys, tokens, extra);
        if found.blocks.len() < keys.len() {
            return Err(invalid!(
                "prefix is not cached: only {} of its {} blocks are",
                found.blocks.len(),
                keys.len()
            ));
        }
        cache.pin(&found.blocks, priority, expires_at)
    }

    pub fn unpin(&mut self, pin_id: u64) -> Result<()> {
        self.cache_mut()?.unpin(pin_id)
    }

    /// Drive the logical clock from the caller's step counter (it never goes back).
    pub fn set_clock(&mut self, t: u64) -> Result<()> {
        self.cache_mut()?.set_clock(t)
    }

    pub fn cache_stats(&self) -> Result<CacheStats> {
        Ok(self.cache_ref()?.stats())
    }

    /// Move the recorded cache events into `out`, oldest first.
    pub fn drain_events(&mut self, out: &mut Vec<CacheEvent>) -> Result<()> {
        self.cache_mut()?.drain_events(out);
        Ok(())
    }

    /// Forget every cached block (refused while pins are held). Returns how many.
    pub fn reset_prefix_cache(&mut self) -> Result<usize> {
        let cache = self.cache.as_deref_mut().ok_or_else(|| invalid!("prefix caching is off for this pool"))?;
        cache.reset(&mut self.alloc)
    }
}
