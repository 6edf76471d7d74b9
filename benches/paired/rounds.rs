//! What the hand-timed benches share (`offload_copy`, `offload_disk`): the command-line
//! flags, rounds that run every row once in alternating order, and the quantiles of the
//! per-round ratios.

/// The value after flag `name` on the command line, if any.
pub fn arg_value(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// The count after flag `name`, or `default`.
pub fn arg(name: &str, default: usize) -> usize {
    arg_value(name).and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Quantile `q` of `xs`, linear between neighbours.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let at = q * (v.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
}

/// Seconds of each of `rows` rows in each of `rounds` rounds: `run(i)` times row `i`;
/// each round runs every row once, forward in even rounds, backward in odd ones, so the
/// rows share the machine's noise.
pub fn alternate(rows: usize, rounds: usize, mut run: impl FnMut(usize) -> f64) -> Vec<Vec<f64>> {
    let mut secs = vec![Vec::with_capacity(rounds); rows];
    for r in 0..rounds {
        let order: Vec<usize> = if r % 2 == 0 { (0..rows).collect() } else { (0..rows).rev().collect() };
        for i in order {
            secs[i].push(run(i));
        }
    }
    secs
}

/// Median and interquartile range of the per-round ratios `secs[base] / secs[row]`.
pub fn ratio(secs: &[Vec<f64>], base: usize, row: usize) -> String {
    let r: Vec<f64> = secs[base].iter().zip(&secs[row]).map(|(b, e)| b / e).collect();
    format!("{:.3} [{:.3}, {:.3}]", quantile(&r, 0.5), quantile(&r, 0.25), quantile(&r, 0.75))
}
