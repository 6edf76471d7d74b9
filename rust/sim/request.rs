//! The simulator's view of one request: where it is (waiting, running, swapped, done) and
//! how far its KV and its output have come.
//!
//! Token accounting follows vLLM v1: a request holds `prompt_len + generated` tokens; the
//! KV of `computed` of them exists; a step computes `to_compute()` tokens (a prompt chunk,
//! or the last sampled token for a decode) and, when that reaches the end, samples one new
//! output token. A request finishes when `generated == output_len`, holding
//! `prompt_len + output_len - 1` KV tokens (the last token is never fed back).

/// Where a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Not arrived yet.
    Pending,
    Waiting,
    Running,
    /// KV parked in the host pool.
    Swapped,
    Finished,
    Rejected,
}

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
    pub generated: u32,
    /// Blocks promised at admission under the reservation policy (0 when paged).
    pub reserve_blocks: u32,
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
            generated: 0,
            reserve_blocks: 0,
        }
    }

    #[inline]
    pub fn num_tokens(&self) -> u32 {
        self.prompt_len + self.generated
    }

    #[inline]
    pub fn to_compute(&self) -> u32 {
        self.num_tokens() - self.computed
    }

    /// The longest KV this request ever holds, in tokens.
    #[inline]
    pub fn max_kv(&self) -> u32 {
        self.prompt_len + self.output_len - 1
    }

    /// A one-token decode (as opposed to a prompt or recompute prefill).
    #[inline]
    pub fn is_decode(&self) -> bool {
        self.generated > 0 && self.computed + 1 == self.num_tokens()
    }
}
