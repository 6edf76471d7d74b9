//! The result of `run_simulation` as nested dicts of numpy columns and summary scalars
//! (`None` for a statistic over an empty set).

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::sim::{Percentiles, RequestMetrics, SimResult, StepMetrics, Workload, UNROUTED};

pub fn result_dict<'py>(py: Python<'py>, r: SimResult, w: &Workload) -> PyResult<Bound<'py, PyDict>> {
    let summary = summary_dict(py, &r)?;
    let d = PyDict::new(py);
    d.set_item("requests", requests_dict(py, r.requests, w)?)?;
    d.set_item("steps", steps_dict(py, r.steps)?)?;
    d.set_item("summary", summary)?;
    Ok(d)
}

/// One column per request: the workload's, the computed latencies, the engine's records.
fn requests_dict<'py>(py: Python<'py>, q: RequestMetrics, w: &Workload) -> PyResult<Bound<'py, PyDict>> {
    let req = PyDict::new(py);
    req.set_item("prompt_len", PyArray1::from_iter(py, w.prompt_len.iter().map(|&x| x as i64)))?;
    req.set_item("output_len", PyArray1::from_iter(py, w.output_len.iter().map(|&x| x as i64)))?;
    req.set_item("priority", PyArray1::from_iter(py, w.priority.iter().map(|&x| x as i64)))?;
    req.set_item("ttft", PyArray1::from_vec(py, q.ttft()))?;
    req.set_item("tpot", PyArray1::from_vec(py, q.tpot(&w.output_len)))?;
    req.set_item("e2e", PyArray1::from_vec(py, q.e2e()))?;
    req.set_item("queueing", PyArray1::from_vec(py, q.queueing()))?;
    req.set_item("arrival", PyArray1::from_vec(py, q.arrival))?;
    req.set_item("first_scheduled", PyArray1::from_vec(py, q.first_scheduled))?;
    req.set_item("first_token", PyArray1::from_vec(py, q.first_token))?;
    req.set_item("finish", PyArray1::from_vec(py, q.finish))?;
    req.set_item("preemptions", PyArray1::from_vec(py, q.preemptions))?;
    req.set_item("swaps", PyArray1::from_vec(py, q.swaps))?;
    req.set_item("recomputed_tokens", PyArray1::from_vec(py, q.recomputed_tokens))?;
    req.set_item("cached_tokens", PyArray1::from_vec(py, q.cached_tokens))?;
    req.set_item("outcome", PyArray1::from_vec(py, q.outcome))?;
    // -1: never routed (the run ended before it arrived).
    let index = |r: &u32| if *r == UNROUTED { -1 } else { *r as i64 };
    req.set_item("replica", PyArray1::from_iter(py, q.replica.iter().map(index)))?;
    // Disaggregated runs fill these; a colocated one has no transfer (-1, NaN).
    let n = w.len();
    let or_nan = |v: Vec<f64>| if v.is_empty() { vec![f64::NAN; n] } else { v };
    if q.decode_replica.is_empty() {
        req.set_item("decode_replica", PyArray1::from_vec(py, vec![-1i64; n]))?;
    } else {
        req.set_item("decode_replica", PyArray1::from_iter(py, q.decode_replica.iter().map(index)))?;
    }
    req.set_item("kv_ready", PyArray1::from_vec(py, or_nan(q.kv_ready)))?;
    req.set_item("decode_start", PyArray1::from_vec(py, or_nan(q.decode_start)))?;
    Ok(req)
}

/// One column per step.
fn steps_dict<'py>(py: Python<'py>, s: StepMetrics) -> PyResult<Bound<'py, PyDict>> {
    let st = PyDict::new(py);
    st.set_item("time", PyArray1::from_vec(py, s.time))?;
    st.set_item("duration", PyArray1::from_vec(py, s.duration))?;
    st.set_item("replica", PyArray1::from_vec(py, s.replica))?;
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
    // Runs with layer groups only: one column per group, in the configured order.
    for (g, col) in s.group_blocks.into_iter().enumerate() {
        st.set_item(format!("blocks_used_g{g}"), PyArray1::from_vec(py, col))?;
    }
    Ok(st)
}

/// The run's totals and statistics; a statistic over an empty set is None.
fn summary_dict<'py>(py: Python<'py>, r: &SimResult) -> PyResult<Bound<'py, PyDict>> {
    let m = &r.summary;
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
        ("kv_transfers", m.kv_transfers),
    ] {
        sum.set_item(k, v)?;
    }
    for (g, &peak) in m.peak_group_blocks.iter().enumerate() {
        sum.set_item(format!("peak_blocks_used_g{g}"), peak)?;
    }
    for (k, v) in [
        ("makespan", m.makespan),
        ("output_throughput", m.output_throughput),
        ("total_throughput", m.total_throughput),
        ("request_throughput", m.request_throughput),
        ("mean_utilization", m.mean_utilization),
        ("prefix_hit_rate", Some(m.prefix_hit_rate)),
        ("kv_transfer_bytes", Some(m.kv_transfer_bytes)),
    ] {
        sum.set_item(k, v)?;
    }
    sum.set_item("stopped", m.stopped)?;
    for (name, p) in [
        ("ttft", &m.ttft),
        ("tpot", &m.tpot),
        ("e2e", &m.e2e),
        ("queueing", &m.queueing),
        ("kv_transfer", &m.kv_transfer),
        ("decode_wait", &m.decode_wait),
    ] {
        let stats = |f: fn(&Percentiles) -> f64| p.as_ref().map(f);
        for (stat, v) in [
            ("mean", stats(|p| p.mean)),
            ("p50", stats(|p| p.p50)),
            ("p90", stats(|p| p.p90)),
            ("p99", stats(|p| p.p99)),
            ("max", stats(|p| p.max)),
        ] {
            sum.set_item(format!("{name}_{stat}"), v)?;
        }
    }
    Ok(sum)
}
