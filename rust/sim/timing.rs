//! Step duration: how long the model takes to run one scheduled batch, in logical seconds.
//!
//! The engine describes each batch by a [`StepShape`] and asks a [`StepTimer`]. Three
//! timers exist: a constant, a roofline of a model on a device or a tensor-parallel
//! replica (the larger of compute time and memory time, plus a fixed overhead and the
//! replica's all-reduce time), and, through the Python bindings, any callable.
//! No wall clock is read anywhere: a run's times depend only on its inputs.

use crate::error::Result;
use crate::invalid;

/// What one engine step computes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepShape {
    /// Prompt (or recomputed) tokens computed in this step.
    pub prefill_tokens: u64,
    /// Requests decoding one token in this step.
    pub decode_tokens: u64,
    /// Requests in the batch.
    pub num_seqs: u64,
    /// KV tokens attended over (every scheduled request's cached context plus its new
    /// tokens), i.e. KV read from memory.
    pub context_tokens: u64,
    /// Query-key pairs of attention in this step (causal within a prefill chunk).
    pub attention_pairs: u64,
    /// Blocks moved between device and host (swap out + swap in).
    pub swapped_blocks: u64,
}

/// A step-duration model.
pub trait StepTimer {
    /// Duration of a step of this shape, in seconds (finite, >= 0).
    fn step_time(&mut self, shape: &StepShape) -> Result<f64>;
}

/// Every step takes the same time (0 gives a pure step count, as in the allocator benchmark).
#[derive(Clone, Copy, Debug)]
pub struct ConstantTime(pub f64);

impl StepTimer for ConstantTime {
    fn step_time(&mut self, _: &StepShape) -> Result<f64> {
        Ok(self.0)
    }
}

/// A dense decoder on one device or one tensor-parallel replica, for a roofline estimate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Roofline {
    /// Model parameters (weights read once per step, 2 FLOPs per parameter per token).
    pub num_params: f64,
    pub bytes_per_param: f64,
    pub num_layers: f64,
    /// Query width per layer (heads x head_dim), for attention FLOPs.
    pub q_dim: f64,
    /// KV bytes per token across all layers (2 x layers x kv_heads x head_dim x dtype bytes).
    pub kv_bytes_per_token: f64,
    /// Device peak FLOP/s actually reachable (peak x efficiency).
    pub flops: f64,
    /// Device memory bandwidth actually reachable, bytes/s.
    pub bandwidth: f64,
    /// Fixed cost per step (launches, scheduling, sampling), seconds.
    pub overhead: f64,
    /// Host <-> device transfer time per swapped block, seconds.
    pub swap_time_per_block: f64,
    /// Tensor parallelism's all-reduces in a step that computes any token: their fixed
    /// (latency) part, seconds per step (0 on one device).
    pub comm_per_step: f64,
    /// Their bandwidth part, seconds per computed token (0 on one device).
    pub comm_per_token: f64,
}

impl Roofline {
    pub fn validate(&self) -> Result<()> {
        let fields = [
            ("num_params", self.num_params),
            ("bytes_per_param", self.bytes_per_param),
            ("num_layers", self.num_layers),
            ("q_dim", self.q_dim),
            ("kv_bytes_per_token", self.kv_bytes_per_token),
            ("overhead", self.overhead),
            ("swap_time_per_block", self.swap_time_per_block),
            ("comm_per_step", self.comm_per_step),
            ("comm_per_token", self.comm_per_token),
        ];
        for (name, v) in fields {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid!("roofline {name} must be finite and >= 0, got {v}"));
            }
        }
        for (name, v) in [("flops", self.flops), ("bandwidth", self.bandwidth)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid!("roofline {name} must be finite and > 0, got {v}"));
            }
        }
        Ok(())
    }

    /// Seconds of the step's all-reduces (none when it computes no token).
    pub fn comm_time(&self, s: &StepShape) -> f64 {
        let tokens = s.prefill_tokens + s.decode_tokens;
        if tokens == 0 {
            return 0.0;
        }
        self.comm_per_step + self.comm_per_token * tokens as f64
    }

    /// `(compute seconds, memory seconds)` of a step, without overhead.
    pub fn components(&self, s: &StepShape) -> (f64, f64) {
        let tokens = (s.prefill_tokens + s.decode_tokens) as f64;
        // QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add, per layer.
        let flops = 2.0 * self.num_params * tokens + 4.0 * self.num_layers * self.q_dim * s.attention_pairs as f64;
        let bytes = self.num_params * self.bytes_per_param + self.kv_bytes_per_token * s.context_tokens as f64;
        (flops / self.flops, bytes / self.bandwidth)
    }
}

impl StepTimer for Roofline {
    fn step_time(&mut self, s: &StepShape) -> Result<f64> {
        if s.num_seqs == 0 && s.swapped_blocks == 0 {
            return Ok(0.0);
        }
        let (c, m) = self.components(s);
        Ok(c.max(m) + self.overhead + self.swap_time_per_block * s.swapped_blocks as f64 + self.comm_time(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama8b_a100() -> Roofline {
        Roofline {
            num_params: 8.0e9,
            bytes_per_param: 2.0,
            num_layers: 32.0,
            q_dim: 4096.0,
            kv_bytes_per_token: 2.0 * 32.0 * 8.0 * 128.0 * 2.0,
            flops: 312e12 * 0.6,
            bandwidth: 2.0e12 * 0.8,
            overhead: 2e-3,
            swap_time_per_block: 0.0,
            comm_per_step: 0.0,
            comm_per_token: 0.0,
        }
    }

    #[test]
    fn decode_is_memory_bound_and_prefill_compute_bound() {
        let r = llama8b_a100();
        let decode = StepShape { decode_tokens: 32, num_seqs: 32, context_tokens: 32 * 1000, attention_pairs: 32 * 1000, ..Default::default() };
        let (c, m) = r.components(&decode);
        assert!(m > c, "decode: compute {c} memory {m}");
        let prefill = StepShape { prefill_tokens: 8192, num_seqs: 4, context_tokens: 8192, attention_pairs: 4 * 2048 * 1025, ..Default::default() };
        let (c, m) = r.components(&prefill);
        assert!(c > m, "prefill: compute {c} memory {m}");
        // 16 GB of weights at 1.6 TB/s: a bit over 10 ms per decode step.
        let t = llama8b_a100().step_time(&decode).unwrap();
        assert!((0.01..0.02).contains(&t), "{t}");
    }

    #[test]
    fn all_reduces_add_their_time_to_steps_that_compute_tokens() {
        let one = llama8b_a100();
        let tp = Roofline { comm_per_step: 1e-3, comm_per_token: 1e-6, ..one };
        let decode = StepShape { decode_tokens: 32, num_seqs: 32, context_tokens: 32 * 1000, ..Default::default() };
        let (mut a, mut b) = (one, tp);
        let extra = b.step_time(&decode).unwrap() - a.step_time(&decode).unwrap();
        assert!((extra - (1e-3 + 32.0 * 1e-6)).abs() < 1e-12, "{extra}");
        let swap_only = StepShape { swapped_blocks: 4, ..Default::default() };
        assert_eq!(b.step_time(&swap_only).unwrap(), a.step_time(&swap_only).unwrap(), "no token, no all-reduce");
    }

    #[test]
    fn validate_rejects_nonsense() {
        let mut r = llama8b_a100();
        r.bandwidth = 0.0;
        assert!(r.validate().is_err());
        r.bandwidth = 1.0;
        r.overhead = f64::NAN;
        assert!(r.validate().is_err());
    }
}
