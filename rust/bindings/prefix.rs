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
    #[getter]
    fn prefix_caching(&self) -> bool {
        self.pool().prefix_cache().is_some()
    }

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
                let c = self.pool().add_sequence_block_keys(seq, &keys, len, &mut slots)?;
                Ok((c, slots))
            })
            .py_err(py)?;
        Ok((cached, PyArray1::from_vec(py, slots)))
    }

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
                self.pool().append_tokens(seq, &tokens, &mut slots, &mut cow).map(|_| (slots, cow))
            })
            .py_err(py)?;
        Ok((PyArray1::from_vec(py, slots), pairs_array(py, &cow)?))
    }

    #[pyo3(signature = (token_ids, extra_key = None))]
    fn block_keys<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
    ) -> PyResult<Bound<'py, PyArray2<u64>>> {
        let tokens = self::token_ids(token_ids, "token_ids")?;
        let extra = extra_key;
        let keys = py.detach(|| self.pool().block_keys(&tokens, extra)).py_err(py)?;
        keys_array(py, keys.into_iter())
    }

    #[pyo3(signature = (token_ids, extra_key = None))]
    fn cached_prefix_len(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = extra_key)] extra_key: Option<u64>,
    ) -> PyResult<usize> {
        let tokens = self::token_ids(token_ids, "token_ids")?;
        let extra = extra_key;
        py.detach(|| self.pool().cached_prefix_len(&tokens, extra)).py_err(py)
    }

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
        py.detach(|| self.pool().pin_prefix_tokens(&tokens, extra_key, priority, expires_at)).py_err(py)
    }

    #[pyo3(signature = (block_keys, *, priority = None, expires_at = None))]
    fn pin_block_keys(
        &self,
        py: Python<'_>,
        block_keys: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = priority)] priority: Option<u32>,
        #[pyo3(from_py_with = expires_at)] expires_at: Option<u64>,
    ) -> PyResult<u64> {
        let keys = self::block_keys(block_keys, "block_keys")?;
        py.detach(|| self.pool().pin_prefix_keys(&keys, priority, expires_at)).py_err(py)
    }

    fn unpin(&self, py: Python<'_>, #[pyo3(from_py_with = pin_id)] pin_id: u64) -> PyResult<()> {
        self.pool().unpin(pin_id).py_err(py)
    }

    fn set_clock(&self, py: Python<'_>, #[pyo3(from_py_with = clock)] t: u64) -> PyResult<()> {
        self.pool().set_clock(t).py_err(py)
    }

    fn cache_stats(&self, py: Python<'_>) -> PyResult<PyCacheStats> {
        self.pool().cache_stats().py_err(py).map(PyCacheStats)
    }

    fn drain_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut ev: Vec<CacheEvent> = Vec::new();
        self.pool().drain_events(&mut ev).py_err(py)?;
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

    fn reset_prefix_cache(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.pool().reset_prefix_cache()).py_err(py)
    }
}

#[pyclass(name = "CacheStats", module = "pykvpool", frozen)]
pub struct PyCacheStats(pub CacheStats);

macro_rules! stat_getters {
    ($($field:ident: $t:ty),* $(,)?) => {
        #[pymethods]
        impl PyCacheStats {
            $( #[getter] fn $field(&self) -> $t { self.0.$field } )*

            #[getter]
            fn policy(&self) -> &'static str {
                self.0.policy.name()
            }
            #[getter]
            fn hit_rate(&self) -> f64 {
                self.0.hit_rate()
            }
            #[getter]
            fn block_hit_rate(&self) -> f64 {
                self.0.block_hit_rate()
            }

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
    queries: u64,
    query_blocks: u64,
    hit_blocks: u64,
    query_tokens: u64,
    hit_tokens: u64,
    stored_blocks: u64,
    evictions: u64,
    collisions: u64,
    cow_hits: u64,
    cached_blocks: usize,
    idle_blocks: usize,
    evictable_blocks: usize,
    pinned_blocks: usize,
    num_pins: usize,
    clock: u64,
    pending_events: usize,
    dropped_events: u64,
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCacheStats>()?;
    m.add("EVENT_STORED", 0u8)?;
    m.add("EVENT_REMOVED", 1u8)?;
    m.add("EVENT_ALL_CLEARED", 2u8)?;
    Ok(())
}
