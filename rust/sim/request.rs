//! The simulator's view of one request: where it is (waiting, running, swapped, done) and
//! how far its KV and its output have come.
//!
//! Token accounting follows vLLM v1: a request holds `prompt_len + generated` tokens; the
//! KV of `computed` of them exists; a step computes `to_compute()` tokens (a prompt chunk,
//! or the last sampled token for a decode) and, when that reaches the end, samples one new
//! output token. A request finishes when `generated == output_len`, holding
//! `prompt_len + output_len - 1` KV tokens (the last token is never fed back).
//!
//! [`Convention::DecodeFirst`] is the allocator benchmark's loop (`benches/scheduler_loop.py`):
//! a prefill samples nothing; every decode appends one KV slot and yields one output token,
//! so a request is in exactly `output_len` decodes and ends holding `prompt + output` tokens.

/// Token accounting and step order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Convention {
    /// vLLM v1: the step that completes a prefill samples the first output token;
    /// finished requests free their blocks after the step.
    Vllm,
    /// The allocator benchmark's loop: each step decodes the running requests, frees the
    /// finished ones, then admits; a prefill samples no token.
    DecodeFirst,
}

/// Where a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Not arrived yet.
    Pending,
    Waiting,
    Running,
    /// KV parked in the host pool.
    Swapped,
    /// Disaggregated: prompt done on a prefill instance, KV on its way to (or arrived at,
    /// not yet admitted by) a decode instance.
    Transferring,
    Finished,
    Rejected,
}

/// A request's state. Its token counts stay in `u32` because a validated workload bounds
/// them: `num_tokens() <= prompt_len + output_len <= 2 * MAX_REQUEST_TOKENS` (see
/// [`super::limits`]); [`ReqState::max_kv`] is widened anyway, as admission checks it
/// before anything else.
#[derive(Clone, Debug)]
pub struct ReqState {
    pub prompt_len: u32,
    pub output_len: u32,
    pub priority: i32,
    /// Rank in arrival order (ties broken by workload index): the FCFS key.
    pub ordinal: u32,
    pub status: Status,
    /// Tokens whose KV has been computed (on device, or on host when swapped).
    pub computed: u32,
    /// Tokens allocated in the device pool (>= computed when a cached prompt was admitted
    /// whole; == computed otherwise between steps).
    pub kv_len: u32,
    /// `kv_len` before the latest growth on the device (the hit length after a cached
    /// admission, 0 when nothing is held): a windowed group holds no block that no query
    /// from there on needs.
    pub frontier: u32,
    pub generated: u32,
    /// Blocks promised at admission under the reservation policy (0 when paged).
    pub reserve_blocks: u32,
    /// Of those, blocks not allocated yet (they stay free but admission cannot take them).
    pub reserve_left: u32,
    /// Blocks of this step's promise drawn from `reserve_left` (undone if it is preempted).
    pub reserve_taken: u32,
}

impl ReqState {
    pub fn new(prompt_len: u32, output_len: u32, priority: i32) -> Self {
        Self {
            prompt_len,
            output_len,
            priority,
            ordinal: 0,
            status: Status::Pending,
            computed: 0,
            kv_len: 0,
            frontier: 0,
            generated: 0,
            reserve_blocks: 0,
            reserve_left: 0,
            reserve_taken: 0,
        }
    }

    #[inline]
    pub fn num_tokens(&self) -> u32 {
        self.prompt_len + self.generated
    }

    /// Tokens the next step computes for this request, before the token budget.
    #[inline]
    pub fn to_compute(&self, c: Convention) -> u32 {
        match c {
            Convention::DecodeFirst if self.computed == self.num_tokens() => 1,
            _ => self.num_tokens() - self.computed,
        }
    }

    /// The longest KV this request ever holds, in tokens.
    #[inline]
    pub fn max_kv(&self, c: Convention) -> u64 {
        let total = self.total_len();
        match c {
            Convention::Vllm => total.saturating_sub(1),
            Convention::DecodeFirst => total,
        }
    }

    /// `prompt_len + output_len`: the context length the request needs (vLLM's
    /// `max_model_len` check), in tokens.
    #[inline]
    pub fn total_len(&self) -> u64 {
        self.prompt_len as u64 + self.output_len as u64
    }

    /// A one-token decode (as opposed to a prompt or recompute prefill).
    #[inline]
    pub fn is_decode(&self, c: Convention) -> bool {
        match c {
            Convention::Vllm => self.generated > 0 && self.computed + 1 == self.num_tokens(),
            Convention::DecodeFirst => self.computed == self.num_tokens(),
        }
    }

    /// Account for `n` tokens computed in a step; returns whether an output token was
    /// sampled.
    #[inline]
    pub fn advance(&mut self, n: u32, c: Convention) -> bool {
        let decode = self.is_decode(c);
        self.computed += n;
        let sampled = match c {
            Convention::Vllm => self.computed == self.num_tokens(),
            Convention::DecodeFirst => decode,
        };
        self.generated += sampled as u32;
        sampled
    }
}
