//! The serving simulator for Python: `synthesize_workload` and `run_simulation`, both
//! returning dicts of numpy arrays (columnar). The run releases the GIL, except while a
//! Python step-time callable is being called. `pykvpool.simulate` is the typed facade.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyInt};

use super::convert::{count, int_vec};
use super::errors::{invalid, IntoPyResult};
use crate::error::{KvError, Result};
use crate::eviction::EvictionPolicy;
use crate::prefix_cache::CacheConfig;
use crate::sim::workload::{synthesize, Arrivals, LengthSpec, Lengths, SharedPrefixes, SyntheticSpec};
use crate::sim::{
    simulate, Allocation, ConstantTime, Convention, Preemption, QueuePolicy, Roofline, SimConfig, SimResult, StepShape, StepTimer,
    Victim, Workload,
};

/// A Python callable as step timer: `f(prefill_tokens, decode_tokens, num_seqs,
/// context_tokens, attention_pairs, swapped_blocks) -> seconds`. Its first exception is
/// kept and re-raised after the run.
struct PyTimer {
    f: Py<PyAny>,
    err: Option<PyErr>,
}

impl StepTimer for PyTimer {
    fn step_time(&mut self, s: &StepShape) -> Result<f64> {
        Python::attach(|py| {
            let args = (s.prefill_tokens, s.decode_tokens, s.num_seqs, s.context_tokens, s.attention_pairs, s.swapped_blocks);
            match self.f.bind(py).call1(args).and_then(|v| v.extract::<f64>()) {
                Ok(t) => Ok(t),
                Err(e) => {
                    self.err = Some(e);
                    Err(KvError::InvalidArgument("the step-time callable raised".into()))
                }
            }
        })
    }
}

enum Timer {
    Constant(ConstantTime),
    Roofline(Roofline),
    Python(PyTimer),
}

fn parse_timer(obj: &Bound<'_, PyAny>) -> PyResult<Timer> {
    let py = obj.py();
    if obj.is_instance_of::<PyFloat>() || obj.is_instance_of::<PyInt>() {
        let t: f64 = obj.extract()?;
        if !(t.is_finite() && t >= 0.0) {
            return Err(invalid(py, format!("a constant step time must be finite and >= 0 s, got {t}")));
        }
        return Ok(Timer::Constant(ConstantTime(t)));
    }
    if obj.is_callable() {
        return Ok(Timer::Python(PyTimer { f: obj.clone().unbind(), err: None }));
    }
    let v: Vec<f64> = obj.extract().map_err(|_| {
        invalid(py, "time_model must be seconds per step, a callable, or the 9 roofline figures")
    })?;
    let [num_params, bytes_per_param, num_layers, q_dim, kv_bytes_per_token, flops, bandwidth, overhead, swap_time_per_block] =
        v[..]
    else {
        return Err(invalid(py, format!("a roofline needs 9 figures, got {}", v.len())));
    };
    let r = Roofline {
        num_params,
        bytes_per_param,
        num_layers,
        q_dim,
        kv_bytes_per_token,
        flops,
        bandwidth,
        overhead,
        swap_time_per_block,
    };
    r.validate().py_err(py)?;
    Ok(Timer::Roofline(r))
}

fn u32_vec(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u32>> {
    let py = obj.py();
    int_vec(obj, name)?
        .into_iter()
        .map(|v| u32::try_from(v).map_err(|_| invalid(py, format!("{name}: {v} is outside 0..2^32"))))
        .collect()
}

fn offsets(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<usize>> {
    let py = obj.py();
    int_vec(obj, name)?.into_iter().map(|v| count(py, v, name)).collect()
}

fn length_spec(py: Python<'_>, kind: &str, params: &[f64], clamp: (i64, i64), what: &str) -> PyResult<LengthSpec> {
    let p = |i: usize| params.get(i).copied().ok_or_else(|| invalid(py, format!("{what}: '{kind}' needs more parameters")));
    let as_u32 = |x: f64| if (0.0..=u32::MAX as f64).contains(&x) { Ok(x.round() as u32) } else { Err(invalid(py, format!("{what}: {x} is not a token count"))) };
    let dist = match kind {
        "fixed" => Lengths::Fixed(as_u32(p(0)?)?),
        "uniform" => Lengths::Uniform { lo: as_u32(p(0)?)?, hi: as_u32(p(1)?)? },
        "lognormal" => Lengths::LogNormal { median: p(0)?, sigma: p(1)? },
        "pareto" => Lengths::Pareto { scale: p(0)?, shape: p(1)? },
        "empirical" => Lengths::Empirical(params.iter().map(|&x| as_u32(x)).collect::<PyResult<_>>()?),
        _ => return Err(invalid(py, format!("{what}: unknown distribution '{kind}' (fixed, uniform, lognormal, pareto, empirical)"))),
    };
    let min = u32::try_from(clamp.0).map_err(|_| invalid(py, format!("{what}: bad clamp minimum {}", clamp.0)))?;
    let max = u32::try_from(clamp.1).map_err(|_| invalid(py, format!("{what}: bad clamp maximum {}", clamp.1)))?;
    Ok(LengthSpec { dist, min, max })
}

/// A seeded synthetic workload as columns; same arguments, identical arrays (bit for bit).
///
/// Args:
///     num_requests: requests to draw.
///     arrivals: ``"burst"`` (all at 0 s), ``"poisson"`` (exponential gaps at ``rate``) or
///         ``"gamma"`` (mean gap ``1 / rate``, coefficient of variation ``cv``).
///     rate: mean arrival rate, requests/s (> 0).
///     cv: coefficient of variation of the gamma gaps (> 0; above 1 is bursty).
///     prompt: prompt lengths as ``(kind, params)``, in tokens: ``("fixed", [n])``,
///         ``("uniform", [lo, hi])`` (inclusive), ``("lognormal", [median, sigma])``,
///         ``("pareto", [scale, shape])`` or ``("empirical", [values...])`` (resampled).
///     prompt_clamp: ``(min, max)`` tokens each drawn prompt length is clamped to.
///     output: output lengths, as ``prompt``.
///     output_clamp: as ``prompt_clamp``, for output lengths.
///     priority_levels: priorities drawn uniformly from ``0..priority_levels``.
///     shared_prefixes: ``(num_prefixes, prefix_len, vocab_size)``: prompts become token ids
///         starting with one of ``num_prefixes`` random prefixes of ``prefix_len`` tokens.
///     seed: the random seed.
///
/// Returns:
///     ``{column: array}`` with ``arrival`` float64 (seconds), ``prompt_len``,
///     ``output_len`` and ``priority`` int64 (tokens; priority levels), and with
///     ``shared_prefixes`` also ``token_ids`` uint32 (all prompts concatenated) and
///     ``token_offsets`` int64 (``num_requests + 1`` offsets into ``token_ids``).
///
/// Raises:
///     InvalidArgumentError: a negative count, an unknown arrival process or length
///         distribution, a rate or cv that is not finite and positive, missing
///         distribution parameters, a bad clamp or shared-prefix shape.
#[pyfunction]
#[pyo3(signature = (num_requests, *, arrivals="poisson", rate=1.0, cv=1.0, prompt=("uniform".to_string(), vec![256.0, 4096.0]),
    prompt_clamp=(1, u32::MAX as i64), output=("uniform".to_string(), vec![128.0, 384.0]), output_clamp=(1, u32::MAX as i64),
    priority_levels=1, shared_prefixes=None, seed=0))]
#[allow(clippy::too_many_arguments)]
fn synthesize_workload<'py>(
    py: Python<'py>,
    num_requests: i64,
    arrivals: &str,
    rate: f64,
    cv: f64,
    prompt: (String, Vec<f64>),
    prompt_clamp: (i64, i64),
    output: (String, Vec<f64>),
    output_clamp: (i64, i64),
    priority_levels: u32,
    shared_prefixes: Option<(usize, u32, u32)>,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let arrivals = match arrivals {
        "burst" => Arrivals::Burst,
        "poisson" => Arrivals::Poisson { rate },
        "gamma" => Arrivals::Gamma { rate, cv },
        _ => return Err(invalid(py, format!("unknown arrival process '{arrivals}' (burst, poisson, gamma)"))),
    };
    let spec = SyntheticSpec {
        num_requests: count(py, num_requests, "num_requests")?,
        arrivals,
        prompt: length_spec(py, &prompt.0, &prompt.1, prompt_clamp, "prompt")?,
        output: length_spec(py, &output.0, &output.1, output_clamp, "output")?,
        priority_levels,
        shared_prefixes: shared_prefixes.map(|(num_prefixes, prefix_len, vocab_size)| SharedPrefixes { num_prefixes, prefix_len, vocab_size }),
        seed,
    };
    let w = py.detach(|| synthesize(&spec)).py_err(py)?;
    let d = PyDict::new(py);
    d.set_item("arrival", PyArray1::from_vec(py, w.arrival.clone()))?;
    d.set_item("prompt_len", PyArray1::from_iter(py, w.prompt_len.iter().map(|&x| x as i64)))?;
    d.set_item("output_len", PyArray1::from_iter(py, w.output_len.iter().map(|&x| x as i64)))?;
    d.set_item("priority", PyArray1::from_iter(py, w.priority.iter().map(|&x| x as i64)))?;
    if let crate::sim::workload::Prompts::Tokens { ids, offsets } = w.prompts {
        d.set_item("token_ids", PyArray1::from_vec(py, ids))?;
        d.set_item("token_offsets", PyArray1::from_iter(py, offsets.into_iter().map(|x| x as i64)))?;
    }
    Ok(d)
}

fn result_dict<'py>(py: Python<'py>, r: SimResult, w: &Workload) -> PyResult<Bound<'py, PyDict>> {
    let q = &r.requests;
    let req = PyDict::new(py);
    req.set_item("prompt_len", PyArray1::from_iter(py, w.prompt_len.iter().map(|&x| x as i64)))?;
    req.set_item("output_len", PyArray1::from_iter(py, w.output_len.iter().map(|&x| x as i64)))?;
    req.set_item("priority", PyArray1::from_iter(py, w.priority.iter().map(|&x| x as i64)))?;
    req.set_item("ttft", PyArray1::from_vec(py, q.ttft()))?;
    req.set_item("tpot", PyArray1::from_vec(py, q.tpot(&w.output_len)))?;
    req.set_item("e2e", PyArray1::from_vec(py, q.e2e()))?;
    req.set_item("queueing", PyArray1::from_vec(py, q.queueing()))?;
    let q = r.requests;
    req.set_item("arrival", PyArray1::from_vec(py, q.arrival))?;
    req.set_item("first_scheduled", PyArray1::from_vec(py, q.first_scheduled))?;
    req.set_item("first_token", PyArray1::from_vec(py, q.first_token))?;
    req.set_item("finish", PyArray1::from_vec(py, q.finish))?;
    req.set_item("preemptions", PyArray1::from_vec(py, q.preemptions))?;
    req.set_item("swaps", PyArray1::from_vec(py, q.swaps))?;
    req.set_item("recomputed_tokens", PyArray1::from_vec(py, q.recomputed_tokens))?;
    req.set_item("cached_tokens", PyArray1::from_vec(py, q.cached_tokens))?;
    req.set_item("outcome", PyArray1::from_vec(py, q.outcome))?;
    let s = r.steps;
    let st = PyDict::new(py);
    st.set_item("time", PyArray1::from_vec(py, s.time))?;
    st.set_item("duration", PyArray1::from_vec(py, s.duration))?;
    st.set_item("running", PyArray1::from_vec(py, s.running))?;
    st.set_item("batch", PyArray1::from_vec(py, s.batch))?;
    st.set_item("waiting", PyArray1::from_vec(py, s.waiting))?;
    st.set_item("swapped", PyArray1::from_vec(py, s.swapped))?;
    st.set_item("prefill_tokens", PyArray1::from_vec(py, s.prefill_tokens))?;
    st.set_item("decode_tokens", PyArray1::from_vec(py, s.decode_tokens))?;
    st.set_item("blocks_used", PyArray1::from_vec(py, s.blocks_used))?;
    st.set_item("blocks_reserved", PyArray1::from_vec(py, s.blocks_reserved))?;
    st.set_item("kv_tokens", PyArray1::from_vec(py, s.kv_tokens))?;
    st.set_item("utilization", PyArray1::from_vec(py, s.utilization))?;
    st.set_item("cache_query_tokens", PyArray1::from_vec(py, s.cache_query_tokens))?;
    st.set_item("cache_hit_tokens", PyArray1::from_vec(py, s.cache_hit_tokens))?;
    st.set_item("prefix_hit_rate", PyArray1::from_vec(py, s.prefix_hit_rate))?;
    st.set_item("preemptions", PyArray1::from_vec(py, s.preemptions))?;
    st.set_item("swapped_blocks", PyArray1::from_vec(py, s.swapped_blocks))?;
    let m = r.summary;
    let sum = PyDict::new(py);
    for (k, v) in [
        ("num_requests", m.num_requests),
        ("finished", m.finished),
        ("rejected", m.rejected),
        ("steps", m.steps),
        ("preemptions", m.preemptions),
        ("swaps", m.swaps),
        ("prompt_tokens", m.prompt_tokens),
        ("output_tokens", m.output_tokens),
        ("recomputed_tokens", m.recomputed_tokens),
        ("cached_tokens", m.cached_tokens),
        ("peak_running", m.peak_running),
        ("peak_blocks_used", m.peak_blocks_used),
        ("leaked_blocks", r.leaked_blocks as u64),
    ] {
        sum.set_item(k, v)?;
    }
    for (k, v) in [
        ("makespan", m.makespan),
        ("output_throughput", m.output_throughput),
        ("total_throughput", m.total_throughput),
        ("request_throughput", m.request_throughput),
        ("mean_utilization", m.mean_utilization),
        ("prefix_hit_rate", m.prefix_hit_rate),
    ] {
        sum.set_item(k, v)?;
    }
    for (name, p) in [("ttft", m.ttft), ("tpot", m.tpot), ("e2e", m.e2e), ("queueing", m.queueing)] {
        for (stat, v) in [("mean", p.mean), ("p50", p.p50), ("p90", p.p90), ("p99", p.p99), ("max", p.max)] {
            sum.set_item(format!("{name}_{stat}"), v)?;
        }
    }
    let d = PyDict::new(py);
    d.set_item("requests", req)?;
    d.set_item("steps", st)?;
    d.set_item("summary", sum)?;
    Ok(d)
}

/// Run the step-level serving simulator over a fresh ``BlockPool(num_blocks, block_size)``.
///
/// The facade :func:`pykvpool.simulate.run` builds these arguments from a
/// :class:`pykvpool.simulate.Workload` and a :class:`pykvpool.simulate.SimConfig`, whose
/// docs describe each policy. The GIL is released while the engine runs, except around
/// calls to a Python ``time_model``.
///
/// Args:
///     arrival: float64 arrival time of each request, seconds (finite, >= 0).
///     prompt_len: prompt length of each request, tokens (>= 1).
///     output_len: generated tokens of each request (>= 1).
///     priority: int32 priority of each request (lower first under ``queue="priority"``).
///     num_blocks: device blocks of the pool.
///     block_size: tokens per block.
///     token_ids: all prompts' token ids concatenated (with ``token_offsets``), for prefix
///         caching.
///     token_offsets: ``len(arrival) + 1`` offsets into ``token_ids``.
///     block_keys: all prompts' block keys concatenated (with ``key_offsets``), one key per
///         ``tokens_per_key`` prompt tokens (a trace's ``hash_ids``).
///     key_offsets: ``len(arrival) + 1`` offsets into ``block_keys``.
///     tokens_per_key: prompt tokens per block key.
///     max_running: requests in flight at most.
///     max_batched_tokens: tokens computed per step across the batch (None: unlimited).
///     chunked_prefill: split prompts that exceed the remaining token budget.
///     watermark: fraction of the pool admission leaves free, in ``[0, 1)``.
///     queue: ``"fcfs"`` or ``"priority"``.
///     allocation: ``"paged"`` (blocks on demand) or ``"reserve"`` (a reservation at
///         admission of ``reserve_tokens`` tokens, or of each request's own ``prompt +
///         output - 1`` tokens when None).
///     reserve_tokens: tokens reserved per request under ``allocation="reserve"``.
///     preemption: ``"recompute"`` or ``"swap"`` (to a host pool of ``host_blocks`` blocks).
///     host_blocks: host blocks for swapping.
///     victim: ``"newest"`` or ``"lowest_priority"``.
///     convention: ``"vllm"`` or ``"decode_first"``.
///     prefix_caching: cache prompts given as ``token_ids`` or ``block_keys`` (prompts
///         given as lengths only never hit).
///     eviction: idle cached blocks to reclaim first: ``"lru"``, ``"fifo"``, ``"lfu"`` or
///         ``"priority"``.
///     time_model: seconds per step (float, default 0.0: steps only); the 9 roofline
///         figures ``[params, bytes/param, layers, q_dim, kv bytes/token, flop/s, bytes/s,
///         overhead s, swap s/block]``; or a callable ``f(prefill_tokens, decode_tokens,
///         num_seqs, context_tokens, attention_pairs, swapped_blocks) -> seconds``, called
///         with the GIL held.
///     check_invariants: check the pool's invariants after every step (slow).
///     max_steps: stop after this many steps (None: run to the end).
///     record_steps: keep the per-step columns.
///
/// Returns:
///     ``{"requests": {column: array}, "steps": {column: array}, "summary": {name:
///     number}}``; the columns are those of :class:`pykvpool.simulate.SimulationResult`.
///
/// Raises:
///     InvalidArgumentError: bad columns (lengths that differ, a zero or out-of-range
///         length, a bad arrival time or offsets), an unknown policy name, a size out of
///         range, token ids mixed with block keys, or a bad time model.
///     InvariantError: the engine broke an invariant (a pykvpool bug).
///     Exception: whatever a Python ``time_model`` raises, unchanged.
#[pyfunction]
#[pyo3(signature = (arrival, prompt_len, output_len, priority=None, *, num_blocks, block_size,
    token_ids=None, token_offsets=None, block_keys=None, key_offsets=None, tokens_per_key=0,
    max_running=256, max_batched_tokens=Some(8192), chunked_prefill=true, watermark=0.0,
    queue="fcfs", allocation="paged", reserve_tokens=None, preemption="recompute", host_blocks=0,
    victim="newest", convention="vllm", prefix_caching=false, eviction="lru", time_model=None,
    check_invariants=false, max_steps=None, record_steps=true))]
#[allow(clippy::too_many_arguments)]
fn run_simulation<'py>(
    py: Python<'py>,
    arrival: PyReadonlyArray1<'py, f64>,
    prompt_len: &Bound<'py, PyAny>,
    output_len: &Bound<'py, PyAny>,
    priority: Option<&Bound<'py, PyAny>>,
    num_blocks: i64,
    block_size: i64,
    token_ids: Option<&Bound<'py, PyAny>>,
    token_offsets: Option<&Bound<'py, PyAny>>,
    block_keys: Option<&Bound<'py, PyAny>>,
    key_offsets: Option<&Bound<'py, PyAny>>,
    tokens_per_key: i64,
    max_running: i64,
    max_batched_tokens: Option<i64>,
    chunked_prefill: bool,
    watermark: f64,
    queue: &str,
    allocation: &str,
    reserve_tokens: Option<i64>,
    preemption: &str,
    host_blocks: i64,
    victim: &str,
    convention: &str,
    prefix_caching: bool,
    eviction: &str,
    time_model: Option<&Bound<'py, PyAny>>,
    check_invariants: bool,
    max_steps: Option<i64>,
    record_steps: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let arrival = arrival.as_slice().map(|s| s.to_vec()).unwrap_or_else(|_| arrival.as_array().to_vec());
    let priority = match priority {
        Some(p) => Some(
            int_vec(p, "priority")?
                .into_iter()
                .map(|v| i32::try_from(v).map_err(|_| invalid(py, format!("priority {v} does not fit in int32"))))
                .collect::<PyResult<Vec<i32>>>()?,
        ),
        None => None,
    };
    let mut w = Workload::new(arrival, u32_vec(prompt_len, "prompt_len")?, u32_vec(output_len, "output_len")?, priority)
        .py_err(py)?;
    match (token_ids, token_offsets, block_keys, key_offsets) {
        (Some(ids), Some(off), None, None) => w = w.with_tokens(u32_vec(ids, "token_ids")?, offsets(off, "token_offsets")?).py_err(py)?,
        (None, None, Some(keys), Some(off)) => {
            let keys: Vec<u64> = int_vec(keys, "block_keys")?.into_iter().map(|k| k as u64).collect();
            w = w.with_block_keys(keys, offsets(off, "key_offsets")?, count(py, tokens_per_key, "tokens_per_key")?).py_err(py)?;
        }
        (None, None, None, None) => {}
        _ => return Err(invalid(py, "give token_ids with token_offsets, or block_keys with key_offsets, not a mix")),
    }

    let mut cfg = SimConfig::new(count(py, num_blocks, "num_blocks")?, count(py, block_size, "block_size")?);
    let s = &mut cfg.scheduler;
    s.max_running = count(py, max_running, "max_running")?;
    s.max_batched_tokens = max_batched_tokens.map(|b| count(py, b, "max_batched_tokens")).transpose()?;
    s.chunked_prefill = chunked_prefill;
    s.watermark = watermark;
    s.queue = match queue {
        "fcfs" => QueuePolicy::Fcfs,
        "priority" => QueuePolicy::Priority,
        _ => return Err(invalid(py, format!("unknown queue policy '{queue}' (fcfs, priority)"))),
    };
    let reserve_tokens = reserve_tokens
        .map(|t| u32::try_from(t).map_err(|_| invalid(py, format!("reserve_tokens {t} is outside 1..2^32"))))
        .transpose()?;
    s.allocation = match allocation {
        "paged" => Allocation::Paged,
        "reserve" => Allocation::Reserve { max_tokens: reserve_tokens },
        _ => return Err(invalid(py, format!("unknown allocation '{allocation}' (paged, reserve)"))),
    };
    s.preemption = match preemption {
        "recompute" => Preemption::Recompute,
        "swap" => Preemption::Swap { host_blocks: count(py, host_blocks, "host_blocks")? },
        _ => return Err(invalid(py, format!("unknown preemption '{preemption}' (recompute, swap)"))),
    };
    s.victim = match victim {
        "newest" => Victim::Newest,
        "lowest_priority" => Victim::LowestPriority,
        _ => return Err(invalid(py, format!("unknown victim policy '{victim}' (newest, lowest_priority)"))),
    };
    s.convention = match convention {
        "vllm" => Convention::Vllm,
        "decode_first" => Convention::DecodeFirst,
        _ => return Err(invalid(py, format!("unknown convention '{convention}' (vllm, decode_first)"))),
    };
    let policy: EvictionPolicy = eviction.parse().py_err(py)?;
    cfg.prefix_cache = prefix_caching.then(|| CacheConfig { policy, ..CacheConfig::default() });
    cfg.check_invariants = check_invariants;
    cfg.max_steps = max_steps.map(|m| count(py, m, "max_steps").map(|m| m as u64)).transpose()?;
    cfg.record_steps = record_steps;

    let mut timer = match time_model {
        Some(t) => parse_timer(t)?,
        None => Timer::Constant(ConstantTime(0.0)),
    };
    let out = match &mut timer {
        Timer::Constant(t) => py.detach(|| simulate(&w, &cfg, t)),
        Timer::Roofline(t) => py.detach(|| simulate(&w, &cfg, t)),
        Timer::Python(t) => {
            let r = py.detach(|| simulate(&w, &cfg, t));
            if let Some(e) = t.err.take() {
                return Err(e);
            }
            r
        }
    };
    result_dict(py, out.py_err(py)?, &w)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(synthesize_workload, m)?)?;
    m.add_function(wrap_pyfunction!(run_simulation, m)?)?;
    Ok(())
}
