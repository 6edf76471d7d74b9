//! An optional exact early stop: end a run as soon as it certainly cannot meet a set of
//! service-level targets, so that a search spends little on overloaded configurations.
//!
//! The targets ([`StopWhen`]) are those of a deployment search's SLO: every request
//! finished, the p99 time to first token, the p50 and p99 time per output token at most
//! their bounds, the output throughput at least its bound. A run is stopped only when
//! its complete version would certainly miss them, so the decision "meets the targets"
//! is the same with and without the stop; a run that is not stopped is the complete run,
//! bit for bit.
//!
//! Why each trigger is certain (the summary's percentiles are
//! [`Percentiles::of`]'s linear interpolation `v[lo] + (v[hi] - v[lo]) * frac`, with
//! `lo = floor(p * (n - 1))`, which rounding keeps `>= v[lo]`):
//! - `rejected`: a request that can never run is never finished.
//! - `ttft_p99`: once `n - lo` requests have a TTFT above the bound, `v[lo]` is above it
//!   (n = all requests: a complete run finishes each). A request still without its first
//!   token whose wait `now - arrival` already exceeds the bound counts: its first token
//!   comes at the end of a later step, at or after `now`.
//! - `tpot_p50`, `tpot_p99`: the same count over finished requests of two or more output
//!   tokens (n = the workload's requests with `output_len > 1`).
//! - `throughput`: with a request unfinished at `now`, the makespan is at least `now -
//!   first arrival`, so the output throughput is at most `total output tokens / (now -
//!   first arrival)`.
//! - `attainment` (DistServe's goodput condition: a share of the requests each meets both
//!   a time-to-first-token and a time-per-output-token bound): a request misses once its
//!   TTFT is above the bound (or it has waited longer than the bound without a first
//!   token), its TPOT is above the bound, or it is rejected; once the requests that can
//!   still meet them are fewer than the share, the run cannot.
//!
//! With [`StopWhen::tolerate_rejections`] (an attainment target counts rejected requests
//! as misses rather than requiring every request finished) a rejection does not stop the
//! run. The percentile triggers stay exact on the fewer values left (the count that
//! lifts a percentile grows with the values), a rejected request never counts as
//! waiting, and the throughput trigger is off once a request was rejected (the makespan
//! then starts at the first finished request's arrival, which may be later).

use super::metrics::Percentiles;
use crate::error::Result;
use crate::invalid;

/// Targets a run must be able to meet to keep running; `None` is not checked.
/// Latencies in seconds, throughput in output tokens/s.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StopWhen {
    pub ttft_p99: Option<f64>,
    pub tpot_p50: Option<f64>,
    pub tpot_p99: Option<f64>,
    pub min_output_throughput: Option<f64>,
    /// A share of the requests must each meet per-request bounds.
    pub attainment: Option<Attainment>,
    /// A rejected request alone does not stop the run.
    pub tolerate_rejections: bool,
}

/// DistServe's attainment: at least `share` of the workload's requests each have a TTFT
/// of at most `ttft` and a TPOT of at most `tpot` (seconds; None: not checked; a request
/// of one output token has no TPOT and meets that bound).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attainment {
    pub ttft: Option<f64>,
    pub tpot: Option<f64>,
    pub share: f64,
}

impl Attainment {
    /// Whether a request's TTFT and TPOT (NaN: none) meet the bounds.
    pub fn met(&self, ttft: f64, tpot: f64) -> bool {
        self.ttft.is_none_or(|b| ttft <= b) && self.tpot.is_none_or(|b| tpot.is_nan() || tpot <= b)
    }
}

impl StopWhen {
    /// Each bound finite and > 0.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("ttft_p99", self.ttft_p99),
            ("tpot_p50", self.tpot_p50),
            ("tpot_p99", self.tpot_p99),
            ("min_output_throughput", self.min_output_throughput),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return Err(invalid!("stop_when.{name} must be finite and > 0, got {v}"));
                }
            }
        }
        if let Some(a) = &self.attainment {
            for (name, v) in [("attain_ttft", a.ttft), ("attain_tpot", a.tpot)] {
                if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
                    return Err(invalid!("stop_when.{name} must be finite and > 0, got {v:?}"));
                }
            }
            if a.ttft.is_none() && a.tpot.is_none() {
                return Err(invalid!("stop_when: an attainment target needs attain_ttft or attain_tpot"));
            }
            if !(a.share > 0.0 && a.share <= 1.0) {
                return Err(invalid!("stop_when.attain_share must be in (0, 1], got {}", a.share));
            }
        }
        Ok(())
    }
}

/// Why a run stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    Rejected,
    TtftP99,
    TpotP50,
    TpotP99,
    Throughput,
    Attainment,
}

impl Stopped {
    /// The name the summary reports.
    pub fn name(self) -> &'static str {
        match self {
            Stopped::Rejected => "rejected",
            Stopped::TtftP99 => "ttft_p99",
            Stopped::TpotP50 => "tpot_p50",
            Stopped::TpotP99 => "tpot_p99",
            Stopped::Throughput => "throughput",
            Stopped::Attainment => "attainment",
        }
    }
}

/// One percentile bound: values above `bound` seen so far, and how many make the
/// percentile of the complete run certainly exceed it.
#[derive(Clone, Copy, Debug)]
struct Bound {
    bound: f64,
    need: usize,
    above: usize,
}

impl Bound {
    /// `None` when there is no bound or no value to take the percentile of.
    fn new(bound: Option<f64>, p: f64, n: usize) -> Option<Self> {
        bound.filter(|_| n > 0).map(|bound| Self { bound, need: Percentiles::certainly_above(p, n), above: 0 })
    }

    fn add(&mut self, v: f64) {
        self.above += (v > self.bound) as usize;
    }
}

/// The counters of a run under a [`StopWhen`].
#[derive(Clone, Debug)]
pub(super) struct StopState {
    ttft: Option<Bound>,
    tpot50: Option<Bound>,
    tpot99: Option<Bound>,
    min_throughput: Option<f64>,
    /// Requests in arrival order whose wait has been compared with the TTFT bound.
    late_scan: usize,
    /// Requests counted late before their first token (they are in `ttft.above`'s future).
    late: Vec<bool>,
    late_waiting: usize,
    rejected: bool,
    tolerate_rejections: bool,
    /// Per request, rejected (kept only when rejections are tolerated), and how many.
    was_rejected: Vec<bool>,
    rejections: usize,
    finished: usize,
    total_output: f64,
    first_arrival: f64,
    attain: Option<AttainState>,
}

/// The attainment target's misses so far.
#[derive(Clone, Debug)]
struct AttainState {
    target: Attainment,
    /// Requests in arrival order whose wait has been compared with the TTFT bound.
    scan: usize,
    missed: Vec<bool>,
    misses: usize,
}

impl AttainState {
    fn miss(&mut self, i: usize) {
        if !self.missed[i] {
            self.missed[i] = true;
            self.misses += 1;
        }
    }
}

impl StopState {
    pub(super) fn new(rule: &StopWhen, arrival: &[f64], output_len: &[u32]) -> Self {
        let n = arrival.len();
        let multi = output_len.iter().filter(|&&o| o > 1).count();
        Self {
            ttft: Bound::new(rule.ttft_p99, 0.99, n),
            tpot50: Bound::new(rule.tpot_p50, 0.5, multi),
            tpot99: Bound::new(rule.tpot_p99, 0.99, multi),
            min_throughput: rule.min_output_throughput,
            late_scan: 0,
            late: if rule.ttft_p99.is_some() { vec![false; n] } else { Vec::new() },
            late_waiting: 0,
            rejected: false,
            tolerate_rejections: rule.tolerate_rejections,
            was_rejected: if rule.tolerate_rejections { vec![false; n] } else { Vec::new() },
            rejections: 0,
            finished: 0,
            total_output: output_len.iter().map(|&o| o as f64).sum(),
            first_arrival: arrival.iter().copied().fold(f64::INFINITY, f64::min),
            attain: rule.attainment.map(|target| AttainState { target, scan: 0, missed: vec![false; n], misses: 0 }),
        }
    }

    /// Request `i` can never run.
    pub(super) fn on_reject(&mut self, i: usize) {
        self.rejected = true;
        self.rejections += 1;
        if let Some(r) = self.was_rejected.get_mut(i) {
            *r = true;
        }
        if let Some(a) = &mut self.attain {
            a.miss(i);
        }
    }

    /// Request `i` got its first token; `ttft` as the summary computes it.
    pub(super) fn on_first_token(&mut self, i: usize, ttft: f64) {
        if let Some(b) = &mut self.ttft {
            if self.late[i] {
                self.late[i] = false;
                self.late_waiting -= 1;
            }
            b.add(ttft);
        }
        if let Some(a) = &mut self.attain {
            if !a.target.met(ttft, f64::NAN) {
                a.miss(i);
            }
        }
    }

    /// Request `i` finished; `tpot` as the summary computes it (NaN for one output token).
    pub(super) fn on_finish(&mut self, i: usize, tpot: f64) {
        self.finished += 1;
        if let Some(a) = &mut self.attain {
            if a.target.tpot.is_some_and(|b| tpot > b) {
                a.miss(i);
            }
        }
        if !tpot.is_nan() {
            for b in [&mut self.tpot50, &mut self.tpot99].into_iter().flatten() {
                b.add(tpot);
            }
        }
    }

    /// After a step ending at `now`: the reason the run cannot meet the targets any more,
    /// if it cannot. `order` holds the request indices by arrival, `first_token` the
    /// first-token times so far (NaN: none yet).
    pub(super) fn check(&mut self, now: f64, order: &[u32], arrival: &[f64], first_token: &[f64]) -> Option<Stopped> {
        if self.rejected && !self.tolerate_rejections {
            return Some(Stopped::Rejected);
        }
        if self.finished + self.rejections == arrival.len() {
            return None; // complete: the summary decides
        }
        let waiting = |i: usize| first_token[i].is_nan() && !self.was_rejected.get(i).copied().unwrap_or(false);
        if let Some(b) = &self.ttft {
            while let Some(&i) = order.get(self.late_scan) {
                let i = i as usize;
                if now - arrival[i] <= b.bound {
                    break;
                }
                if waiting(i) {
                    self.late[i] = true;
                    self.late_waiting += 1;
                }
                self.late_scan += 1;
            }
            if b.above + self.late_waiting >= b.need {
                return Some(Stopped::TtftP99);
            }
        }
        for (b, why) in [(&self.tpot50, Stopped::TpotP50), (&self.tpot99, Stopped::TpotP99)] {
            if b.is_some_and(|b| b.above >= b.need) {
                return Some(why);
            }
        }
        if let Some(a) = &mut self.attain {
            if let Some(bound) = a.target.ttft {
                while let Some(&i) = order.get(a.scan) {
                    let i = i as usize;
                    if now - arrival[i] <= bound {
                        break;
                    }
                    if first_token[i].is_nan() {
                        a.miss(i);
                    }
                    a.scan += 1;
                }
            }
            let n = arrival.len();
            if ((n - a.misses) as f64) < a.target.share * n as f64 {
                return Some(Stopped::Attainment);
            }
        }
        let span = now - self.first_arrival;
        match self.min_throughput {
            Some(m) if !self.rejected && span > 0.0 && self.total_output / span < m => Some(Stopped::Throughput),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certainly_above_is_the_count_that_lifts_the_lower_order_statistic() {
        // k values above the bound (the rest at it): from `need` on, the order statistic
        // below the percentile is above the bound and so is the percentile (checked on
        // values just above it, the closest case); one fewer leaves that statistic at it.
        let pick = |q: &Percentiles, p: f64| if p == 0.5 { q.p50 } else if p == 0.9 { q.p90 } else { q.p99 };
        for n in 1..300usize {
            for p in [0.5, 0.9, 0.99] {
                let need = Percentiles::certainly_above(p, n);
                assert!((1..=n).contains(&need), "{n} {p} {need}");
                let lo = (p * (n - 1) as f64).floor() as usize;
                for k in [need - 1, need] {
                    let mut v: Vec<f64> = (0..n).map(|j| if j < k { 1.0 + 1e-9 } else { 1.0 }).collect();
                    let q = Percentiles::of(&v).unwrap();
                    v.sort_by(f64::total_cmp);
                    assert_eq!(v[lo] > 1.0, k == need, "n={n} p={p} k={k}");
                    if k == need {
                        assert!(pick(&q, p) > 1.0, "n={n} p={p} k={k}");
                    }
                }
            }
        }
    }

    #[test]
    fn bad_bounds_are_refused_by_name() {
        for v in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = StopWhen { tpot_p50: Some(v), ..Default::default() }.validate().unwrap_err();
            assert!(e.to_string().contains("stop_when.tpot_p50"), "{e}");
        }
        assert!(StopWhen { ttft_p99: Some(2.0), ..Default::default() }.validate().is_ok());
    }
}
