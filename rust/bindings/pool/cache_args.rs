//! The arguments of `BlockPool`'s prefix-caching methods: the cache options of the
//! constructor, token ids (`uint32` range) and the small optional ints (extra key,
//! priority, clock, pin id).

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::bindings::convert::{count_arg, int_scalar, int_vec, ints_as};
use crate::bindings::errors::{invalid, IntoPyResult};
use crate::prefix_cache::block_hash::{BlockHasher, BlockKey};
use crate::prefix_cache::eviction::EvictionPolicy;
use crate::prefix_cache::tiers::{GateConfig, TierChoices, TierConfig, TierPolicy, TierRules, TierStats};
use crate::prefix_cache::{CacheConfig, CacheEvent, MAX_EVENTS_LIMIT};

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

/// Keyword options of `BlockPool(...)` for the tiers below the device; `None` = not given.
pub struct TierOptions<'a> {
    pub host_blocks: Option<&'a Bound<'a, PyAny>>,
    pub disk_blocks: Option<&'a Bound<'a, PyAny>>,
    pub tier_eviction: Option<&'a str>,
    pub reuse_gate: Option<&'a Bound<'a, PyAny>>,
    pub write_through: Option<bool>,
}

impl TierOptions<'_> {
    /// The tiers (host, then disk) and their rules; no tier when `host_blocks` is not
    /// given. The gate's counts halve every `4 x` (the tiers' blocks) sightings.
    pub fn configs(&self, py: Python<'_>, caching: bool) -> PyResult<(Vec<TierConfig>, TierRules)> {
        let Some(host) = self.host_blocks else {
            if self.disk_blocks.is_some() || self.tier_eviction.is_some() || self.reuse_gate.is_some() || self.write_through.is_some() {
                return Err(invalid(py, "disk_blocks, tier_eviction, reuse_gate and write_through need host_blocks"));
            }
            return Ok((Vec::new(), TierRules::default()));
        };
        if !caching {
            return Err(invalid(py, "host_blocks needs prefix_caching=True"));
        }
        let policy = TierPolicy::parse(self.tier_eviction.unwrap_or("lru")).py_err(py)?;
        let mut tiers = vec![TierConfig { capacity_blocks: count_arg(host, "host_blocks")?, policy }];
        if let Some(d) = self.disk_blocks {
            tiers.push(TierConfig { capacity_blocks: count_arg(d, "disk_blocks")?, policy });
        }
        let gate = match self.reuse_gate {
            None => None,
            Some(g) => {
                let n = int_scalar(g, "reuse_gate")?;
                let min_seen = u32::try_from(n).ok().filter(|n| (1..=255).contains(n));
                let min_seen = min_seen.ok_or_else(|| invalid(py, format!("reuse_gate must be in 1..=255 sightings, got {n}")))?;
                let total: usize = tiers.iter().map(|t| t.capacity_blocks).sum();
                Some(GateConfig { min_seen, half_life: (total as u64).saturating_mul(4).max(1) })
            }
        };
        Ok((tiers, TierRules { gate, write_through: self.write_through.unwrap_or(false) }))
    }
}

/// `BlockPool.tier_stats()`'s list: one dict per tier, host first.
pub fn tier_stats_list<'py>(py: Python<'py>, stats: &[TierStats], choices: TierChoices) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for (i, s) in stats.iter().enumerate() {
        let d = PyDict::new(py);
        d.set_item("tier", if i == 0 { "host" } else { "disk" })?;
        d.set_item("stored", s.stored)?;
        d.set_item("hits", s.hits)?;
        d.set_item("evicted", s.evicted)?;
        d.set_item("collisions", s.collisions)?;
        d.set_item("held", s.held)?;
        let top = |n: u64| if i == 0 { n } else { 0 };
        d.set_item("gated", top(choices.gated))?;
        d.set_item("loads_won", top(choices.loads_won))?;
        d.set_item("recompute_won", top(choices.recompute_won))?;
        list.append(d)?;
    }
    Ok(list)
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
    ints_as(obj.py(), int_vec(obj, name)?, name, " is not a token id in 0..2**32")
}

/// Drained cache events as a dict of equal-length arrays (`BlockPool.drain_events`).
pub(crate) fn events_dict<'py>(py: Python<'py>, ev: &[CacheEvent]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kind", PyArray1::from_iter(py, ev.iter().map(|e| e.kind as u8)))?;
    d.set_item("block", PyArray1::from_iter(py, ev.iter().map(|e| e.block.map_or(-1, |b| b.0 as i64))))?;
    d.set_item("key", keys_array(py, ev.iter().map(|e| e.key))?)?;
    d.set_item("parent_key", keys_array(py, ev.iter().map(|e| e.parent_key.unwrap_or(0)))?)?;
    d.set_item("has_parent", PyArray1::from_iter(py, ev.iter().map(|e| e.parent_key.is_some())))?;
    d.set_item("tokens", PyArray1::from_iter(py, ev.iter().map(|e| e.tokens)))?;
    d.set_item("clock", PyArray1::from_iter(py, ev.iter().map(|e| e.clock)))?;
    d.set_item("group", PyArray1::from_iter(py, ev.iter().map(|e| e.group)))?;
    d.set_item("medium", PyArray1::from_iter(py, ev.iter().map(|e| e.medium)))?;
    Ok(d)
}

pub(super) fn keys_array<'py>(py: Python<'py>, keys: impl ExactSizeIterator<Item = BlockKey>) -> PyResult<Bound<'py, PyArray2<u64>>> {
    let n = keys.len();
    let flat: Vec<u64> = keys.flat_map(|k| [(k >> 64) as u64, k as u64]).collect();
    PyArray1::from_vec(py, flat).reshape([n, 2])
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

pub(crate) fn extra_key(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    // int_scalar stops at int64; extra keys above 2**63 are not needed from Python.
    opt_uint(obj, "extra_key", "0..2**63")
}

pub(crate) fn priority(obj: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
    opt_uint(obj, "priority", "0..2**32")
}

pub(crate) fn expires_at(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    opt_uint(obj, "expires_at", "0..2**63")
}

pub(crate) fn clock(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    opt_uint(obj, "t", "0..2**63")?.ok_or_else(|| invalid(obj.py(), "t must be an int, got None"))
}

pub(crate) fn pin_id(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    opt_uint(obj, "pin_id", "issued pin ids")?.ok_or_else(|| invalid(obj.py(), "pin_id must be an int, got None"))
}
