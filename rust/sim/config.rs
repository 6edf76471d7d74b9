//! What a run is configured with: everything but the workload and the step timers.

use super::disagg::Disaggregation;
use super::router::Router;
use super::scheduler::SchedulerConfig;
use super::stop::StopWhen;
use crate::pool::GroupSpec;
use crate::prefix_cache::CacheConfig;

/// Everything but the workload and the timer.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub num_blocks: usize,
    pub block_size: usize,
    pub scheduler: SchedulerConfig,
    /// Automatic prefix caching of prompts given as token ids or block keys (None: off).
    pub prefix_cache: Option<CacheConfig>,
    /// The model's layer groups: the device (and the host pool for swapping) is a
    /// `BlockPool` of them (None: one full-attention group); prefix caching caches every group.
    pub groups: Option<Vec<GroupSpec>>,
    /// Run `check_invariants` on both pools after every step (slow; for tests).
    pub check_invariants: bool,
    /// Stop after this many steps (requests still in flight are reported `Unfinished`).
    pub max_steps: Option<u64>,
    /// Record per-step columns (the summary's utilization needs them).
    pub record_steps: bool,
    /// Stop as soon as the run certainly cannot meet these targets (see [`super::stop`]); the
    /// summary's `stopped` says why. None: run to the end.
    pub stop_when: Option<StopWhen>,
    /// Replicas of the deployment (data parallelism), each a whole engine of this
    /// configuration with its own pools; 1 (default) to [`super::MAX_REPLICAS`].
    pub replicas: usize,
    /// How arrivals are spread over the replicas (see [`super::router`]).
    pub router: Router,
    /// Prefill/decode disaggregation: the `replicas` above are prefill instances, these
    /// decode instances follow them (see [`super::disagg`]). Needs paged allocation and the vLLM
    /// convention. None (default): every replica serves both phases.
    pub disaggregation: Option<Disaggregation>,
}

impl SimConfig {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            num_blocks,
            block_size,
            scheduler: SchedulerConfig::default(),
            prefix_cache: None,
            groups: None,
            check_invariants: false,
            max_steps: None,
            record_steps: true,
            stop_when: None,
            replicas: 1,
            router: Router::RoundRobin,
            disaggregation: None,
        }
    }
}
