//! The decode kernel on a cache that stays in L2, against the instruction-mix roofs of
//! `dot_rates`: how much of an 8-bit decode's loss at full size is the loop's own
//! (softmax, the score -> V hand-over, bookkeeping) and how much is memory.
//!
//! Per decode path and g = 1 and 4 query heads per KV head: one sequence, one KV head,
//! head_dim 128, blocks of 16 tokens in a scattered order, `decode_attention` on one
//! thread (the kernels' pool set to 1, no split). The rate is marginal: the time of a
//! call over `LONG` tokens minus that of a call over `SHORT` tokens, over the codes the
//! difference reads (K and V, `2 x 128` per token), so the fixed cost of a call (plan,
//! buffers, merge) drops out; both lengths keep the codes in L2 (at most 1 MiB for bf16).
//! Printed in G codes/s and in codes per FMA instruction time (the FMA's rate measured
//! here the same way), the unit of `dot_rates`' "K+V codes per FMA time" column: their
//! quotient is the share of its instruction roof the kernel reaches with memory out of
//! the picture. The median of 7 rounds; in each, per length, the fastest of 9 batches of
//! 20 calls, timed by this thread's CPU time (the one-thread pool runs each call on the
//! calling thread; time a shared machine's other processes take is not counted). A
//! difference of two timings is noisy: a round whose short call was disturbed reads
//! too fast, hence the median, not the best.
//!
//! Run: `cargo bench --bench decode_rate [-- --quick]`.

// Off x86-64 only `main`'s skip message is compiled in use.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

use std::hint::black_box;
use std::time::Instant;

use pykvpool::attention::{decode_attention, DecodeOptions, SeqTables};
use pykvpool::{DType, KvCache, KvShape};

const D: usize = 128;
const BS: usize = 16;
const SHORT: usize = 1024;
const LONG: usize = 2048;
/// Calls per timed batch.
const CALLS: usize = 20;

/// A decode path: name, cache dtype, options.
struct Path {
    name: &'static str,
    dtype: DType,
    bf16_scores: bool,
    int8_scores: bool,
    int8_pv: bool,
}

const PATHS: [Path; 10] = [
    Path { name: "bf16", dtype: DType::BF16, bf16_scores: false, int8_scores: false, int8_pv: false },
    Path { name: "int8", dtype: DType::I8, bf16_scores: false, int8_scores: false, int8_pv: false },
    Path { name: "fp8_e4m3", dtype: DType::E4M3, bf16_scores: false, int8_scores: false, int8_pv: false },
    Path { name: "fp8_e5m2", dtype: DType::E5M2, bf16_scores: false, int8_scores: false, int8_pv: false },
    Path { name: "bf16+bf16_scores", dtype: DType::BF16, bf16_scores: true, int8_scores: false, int8_pv: false },
    Path { name: "fp8_e4m3+bf16_scores", dtype: DType::E4M3, bf16_scores: true, int8_scores: false, int8_pv: false },
    Path { name: "fp8_e5m2+bf16_scores", dtype: DType::E5M2, bf16_scores: true, int8_scores: false, int8_pv: false },
    Path { name: "int8_scores", dtype: DType::I8, bf16_scores: false, int8_scores: true, int8_pv: false },
    Path { name: "int8_pv", dtype: DType::I8, bf16_scores: false, int8_scores: false, int8_pv: true },
    Path { name: "int8_scores+int8_pv", dtype: DType::I8, bf16_scores: false, int8_scores: true, int8_pv: true },
];

/// A deterministic generator of floats in [-1, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// A one-KV-head cache of `LONG` tokens of random K and V, and tables of one sequence
/// of `len` tokens on its blocks in a scattered order (stride 7 modulo the block count).
fn case(dtype: DType, len: usize) -> (KvCache, SeqTables) {
    let nb = LONG / BS;
    let s = KvShape { num_layers: 1, num_blocks: nb, block_size: BS, num_kv_heads: 1, head_dim: D };
    let mut r = Lcg(7);
    let k: Vec<f32> = (0..nb * BS * D).map(|_| 2.0 * r.next()).collect();
    let v: Vec<f32> = (0..nb * BS * D).map(|_| r.next()).collect();
    let mut c = KvCache::new(s, dtype).expect("cache");
    c.write(0, &k, &v, &(0..(nb * BS) as i64).collect::<Vec<_>>()).expect("write");
    let table: Vec<i64> = (0..nb).map(|b| ((b * 7) % nb) as i64).collect();
    let t = SeqTables::padded(&table, nb, &[len as i64], BS, nb).expect("tables");
    (c, t)
}

/// This thread's CPU seconds (a one-thread pool runs the call on this thread).
fn thread_cpu_s() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Least over `reps` batches of the CPU seconds per call of `CALLS` calls of `f`.
fn least_s(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let t0 = thread_cpu_s();
            for _ in 0..CALLS {
                f();
            }
            (thread_cpu_s() - t0) / CALLS as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[0]
}

/// Marginal K+V codes per second of `p` at `g` query heads: the median over `rounds` of the
/// codes between `SHORT` and `LONG` tokens over the time between their calls.
fn kernel_rate(p: &Path, g: usize, rounds: usize) -> f64 {
    let opts = DecodeOptions {
        split_tokens: Some(0),
        bf16_scores: p.bf16_scores,
        int8_scores: p.int8_scores,
        int8_pv: p.int8_pv,
        ..Default::default()
    };
    let mut r = Lcg(11);
    let q: Vec<f32> = (0..g * D).map(|_| r.next()).collect();
    let mut out = vec![0f32; g * D];
    let (short, long) = (case(p.dtype, SHORT), case(p.dtype, LONG));
    let mut call = |(c, t): &(KvCache, SeqTables)| {
        decode_attention(c, 0, &q, g, t, &mut out, None, &opts).expect("decode");
        black_box(&out);
    };
    let mut rates = (0..rounds)
        .map(|_| {
            let (a, b) = (least_s(9, || call(&short)), least_s(9, || call(&long)));
            ((LONG - SHORT) * 2 * D) as f64 / (b - a).max(1e-9)
        })
        .collect::<Vec<f64>>();
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

#[cfg(target_arch = "x86_64")]
#[path = "dot_rates/fma.rs"]
mod fma;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 2 } else { 7 };
    #[cfg(target_arch = "x86_64")]
    {
        let feats = pykvpool::attention::cpu_features();
        let has = |f: &str| feats.contains(&f);
        if !["avx512f", "avx512bw", "avx512vl", "fma", "f16c"].iter().all(|f| has(f)) {
            println!("SKIPPED: this CPU lacks AVX-512 F/BW/VL, FMA or F16C");
            return;
        }
        pykvpool::runtime::threads::set_num_threads(1).expect("threads");
        let n = 4_000_000u64;
        let fma = (0..rounds)
            .map(|_| {
                let t0 = Instant::now();
                // SAFETY: avx512f and fma were checked just above.
                unsafe { fma::fma(n) };
                n as f64 * 12.0 / t0.elapsed().as_secs_f64()
            })
            .fold(0.0, f64::max);
        println!("1 thread, wall clock: vfmadd231ps zmm {:.2} G instr/s", fma / 1e9);
        println!("| path | g | kernel G codes/s (L2) | kernel codes per FMA time |");
        println!("|---|---|---|---|");
        let mut json = Vec::new();
        for p in &PATHS {
            let needs: &[&str] = match (p.bf16_scores, p.int8_scores || p.int8_pv) {
                (true, _) => &["avx512bf16", "avx512vbmi"],
                (_, true) => &["avx512vnni"],
                _ => &[],
            };
            if !needs.iter().all(|f| has(f)) {
                continue;
            }
            for g in [1, 4] {
                let r = kernel_rate(p, g, rounds);
                println!("| {} | {g} | {:.2} | {:.2} |", p.name, r / 1e9, r / fma);
                json.push(format!("{{\"path\": \"{}\", \"g\": {g}, \"codes_per_s\": {r:.6e}, \"codes_per_fma\": {:.4}}}", p.name, r / fma));
            }
        }
        println!("{{\"decode_rate\": 1, \"fma_instr_per_s\": {fma:.6e}, \"rates\": [{}]}}", json.join(", "));
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = rounds;
        println!("SKIPPED: x86-64 only (the roofs it compares with are AVX-512's)");
    }
}
