//! Prefix-caching methods of `BlockPool`, `CacheStats`, and the argument checks for token
//! ids (`uint32` range) and block keys (64-bit ids or `[n, 2]` uint64 128-bit keys).

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::convert::{arg, int_scalar, int_vec};
use super::errors::{invalid, IntoPyResult};
use super::pool::PyBlockPool;
use crate::block_hash::{BlockHasher, BlockKey};
use crate::eviction::EvictionPolicy;
use crate::prefix_cache::{CacheConfig, CacheEvent, CacheStats, MAX_EVENTS_LIMIT};
use crate::types::{BlockId, SeqId};

/// Keyword options of `BlockPool(...)` for the prefix cache; `None` = not given.
pub struct CacheOptions<'a> {
    pub eviction: Option<&'a str>,
    pub verify_tokens: Option<bool>,
    pub cow_partial_hit: Option<bool>,
    pub record_events: Option<bool>,
    pub hash_bits: Option<u32>,
    pub max_events: Option<&'a Bound<'a, PyAny>>,
}

impl CacheOptions<'_> {
    /// The cache config, `None` without caching. Cache options without
    /// `prefix_caching=True` are an error rather than silently ignored.
    pub fn config(&self, py: Python<'_>, enabled: bool) -> PyResult<Option<CacheConfig>> {
        let given = self.eviction.is_some()
            || self.verify_tokens.is_some()
            || self.cow_partial_hit.is_some()
            || self.record_events.is_some()
            || self.hash_bits.is_some()
            || self.max_events.is_some();
        if !enabled {
            if given {
                return Err(invalid(py, "prefix-cache options need prefix_caching=True"));
            }
            return Ok(None);
        }
        let d = CacheConfig::default();
        let policy = match self.eviction {
            Some(s) => s.parse::<EvictionPolicy>().py_err(py)?,
            None => d.policy,
        };
        let hasher = match self.hash_bits {
            None | Some(128) => BlockHasher::Xxh3,
            Some(b @ 1..=127) => BlockHasher::Truncated { bits: b as u8 },
            Some(b) => return Err(invalid(py, format!("hash_bits must be in 1..=128, got {b}"))),
        };
        let record_events = self.record_events.unwrap_or(d.record_events);
        let max_events = match self.max_events {
            None => d.max_events,
            Some(_) if !record_events => return Err(invalid(py, "max_events needs record_events=True")),
            Some(obj) => {
                let v = int_scalar(obj, "max_events")?;
                usize::try_from(v)
                    .ok()
                    .filter(|n| (1..=MAX_EVENTS_LIMIT).contains(n))
                    .ok_or_else(|| invalid(py, format!("max_events must be in 1..={MAX_EVENTS_LIMIT} events, got {v}")))?
            }
        };
        Ok(Some(CacheConfig {
            policy,
            verify_tokens: self.verify_tokens.unwrap_or(d.verify_tokens),
            cow_partial_hit: self.cow_partial_hit.unwrap_or(d.cow_partial_hit),
            hasher,
            record_events,
            max_events,
        }))
    }
}

macro_rules! tokens_from {
    ($obj:expr, $name:expr, $($t:ty),*) => {
        $(
            if let Ok(a) = $obj.cast::<PyArray1<$t>>() {
                let ro = a.try_readonly().map_err(|e| invalid($obj.py(), format!("{}: {e}", $name)))?;
                let view = ro.as_array();
                // A branch-free range check first (it vectorizes), then a plain cast; the
                // error path finds the first bad id for the message.
                #[allow(clippy::unnecessary_fallible_conversions, irrefutable_let_patterns)]
                let fits = |v: $t| u32::try_from(v).is_ok();
                if !view.iter().fold(true, |ok, &v| ok & fits(v)) {
                    if let Some((i, v)) = view.iter().enumerate().find(|(_, &v)| !fits(v)) {
                        return Err(invalid($obj.py(), format!("{}[{i}] = {v} is not a token id in 0..2**32", $name)));
                    }
                }
                return Ok(match view.as_slice() {
                    Some(s) => s.iter().map(|&v| v as u32).collect(),
                    None => view.iter().map(|&v| v as u32).collect(),
                });
            }
        )*
    };
}

/// Token ids: a 1-D integer array (int32 and int64 on the fast path) or a sequence of
/// ints, each in `0..2**32`.
pub fn token_ids(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u32>> {
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        if arr.ndim() == 1 {
            tokens_from!(obj, name, i32, i64, u32, u64, i16, u16, i8, u8);
        }
    }
    // Everything else (wrong shape or dtype, Python sequences) gets int_vec's checks.
    int_vec(obj, name)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            u32::try_from(v)
                .map_err(|_| invalid(obj.py(), format!("{name}[{i}] = {v} is not a token id in 0..2**32")))
        })
        .collect()
}

/// Block keys: a 1-D array of non-negative ints below 2**64 (uint64 whole range), or an
/// `[n, 2]` uint64 array of `(high, low)` 64-bit halves of 128-bit keys.
pub fn block_keys(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<BlockKey>> {
    let py = obj.py();
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        if arr.ndim() == 2 {
            let a = obj.cast::<PyArray2<u64>>().map_err(|_| {
                invalid(py, format!("{name}: a 2-D key array must be uint64 of shape [n, 2] (high, low)"))
            })?;
            if arr.shape()[1] != 2 {
                return Err(invalid(py, format!("{name}: 2-D keys must have 2 columns (high, low), got shape {:?}", arr.shape())));
            }
            let ro = a.try_readonly().map_err(|e| invalid(py, format!("{name}: {e}")))?;
            let view = ro.as_array();
            return Ok(view.rows().into_iter().map(|r| ((r[0] as u128) << 64) | r[1] as u128).collect());
        }
        if let Ok(a) = obj.cast::<PyArray1<u64>>() {
            let ro = a.try_readonly().map_err(|e| invalid(py, format!("{name}: {e}")))?;
            return Ok(ro.as_array().iter().map(|&v| v as u128).collect());
        }
    }
    int_vec(obj, name)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            u64::try_from(v)
                .map(|k| k as u128)
                .map_err(|_| invalid(py, format!("{name}[{i}] = {v} is negative: keys are unsigned")))
        })
        .collect()
}

fn keys_array<'py>(py: Python<'py>, keys: impl ExactSizeIterator<Item = BlockKey>) -> PyResult<Bound<'py, PyArray2<u64>>> {
    let n = keys.len();
    let flat: Vec<u64> = keys.flat_map(|k| [(k >> 64) as u64, k as u64]).collect();
    PyArray1::from_vec(py, flat).reshape([n, 2])
}

fn pairs_array<'py>(py: Python<'py>, pairs: &[(BlockId, BlockId)]) -> PyResult<Bound<'py, PyArray2<i64>>> {
    super::pool::cow_array(py, pairs)
}

/// An optional non-negative int argument (`None` allowed); floats, bools, negatives and
/// values past the target type are `InvalidArgumentError`s.
fn opt_uint<T: TryFrom<i64>>(obj: &Bound<'_, PyAny>, name: &str, range: &str) -> PyResult<Option<T>> {
    if obj.is_none() {
        return Ok(None);
    }
    let v = int_scalar(obj, name)?;
    T::try_from(v).map(Some).map_err(|_| invalid(obj.py(), format!("{name} must be in {range}, got {v}")))
}

/// `hash_bits` of `BlockPool(...)`: `None` or an int (its range, 1..=128, is checked
/// with the other cache options).
pub(crate) fn hash_bits(obj: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
    opt_uint(obj, "hash_bits", "1..=128")
}

fn extra_key(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    // int_scalar stops at int64; extra keys above 2**63 are not needed from Python.
    opt_uint(obj, "extra_key", "0..2**63")
}

fn priority(obj: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
    opt_uint(obj, "priority", "0..2**32")
}

fn expires_at(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    opt_uint(obj, "expires_at", "0..2**63")
}

fn clock(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    opt_uint(obj, "t", "0..2**63")?.ok_or_else(|| invalid(obj.py(), "t must be an int, got None"))
}

fn pin_id(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    opt_uint(obj, "pin_id", "issued pin ids")?.ok_or_else(|| invalid(obj.py(), "pin_id must be an int, got None"))
}

type Slots<'py> = Bound<'py, PyArray1<i64>>;
type Pairs<'py> = Bound<'py, PyArray2<i64>>;

#[pymethods]
impl PyBlockPool {
    /// Whether this pool caches prefixes (``prefix_caching=True``).
    #[getter]
    fn prefix_caching(&self) -> bool {
        self.with(|p| p.prefix_cache().is_some())
    }

    /// Admit ``seq_id`` with its prompt token ids, reusing the longest cached prefix of full
    /// blocks.
    ///
    /// At least one prompt token is always left to compute (its logits are needed), so a fully
    /// cached prompt reports one token fewer than its length as cached.
    ///
    /// Args:
    ///     seq_id: the new sequence's id, a non-negative int64.
    ///     token_ids: the prompt's token ids (any integer dtype, each in ``0..2**32``).
    ///     extra_key: ``0..2**63``, mixed into every block's key (an adapter id, a tenant salt):
    ///         prompts with different extra keys never share blocks (default: none).
    ///
    /// Returns:
    ///     ``(cached_tokens, slots, cow)``: the number of leading prompt tokens whose KV is
    ///     reused; the int64 slots of the remaining ``len(token_ids) - cached_tokens`` tokens;
    ///     an int64 ``[k, 2]`` array of ``(src, dst)`` blocks to copy before computing (k <= 1,
    ///     only with ``cow_partial_hit``).
    ///
    /// Raises:
    ///     DuplicateSequenceError: ``seq_id`` is live.
    ///     PoolExhaustedError: not enough free or evictable blocks (nothing changed).
    ///     InvalidArgumentError: a negative id, a token id outside ``0..2**32``, an
    ///         ``extra_key`` outside ``0..2**63``, a non-integer or non-1-D array, or caching
    ///         off.
    #[pyo3(signature = (seq_id, token_ids, extra_key = None))]
    fn add_sequence_tokens<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        token_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
    ) -> PyResult<(usize, Slots<'py>, Pairs<'py>)> {
        let (seq, extra) = (seq_id, extra_key);
        let tokens = self::token_ids(token_ids, "token_ids")?;
        let (cached, slots, cow) = self
            .run(py, tokens.len(), |pool| {
                let (mut slots, mut cow) = (Vec::new(), Vec::new());
                let c = pool.add_sequence_tokens_vec(seq, tokens, extra, &mut slots, &mut cow)?;
                Ok((c, slots, cow))
            })
            .py_err(py)?;
        Ok((cached, PyArray1::from_vec(py, slots), pairs_array(py, &cow)?))
    }

    /// Admit ``seq_id`` from a trace that gives block ids instead of tokens (Mooncake's
    /// ``hash_ids``), reusing the longest cached prefix.
    ///
    /// Each key stands for one block's chained content (equal keys = equal content, prefix
    /// and fill). The last key may stand for a partly filled block (``prompt_len %
    /// block_size`` tokens): it is cached with its fill, matches only a later prompt's
    /// partly filled last block of the same key and fill (never a full block: a lookup
    /// never reuses more tokens than were written), and the sequence's first append copies
    /// it (copy-on-write). A fill mismatch counts as a collision.
    ///
    /// Args:
    ///     seq_id: the new sequence's id, a non-negative int64.
    ///     block_keys: exactly ``ceil(prompt_len / block_size)`` keys: a 1-D array of ints in
    ///         ``0..2**64``, or a uint64 ``[n, 2]`` array of 128-bit keys as ``(high, low)``
    ///         halves.
    ///     prompt_len: the prompt's length, in tokens (at most ``2**27``).
    ///
    /// Returns:
    ///     ``(cached_tokens, slots)`` as for :meth:`add_sequence_tokens`.
    ///
    /// Raises:
    ///     DuplicateSequenceError: ``seq_id`` is live.
    ///     PoolExhaustedError: not enough free or evictable blocks (nothing changed).
    ///     InvalidArgumentError: a wrong key count or width, negative keys, a negative id or
    ///         length, or caching off.
    fn add_sequence_block_keys<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        block_keys: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = arg::prompt_len)] prompt_len: usize,
    ) -> PyResult<(usize, Slots<'py>)> {
        let (seq, len) = (seq_id, prompt_len);
        let keys = self::block_keys(block_keys, "block_keys")?;
        let (cached, slots) = py
            .detach(|| {
                let mut slots = Vec::new();
                let c = self.with(|p| p.add_sequence_block_keys(seq, &keys, len, &mut slots))?;
                Ok((c, slots))
            })
            .py_err(py)?;
        Ok((cached, PyArray1::from_vec(py, slots)))
    }

    /// Append token ids to ``seq_id`` (as :meth:`append`), registering each block that fills
    /// in the cache when the sequence was admitted with token ids and every block before it is
    /// cached. Writing into a cached block copies it first.
    ///
    /// Args:
    ///     seq_id: a live sequence.
    ///     token_ids: the new tokens' ids (any integer dtype, each in ``0..2**32``).
    ///
    /// Returns:
    ///     ``(slots, cow)`` as for :meth:`append`.
    ///
    /// Raises:
    ///     UnknownSequenceError: ``seq_id`` is not live.
    ///     PoolExhaustedError: not enough free or evictable blocks (nothing was appended).
    ///     InvalidArgumentError: a token id outside ``0..2**32``, a non-integer or non-1-D
    ///         array, or caching off.
    fn append_tokens<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = arg::seq_id)] seq_id: SeqId,
        token_ids: &Bound<'py, PyAny>,
    ) -> PyResult<(Slots<'py>, Pairs<'py>)> {
        let seq = seq_id;
        let tokens = self::token_ids(token_ids, "token_ids")?;
        let (slots, cow) = py
            .detach(|| {
                let (mut slots, mut cow) = (Vec::new(), Vec::new());
                self.with(|p| p.append_tokens(seq, &tokens, &mut slots, &mut cow)).map(|_| (slots, cow))
            })
            .py_err(py)?;
        Ok((PyArray1::from_vec(py, slots), pairs_array(py, &cow)?))
    }

    /// Keys of the full blocks of ``token_ids`` (a partial last block has none). Stable across
    /// processes and runs.
    ///
    /// Each key is XXH3-128 with seed ``b"pkvpool1"`` over ``parent key (16 bytes LE) || 0x00 |
    /// 0x01 extra (8 bytes LE) || token ids (4 bytes LE each)``, parent 0 for the first block.
    ///
    /// Args:
    ///     token_ids: token ids (any integer dtype, each in ``0..2**32``).
    ///     extra_key: as for :meth:`add_sequence_tokens`.
    ///
    /// Returns:
    ///     uint64 ``[len(token_ids) // block_size, 2]``: each key's ``(high, low)`` halves.
    ///
    /// Raises:
    ///     InvalidArgumentError: a token id outside ``0..2**32``, an ``extra_key`` outside
    ///         ``0..2**63``, or caching off.
    #[pyo3(signature = (token_ids, extra_key = None))]
    fn block_keys<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
    ) -> PyResult<Bound<'py, PyArray2<u64>>> {
        let tokens = self::token_ids(token_ids, "token_ids")?;
        let extra = extra_key;
        let keys = self.detached(py, |p| p.block_keys(&tokens, extra)).py_err(py)?;
        keys_array(py, keys.into_iter())
    }

    /// Tokens of ``token_ids`` held by cached full blocks now (before the last-token rule of
    /// :meth:`add_sequence_tokens`). Changes nothing and touches nothing.
    ///
    /// Args:
    ///     token_ids: token ids (any integer dtype, each in ``0..2**32``).
    ///     extra_key: as for :meth:`add_sequence_tokens`.
    ///
    /// Returns:
    ///     A number of tokens, a multiple of ``block_size``.
    ///
    /// Raises:
    ///     InvalidArgumentError: a token id outside ``0..2**32``, an ``extra_key`` outside
    ///         ``0..2**63``, or caching off.
    #[pyo3(signature = (token_ids, extra_key = None))]
    fn cached_prefix_len(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
    ) -> PyResult<usize> {
        let tokens = self::token_ids(token_ids, "token_ids")?;
        let extra = extra_key;
        self.detached(py, |p| p.cached_prefix_len(&tokens, extra)).py_err(py)
    }

    /// Pin the cached full blocks of ``token_ids`` and return a pin id for :meth:`unpin`.
    ///
    /// Without ``priority`` the pin is hard: the blocks are never evicted. With a ``priority``
    /// the pin is soft: under ``eviction="priority"`` idle blocks with a lower priority go
    /// first.
    ///
    /// Args:
    ///     token_ids: the prefix's token ids (any integer dtype, each in ``0..2**32``).
    ///     extra_key: as for :meth:`add_sequence_tokens`.
    ///     priority: ``0..2**32`` for a soft pin; None (default) for a hard pin.
    ///     expires_at: the logical time (see :meth:`set_clock`) at which the pin lapses; None
    ///         (default) for never.
    ///
    /// Returns:
    ///     The pin id.
    ///
    /// Raises:
    ///     InvalidArgumentError: the prefix has no full block or is not fully cached;
    ///         ``expires_at`` is not after the current clock; a value out of range; caching
    ///         off.
    #[pyo3(signature = (token_ids, extra_key = None, *, priority = None, expires_at = None))]
    fn pin_prefix(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
        #[pyo3(from_py_with = priority)] priority: Option<u32>,
        #[pyo3(from_py_with = expires_at)] expires_at: Option<u64>,
    ) -> PyResult<u64> {
        let tokens = self::token_ids(token_ids, "token_ids")?;
        self.detached(py, |p| p.pin_prefix_tokens(&tokens, extra_key, priority, expires_at)).py_err(py)
    }

    /// :meth:`pin_prefix` for a prefix given as block keys, each standing for a full block
    /// (a partly filled keyed block cannot be pinned).
    ///
    /// Args:
    ///     block_keys: as for :meth:`add_sequence_block_keys`, one key per full block to pin.
    ///     priority: as for :meth:`pin_prefix`.
    ///     expires_at: as for :meth:`pin_prefix`.
    ///
    /// Returns:
    ///     The pin id.
    ///
    /// Raises:
    ///     InvalidArgumentError: no key, a key that is not cached as a full block, a wrong key
    ///         width or a negative key; ``expires_at`` is not after the current clock;
    ///         caching off.
    #[pyo3(signature = (block_keys, *, priority = None, expires_at = None))]
    fn pin_block_keys(
        &self,
        py: Python<'_>,
        block_keys: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = priority)] priority: Option<u32>,
        #[pyo3(from_py_with = expires_at)] expires_at: Option<u64>,
    ) -> PyResult<u64> {
        let keys = self::block_keys(block_keys, "block_keys")?;
        self.detached(py, |p| p.pin_prefix_keys(&keys, priority, expires_at)).py_err(py)
    }

    /// Release a pin; its blocks become evictable again once no other pin holds them.
    ///
    /// Raises:
    ///     InvalidArgumentError: an unknown, released or lapsed pin id, or caching off.
    fn unpin(&self, py: Python<'_>, #[pyo3(from_py_with = pin_id)] pin_id: u64) -> PyResult<()> {
        self.with(|p| p.unpin(pin_id)).py_err(py)
    }

    /// Drive the logical clock from the caller's step counter from now on (by default it counts
    /// completed admissions, appends, steps, forks, truncations and frees). Pins whose
    /// ``expires_at`` is reached are released.
    ///
    /// Args:
    ///     t: the new time, ``0..2**63``, not before the current one.
    ///
    /// Raises:
    ///     InvalidArgumentError: ``t`` goes back or is out of range, or caching off.
    fn set_clock(&self, py: Python<'_>, #[pyo3(from_py_with = clock)] t: u64) -> PyResult<()> {
        self.with(|p| p.set_clock(t)).py_err(py)
    }

    /// Hit metrics and occupancy of the prefix cache.
    ///
    /// Returns:
    ///     A :class:`CacheStats` snapshot.
    ///
    /// Raises:
    ///     InvalidArgumentError: caching off.
    fn cache_stats(&self, py: Python<'_>) -> PyResult<PyCacheStats> {
        self.with(|p| p.cache_stats()).py_err(py).map(PyCacheStats)
    }

    /// Take the queued cache events (``record_events=True``; none otherwise), oldest first.
    ///
    /// The queue keeps the newest ``max_events`` events: when
    /// :attr:`CacheStats.dropped_events` grew since the last drain, older events were lost
    /// and a consumer mirroring the cache must resynchronise.
    ///
    /// Returns:
    ///     A dict of arrays of equal length ``n``: ``kind`` uint8 (:data:`EVENT_STORED`,
    ///     :data:`EVENT_REMOVED`, :data:`EVENT_ALL_CLEARED`), ``block`` int64 (-1 for a clear),
    ///     ``key`` and ``parent_key`` uint64 ``[n, 2]`` (high, low), ``has_parent`` bool,
    ///     ``tokens`` uint32 (tokens of KV the block holds: ``block_size``, fewer for a keyed
    ///     prompt's partly filled last block, 0 for a clear), ``clock`` uint64 (logical
    ///     time).
    ///
    /// Raises:
    ///     InvalidArgumentError: caching off.
    fn drain_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut ev: Vec<CacheEvent> = Vec::new();
        self.with(|p| p.drain_events(&mut ev)).py_err(py)?;
        let d = PyDict::new(py);
        d.set_item("kind", PyArray1::from_iter(py, ev.iter().map(|e| e.kind as u8)))?;
        d.set_item("block", PyArray1::from_iter(py, ev.iter().map(|e| e.block.map_or(-1, |b| b.0 as i64))))?;
        d.set_item("key", keys_array(py, ev.iter().map(|e| e.key))?)?;
        d.set_item("parent_key", keys_array(py, ev.iter().map(|e| e.parent_key.unwrap_or(0)))?)?;
        d.set_item("has_parent", PyArray1::from_iter(py, ev.iter().map(|e| e.parent_key.is_some())))?;
        d.set_item("tokens", PyArray1::from_iter(py, ev.iter().map(|e| e.tokens)))?;
        d.set_item("clock", PyArray1::from_iter(py, ev.iter().map(|e| e.clock)))?;
        Ok(d)
    }

    /// Forget every cached block: idle ones become free, live ones stay with their sequences,
    /// uncached.
    ///
    /// Returns:
    ///     The number of blocks that were cached.
    ///
    /// Raises:
    ///     InvalidArgumentError: pins are held, or caching off.
    fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<usize> {
        self.detached(py, |p| p.reset_prefix_cache()).py_err(py)
    }
}

/// Prefix-cache metrics of a :class:`BlockPool`, taken by :meth:`BlockPool.cache_stats`
/// (hits count successful admissions). Counts are in blocks, tokens and admissions.
#[pyclass(name = "CacheStats", module = "pykvpool", frozen)]
pub struct PyCacheStats(pub CacheStats);

/// The `CacheStats` getters of plain fields: `field: type`, each after its `///` doc lines.
macro_rules! stat_getters {
    ($($(#[doc = $doc:tt])* $field:ident: $t:ty),* $(,)?) => {
        #[pymethods]
        impl PyCacheStats {
            $( $(#[doc = $doc])* #[getter] fn $field(&self) -> $t { self.0.$field } )*

            /// Eviction policy name.
            #[getter]
            fn policy(&self) -> &'static str {
                self.0.policy.name()
            }
            /// ``hit_tokens / query_tokens`` (0.0 before any query).
            #[getter]
            fn hit_rate(&self) -> f64 {
                self.0.hit_rate()
            }
            /// ``hit_blocks / query_blocks`` (0.0 before any query).
            #[getter]
            fn block_hit_rate(&self) -> f64 {
                self.0.block_hit_rate()
            }

            /// All fields as a dict.
            ///
            /// Returns:
            ///     ``{name: value}`` for every property of this class: ints, the rates floats,
            ///     ``policy`` a str.
            fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let d = PyDict::new(py);
                d.set_item("policy", self.0.policy.name())?;
                $( d.set_item(stringify!($field), self.0.$field)?; )*
                d.set_item("hit_rate", self.0.hit_rate())?;
                d.set_item("block_hit_rate", self.0.block_hit_rate())?;
                Ok(d)
            }

            fn __repr__(&self) -> String {
                let s = &self.0;
                format!(
                    "CacheStats(policy={}, hit_rate={:.4}, block_hit_rate={:.4}, cached_blocks={}, evictable_blocks={}, evictions={})",
                    s.policy, s.hit_rate(), s.block_hit_rate(), s.cached_blocks, s.evictable_blocks, s.evictions
                )
            }
        }
    };
}

stat_getters!(
    /// Admissions that looked the cache up.
    queries: u64,
    /// Prompt blocks looked up (full blocks for token ids; every key for block keys).
    query_blocks: u64,
    /// Leading prompt blocks found cached, before the last-token rule.
    hit_blocks: u64,
    /// Prompt tokens admitted.
    query_tokens: u64,
    /// Prompt tokens returned as cached (after the last-token rule).
    hit_tokens: u64,
    /// Blocks registered in the cache so far.
    stored_blocks: u64,
    /// Idle cached blocks reclaimed by allocations so far.
    evictions: u64,
    /// Lookups that found a key whose block failed verification: parent, extra key,
    /// token ids or fill (a miss).
    collisions: u64,
    /// Admissions that took a copy-on-write partial hit.
    cow_hits: u64,
    /// Blocks in the cache now (live or idle).
    cached_blocks: usize,
    /// Cached blocks with refcount 0.
    idle_blocks: usize,
    /// Idle blocks that are not hard-pinned (counted in ``num_free_blocks``).
    evictable_blocks: usize,
    /// Cached blocks under at least one hard pin.
    pinned_blocks: usize,
    /// Live pins.
    num_pins: usize,
    /// Current logical time (see :meth:`BlockPool.set_clock`).
    clock: u64,
    /// Events recorded and not drained yet (at most ``max_events``).
    pending_events: usize,
    /// Events dropped so far, oldest first, because the queue was full.
    dropped_events: u64,
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCacheStats>()?;
    m.add("EVENT_STORED", 0u8)?;
    m.add("EVENT_REMOVED", 1u8)?;
    m.add("EVENT_ALL_CLEARED", 2u8)?;
    Ok(())
}
