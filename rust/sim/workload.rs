//! Workloads for the simulator: a columnar list of requests (arrival time, prompt, output
//! length, priority), and seeded generators for synthetic ones.
//!
//! A prompt is given as a length only, as token ids (for prefix caching by content), or as
//! block keys (Mooncake `hash_ids`: one key per `tokens_per_key`-token block of the prompt,
//! chained, so equal keys at equal positions mean a shared prefix). Trace parsing lives in
//! Python (`pykvpool.simulate`); it hands the columns over as arrays.
//!
//! Generators draw each column from its own PCG stream derived from the seed, so changing
//! the output-length distribution does not move the arrival times: same seed and spec,
//! identical workload bit for bit.

use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp, Gamma, LogNormal, Pareto};
use rand_pcg::Pcg64Mcg;

use super::limits::{MAX_REQUESTS, MAX_REQUEST_TOKENS, MAX_TOKEN_IDS};
use crate::error::{collect_n, filled, vec_for};
use crate::error::Result;
use crate::invalid;

/// How the prompt of each request is described.
#[derive(Clone, Debug, Default)]
pub enum Prompts {
    /// Lengths only: no prefix can be shared.
    #[default]
    Lengths,
    /// Token ids of every prompt, concatenated; request `i` owns `ids[offsets[i]..offsets[i+1]]`.
    Tokens { ids: Vec<u32>, offsets: Vec<usize> },
    /// Block keys of every prompt, concatenated like `Tokens`; one key per `tokens_per_key`
    /// prompt tokens (the last key may cover a partial block).
    BlockKeys { keys: Vec<u64>, offsets: Vec<usize>, tokens_per_key: usize },
}

/// Requests in columns, one entry per request. Times in seconds, lengths in tokens.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    pub arrival: Vec<f64>,
    pub prompt_len: Vec<u32>,
    pub output_len: Vec<u32>,
    /// Lower value = served first under the priority policy (vLLM's convention).
    pub priority: Vec<i32>,
    pub prompts: Prompts,
}

fn check_offsets(offsets: &[usize], total: usize, n: usize, what: &str) -> Result<()> {
    if offsets.len() != n + 1 || offsets.first() != Some(&0) || offsets.last() != Some(&total) {
        return Err(invalid!("{what} must have {} entries (one per request, plus 1) from 0 to {total}", n + 1));
    }
    if offsets.windows(2).any(|w| w[1] < w[0]) {
        return Err(invalid!("{what} must be non-decreasing"));
    }
    Ok(())
}

impl Workload {
    /// A workload from columns; `priority` defaults to 0 for every request.
    pub fn new(arrival: Vec<f64>, prompt_len: Vec<u32>, output_len: Vec<u32>, priority: Option<Vec<i32>>) -> Result<Self> {
        let priority = match priority {
            Some(p) => p,
            None => filled(0, arrival.len(), "priority")?,
        };
        let w = Self { arrival, prompt_len, output_len, priority, prompts: Prompts::Lengths };
        w.validate()?;
        Ok(w)
    }

    /// Check every column: equal lengths, at most [`MAX_REQUESTS`] requests, arrival times
    /// finite and >= 0, lengths in `1..=MAX_REQUEST_TOKENS`, prompt ids or keys matching
    /// the lengths. [`crate::sim::simulate`] runs it on every workload (the fields are
    /// public), so the engine's token arithmetic never leaves `u32`.
    pub fn validate(&self) -> Result<()> {
        let n = self.arrival.len();
        if n > MAX_REQUESTS {
            return Err(invalid!("arrival: {n} requests exceed the limit of {MAX_REQUESTS} per workload; split the trace"));
        }
        if self.prompt_len.len() != n || self.output_len.len() != n || self.priority.len() != n {
            return Err(invalid!(
                "workload columns differ in length: arrival {n}, prompt_len {}, output_len {}, priority {}",
                self.prompt_len.len(),
                self.output_len.len(),
                self.priority.len()
            ));
        }
        if let Some((i, t)) = self.arrival.iter().enumerate().find(|(_, t)| !t.is_finite() || **t < 0.0) {
            return Err(invalid!("arrival[{i}] = {t}: arrival times must be finite and >= 0 seconds"));
        }
        for (name, col) in [("prompt_len", &self.prompt_len), ("output_len", &self.output_len)] {
            if let Some(i) = col.iter().position(|&v| v == 0 || v > MAX_REQUEST_TOKENS) {
                return Err(invalid!("{name}[{i}] = {}: lengths must be in 1..={MAX_REQUEST_TOKENS} tokens", col[i]));
            }
        }
        match &self.prompts {
            Prompts::Lengths => Ok(()),
            Prompts::Tokens { ids, offsets } => self.check_tokens(ids, offsets),
            Prompts::BlockKeys { keys, offsets, tokens_per_key } => self.check_block_keys(keys, offsets, *tokens_per_key),
        }
    }

    fn check_tokens(&self, ids: &[u32], offsets: &[usize]) -> Result<()> {
        check_offsets(offsets, ids.len(), self.len(), "token_offsets")?;
        for (i, w) in offsets.windows(2).enumerate() {
            if w[1] - w[0] != self.prompt_len[i] as usize {
                return Err(invalid!("token_offsets: request {i} has {} token_ids but prompt_len {}", w[1] - w[0], self.prompt_len[i]));
            }
        }
        Ok(())
    }

    fn check_block_keys(&self, keys: &[u64], offsets: &[usize], tokens_per_key: usize) -> Result<()> {
        if tokens_per_key == 0 {
            return Err(invalid!("tokens_per_key must be >= 1"));
        }
        check_offsets(offsets, keys.len(), self.len(), "key_offsets")?;
        for (i, w) in offsets.windows(2).enumerate() {
            let want = (self.prompt_len[i] as usize).div_ceil(tokens_per_key);
            if w[1] - w[0] != want {
                return Err(invalid!(
                    "key_offsets: request {i} has {} block_keys, expected ceil(prompt_len {} / tokens_per_key {tokens_per_key}) = {want}",
                    w[1] - w[0],
                    self.prompt_len[i]
                ));
            }
        }
        Ok(())
    }

    /// Attach prompt token ids; `offsets[i+1] - offsets[i]` must equal `prompt_len[i]`.
    pub fn with_tokens(mut self, ids: Vec<u32>, offsets: Vec<usize>) -> Result<Self> {
        self.check_tokens(&ids, &offsets)?;
        self.prompts = Prompts::Tokens { ids, offsets };
        Ok(self)
    }

    /// Attach block keys; request `i` must have `ceil(prompt_len[i] / tokens_per_key)` keys.
    pub fn with_block_keys(mut self, keys: Vec<u64>, offsets: Vec<usize>, tokens_per_key: usize) -> Result<Self> {
        self.check_block_keys(&keys, &offsets, tokens_per_key)?;
        self.prompts = Prompts::BlockKeys { keys, offsets, tokens_per_key };
        Ok(self)
    }

    pub fn len(&self) -> usize {
        self.arrival.len()
    }

    pub fn is_empty(&self) -> bool {
        self.arrival.is_empty()
    }

    /// Token ids of request `i`'s prompt, when the workload has them.
    pub fn tokens(&self, i: usize) -> Option<&[u32]> {
        match &self.prompts {
            Prompts::Tokens { ids, offsets } => Some(&ids[offsets[i]..offsets[i + 1]]),
            _ => None,
        }
    }

    /// Block keys of request `i`'s prompt and the tokens each covers.
    pub fn block_keys(&self, i: usize) -> Option<(&[u64], usize)> {
        match &self.prompts {
            Prompts::BlockKeys { keys, offsets, tokens_per_key } => Some((&keys[offsets[i]..offsets[i + 1]], *tokens_per_key)),
            _ => None,
        }
    }
}

/// Arrival process of a synthetic workload.
#[derive(Clone, Debug)]
pub enum Arrivals {
    /// Everything arrives at time 0 (offline batch, the allocator benchmark).
    Burst,
    /// Exponential inter-arrival times at `rate` requests/s.
    Poisson { rate: f64 },
    /// Gamma inter-arrival times with mean `1 / rate` and coefficient of variation `cv`
    /// (`cv > 1` is burstier than Poisson, `cv = 1` is Poisson).
    Gamma { rate: f64, cv: f64 },
}

/// A length distribution in tokens; draws are rounded and clamped to `[min, max]`.
#[derive(Clone, Debug)]
pub enum Lengths {
    Fixed(u32),
    /// Uniform integers in `lo..=hi`.
    Uniform { lo: u32, hi: u32 },
    /// Log-normal with the given median and sigma of the underlying normal.
    LogNormal { median: f64, sigma: f64 },
    /// Pareto (heavy tail): `scale * U^(-1/shape)`.
    Pareto { scale: f64, shape: f64 },
    /// Resample (with replacement) from observed lengths, e.g. a trace's column.
    Empirical(Vec<u32>),
}

/// A length distribution with its clamp.
#[derive(Clone, Debug)]
pub struct LengthSpec {
    pub dist: Lengths,
    pub min: u32,
    pub max: u32,
}

/// Prompts built from a few shared prefixes plus a unique suffix (token ids), so that
/// prefix caching has something to reuse.
#[derive(Clone, Debug)]
pub struct SharedPrefixes {
    pub num_prefixes: usize,
    /// Tokens of each shared prefix (capped at the prompt length).
    pub prefix_len: u32,
    pub vocab_size: u32,
}

/// Everything that defines a synthetic workload.
#[derive(Clone, Debug)]
pub struct SyntheticSpec {
    pub num_requests: usize,
    pub arrivals: Arrivals,
    pub prompt: LengthSpec,
    pub output: LengthSpec,
    /// Priorities drawn uniformly from `0..priority_levels` (1 = everyone at 0).
    pub priority_levels: u32,
    pub shared_prefixes: Option<SharedPrefixes>,
    pub seed: u64,
}

/// Independent stream `stream` of `seed`.
fn stream(seed: u64, stream: u64) -> Pcg64Mcg {
    Pcg64Mcg::seed_from_u64(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

fn positive(v: f64, what: &str) -> Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(invalid!("{what} must be finite and > 0, got {v}"))
    }
}

fn draw_lengths(spec: &LengthSpec, n: usize, rng: &mut Pcg64Mcg, what: &str) -> Result<Vec<u32>> {
    if spec.min == 0 || spec.min > spec.max || spec.max > MAX_REQUEST_TOKENS {
        return Err(invalid!(
            "{what}_clamp must satisfy 1 <= min <= max <= {MAX_REQUEST_TOKENS} tokens, got ({}, {})",
            spec.min,
            spec.max
        ));
    }
    let (lo_clamp, hi_clamp) = (spec.min, spec.max);
    let clamp = move |x: f64| x.round().clamp(lo_clamp as f64, hi_clamp as f64) as u32;
    let col = format!("{what} lengths");
    match &spec.dist {
        Lengths::Fixed(v) => filled((*v).clamp(spec.min, spec.max), n, &col),
        Lengths::Uniform { lo, hi } => {
            if lo > hi {
                return Err(invalid!("{what}: uniform range {lo}..={hi} is empty"));
            }
            collect_n(n, &col, |_| rng.random_range(*lo..=*hi).clamp(spec.min, spec.max))
        }
        Lengths::LogNormal { median, sigma } => {
            let median = positive(*median, &format!("{what}: lognormal median"))?;
            if !(sigma.is_finite() && *sigma >= 0.0) {
                return Err(invalid!("{what}: lognormal sigma must be finite and >= 0, got {sigma}"));
            }
            let d = LogNormal::new(median.ln(), *sigma).map_err(|e| invalid!("{what}: lognormal: {e}"))?;
            collect_n(n, &col, |_| clamp(d.sample(rng)))
        }
        Lengths::Pareto { scale, shape } => {
            let d = Pareto::new(positive(*scale, &format!("{what}: pareto scale"))?, positive(*shape, &format!("{what}: pareto shape"))?)
                .map_err(|e| invalid!("{what}: pareto: {e}"))?;
            collect_n(n, &col, |_| clamp(d.sample(rng)))
        }
        Lengths::Empirical(values) => {
            if values.is_empty() {
                return Err(invalid!("{what}: empirical distribution needs at least one value"));
            }
            collect_n(n, &col, |_| values[rng.random_range(0..values.len())].clamp(spec.min, spec.max))
        }
    }
}

fn draw_arrivals(a: &Arrivals, n: usize, rng: &mut Pcg64Mcg) -> Result<Vec<f64>> {
    let mut gaps: Box<dyn FnMut(&mut Pcg64Mcg) -> f64> = match a {
        Arrivals::Burst => Box::new(|_| 0.0),
        Arrivals::Poisson { rate } => {
            let d = Exp::new(positive(*rate, "rate")?).map_err(|e| invalid!("rate: poisson: {e}"))?;
            Box::new(move |r| d.sample(r))
        }
        Arrivals::Gamma { rate, cv } => {
            let (rate, cv) = (positive(*rate, "rate")?, positive(*cv, "cv")?);
            let shape = 1.0 / (cv * cv);
            let d = Gamma::new(shape, 1.0 / (rate * shape)).map_err(|e| invalid!("rate, cv: gamma: {e}"))?;
            Box::new(move |r| d.sample(r))
        }
    };
    let mut t = 0.0;
    let out = collect_n(n, "arrival", |i| {
        // The first request arrives at 0 so that a run starts with work.
        if i > 0 {
            t += gaps(rng);
        }
        t
    })?;
    if !t.is_finite() {
        return Err(invalid!("rate is too small for {n} requests: arrival times overflow"));
    }
    Ok(out)
}

/// Generate a synthetic workload: at most [`MAX_REQUESTS`] requests, lengths clamped to at
/// most [`MAX_REQUEST_TOKENS`], and with shared prefixes at most [`MAX_TOKEN_IDS`] prompt
/// token ids (prefixes included).
pub fn synthesize(spec: &SyntheticSpec) -> Result<Workload> {
    let n = spec.num_requests;
    if n > MAX_REQUESTS {
        return Err(invalid!("num_requests must be at most {MAX_REQUESTS}, got {n}"));
    }
    let arrival = draw_arrivals(&spec.arrivals, n, &mut stream(spec.seed, 1))?;
    let prompt_len = draw_lengths(&spec.prompt, n, &mut stream(spec.seed, 2), "prompt")?;
    let output_len = draw_lengths(&spec.output, n, &mut stream(spec.seed, 3), "output")?;
    let levels = spec.priority_levels.max(1);
    let mut prng = stream(spec.seed, 4);
    let priority = collect_n(n, "priority", |_| prng.random_range(0..levels) as i32)?;
    let w = Workload::new(arrival, prompt_len, output_len, Some(priority))?;
    match &spec.shared_prefixes {
        Some(sp) => shared_prefix_ids(w, sp, spec.seed),
        None => Ok(w),
    }
}

/// Give `w`'s prompts token ids: one of `sp.num_prefixes` random prefixes, then random tokens.
fn shared_prefix_ids(w: Workload, sp: &SharedPrefixes, seed: u64) -> Result<Workload> {
    if sp.num_prefixes == 0 || sp.num_prefixes > MAX_REQUESTS || sp.vocab_size == 0 {
        return Err(invalid!(
            "shared_prefixes needs 1 <= num_prefixes <= {MAX_REQUESTS} and vocab_size >= 1, got {} and {}",
            sp.num_prefixes,
            sp.vocab_size
        ));
    }
    let prefix_ids = (sp.num_prefixes as u128) * sp.prefix_len as u128;
    let total: u64 = w.prompt_len.iter().map(|&p| p as u64).sum();
    if prefix_ids > MAX_TOKEN_IDS as u128 || total > MAX_TOKEN_IDS as u64 {
        return Err(invalid!(
            "shared_prefixes: {prefix_ids} prefix and {total} prompt token ids exceed the limit of {MAX_TOKEN_IDS} each"
        ));
    }
    let mut trng = stream(seed, 5);
    let mut prefixes = vec_for(sp.num_prefixes, "shared_prefixes")?;
    for _ in 0..sp.num_prefixes {
        prefixes.push(collect_n(sp.prefix_len as usize, "shared_prefixes", |_| trng.random_range(0..sp.vocab_size))?);
    }
    let mut ids = vec_for(total as usize, "token ids")?;
    let mut offsets = vec_for(w.len() + 1, "token offsets")?;
    offsets.push(0);
    for &p in &w.prompt_len {
        let prefix: &Vec<u32> = &prefixes[trng.random_range(0..sp.num_prefixes)];
        let k = prefix.len().min(p as usize);
        ids.extend_from_slice(&prefix[..k]);
        ids.extend((k..p as usize).map(|_| trng.random_range(0..sp.vocab_size)));
        offsets.push(ids.len());
    }
    w.with_tokens(ids, offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(seed: u64) -> SyntheticSpec {
        SyntheticSpec {
            num_requests: 500,
            arrivals: Arrivals::Gamma { rate: 10.0, cv: 2.0 },
            prompt: LengthSpec { dist: Lengths::LogNormal { median: 800.0, sigma: 1.0 }, min: 1, max: 8192 },
            output: LengthSpec { dist: Lengths::Pareto { scale: 20.0, shape: 1.5 }, min: 1, max: 2048 },
            priority_levels: 3,
            shared_prefixes: Some(SharedPrefixes { num_prefixes: 4, prefix_len: 64, vocab_size: 32000 }),
            seed,
        }
    }

    #[test]
    fn same_seed_same_workload_bit_for_bit() {
        let (a, b, c) = (synthesize(&spec(7)).unwrap(), synthesize(&spec(7)).unwrap(), synthesize(&spec(8)).unwrap());
        let bits = |w: &Workload| w.arrival.iter().map(|t| t.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b));
        assert_eq!(a.prompt_len, b.prompt_len);
        assert_eq!(a.output_len, b.output_len);
        assert_eq!(a.tokens(17), b.tokens(17));
        assert_ne!(bits(&a), bits(&c));
    }

    #[test]
    fn gamma_rate_and_clamps_hold() {
        let w = synthesize(&spec(1)).unwrap();
        let mean_gap = w.arrival[w.len() - 1] / (w.len() - 1) as f64;
        assert!((mean_gap - 0.1).abs() < 0.03, "mean gap {mean_gap}");
        assert!(w.arrival.windows(2).all(|p| p[0] <= p[1]));
        assert!(w.prompt_len.iter().all(|&p| (1..=8192).contains(&p)));
        assert!(w.priority.iter().all(|&p| (0..3).contains(&p)));
        assert_eq!(w.tokens(3).unwrap().len(), w.prompt_len[3] as usize);
    }

    #[test]
    fn rejects_bad_columns_and_keys() {
        assert!(Workload::new(vec![0.0], vec![0], vec![1], None).is_err());
        assert!(Workload::new(vec![f64::NAN], vec![1], vec![1], None).is_err());
        assert!(Workload::new(vec![0.0, 1.0], vec![1], vec![1], None).is_err());
        let w = Workload::new(vec![0.0], vec![1000], vec![1], None).unwrap();
        assert!(w.clone().with_block_keys(vec![1], vec![0, 1], 512).is_err());
        assert!(w.with_block_keys(vec![1, 2], vec![0, 2], 512).is_ok());
    }
}
