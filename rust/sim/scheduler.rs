//! Continuous batching in the manner of vLLM v1's scheduler, one step at a time.
//!
//! Each step first serves running requests in order (a decode token each, or the next
//! chunk of a prefill), then — only if nobody was preempted in this step — swapped
//! requests, then waiting ones, within a limit on running requests and a token budget.
//! When a running request cannot get a block, a victim (the newest running request, or
//! the lowest-priority one) is preempted until it can: recompute frees its KV and puts
//! it back at the front of the queue; swap parks its KV in a host pool. Admission can
//! instead reserve a fixed maximum length per request up front (Orca), or each request's
//! own final length (an oracle that knows output lengths); neither ever preempts.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::error::{KvError, Result};
use crate::invalid;
use crate::pool::MAX_SEQ_TOKENS;

use super::kv::Kv;
use super::limits::MAX_STEP_TOKENS;
use super::request::{Convention, ReqState, Status};
use super::workload::Workload;

/// Order of the waiting queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueuePolicy {
    /// First come, first served; preempted requests go back to the front.
    Fcfs,
    /// Lowest `priority` value first, then arrival order.
    Priority,
}

/// How admission claims memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Blocks on demand as tokens are computed (vLLM).
    Paged,
    /// Orca's max-length reservation: every request reserves the blocks of `tokens` tokens
    /// (the model's context) at admission. A request whose `prompt + output` exceeds
    /// `tokens` can never be served and is rejected.
    Reserve { tokens: u32 },
    /// Each request reserves its own final length at admission (`prompt + output - 1`
    /// tokens under [`Convention::Vllm`], `prompt + output` under `DecodeFirst`): an
    /// oracle that knows output lengths, the most favourable reservation.
    Oracle,
}

/// What happens to a preempted request's KV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preemption {
    /// Free it and compute it again later.
    Recompute,
    /// Park it in a host pool of `host_blocks` blocks (recompute when that is full).
    Swap { host_blocks: usize },
}

/// Which running request is preempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victim {
    /// The most recently scheduled (vLLM's FCFS choice).
    Newest,
    /// Largest `priority` value, latest arrival among equals (vLLM's priority choice).
    LowestPriority,
}

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub max_running: usize,
    /// Tokens computed per step across the batch (`None`: unlimited).
    pub max_batched_tokens: Option<usize>,
    /// Split prompts that do not fit the remaining budget into chunks.
    pub chunked_prefill: bool,
    /// Fraction of the pool admission keeps free.
    pub watermark: f64,
    pub queue: QueuePolicy,
    pub allocation: Allocation,
    pub preemption: Preemption,
    pub victim: Victim,
    pub convention: Convention,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_running: 256,
            max_batched_tokens: Some(8192),
            chunked_prefill: true,
            watermark: 0.0,
            queue: QueuePolicy::Fcfs,
            allocation: Allocation::Paged,
            preemption: Preemption::Recompute,
            victim: Victim::Newest,
            convention: Convention::Vllm,
        }
    }
}

impl SchedulerConfig {
    pub fn validate(&self) -> Result<()> {
        if self.max_running == 0 {
            return Err(invalid!("max_running must be >= 1"));
        }
        if let Some(b) = self.max_batched_tokens {
            if b == 0 || b > MAX_STEP_TOKENS as usize {
                return Err(invalid!("max_batched_tokens must be in 1..={MAX_STEP_TOKENS} tokens (None: that limit), got {b}"));
            }
        }
        if !(self.watermark.is_finite() && (0.0..1.0).contains(&self.watermark)) {
            return Err(invalid!("watermark must be a fraction in [0, 1), got {}", self.watermark));
        }
        if self.allocation == (Allocation::Reserve { tokens: 0 }) {
            return Err(invalid!("reserve_tokens must be >= 1"));
        }
        Ok(())
    }

    /// Tokens one step computes at most (`validate` bounds it by [`MAX_STEP_TOKENS`]).
    fn budget(&self) -> u32 {
        self.max_batched_tokens.map_or(MAX_STEP_TOKENS, |b| b.min(MAX_STEP_TOKENS as usize) as u32)
    }
}

/// Where a request's computed KV waits to be resumed.
#[derive(Clone, Copy)]
enum Parked {
    /// Swapped out to the host pool.
    Host,
    /// Arrived from a prefill instance.
    Wire,
}

/// The waiting queue under either policy.
enum WaitQueue {
    Fcfs(VecDeque<u32>),
    Priority(BinaryHeap<Reverse<(i32, u32, u32)>>),
}

/// Requests scheduled in one step: `(request, tokens computed)`, plus step counters.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub items: Vec<(u32, u32)>,
    pub preemptions: u32,
    pub swapped_blocks: u64,
    /// Blocks of requests admitted with KV arrived from a prefill instance.
    pub received_blocks: u64,
    pub cache_query_tokens: u64,
    pub cache_hit_tokens: u64,
    /// Token budget left for the rest of the step.
    pub budget: u32,
}

pub struct Scheduler {
    pub cfg: SchedulerConfig,
    waiting: WaitQueue,
    /// In scheduling order; a newly admitted or resumed request goes to the end.
    pub running: Vec<u32>,
    swapped: VecDeque<u32>,
    /// Disaggregated decode instance: requests whose KV has arrived from a prefill
    /// instance, in arrival order.
    received: VecDeque<u32>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Result<Self> {
        cfg.validate()?;
        let waiting = match cfg.queue {
            QueuePolicy::Fcfs => WaitQueue::Fcfs(VecDeque::new()),
            QueuePolicy::Priority => WaitQueue::Priority(BinaryHeap::new()),
        };
        Ok(Self { cfg, waiting, running: Vec::new(), swapped: VecDeque::new(), received: VecDeque::new() })
    }

    pub fn num_waiting(&self) -> usize {
        match &self.waiting {
            WaitQueue::Fcfs(q) => q.len(),
            WaitQueue::Priority(h) => h.len(),
        }
    }

    pub fn num_swapped(&self) -> usize {
        self.swapped.len()
    }

    /// Requests whose KV arrived from a prefill instance, not admitted yet.
    pub fn num_received(&self) -> usize {
        self.received.len()
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.swapped.is_empty() && self.num_waiting() == 0 && self.received.is_empty()
    }

    /// Queue a request whose KV has arrived from a prefill instance.
    pub fn deliver(&mut self, idx: u32) {
        self.received.push_back(idx);
    }

    /// Queue an arrived request, or a preempted one (`front`: ahead of everybody under FCFS).
    pub fn enqueue(&mut self, idx: u32, r: &ReqState, front: bool) {
        match &mut self.waiting {
            WaitQueue::Fcfs(q) if front => q.push_front(idx),
            WaitQueue::Fcfs(q) => q.push_back(idx),
            WaitQueue::Priority(h) => h.push(Reverse((r.priority, r.ordinal, idx))),
        }
    }

    fn peek_waiting(&self) -> Option<u32> {
        match &self.waiting {
            WaitQueue::Fcfs(q) => q.front().copied(),
            WaitQueue::Priority(h) => h.peek().map(|Reverse((_, _, i))| *i),
        }
    }

    fn pop_waiting(&mut self) {
        match &mut self.waiting {
            WaitQueue::Fcfs(q) => {
                q.pop_front();
            }
            WaitQueue::Priority(h) => {
                h.pop();
            }
        }
    }

    /// Blocks admission promises a request for its whole life, or `None` when paged: with
    /// layer groups, every logical block of every group ([`Kv::reserve_blocks`]).
    pub fn reservation(&self, r: &ReqState, kv: &Kv) -> Option<usize> {
        match self.cfg.allocation {
            Allocation::Paged => None,
            Allocation::Reserve { tokens } => Some(kv.reserve_blocks(tokens as usize)),
            Allocation::Oracle => Some(kv.reserve_blocks(r.max_kv(self.cfg.convention) as usize)),
        }
    }

    /// Whether a request can ever run alone holding at most `longest` KV tokens
    /// ([`ReqState::max_kv`], or the prompt on a prefill instance); `Err(reason)` when it
    /// cannot. `keyed`: its prompt has token ids or block keys (a caching admission
    /// allocates it whole).
    pub fn admissible_alone(&self, r: &ReqState, kv: &Kv, keyed: bool, longest: u64) -> std::result::Result<(), String> {
        if longest > MAX_SEQ_TOKENS as u64 {
            return Err(format!("{longest} tokens exceed a pool sequence ({MAX_SEQ_TOKENS})"));
        }
        if let Allocation::Reserve { tokens } = self.cfg.allocation {
            if r.total_len() > tokens as u64 {
                return Err(format!("prompt + output = {} tokens exceed the reservation of {tokens}", r.total_len()));
            }
        }
        let cap = kv.device.num_blocks().saturating_sub(kv.watermark);
        // A growth computes at most the token budget with chunked prefill, else a whole
        // (re)computed prompt.
        let chunk = if self.cfg.chunked_prefill { longest.min(self.cfg.budget() as u64) } else { longest };
        let mut need = self.reservation(r, kv).unwrap_or_else(|| kv.peak_alone(longest as usize, chunk as usize));
        if kv.caching && keyed {
            // A caching admission allocates the whole prompt in every group at once.
            need = need.max(kv.reserve_blocks(r.prompt_len as usize));
        }
        if need > cap {
            return Err(format!("needs {need} blocks, the pool admits {cap}"));
        }
        if !self.cfg.chunked_prefill && longest > self.cfg.budget() as u64 {
            return Err(format!("a {longest}-token recompute exceeds the token budget without chunked prefill"));
        }
        Ok(())
    }

    fn pick_victim(&self, reqs: &[ReqState]) -> usize {
        match self.cfg.victim {
            Victim::Newest => self.running.len() - 1,
            Victim::LowestPriority => {
                let key = |&(_, &i): &(usize, &u32)| {
                    let r = &reqs[i as usize];
                    (r.priority, r.ordinal)
                };
                self.running.iter().enumerate().max_by_key(key).map_or(0, |(p, _)| p)
            }
        }
    }

    fn preempt(&mut self, v: u32, reqs: &mut [ReqState], kv: &mut Kv, batch: &mut Batch, stats: &mut Counters) -> Result<()> {
        let r = &mut reqs[v as usize];
        // Counters saturate: a pathological run cannot wrap them around.
        stats.preemptions[v as usize] = stats.preemptions[v as usize].saturating_add(1);
        batch.preemptions += 1;
        if matches!(self.cfg.preemption, Preemption::Swap { .. }) && r.generated > 0 {
            if let Some(moved) = kv.swap_out(v as usize, r)? {
                r.status = Status::Swapped;
                stats.swaps[v as usize] = stats.swaps[v as usize].saturating_add(1);
                batch.swapped_blocks += moved as u64;
                self.swapped.push_back(v);
                return Ok(());
            }
        }
        stats.recomputed[v as usize] = stats.recomputed[v as usize].saturating_add(r.computed as u64);
        kv.release(v as usize, r)?;
        r.computed = 0;
        r.status = Status::Waiting;
        let r = &reqs[v as usize];
        self.enqueue(v, r, true);
        Ok(())
    }

    /// Start a step: serve the running requests in order, preempting when one cannot get
    /// its blocks, and promise their blocks (`kv.commit` allocates them).
    pub fn schedule_running(&mut self, reqs: &mut [ReqState], kv: &mut Kv, batch: &mut Batch, stats: &mut Counters) -> Result<()> {
        batch.items.clear();
        batch.preemptions = 0;
        batch.swapped_blocks = 0;
        batch.received_blocks = 0;
        batch.cache_query_tokens = 0;
        batch.cache_hit_tokens = 0;
        let conv = self.cfg.convention;
        let mut budget = self.cfg.budget();
        let mut i = 0;
        'running: while i < self.running.len() && budget > 0 {
            let r = self.running[i];
            let n = reqs[r as usize].to_compute(conv).min(budget);
            let need = kv.grow_need(r, &reqs[r as usize], n)?;
            while !kv.fits(need) {
                let pos = self.pick_victim(reqs);
                let v = self.running.remove(pos);
                if pos < i {
                    let at = batch.items.iter().position(|&(x, _)| x == v).ok_or_else(|| {
                        KvError::Invariant("a scheduled victim is missing from the batch".into())
                    })?;
                    let (_, vn) = batch.items.remove(at);
                    budget += vn;
                    // Its promise was computed from the same state: undo it exactly.
                    let vneed = kv.grow_need(v, &reqs[v as usize], vn)?;
                    kv.unpromise(&mut reqs[v as usize], vneed);
                    i -= 1;
                }
                self.preempt(v, reqs, kv, batch, stats)?;
                if v == r {
                    break 'running;
                }
            }
            kv.promise(r, &mut reqs[r as usize], need)?;
            batch.items.push((r, n));
            budget -= n;
            i += 1;
        }
        batch.budget = budget;
        Ok(())
    }

    /// Finish a step's choice: unless somebody was preempted in this step, resume swapped
    /// requests, then admit waiting ones, appending them to the batch.
    pub fn schedule_admissions(
        &mut self,
        reqs: &mut [ReqState],
        kv: &mut Kv,
        w: &Workload,
        batch: &mut Batch,
        stats: &mut Counters,
    ) -> Result<()> {
        if batch.preemptions > 0 {
            return Ok(());
        }
        let mut budget = batch.budget;
        let mut swapped = std::mem::take(&mut self.swapped);
        let resumed = self.resume(&mut swapped, Parked::Host, reqs, kv, batch, &mut budget);
        self.swapped = swapped;
        if !resumed? {
            batch.budget = budget;
            return Ok(());
        }
        let conv = self.cfg.convention;
        while let Some(idx) = self.peek_waiting() {
            if self.running.len() >= self.cfg.max_running || budget == 0 {
                break;
            }
            let r = &reqs[idx as usize];
            let plan = kv.plan(idx as usize, r, w)?;
            let want = r.to_compute(conv) - plan.cached;
            if !self.cfg.chunked_prefill && want > budget {
                break;
            }
            let n = want.min(budget);
            let end = plan.kv_len.max(plan.cached + n) as usize;
            let first = kv.admission_need(plan, end);
            let reserve = self.reservation(r, kv);
            if reserve.unwrap_or(first) > kv.admissible() {
                break;
            }
            self.pop_waiting();
            let r = &mut reqs[idx as usize];
            // At most the pool's block count (admissible_alone), so it fits.
            r.reserve_blocks = u32::try_from(reserve.unwrap_or(0)).map_err(|_| KvError::Invariant("reservation beyond u32".into()))?;
            let cached = kv.admit(idx as usize, r, w, plan)?;
            if plan.kv_len > 0 {
                batch.cache_query_tokens += r.prompt_len as u64;
                batch.cache_hit_tokens += cached as u64;
                stats.cached[idx as usize] += cached as u64;
            }
            self.start(idx, r, n, kv, batch)?;
            budget -= n;
        }
        if self.num_waiting() == 0 {
            let mut received = std::mem::take(&mut self.received);
            let resumed = self.resume(&mut received, Parked::Wire, reqs, kv, batch, &mut budget);
            self.received = received;
            resumed?;
        }
        batch.budget = budget;
        Ok(())
    }

    /// Resume the requests of `queue` (KV parked where `from` says) in order while they
    /// fit; whether the queue is empty then.
    fn resume(&mut self, queue: &mut VecDeque<u32>, from: Parked, reqs: &mut [ReqState], kv: &mut Kv, batch: &mut Batch, budget: &mut u32) -> Result<bool> {
        let conv = self.cfg.convention;
        while let Some(&s) = queue.front() {
            if self.running.len() >= self.cfg.max_running || *budget == 0 {
                break;
            }
            let r = &reqs[s as usize];
            let n = r.to_compute(conv).min(*budget);
            if !kv.swap_in_fits(r, n) {
                break;
            }
            queue.pop_front();
            let r = &mut reqs[s as usize];
            match from {
                Parked::Host => batch.swapped_blocks += kv.swap_in(s as usize, r)? as u64,
                Parked::Wire => batch.received_blocks += kv.receive(s as usize, r)? as u64,
            }
            self.start(s, r, n, kv, batch)?;
            *budget -= n;
        }
        Ok(queue.is_empty())
    }

    /// A resumed or admitted request joins the running list and computes `n` tokens now.
    fn start(&mut self, idx: u32, r: &mut ReqState, n: u32, kv: &mut Kv, batch: &mut Batch) -> Result<()> {
        r.status = Status::Running;
        let need = kv.grow_need(idx, r, n)?;
        kv.promise(idx, r, need)?;
        self.running.push(idx);
        batch.items.push((idx, n));
        Ok(())
    }

    /// Drop finished requests from the running list, keeping the order of the others.
    pub fn retire(&mut self, reqs: &[ReqState]) {
        self.running.retain(|&i| reqs[i as usize].status == Status::Running);
    }
}

/// Per-request counters the scheduler updates.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub preemptions: Vec<u32>,
    pub swaps: Vec<u32>,
    pub recomputed: Vec<u64>,
    pub cached: Vec<u64>,
}
