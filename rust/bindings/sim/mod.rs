//! The serving simulator for Python: `synthesize_workload` and `run_simulation`, both
//! returning dicts of numpy arrays (columnar). The run releases the GIL, except while a
//! Python step-time callable is being called. `pykvpool.simulate` is the typed facade.
//! Every argument is converted by [`args`], which names it in each error.

mod args;
mod options;
mod result;

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt};

use self::args::named;
use super::errors::{invalid, IntoPyResult};
use crate::error::{KvError, Result};
use crate::sim::workload::{synthesize, Arrivals, LengthSpec, Lengths, Prompts, SharedPrefixes, SyntheticSpec};
use crate::sim::{simulate_with, ConstantTime, Roofline, StepShape, StepTimer, MAX_REQUEST_TOKENS};

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
            // The callable's own exception propagates unchanged; a return value that is not
            // a number of seconds is an InvalidArgumentError naming time_model.
            let seconds = self.f.bind(py).call1(args).and_then(|v| {
                if v.is_instance_of::<PyBool>() {
                    return Err(invalid(py, "time_model returned a bool, not seconds"));
                }
                v.extract::<f64>().map_err(|_| invalid(py, format!("time_model returned {}, not seconds", v.get_type())))
            });
            seconds.map_err(|e| {
                self.err = Some(e);
                KvError::InvalidArgument("the step-time callable failed".into())
            })
        })
    }
}

enum Timer {
    Constant(ConstantTime),
    Roofline(Roofline),
    Python(PyTimer),
}

impl Timer {
    fn as_dyn(&mut self) -> &mut (dyn StepTimer + Send) {
        match self {
            Timer::Constant(t) => t,
            Timer::Roofline(t) => t,
            Timer::Python(t) => t,
        }
    }

    /// The first exception a Python step timer raised, if any.
    fn take_err(&mut self) -> Option<PyErr> {
        match self {
            Timer::Python(t) => t.err.take(),
            _ => None,
        }
    }
}

fn parse_timer(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Timer> {
    let py = obj.py();
    if obj.is_instance_of::<PyBool>() {
        return Err(invalid(py, format!("{name} must be seconds per step, a callable, or the 11 roofline figures, got a bool")));
    }
    if obj.is_instance_of::<PyFloat>() || obj.is_instance_of::<PyInt>() {
        let t = args::real(obj, name)?;
        if !(t.is_finite() && t >= 0.0) {
            return Err(invalid(py, format!("{name}: a constant step time must be finite and >= 0 s, got {t}")));
        }
        return Ok(Timer::Constant(ConstantTime(t)));
    }
    if obj.is_callable() {
        return Ok(Timer::Python(PyTimer { f: obj.clone().unbind(), err: None }));
    }
    let v: Vec<f64> = args::floats(obj, name)
        .map_err(|_| invalid(py, format!("{name} must be seconds per step, a callable, or the 11 roofline figures")))?;
    let [num_params, bytes_per_param, num_layers, q_dim, kv_bytes_per_token, flops, bandwidth, overhead, swap_time_per_block, comm_per_step, comm_per_token] =
        v[..]
    else {
        return Err(invalid(py, format!("{name}: a roofline needs 11 figures, got {}", v.len())));
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
        comm_per_step,
        comm_per_token,
    };
    r.validate().map_err(|e| invalid(py, format!("{name}: {e}")))?;
    Ok(Timer::Roofline(r))
}

fn length_spec(py: Python<'_>, (kind, params): (String, Vec<f64>), (min, max): (u32, u32), what: &str) -> PyResult<LengthSpec> {
    let want = |n: usize| -> PyResult<()> {
        if params.len() == n {
            return Ok(());
        }
        Err(invalid(py, format!("{what}: '{kind}' takes {n} parameters, got {}", params.len())))
    };
    let tokens = |x: f64| {
        if (0.0..=u32::MAX as f64).contains(&x) {
            Ok(x.round() as u32)
        } else {
            Err(invalid(py, format!("{what}: {x} is not a token count")))
        }
    };
    let dist = match kind.as_str() {
        "fixed" => {
            want(1)?;
            Lengths::Fixed(tokens(params[0])?)
        }
        "uniform" => {
            want(2)?;
            Lengths::Uniform { lo: tokens(params[0])?, hi: tokens(params[1])? }
        }
        "lognormal" => {
            want(2)?;
            Lengths::LogNormal { median: params[0], sigma: params[1] }
        }
        "pareto" => {
            want(2)?;
            Lengths::Pareto { scale: params[0], shape: params[1] }
        }
        "empirical" => Lengths::Empirical(params.iter().map(|&x| tokens(x)).collect::<PyResult<_>>()?),
        _ => {
            return Err(invalid(py, format!("{what}: unknown distribution '{kind}' (fixed, uniform, lognormal, pareto, empirical)")))
        }
    };
    Ok(LengthSpec { dist, min, max })
}

/// A seeded synthetic workload as columns; same arguments, identical arrays (bit for bit).
///
/// Args:
///     num_requests: requests to draw, 0 to ``SIM_MAX_REQUESTS`` (0: empty columns).
///     arrivals: ``"burst"`` (all at 0 s), ``"poisson"`` (exponential gaps at ``rate``) or
///         ``"gamma"`` (mean gap ``1 / rate``, coefficient of variation ``cv``).
///     rate: mean arrival rate, requests/s (finite, > 0).
///     cv: coefficient of variation of the gamma gaps (finite, > 0; above 1 is bursty).
///     prompt: prompt lengths as ``(kind, params)``, in tokens: ``("fixed", [n])``,
///         ``("uniform", [lo, hi])`` (inclusive), ``("lognormal", [median, sigma])``,
///         ``("pareto", [scale, shape])`` or ``("empirical", [values...])`` (resampled).
///     prompt_clamp: ``(min, max)`` tokens each drawn prompt length is clamped to, with
///         ``1 <= min <= max <= SIM_MAX_REQUEST_TOKENS`` (default: that whole range).
///     output: output lengths, as ``prompt``.
///     output_clamp: as ``prompt_clamp``, for output lengths.
///     priority_levels: priorities drawn uniformly from ``0..priority_levels``.
///     shared_prefixes: ``(num_prefixes, prefix_len, vocab_size)``: prompts become token ids
///         starting with one of ``num_prefixes`` random prefixes of ``prefix_len`` tokens
///         (at most 2**28 prefix token ids, and 2**28 prompt token ids in all).
///     seed: the random seed, any int in ``0..2**64``.
///
/// Returns:
///     ``{column: array}`` with ``arrival`` float64 (seconds), ``prompt_len``,
///     ``output_len`` and ``priority`` int64 (tokens; priority levels), and with
///     ``shared_prefixes`` also ``token_ids`` uint32 (all prompts concatenated) and
///     ``token_offsets`` int64 (``num_requests + 1`` offsets into ``token_ids``).
///
/// Raises:
///     InvalidArgumentError: any argument out of range, naming it: a negative count or
///         one above its limit, a bool where a count or a number is meant, an unknown
///         arrival process or length distribution, a rate or cv that is not finite and
///         positive, a wrong number of distribution parameters, a bad clamp or
///         shared-prefix shape, a seed outside ``0..2**64``.
#[pyfunction]
#[pyo3(signature = (num_requests, *, arrivals="poisson", rate=1.0, cv=1.0, prompt=("uniform".to_string(), vec![256.0, 4096.0]),
    prompt_clamp=(1, MAX_REQUEST_TOKENS), output=("uniform".to_string(), vec![128.0, 384.0]), output_clamp=(1, MAX_REQUEST_TOKENS),
    priority_levels=1, shared_prefixes=None, seed=0))]
#[allow(clippy::too_many_arguments)]
fn synthesize_workload<'py>(
    py: Python<'py>,
    #[pyo3(from_py_with = named::num_requests)] num_requests: usize,
    arrivals: &str,
    #[pyo3(from_py_with = named::rate)] rate: f64,
    #[pyo3(from_py_with = named::cv)] cv: f64,
    #[pyo3(from_py_with = named::prompt)] prompt: (String, Vec<f64>),
    #[pyo3(from_py_with = named::prompt_clamp)] prompt_clamp: (u32, u32),
    #[pyo3(from_py_with = named::output)] output: (String, Vec<f64>),
    #[pyo3(from_py_with = named::output_clamp)] output_clamp: (u32, u32),
    #[pyo3(from_py_with = named::priority_levels)] priority_levels: u32,
    #[pyo3(from_py_with = args::shared_prefixes)] shared_prefixes: Option<(usize, u32, u32)>,
    #[pyo3(from_py_with = args::seed)] seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    for (name, v) in [("rate", rate), ("cv", cv)] {
        if !(v.is_finite() && v > 0.0) {
            return Err(invalid(py, format!("{name} must be finite and > 0, got {v}")));
        }
    }
    let arrivals = match arrivals {
        "burst" => Arrivals::Burst,
        "poisson" => Arrivals::Poisson { rate },
        "gamma" => Arrivals::Gamma { rate, cv },
        _ => return Err(invalid(py, format!("unknown arrival process arrivals='{arrivals}' (burst, poisson, gamma)"))),
    };
    let spec = SyntheticSpec {
        num_requests,
        arrivals,
        prompt: length_spec(py, prompt, prompt_clamp, "prompt")?,
        output: length_spec(py, output, output_clamp, "output")?,
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
    if let Prompts::Tokens { ids, offsets } = w.prompts {
        d.set_item("token_ids", PyArray1::from_vec(py, ids))?;
        d.set_item("token_offsets", PyArray1::from_iter(py, offsets.into_iter().map(|x| x as i64)))?;
    }
    Ok(d)
}

/// Run the step-level serving simulator over a fresh ``BlockPool(num_blocks, block_size)``
/// (with ``groups``: ``BlockPool(num_blocks, block_size, groups)``).
///
/// The facade :func:`pykvpool.simulate.run` builds both dicts from a
/// :class:`pykvpool.simulate.Workload` and a :class:`pykvpool.simulate.SimConfig`, whose
/// docs describe each policy. The GIL is released while the engine runs, except around
/// calls to a Python ``time_model``. A request that can never run (longer than the pool,
/// than ``reserve_tokens``, or than the token budget without chunked prefill) is not an
/// error: it gets outcome 1 (rejected) and is counted. A key missing from a dict takes
/// its default; an unknown key is an error.
///
/// Args:
///     workload: the requests' columns, by key:
///         ``arrival`` (required): arrival time of each request, seconds (finite, >= 0):
///         a 1-D float array or a sequence of numbers; at most ``SIM_MAX_REQUESTS``
///         requests (empty: an empty result).
///         ``prompt_len`` (required): prompt length of each request, tokens (1 to
///         ``SIM_MAX_REQUEST_TOKENS``).
///         ``output_len`` (required): generated tokens of each request (1 to
///         ``SIM_MAX_REQUEST_TOKENS``).
///         ``priority``: int32 priority of each request (lower first under
///         ``queue="priority"``; default all 0).
///         ``token_ids``: all prompts' token ids concatenated (with ``token_offsets``),
///         for prefix caching.
///         ``token_offsets``: ``len(arrival) + 1`` offsets into ``token_ids``.
///         ``block_keys``: all prompts' block keys concatenated (with ``key_offsets``),
///         one key per ``tokens_per_key`` prompt tokens (a trace's ``hash_ids``), each in
///         ``0..2**64`` (a negative key is an error, as for :class:`BlockPool`).
///         ``key_offsets``: ``len(arrival) + 1`` offsets into ``block_keys``.
///         ``tokens_per_key``: prompt tokens per block key (default 0).
///     config: the pool and the scheduler, by key:
///         ``num_blocks`` (required): device blocks of the pool.
///         ``block_size`` (required): tokens per block.
///         ``max_running``: requests in flight at most (default 256).
///         ``max_batched_tokens``: tokens computed per step across the batch, at most
///         ``SIM_MAX_STEP_TOKENS`` (default 8192; None: that limit).
///         ``chunked_prefill``: split prompts that exceed the remaining token budget
///         (default True).
///         ``watermark``: fraction of the pool admission leaves free, in ``[0, 1)``
///         (default 0.0).
///         ``queue``: ``"fcfs"`` (default) or ``"priority"``.
///         ``allocation``: ``"paged"`` (default: blocks on demand), ``"reserve"`` (Orca:
///         every request reserves ``reserve_tokens`` tokens at admission; a request whose
///         prompt + output exceeds them is rejected) or ``"oracle"`` (each request
///         reserves its own final length: ``prompt + output - 1`` tokens under
///         ``"vllm"``, ``prompt + output`` under ``"decode_first"``).
///         ``reserve_tokens``: tokens reserved per request under ``allocation="reserve"``
///         (required there, 1 to 2**32 - 1; the model's context); ignored otherwise.
///         ``preemption``: ``"recompute"`` (default) or ``"swap"`` (to a host pool of
///         ``host_blocks`` blocks).
///         ``host_blocks``: host blocks for swapping (default 0).
///         ``victim``: ``"newest"`` (default) or ``"lowest_priority"``.
///         ``convention``: ``"vllm"`` (default) or ``"decode_first"``.
///         ``prefix_caching``: cache prompts given as ``token_ids`` or ``block_keys``
///         (prompts given as lengths only never hit; default False).
///         ``eviction``: idle cached blocks to reclaim first: ``"lru"`` (default),
///         ``"fifo"``, ``"lfu"`` or ``"priority"``.
///         ``check_invariants``: check the pool's invariants after every step (slow;
///         default False).
///         ``max_steps``: stop after this many steps (default None: run to the end).
///         ``record_steps``: keep the per-step columns (default True).
///         ``groups``: the model's layer groups (default None: one full-attention group,
///         a ``BlockPool``): a list of 1 to 64 tuples ``("full",)``, ``("sliding",
///         window)``, ``("sliding", window, sink_tokens)`` or ``("chunked", chunk_size)``
///         (tokens; window and chunk >= 1), sharing the ``num_blocks`` blocks. A
///         windowed group releases the blocks no later query needs at the start of each
///         growth and the scheduler counts them free; a reservation counts every logical
///         block of every group. The steps then gain a column ``blocks_used_g{j}`` per
///         group (blocks it holds; they add up to ``blocks_used``), the summary
///         ``peak_blocks_used_g{j}``, and ``kv_tokens`` counts the tokens stored over all
///         groups (utilization: stored tokens over held and reserved slots). With
///         ``prefix_caching`` the pool caches every group (:class:`BlockPool`): a hit
///         shares blocks, which ``blocks_used_g{j}`` and ``kv_tokens`` then count once per
///         holder, and an admission allocates its whole prompt in every group at once (a
///         prompt larger than the pool is rejected). With ``preemption="swap"`` the host
///         pool has the same groups (``host_blocks`` of them) and a swap moves what each
///         group holds (a window only its sinks and window).
///         ``stop_when``: None (default: run to the end) or a dict of SLO targets, each
///         None or a number finite and > 0: ``ttft_p99``, ``tpot_p50``, ``tpot_p99``
///         (seconds) and ``min_output_throughput`` (output tokens/s); ``attain_ttft``,
///         ``attain_tpot`` (seconds) with ``attain_share`` (in (0, 1]): that share of
///         the requests each finishes within both bounds (DistServe's attainment);
///         ``tolerate_rejections`` (a bool, default False): a rejected request alone
///         does not stop the run. The run stops as soon as its complete version
///         certainly misses them (a request rejected, enough latencies above a bound
///         that the percentile of the complete run is above it, or too few requests
///         left that can meet the attainment bounds: :mod:`pykvpool.simulate.stop`); the
///         summary's ``stopped`` names the target (``rejected``, ``ttft_p99``,
///         ``tpot_p50``, ``tpot_p99``, ``throughput``, ``attainment``), None when the
///         run went to the end (then it is the run without the rule, bit for bit).
///         ``replicas``: data parallelism: replicas of this configuration behind one
///         router, 1 (default) to ``SIM_MAX_REPLICAS``, each with its own pools and the
///         same ``time_model``; their steps run in time order on one clock.
///         ``router``: ``"round_robin"`` (default: the k-th arrival to replica k mod
///         ``replicas``) or ``"shortest_queue"`` (the fewest pending tokens: a request
///         counts its prompt until its first token, then 1 until it finishes). Requests
///         and steps gain a ``replica`` column (-1: never routed).
///         ``disaggregation``: None (default: every replica serves both phases) or a
///         dict: the ``replicas`` are prefill instances and ``decode_replicas`` (1 to
///         ``SIM_MAX_REPLICAS``) decode instances of ``decode_num_blocks`` blocks each
///         (default ``num_blocks``; no prefix caching) follow them, replica indices
///         ``replicas`` on. A request's prompt runs on a prefill instance (its first
///         token ends there); one of more output tokens then leaves its batch, its
///         blocks held there until its KV (``prompt_len * bytes_per_token`` bytes) has
///         moved over the link: ``bandwidth`` bytes/s per instance (finite, > 0),
///         ``latency`` s per transfer (default 0), first come first served on the
///         sender's and the receiver's link, pipelined over ``layers`` parts of the last
///         prefill step (default 1: after it; at most 65,536). The router's policy over
///         the decode instances picks one at the prefill's end (a request counts 1 token
///         until it finishes); it admits the request at its first step once the KV has
///         arrived and fits. ``mixed_tokens`` (0 to 2**63 - 1; default None: never): a mixed pool, an
///         arrival that finds every prefill instance with at least that many tokens
///         pending (the router's count) goes to a decode instance (the decode router's
///         choice), which serves it whole. Needs ``allocation="paged"`` and
///         ``convention="vllm"``.
///         Requests gain ``decode_replica`` (-1: none), ``kv_ready`` and
///         ``decode_start`` (s; NaN: none); the summary ``kv_transfers``,
///         ``kv_transfer_bytes`` and the ``kv_transfer_*`` (first token to KV arrived)
///         and ``decode_wait_*`` (KV arrived to admission) statistics.
///     time_model: seconds per step (float, default 0.0: steps only); the 11 roofline
///         figures ``[params, bytes/param, layers, q_dim, kv bytes/token, flop/s, bytes/s,
///         overhead s, swap s/block, all-reduce s/step, all-reduce s/token]``
///         (:meth:`pykvpool.planning.roofline.Roofline.figures`); or a callable ``f(prefill_tokens, decode_tokens,
///         num_seqs, context_tokens, attention_pairs, swapped_blocks) -> seconds``, called
///         with the GIL held.
///     decode_time_model: with ``disaggregation``, the decode instances' step time, as
///         ``time_model`` (default None: ``time_model`` times every step).
///
/// Returns:
///     ``{"requests": {column: array}, "steps": {column: array}, "summary": {name:
///     int | float | None}}``; the columns are those of
///     :class:`pykvpool.simulate.SimulationResult`. A summary statistic over an empty set
///     (no finished request, no step) is None, never NaN; ``summary["stopped"]`` is None
///     or the ``stop_when`` target that ended the run early.
///
/// Raises:
///     InvalidArgumentError: an unknown or missing required key; bad columns (2-D or
///         ragged, lengths that differ, a zero or out-of-range length, a bad arrival time
///         or offsets, a negative block key, more than ``SIM_MAX_REQUESTS`` requests), an
///         unknown policy name, ``"reserve"`` without ``reserve_tokens``, a size out of
///         range or a bool as a count, token ids mixed with block keys, a malformed
///         ``groups`` entry (naming ``groups[i]``), a ``stop_when`` bound that is not a number finite and
///         > 0 (naming ``stop_when.<key>``), a bad ``disaggregation`` entry (naming
///         ``disaggregation.<key>``; with ``allocation`` other than ``"paged"`` or
///         ``convention="decode_first"``), ``decode_time_model`` without
///         ``disaggregation``, or a bad time model or step time; each names the key.
///     TypeError: a dict that is not a dict (``stop_when`` and ``disaggregation``
///         included), a flag that is not a bool or a policy name
///         that is not a str (naming the key).
///     InvariantError: the engine broke an invariant (a pykvpool bug).
///     Exception: whatever a Python ``time_model`` raises, unchanged.
#[pyfunction]
#[pyo3(signature = (workload, config, time_model=None, decode_time_model=None))]
fn run_simulation<'py>(
    py: Python<'py>,
    workload: &Bound<'py, PyDict>,
    config: &Bound<'py, PyDict>,
    time_model: Option<&Bound<'py, PyAny>>,
    decode_time_model: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = options::sim_config(config)?;
    let w = options::workload(workload)?;
    let mut timer = match time_model {
        Some(t) => parse_timer(t, "time_model")?,
        None => Timer::Constant(ConstantTime(0.0)),
    };
    let mut decode = decode_time_model.filter(|t| !t.is_none()).map(|t| parse_timer(t, "decode_time_model")).transpose()?;
    if decode.is_some() && cfg.disaggregation.is_none() {
        return Err(invalid(py, "decode_time_model needs disaggregation (it times the decode instances' steps)"));
    }
    let (t, d) = (timer.as_dyn(), decode.as_mut().map(Timer::as_dyn));
    // A Python timer takes the GIL back around each call of its callable.
    let out = py.detach(|| simulate_with(&w, &cfg, t, d.map(|d| d as &mut dyn StepTimer)));
    if let Some(e) = timer.take_err().or_else(|| decode.as_mut().and_then(Timer::take_err)) {
        return Err(e);
    }
    result::result_dict(py, out.py_err(py)?, &w)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("SIM_MAX_REQUESTS", crate::sim::MAX_REQUESTS)?;
    m.add("SIM_MAX_REQUEST_TOKENS", MAX_REQUEST_TOKENS)?;
    m.add("SIM_MAX_STEP_TOKENS", crate::sim::MAX_STEP_TOKENS)?;
    m.add("SIM_MAX_REPLICAS", crate::sim::MAX_REPLICAS)?;
    m.add_function(wrap_pyfunction!(synthesize_workload, m)?)?;
    m.add_function(wrap_pyfunction!(run_simulation, m)?)?;
    Ok(())
}
