//! Prefill/decode disaggregation (Splitwise, ISCA'24; DistServe, OSDI'24; Mooncake,
//! FAST'25): prefill instances compute prompts, decode instances generate, and each
//! request's KV moves from one to the other over a link of finite bandwidth.
//!
//! With [`Disaggregation`] set, the deployment's [`super::SimConfig::replicas`] are the
//! prefill instances (their pools of `num_blocks` blocks, the run's step timer) and
//! `decode_replicas` decode instances follow them (pools of `decode_num_blocks` blocks,
//! the decode timer). A request's life:
//!
//! 1. The router sends its arrival to a prefill instance, which schedules it as any
//!    engine does (chunked prefill, caching, preemption). The step that completes its
//!    prompt samples the first output token: its time to first token ends there.
//! 2. A request of one output token finishes there. Any other leaves the prefill
//!    instance's batch, which keeps holding its KV blocks until the transfer is done.
//! 3. At the end of that step a second router (the same policy over the decode instances,
//!    a request counting 1 token until it finishes) picks its decode instance, and the
//!    transfer of its prompt's KV (`prompt_len x bytes_per_token` bytes) is queued on
//!    the sender's outgoing and the receiver's incoming link, first come first served
//!    ([`KvLink::transfer`]). It arrives `latency` seconds after its last byte left.
//! 4. The decode instance admits it at its first step that starts once the KV has
//!    arrived and when its blocks fit (as a swapped request is resumed, after the
//!    instance's own swapped and preempted requests); until then the KV waits in the
//!    receiver's buffer, outside its pool. It then decodes as usual (a preempted one is
//!    recomputed or swapped on the decode instance).
//!
//! The prefill instance frees the request's blocks at its first step that starts once
//! the transfer is done (its pool is only read at its steps), or at the end of the run.
//!
//! A mixed pool ([`Disaggregation::mixed_tokens`]) lets decode instances take prompts
//! under pressure: an arrival that finds every prefill instance with that many tokens
//! pending goes to a decode instance, which serves it as a colocated engine would.

use crate::error::Result;
use crate::invalid;

use super::limits::MAX_REPLICAS;

/// Most layers a transfer is pipelined over.
pub const MAX_LINK_LAYERS: u32 = 1 << 16;

/// The link KV moves over from a prefill to a decode instance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvLink {
    /// Bytes per second one instance sends (prefill) or receives (decode), all its
    /// devices together.
    pub bandwidth: f64,
    /// Seconds from a transfer's last byte leaving to its KV being usable (setup and
    /// propagation), per transfer.
    pub latency: f64,
    /// KV bytes one prompt token moves: every layer's keys and values as the decode
    /// instances store them.
    pub bytes_per_token: f64,
    /// Layers the transfer is pipelined over: 1 sends the KV once the prefill's last step
    /// ends; `L > 1` sends layer `l` (of `L` equal parts) as soon as the last step has
    /// computed it, at `start + (l + 1) x duration / L`, in layer order.
    pub layers: u32,
}

impl KvLink {
    pub fn validate(&self) -> Result<()> {
        if !(self.bandwidth.is_finite() && self.bandwidth > 0.0) {
            return Err(invalid!("bandwidth must be finite and > 0 bytes/s, got {}", self.bandwidth));
        }
        if !(self.latency.is_finite() && self.latency >= 0.0) {
            return Err(invalid!("latency must be finite and >= 0 s, got {}", self.latency));
        }
        if !(self.bytes_per_token.is_finite() && self.bytes_per_token > 0.0) {
            return Err(invalid!("bytes_per_token must be finite and > 0, got {}", self.bytes_per_token));
        }
        if !(1..=MAX_LINK_LAYERS).contains(&self.layers) {
            return Err(invalid!("layers must be in 1..={MAX_LINK_LAYERS}, got {}", self.layers));
        }
        Ok(())
    }

    /// A transfer of `bytes` whose prefill's last step ran from `start` to `end`, on a
    /// link busy until `free`: `(when its last byte has left, when its KV has arrived)`.
    ///
    /// Layer part `l` is ready at `r_l = start + (l + 1) x (end - start) / L` and takes
    /// `w = bytes / bandwidth / L` on the wire, the parts in order, so the last one leaves
    /// at `max(free + L w, max_l(r_l + (L - l) w))`; that inner maximum is linear in `l`,
    /// so it is at `l = 0` or `l = L - 1`. With `L = 1` this is `max(free, end) + bytes /
    /// bandwidth`.
    pub fn transfer(&self, bytes: f64, start: f64, end: f64, free: f64) -> (f64, f64) {
        let wire = bytes / self.bandwidth;
        let l = self.layers as f64;
        let first_layer = start + (end - start) / l + wire;
        let last_layer = end + wire / l;
        let done = (free + wire).max(first_layer).max(last_layer);
        (done, done + self.latency)
    }
}

/// Prefill/decode disaggregation of a deployment (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Disaggregation {
    /// Decode instances, 1 to [`MAX_REPLICAS`].
    pub decode_replicas: usize,
    /// Device blocks of each decode instance's pool (of the run's block size).
    pub decode_num_blocks: usize,
    pub link: KvLink,
    /// A mixed pool: an arrival when every prefill instance has at least this many
    /// tokens pending (the router's count, kept under either policy) goes to a decode
    /// instance instead (the decode router's choice), which serves it whole, prompt and
    /// output, without a transfer. None: never.
    pub mixed_tokens: Option<u64>,
}

impl Disaggregation {
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_REPLICAS).contains(&self.decode_replicas) {
            return Err(invalid!("decode_replicas must be in 1..={MAX_REPLICAS}, got {}", self.decode_replicas));
        }
        self.link.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The closed form against the layer-by-layer recurrence it solves.
    #[test]
    fn transfer_is_the_layer_by_layer_recurrence() {
        for layers in [1u32, 2, 3, 8, 80] {
            for (bytes, bw) in [(1e6, 1e9), (5e9, 1e9), (3e7, 25e9)] {
                for (start, end, free) in [(0.0, 0.5, 0.0), (1.0, 1.25, 3.0), (2.0, 2.0, 1.0), (0.0, 0.01, 0.5)] {
                    let link = KvLink { bandwidth: bw, latency: 0.002, bytes_per_token: 1.0, layers };
                    let (l, w) = (layers as f64, bytes / bw / layers as f64);
                    let mut t: f64 = free;
                    for k in 0..layers {
                        let ready = start + (k + 1) as f64 * (end - start) / l;
                        t = t.max(ready) + w;
                    }
                    let (done, arrived) = link.transfer(bytes, start, end, free);
                    assert!((done - t).abs() <= 1e-9 * t.max(1.0), "layers {layers}: {done} vs {t}");
                    assert_eq!(arrived, done + 0.002);
                }
            }
        }
    }

    #[test]
    fn one_layer_sends_after_the_step_and_bad_links_are_refused() {
        let link = KvLink { bandwidth: 2.0, latency: 1.0, bytes_per_token: 1.0, layers: 1 };
        assert_eq!(link.transfer(4.0, 0.0, 3.0, 1.0), (5.0, 6.0));
        assert_eq!(link.transfer(4.0, 0.0, 3.0, 7.0), (9.0, 10.0));
        for bad in [
            KvLink { bandwidth: 0.0, ..link },
            KvLink { bandwidth: f64::INFINITY, ..link },
            KvLink { latency: -1.0, ..link },
            KvLink { bytes_per_token: f64::NAN, ..link },
            KvLink { layers: 0, ..link },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let d = Disaggregation { decode_replicas: 0, decode_num_blocks: 8, link, mixed_tokens: None };
        assert!(d.validate().unwrap_err().to_string().contains("decode_replicas"));
    }
}
