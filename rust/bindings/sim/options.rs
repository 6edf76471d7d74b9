//! The two dicts `run_simulation` takes: the workload's columns and the configuration.
//! Each key is converted by [`super::args`], whose errors name it; an unknown key is an
//! error too (a misspelt option would otherwise be silently ignored).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::args::{self, named};
use crate::bindings::convert::u64_keys;
use crate::bindings::errors::{invalid, IntoPyResult};
use crate::prefix_cache::eviction::EvictionPolicy;
use crate::prefix_cache::CacheConfig;
use crate::sim::{
    Allocation, Attainment, Convention, Disaggregation, KvLink, Preemption, QueuePolicy, Router, SchedulerConfig, SimConfig,
    StopWhen, Victim, Workload, MAX_LINK_LAYERS, MAX_REPLICAS,
};

/// Keys of the workload dict.
const WORKLOAD_KEYS: &[&str] = &[
    "arrival", "prompt_len", "output_len", "priority", "token_ids", "token_offsets", "block_keys", "key_offsets",
    "tokens_per_key",
];

/// Keys of the configuration dict.
const CONFIG_KEYS: &[&str] = &[
    "num_blocks", "block_size", "max_running", "max_batched_tokens", "chunked_prefill", "watermark", "queue",
    "allocation", "reserve_tokens", "preemption", "host_blocks", "victim", "convention", "prefix_caching", "eviction",
    "check_invariants", "max_steps", "record_steps", "groups", "stop_when", "replicas", "router", "disaggregation",
];

/// Keys of the `disaggregation` dict.
const DISAGG_KEYS: &[&str] =
    &["decode_replicas", "decode_num_blocks", "bandwidth", "latency", "bytes_per_token", "layers", "mixed_tokens"];

/// Keys of the `stop_when` dict.
const STOP_KEYS: &[&str] = &[
    "ttft_p99", "tpot_p50", "tpot_p99", "min_output_throughput", "attain_ttft", "attain_tpot", "attain_share",
    "tolerate_rejections",
];

/// A dict of named arguments, each read once by its converter.
struct Keys<'a, 'py> {
    dict: &'a Bound<'py, PyDict>,
    what: &'static str,
}

impl<'a, 'py> Keys<'a, 'py> {
    /// `dict` after checking that every key is a known name.
    fn new(dict: &'a Bound<'py, PyDict>, what: &'static str, known: &[&str]) -> PyResult<Self> {
        for k in dict.keys() {
            let name = k.cast::<PyString>().ok().and_then(|s| s.to_str().ok().map(str::to_owned));
            if !name.as_deref().is_some_and(|n| known.contains(&n)) {
                return Err(invalid(dict.py(), format!("{what}: unknown key {k} (known: {})", known.join(", "))));
            }
        }
        Ok(Self { dict, what })
    }

    /// The value under `key`; None when absent.
    fn get(&self, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.dict.get_item(key)
    }

    /// The value under `key`; absent or None is None.
    fn column(&self, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok(self.get(key)?.filter(|v| !v.is_none()))
    }

    fn required(&self, key: &str) -> PyResult<Bound<'py, PyAny>> {
        self.get(key)?.ok_or_else(|| invalid(self.dict.py(), format!("{}: {key} is required", self.what)))
    }

    /// `conv` of the value under `key`, or `default` when absent.
    fn with<T>(&self, key: &str, conv: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<T>, default: T) -> PyResult<T> {
        self.get(key)?.map_or(Ok(default), |v| conv(&v))
    }

    /// A flag: a bool (a `TypeError` naming `key` otherwise).
    fn flag(&self, key: &str, default: bool) -> PyResult<bool> {
        self.with(key, |v| v.extract::<bool>().map_err(|_| type_error(key, "a bool", v)), default)
    }

    /// A policy name: a str (a `TypeError` naming `key` otherwise).
    fn name(&self, key: &str, default: &str) -> PyResult<String> {
        self.with(key, |v| v.extract::<String>().map_err(|_| type_error(key, "a str", v)), default.to_owned())
    }
}

fn type_error(key: &str, want: &str, v: &Bound<'_, PyAny>) -> PyErr {
    let got = v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
    PyTypeError::new_err(format!("{key} must be {want}, got {got}"))
}

/// The workload from its columns, every one checked and named.
pub(super) fn workload(dict: &Bound<'_, PyDict>) -> PyResult<Workload> {
    let py = dict.py();
    let k = Keys::new(dict, "workload", WORKLOAD_KEYS)?;
    let arrival = k.required("arrival")?;
    args::num_requests(&arrival, "arrival")?;
    let arrival = args::floats(&arrival, "arrival")?;
    let priority = k.column("priority")?;
    let priority = priority.map(|p| args::typed::<i32>(&p, "priority", "priorities must fit in int32")).transpose()?;
    let prompt = args::lengths(&k.required("prompt_len")?, "prompt_len")?;
    let output = args::lengths(&k.required("output_len")?, "output_len")?;
    let mut w = Workload::new(arrival, prompt, output, priority).py_err(py)?;
    let tokens = (k.column("token_ids")?, k.column("token_offsets")?);
    let keys = (k.column("block_keys")?, k.column("key_offsets")?);
    let per_key = k.with("tokens_per_key", named::tokens_per_key, 0)?;
    match (tokens, keys) {
        ((Some(ids), Some(off)), (None, None)) => {
            let ids = args::typed(&ids, "token_ids", "token ids must be in 0..2**32")?;
            w = w.with_tokens(ids, offsets(&off, "token_offsets")?).py_err(py)?;
        }
        ((None, None), (Some(keys), Some(off))) => {
            let keys = u64_keys(&keys, "block_keys")?;
            w = w.with_block_keys(keys, offsets(&off, "key_offsets")?, per_key).py_err(py)?;
        }
        ((None, None), (None, None)) => {}
        _ => return Err(invalid(py, "give token_ids with token_offsets, or block_keys with key_offsets, not a mix")),
    }
    Ok(w)
}

fn offsets(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<usize>> {
    args::typed(obj, name, "offsets must be >= 0")
}

/// The run's configuration, every key checked and named.
pub(super) fn sim_config(dict: &Bound<'_, PyDict>) -> PyResult<SimConfig> {
    let py = dict.py();
    let k = Keys::new(dict, "config", CONFIG_KEYS)?;
    let mut cfg = SimConfig::new(named::num_blocks(&k.required("num_blocks")?)?, named::block_size(&k.required("block_size")?)?);
    scheduler(&k, &mut cfg.scheduler)?;
    let eviction = k.name("eviction", "lru")?;
    let policy: EvictionPolicy = eviction.parse().map_err(|e| invalid(py, format!("eviction: {e}")))?;
    cfg.prefix_cache = k.flag("prefix_caching", false)?.then(|| CacheConfig { policy, ..CacheConfig::default() });
    cfg.groups = k.with("groups", args::groups, None)?;
    cfg.check_invariants = k.flag("check_invariants", false)?;
    cfg.max_steps = k.with("max_steps", named::max_steps, None)?.map(|m| m as u64);
    cfg.record_steps = k.flag("record_steps", true)?;
    cfg.stop_when = k.column("stop_when")?.map(|v| stop_when(&v)).transpose()?;
    cfg.replicas = k.with("replicas", named::replicas, 1)?;
    cfg.router = match k.name("router", "round_robin")?.as_str() {
        "round_robin" => Router::RoundRobin,
        "shortest_queue" => Router::ShortestQueue,
        r => return Err(invalid(py, format!("unknown router='{r}' (round_robin, shortest_queue)"))),
    };
    cfg.disaggregation = k.column("disaggregation")?.map(|v| disaggregation(&v, cfg.num_blocks)).transpose()?;
    Ok(cfg)
}

/// Prefill/decode disaggregation: a dict of the decode instances and the KV link.
fn disaggregation(obj: &Bound<'_, PyAny>, num_blocks: usize) -> PyResult<Disaggregation> {
    let py = obj.py();
    let dict = obj.cast::<PyDict>().map_err(|_| type_error("disaggregation", "a dict or None", obj))?;
    let k = Keys::new(dict, "disaggregation", DISAGG_KEYS)?;
    let counted = |key: &str, max: u64| -> PyResult<u64> {
        args::count(&k.required(key)?, &format!("disaggregation.{key}"), max)
    };
    let real = |key: &str, default: Option<f64>| -> PyResult<f64> {
        let name = format!("disaggregation.{key}");
        match (k.get(key)?, default) {
            (Some(v), _) => args::real(&v, &name),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(invalid(py, format!("{name} is required"))),
        }
    };
    let decode_num_blocks = match k.column("decode_num_blocks")? {
        Some(v) => args::count(&v, "disaggregation.decode_num_blocks", usize::MAX as u64)? as usize,
        None => num_blocks,
    };
    let layers = match k.get("layers")? {
        Some(v) => args::count(&v, "disaggregation.layers", MAX_LINK_LAYERS as u64)? as u32,
        None => 1,
    };
    let mixed_tokens = match k.column("mixed_tokens")? {
        Some(v) => Some(args::count(&v, "disaggregation.mixed_tokens", i64::MAX as u64)?),
        None => None,
    };
    let d = Disaggregation {
        decode_replicas: counted("decode_replicas", MAX_REPLICAS as u64)? as usize,
        decode_num_blocks,
        mixed_tokens,
        link: KvLink {
            bandwidth: real("bandwidth", None)?,
            latency: real("latency", Some(0.0))?,
            bytes_per_token: real("bytes_per_token", None)?,
            layers,
        },
    };
    d.validate().map_err(|e| invalid(py, format!("disaggregation.{e}")))?;
    Ok(d)
}

/// The stop rule: a dict of bounds, each None or a number finite and > 0 (seconds;
/// output tokens/s for `min_output_throughput`).
fn stop_when(obj: &Bound<'_, PyAny>) -> PyResult<StopWhen> {
    let py = obj.py();
    let dict = obj.cast::<PyDict>().map_err(|_| type_error("stop_when", "a dict or None", obj))?;
    let k = Keys::new(dict, "stop_when", STOP_KEYS)?;
    let bound = |key: &str| -> PyResult<Option<f64>> {
        let name = format!("stop_when.{key}");
        k.column(key)?.map(|v| args::real(&v, &name)).transpose()
    };
    let (attain_ttft, attain_tpot, share) = (bound("attain_ttft")?, bound("attain_tpot")?, bound("attain_share")?);
    let attainment = match (attain_ttft, attain_tpot, share) {
        (None, None, None) => None,
        (ttft, tpot, Some(share)) => Some(Attainment { ttft, tpot, share }),
        _ => return Err(invalid(py, "stop_when: attain_ttft and attain_tpot need attain_share (a share in (0, 1])")),
    };
    let s = StopWhen {
        ttft_p99: bound("ttft_p99")?,
        tpot_p50: bound("tpot_p50")?,
        tpot_p99: bound("tpot_p99")?,
        min_output_throughput: bound("min_output_throughput")?,
        attainment,
        tolerate_rejections: k.flag("tolerate_rejections", false)?,
    };
    s.validate().py_err(py)?;
    Ok(s)
}

/// The scheduler's limits and policies.
fn scheduler(k: &Keys<'_, '_>, s: &mut SchedulerConfig) -> PyResult<()> {
    let py = k.dict.py();
    s.max_running = k.with("max_running", named::max_running, 256)?;
    s.max_batched_tokens = k.with("max_batched_tokens", named::max_batched_tokens, Some(8192))?;
    s.chunked_prefill = k.flag("chunked_prefill", true)?;
    s.watermark = k.with("watermark", named::watermark, 0.0)?;
    let unknown = |key: &str, v: &str, known: &str| invalid(py, format!("unknown {key}='{v}' ({known})"));
    s.queue = match k.name("queue", "fcfs")?.as_str() {
        "fcfs" => QueuePolicy::Fcfs,
        "priority" => QueuePolicy::Priority,
        q => return Err(unknown("queue policy queue", q, "fcfs, priority")),
    };
    let reserve_tokens = k.with("reserve_tokens", named::reserve_tokens, None)?;
    s.allocation = match k.name("allocation", "paged")?.as_str() {
        "paged" => Allocation::Paged,
        "reserve" => Allocation::Reserve {
            tokens: reserve_tokens.ok_or_else(|| {
                invalid(py, "allocation='reserve' needs reserve_tokens: the tokens reserved per request (the model's context)")
            })?,
        },
        "oracle" => Allocation::Oracle,
        a => return Err(unknown("allocation", a, "paged, reserve, oracle")),
    };
    let host_blocks = k.with("host_blocks", named::host_blocks, 0)?;
    s.preemption = match k.name("preemption", "recompute")?.as_str() {
        "recompute" => Preemption::Recompute,
        "swap" => Preemption::Swap { host_blocks },
        p => return Err(unknown("preemption", p, "recompute, swap")),
    };
    s.victim = match k.name("victim", "newest")?.as_str() {
        "newest" => Victim::Newest,
        "lowest_priority" => Victim::LowestPriority,
        v => return Err(unknown("victim policy victim", v, "newest, lowest_priority")),
    };
    s.convention = match k.name("convention", "vllm")?.as_str() {
        "vllm" => Convention::Vllm,
        "decode_first" => Convention::DecodeFirst,
        c => return Err(unknown("convention", c, "vllm, decode_first")),
    };
    Ok(())
}
