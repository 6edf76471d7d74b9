//! What the simulator's test binaries share: a roofline step timer of a 1B-parameter
//! model and a bursty (gamma, cv 2) workload of uniform lengths.

// Each test binary uses the helpers it needs.
#![allow(dead_code)]

use pykvpool::sim::workload::{synthesize, Arrivals, LengthSpec, Lengths, SyntheticSpec};
use pykvpool::sim::{Roofline, Workload, MAX_REQUEST_TOKENS};

/// A roofline of a 1B-parameter model, 16 layers, on a 10 TFLOP/s, 200 GB/s device.
pub fn timer() -> Roofline {
    Roofline {
        num_params: 1e9,
        bytes_per_param: 2.0,
        num_layers: 16.0,
        q_dim: 2048.0,
        kv_bytes_per_token: 65536.0,
        flops: 1e13,
        bandwidth: 2e11,
        overhead: 1e-3,
        swap_time_per_block: 1e-5,
        comm_per_step: 0.0,
        comm_per_token: 0.0,
    }
}

/// `n` requests arriving at `rate` per second in bursts (gamma, cv 2), prompt and output
/// lengths uniform in the given ranges, `priority_levels` priorities.
pub fn workload(n: usize, rate: f64, prompt: (u32, u32), output: (u32, u32), priority_levels: u32, seed: u64) -> Workload {
    let uniform = |(lo, hi)| LengthSpec { dist: Lengths::Uniform { lo, hi }, min: 1, max: MAX_REQUEST_TOKENS };
    synthesize(&SyntheticSpec {
        num_requests: n,
        arrivals: Arrivals::Gamma { rate, cv: 2.0 },
        prompt: uniform(prompt),
        output: uniform(output),
        priority_levels,
        shared_prefixes: None,
        seed,
    })
    .unwrap()
}
