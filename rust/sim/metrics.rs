//! What a simulation records: per-request timings and counters, per-step occupancy, and a
//! summary. Everything is columnar (one `Vec` per field) so the bindings hand each column to
//! numpy as one array. Times are logical seconds from the timer, never the wall clock.

/// Final state of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Outcome {
    Finished = 0,
    /// Could never fit: its longest KV exceeds the pool (or the reservation limit, or the
    /// token budget without chunked prefill).
    Rejected = 1,
    /// The run stopped (`max_steps`, or the stop rule `stop_when`) before it finished.
    Unfinished = 2,
}

/// Per-request columns, in the workload's order. Times in seconds; NaN where an event
/// never happened (a rejected request has no first token).
#[derive(Clone, Debug, Default)]
pub struct RequestMetrics {
    pub arrival: Vec<f64>,
    /// Start of the step that first scheduled it.
    pub first_scheduled: Vec<f64>,
    /// End of the step that produced its first output token.
    pub first_token: Vec<f64>,
    /// End of the step that produced its last output token.
    pub finish: Vec<f64>,
    pub preemptions: Vec<u32>,
    /// Tokens whose KV was dropped by a recompute preemption and computed again.
    pub recomputed_tokens: Vec<u64>,
    /// Prompt tokens served from the prefix cache (summed over admissions).
    pub cached_tokens: Vec<u64>,
    /// Times swapped out to the host pool.
    pub swaps: Vec<u32>,
    pub outcome: Vec<u8>,
    /// The replica the router sent it to; [`UNROUTED`] when the run ended before it arrived.
    pub replica: Vec<u32>,
    /// Disaggregated runs only (empty otherwise): the decode instance its KV went to
    /// ([`UNROUTED`]: none, it finished on its prefill instance or never got there)...
    pub decode_replica: Vec<u32>,
    /// ... when its KV had arrived there ...
    pub kv_ready: Vec<f64>,
    /// ... and the start of the decode instance's step that admitted it.
    pub decode_start: Vec<f64>,
}

/// The `replica` of a request the run never routed.
pub const UNROUTED: u32 = u32::MAX;

impl RequestMetrics {
    pub fn ttft(&self) -> Vec<f64> {
        self.first_token.iter().zip(&self.arrival).map(|(f, a)| f - a).collect()
    }

    pub fn e2e(&self) -> Vec<f64> {
        self.finish.iter().zip(&self.arrival).map(|(f, a)| f - a).collect()
    }

    pub fn queueing(&self) -> Vec<f64> {
        self.first_scheduled.iter().zip(&self.arrival).map(|(f, a)| f - a).collect()
    }

    /// `to - from` per request; NaN everywhere when `to` is empty (a colocated run).
    pub fn delta(&self, from: &[f64], to: &[f64]) -> Vec<f64> {
        if to.is_empty() {
            return vec![f64::NAN; self.arrival.len()];
        }
        to.iter().zip(from).map(|(t, f)| t - f).collect()
    }

    /// Time per output token after the first; NaN for single-token outputs.
    pub fn tpot(&self, output_len: &[u32]) -> Vec<f64> {
        (0..self.arrival.len())
            .map(|i| {
                if output_len[i] > 1 {
                    (self.finish[i] - self.first_token[i]) / (output_len[i] - 1) as f64
                } else {
                    f64::NAN
                }
            })
            .collect()
    }
}

/// Per-step columns, one entry per engine step.
#[derive(Clone, Debug, Default)]
pub struct StepMetrics {
    /// Start of the step, seconds (steps of all replicas, in the order they ran: by start).
    pub time: Vec<f64>,
    /// The replica that ran it.
    pub replica: Vec<u32>,
    pub duration: Vec<f64>,
    /// Requests running (holding device KV) once the step's admissions are done.
    pub running: Vec<u32>,
    /// Requests computing in this step.
    pub batch: Vec<u32>,
    /// Arrived requests waiting for admission after scheduling.
    pub waiting: Vec<u32>,
    /// Requests parked in the host pool after scheduling.
    pub swapped: Vec<u32>,
    pub prefill_tokens: Vec<u32>,
    pub decode_tokens: Vec<u32>,
    /// Device blocks held by sequences after the step's allocation.
    pub blocks_used: Vec<u32>,
    /// Blocks promised to running requests but not allocated yet (reservation policy).
    pub blocks_reserved: Vec<u32>,
    /// KV tokens held on the device; with layer groups, the tokens stored over all groups
    /// (a windowed group stores its sinks and window only).
    pub kv_tokens: Vec<u64>,
    /// `1 - waste / ((blocks_used + blocks_reserved) x block_size)`, the waste being the
    /// empty slots of the blocks held (partly filled last blocks) plus
    /// reserved-but-unallocated blocks (without prefix sharing this is
    /// `kv_tokens / capacity`); 1.0 when nothing is held.
    pub utilization: Vec<f64>,
    /// With layer groups, one column per group: device blocks the group holds after the
    /// step's allocation (they add up to `blocks_used`); empty without groups.
    pub group_blocks: Vec<Vec<u32>>,
    /// Prompt tokens looked up / found in the prefix cache at admissions of this step.
    pub cache_query_tokens: Vec<u64>,
    pub cache_hit_tokens: Vec<u64>,
    /// `cache_hit_tokens / cache_query_tokens`; NaN in steps without a cached admission.
    pub prefix_hit_rate: Vec<f64>,
    pub preemptions: Vec<u32>,
    pub swapped_blocks: Vec<u32>,
}

/// Whole-run figures. A statistic over an empty set is `None`, never NaN: the latency
/// percentiles without a finished request (TPOT: without a finished multi-token output),
/// the makespan without a finished request, throughputs without a positive makespan, the
/// mean utilization without a recorded step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub num_requests: u64,
    pub finished: u64,
    pub rejected: u64,
    pub steps: u64,
    pub preemptions: u64,
    pub swaps: u64,
    /// First arrival to last finish of the finished requests, seconds.
    pub makespan: Option<f64>,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub recomputed_tokens: u64,
    pub cached_tokens: u64,
    /// Output tokens / makespan.
    pub output_throughput: Option<f64>,
    /// (Prompt + output tokens) / makespan.
    pub total_throughput: Option<f64>,
    pub request_throughput: Option<f64>,
    pub peak_running: u64,
    pub peak_blocks_used: u64,
    /// Per group, the most blocks it held at once (empty without groups).
    pub peak_group_blocks: Vec<u64>,
    /// Step-duration-weighted mean utilization (steps of zero duration weigh 1 each when
    /// every step has zero duration).
    pub mean_utilization: Option<f64>,
    /// Prompt tokens served from the cache / prompt tokens looked up; 0 when nothing was
    /// looked up (caching off, or prompts given as lengths only).
    pub prefix_hit_rate: f64,
    pub ttft: Option<Percentiles>,
    pub tpot: Option<Percentiles>,
    pub e2e: Option<Percentiles>,
    pub queueing: Option<Percentiles>,
    /// Disaggregated runs: transfers scheduled, the bytes they move, and over the finished
    /// requests that moved, the time from first token to arrived KV and from arrived KV to
    /// the decode instance's admission.
    pub kv_transfers: u64,
    pub kv_transfer_bytes: f64,
    pub kv_transfer: Option<Percentiles>,
    pub decode_wait: Option<Percentiles>,
    /// Why the run was stopped early under [`super::StopWhen`] (None: it ran to the end,
    /// or to `max_steps`); the statistics then cover what happened before the stop.
    pub stopped: Option<&'static str>,
}

/// Mean and percentiles over finished requests.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// Linear interpolation between order statistics (numpy's default), ignoring NaN;
    /// `None` when no value is left.
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let (lo, hi, frac) = Self::rank(p, v.len());
            v[lo] + (v[hi] - v[lo]) * frac
        };
        Some(Self { mean: v.iter().sum::<f64>() / v.len() as f64, p50: q(0.5), p90: q(0.9), p99: q(0.99), max: v[v.len() - 1] })
    }
}

impl Percentiles {
    /// The order statistics the `p` quantile of `n >= 1` sorted values interpolates
    /// between, and the weight of the upper one: `pos = p * (n - 1)`, `(floor(pos),
    /// ceil(pos), pos - floor(pos))`.
    fn rank(p: f64, n: usize) -> (usize, usize, f64) {
        let pos = p * (n - 1) as f64;
        let lo = pos.floor() as usize;
        (lo, pos.ceil() as usize, pos - lo as f64)
    }

    /// How many of `n >= 1` values above a bound make their `p` quantile (as [`Self::of`]
    /// computes it) certainly above the bound: `n - floor(p * (n - 1))`. With that many,
    /// the lower order statistic of the interpolation is above the bound, and the
    /// interpolation never goes below it (the upper one is no smaller, and rounding keeps
    /// `a + (b - a) * f >= a` for `b >= a`, `f >= 0`).
    pub fn certainly_above(p: f64, n: usize) -> usize {
        n - Self::rank(p, n).0
    }
}

impl Summary {
    pub fn compute(req: &RequestMetrics, steps: &StepMetrics, prompt_len: &[u32], output_len: &[u32], total_steps: u64) -> Self {
        let done: Vec<usize> = (0..req.arrival.len()).filter(|&i| req.outcome[i] == Outcome::Finished as u8).collect();
        let pick = |col: &[f64]| done.iter().map(|&i| col[i]).collect::<Vec<f64>>();
        let first = done.iter().map(|&i| req.arrival[i]).fold(f64::INFINITY, f64::min);
        let last = done.iter().map(|&i| req.finish[i]).fold(f64::NEG_INFINITY, f64::max);
        let makespan = (!done.is_empty()).then_some(last - first);
        let prompt_tokens: u64 = done.iter().map(|&i| prompt_len[i] as u64).sum();
        let output_tokens: u64 = done.iter().map(|&i| output_len[i] as u64).sum();
        let per_s = |x: f64| makespan.filter(|&m| m > 0.0).map(|m| x / m);
        let total_dur: f64 = steps.duration.iter().sum();
        let mean_utilization = if steps.utilization.is_empty() {
            None
        } else if total_dur > 0.0 {
            Some(steps.utilization.iter().zip(&steps.duration).map(|(u, d)| u * d).sum::<f64>() / total_dur)
        } else {
            Some(steps.utilization.iter().sum::<f64>() / steps.utilization.len() as f64)
        };
        let queried: u64 = steps.cache_query_tokens.iter().sum();
        let hit: u64 = steps.cache_hit_tokens.iter().sum();
        Self {
            num_requests: req.arrival.len() as u64,
            finished: done.len() as u64,
            rejected: req.outcome.iter().filter(|&&o| o == Outcome::Rejected as u8).count() as u64,
            steps: total_steps,
            preemptions: req.preemptions.iter().map(|&p| p as u64).sum(),
            swaps: req.swaps.iter().map(|&p| p as u64).sum(),
            makespan,
            prompt_tokens,
            output_tokens,
            recomputed_tokens: req.recomputed_tokens.iter().sum(),
            cached_tokens: req.cached_tokens.iter().sum(),
            output_throughput: per_s(output_tokens as f64),
            total_throughput: per_s((prompt_tokens + output_tokens) as f64),
            request_throughput: per_s(done.len() as f64),
            peak_running: steps.running.iter().copied().max().unwrap_or(0) as u64,
            peak_blocks_used: steps.blocks_used.iter().copied().max().unwrap_or(0) as u64,
            peak_group_blocks: steps.group_blocks.iter().map(|c| c.iter().copied().max().unwrap_or(0) as u64).collect(),
            mean_utilization,
            prefix_hit_rate: if queried > 0 { hit as f64 / queried as f64 } else { 0.0 },
            ttft: Percentiles::of(&pick(&req.ttft())),
            tpot: Percentiles::of(&pick(&req.tpot(output_len))),
            e2e: Percentiles::of(&pick(&req.e2e())),
            queueing: Percentiles::of(&pick(&req.queueing())),
            kv_transfers: 0,
            kv_transfer_bytes: 0.0,
            kv_transfer: Percentiles::of(&pick(&req.delta(&req.first_token, &req.kv_ready))),
            decode_wait: Percentiles::of(&pick(&req.delta(&req.kv_ready, &req.decode_start))),
            stopped: None,
        }
    }
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct SimResult {
    pub requests: RequestMetrics,
    pub steps: StepMetrics,
    pub summary: Summary,
    /// Blocks still held when the run ended (0 after a complete run: conservation).
    pub leaked_blocks: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_numpy_linear() {
        let p = Percentiles::of(&[4.0, 1.0, f64::NAN, 3.0, 2.0]).unwrap();
        assert_eq!(p.p50, 2.5);
        assert!((p.p90 - 3.7).abs() < 1e-12);
        assert_eq!(p.max, 4.0);
        assert_eq!(p.mean, 2.5);
        assert!(Percentiles::of(&[]).is_none());
        assert!(Percentiles::of(&[f64::NAN]).is_none());
    }
}
