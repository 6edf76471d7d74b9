//! The simulator's documented input limits. Every buffer they size goes through the
//! crate's fallible allocation (`crate::error::vec_for`).
//!
//! The limits keep each allocation a run makes proportional to input the caller already
//! holds, and small enough that the host can refuse it cleanly: a workload column of
//! [`MAX_REQUESTS`] entries is at most 128 MiB, the slot mapping of one step or one
//! admission at most 128 MiB. They also keep every per-request token count of the engine
//! in `u32`: a request holds at most `prompt + output <= 2 * MAX_REQUEST_TOKENS` tokens.

/// Most requests in one workload (16 Mi). Larger traces are split into runs.
pub const MAX_REQUESTS: usize = 1 << 24;

/// Most tokens in one prompt, and in one output (16 Mi each; longer than any model's
/// context). Longer values are rejected as input, never truncated.
pub const MAX_REQUEST_TOKENS: u32 = 1 << 24;

/// Most tokens one engine step computes across its batch (16 Mi): the token budget when
/// `max_batched_tokens` is unlimited, and the largest budget accepted.
pub const MAX_STEP_TOKENS: u32 = 1 << 24;

/// Most prompt token ids a synthesized workload materializes (256 Mi ids, 1 GiB).
pub const MAX_TOKEN_IDS: usize = 1 << 28;


/// Most replicas of one simulated deployment: each has its own pools of `num_blocks`
/// blocks, so the bookkeeping a run allocates grows with it.
pub const MAX_REPLICAS: usize = 1024;
