//! The compute roofs of the AVX-512 decode kernels, measured on this machine's cores:
//! what `benches/bench_quant.py` (through `benches/quant_roofs.py`) takes for its
//! instruction-mix roofs, and the probe behind `benches/RESULTS.md`'s streamed sequences.
//!
//! 1. Issue rates: 512-bit `vfmadd231ps` (16 FMA; the unit of every other figure) and
//!    `vpdpbusd` (64 int8 multiply-adds, VNNI), each as 12 independent chains, and
//!    `vpdpbusd` : FMA mixed 1:4 (that the two share the FMA's rate is what
//!    `bench_quant.py`'s FMA-only roofs of the `int8_*` rows assume).
//! 2. For each decode path `bench_quant.py` times (`bf16`, `int8`, `fp8_e4m3`, `fp8_e5m2`,
//!    `int8_scores`, `bf16_scores` on bf16 and fp8,
//!    `fp16_reduction` on fp8) and g = 1 and 4 query heads per KV head: codes per second
//!    of the minimal instruction sequence the path issues per cached code (the widening
//!    of the codes and the g dot products, see `dot_rates/paths.rs`), on one L1-resident
//!    tile (16 tokens x head_dim 128 of K and of V, at most 8 KiB), so memory is out of the picture: K alone, V alone and both per
//!    tile (`kv`, the path's roof), and the same `kv` rate in codes per FMA instruction
//!    time (codes/s over the FMA's instr/s measured the same way), against the codes per
//!    FMA time the FMA-only count assumes (16 / g for the exact paths, 128 / (5 g) for
//!    `int8_scores`, 64 / (3 g) for `bf16_scores`).
//! 3. The softmax's `exp2` (the kernel's 12-instruction sequence per 16 scores), reported
//!    apart: it is per score, not per code, and not part of the roof.
//!
//! Every figure is measured at each thread count of `--threads` (default 1,2): that many
//! threads run the same loop at once (a barrier starts each round), each timed by its
//! own thread CPU time (`CLOCK_THREAD_CPUTIME_ID`: time a shared machine's other
//! processes take is not counted), the rates summed; best of 5 rounds (2 with `--quick`)
//! of about 40 ms (10 ms) each. A path's K+V rate far under the harmonic mean of its K
//! and V rates (every round disturbed) is measured again, up to twice (`*` in the table).
//!
//! Prints tables and one machine-readable JSON line (starting `{"dot_rates"`), which
//! `benches/bench_quant.py` reads for its instruction-mix roofs.
//!
//! With `--stream [MiB]` it prints instead the 8-bit and bf16 paths' sequences on tiles
//! streamed from memory against the L1 rates and a plain read of the same tiles
//! (`dot_rates/stream.rs`; JSON line `{"stream_rates"`).
//!
//! Timed by hand, not by divan: a figure is the sum of N threads' rates running the same
//! loop at once behind a barrier, each by its own thread CPU time, and the output is the
//! JSON line `bench_quant.py` parses; divan times one closure by wall clock and prints its
//! own table.
//!
//! Run: `cargo bench --bench dot_rates [-- --quick] [-- --threads 1,2] [-- --stream [MiB]]`.

use std::sync::Barrier;

#[cfg(target_arch = "x86_64")]
#[path = "dot_rates/f16.rs"]
mod f16;
#[cfg(target_arch = "x86_64")]
#[path = "dot_rates/memory.rs"]
mod memory;
#[cfg(target_arch = "x86_64")]
#[path = "dot_rates/paths.rs"]
mod paths;
#[cfg(target_arch = "x86_64")]
#[path = "dot_rates/widen.rs"]
mod widen;

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn thread_cpu_s() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Measurement settings from the command line.
struct Opts {
    quick: bool,
    threads: Vec<usize>,
    /// `--stream [MiB]`: the streamed table instead ([`stream`]), its buffer's size;
    /// `--paths a,b`: only those paths; `--prefetch P` (repeated): its policies;
    /// `--heads N` (default 8) KV heads per block; `--in-order`: blocks not scattered.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    stream: Option<Option<usize>>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    paths: Vec<String>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    prefetch: Vec<String>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    heads: usize,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    in_order: bool,
}

impl Opts {
    /// `--quick`, `--threads 1,2`, `--stream [MiB]`; other arguments (cargo's `--bench`)
    /// are ignored.
    fn parse() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let stream = args.iter().position(|a| a == "--stream").map(|i| args.get(i + 1).and_then(|m| m.parse().ok()));
        if stream == Some(Some(0)) {
            eprintln!("dot_rates: error: --stream takes a buffer size in MiB >= 1");
            std::process::exit(2);
        }
        let value = |flag: &str| -> Vec<String> {
            args.iter().enumerate().filter(|(_, a)| *a == flag).filter_map(|(i, _)| args.get(i + 1).cloned()).collect()
        };
        let paths = value("--paths").iter().flat_map(|l| l.split(',').map(str::to_string)).collect();
        let mut prefetch = value("--prefetch");
        if prefetch.is_empty() {
            prefetch.push("none".into());
        }
        let heads = match value("--heads").first().map(|h| h.parse::<usize>()) {
            None => 8,
            Some(Ok(h)) if (1..=64).contains(&h) => h,
            Some(_) => {
                eprintln!("dot_rates: error: --heads takes a count in 1..=64");
                std::process::exit(2);
            }
        };
        let in_order = args.iter().any(|a| a == "--in-order");
        let mut o = Opts {
            quick: args.iter().any(|a| a == "--quick"),
            threads: vec![1, 2],
            stream,
            paths,
            prefetch,
            heads,
            in_order,
        };
        if let Some(i) = args.iter().position(|a| a == "--threads") {
            let list = args.get(i + 1).map(String::as_str).unwrap_or("");
            o.threads = list.split(',').filter_map(|x| x.trim().parse().ok()).filter(|&t| t >= 1).collect();
            if o.threads.is_empty() {
                eprintln!("dot_rates: error: --threads takes a comma-separated list of counts >= 1, got {list:?}");
                std::process::exit(2);
            }
        }
        o
    }

    /// Seconds per round and rounds.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn round(&self) -> (f64, usize) {
        if self.quick {
            (0.01, 2)
        } else {
            (0.04, 5)
        }
    }
}

/// Units per second of `threads` threads each running `f(state, n)` at once (each with
/// its own `make()` state): per round the sum of the threads' `n * units / CPU seconds`,
/// best over rounds; `n` calibrated on this thread to the round length.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn rate<S>(o: &Opts, threads: usize, units: f64, make: impl Fn() -> S + Sync, f: impl Fn(&mut S, u64) + Sync) -> f64 {
    let (secs, rounds) = o.round();
    let mut st = make();
    let mut n = 1u64;
    loop {
        let t = thread_cpu_s();
        f(&mut st, n);
        let dt = thread_cpu_s() - t;
        if dt > secs / 8.0 {
            n = ((n as f64 * secs / dt).ceil() as u64).max(1);
            break;
        }
        n *= 4;
    }
    let barrier = Barrier::new(threads);
    let per_thread: Vec<Vec<f64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| {
                    let mut st = make();
                    f(&mut st, n / 8 + 1);
                    (0..rounds)
                        .map(|_| {
                            barrier.wait();
                            let t = thread_cpu_s();
                            f(&mut st, n);
                            n as f64 * units / (thread_cpu_s() - t)
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("bench thread")).collect()
    });
    (0..rounds).map(|r| per_thread.iter().map(|v| v[r]).sum::<f64>()).fold(0.0, f64::max)
}

#[cfg(target_arch = "x86_64")]
#[path = "dot_rates/fma.rs"]
mod fma;

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    #[target_feature(enable = "avx512f,avx512vnni")]
    pub fn dpbusd(n: u64) {
        let (u, s) = (_mm512_set1_epi8(black_box(3)), _mm512_set1_epi8(black_box(-2)));
        let mut a = [_mm512_setzero_si512(); 12];
        for _ in 0..n {
            for x in a.iter_mut() {
                *x = _mm512_dpbusd_epi32(*x, u, s);
            }
        }
        black_box(a);
    }

    /// 2 `vpdpbusd` + 8 FMAs per round (10 chains in all): `int8_scores`' 1:4 mix.
    #[target_feature(enable = "avx512f,avx512vnni,fma")]
    pub fn mix(n: u64) {
        let (u, s) = (_mm512_set1_epi8(black_box(3)), _mm512_set1_epi8(black_box(-2)));
        let (m, c) = (_mm512_set1_ps(black_box(0.999_999)), _mm512_set1_ps(black_box(1e-7)));
        let mut a = [_mm512_setzero_si512(); 2];
        let mut f = [_mm512_set1_ps(1.0); 8];
        for _ in 0..n {
            for x in a.iter_mut() {
                *x = _mm512_dpbusd_epi32(*x, u, s);
            }
            for x in f.iter_mut() {
                *x = _mm512_fmadd_ps(*x, m, c);
            }
        }
        black_box((a, f));
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "dot_rates/table.rs"]
mod table;

#[cfg(target_arch = "x86_64")]
#[path = "dot_rates/stream.rs"]
mod stream;

fn main() {
    let o = Opts::parse();
    #[cfg(target_arch = "x86_64")]
    {
        let has = |f: &str| pykvpool::attention::cpu_features().contains(&f);
        if !has("avx512f") || !has("avx512bw") || !has("avx512vl") || !has("fma") || !has("f16c") {
            println!("SKIPPED: this CPU lacks AVX-512 F/BW/VL, FMA or F16C");
            return;
        }
        if let Some(mib) = o.stream {
            stream::run(&o, mib, &o.paths, &o.prefetch, o.heads, !o.in_order);
            return;
        }
        // SAFETY (every call below): the features each function is compiled for were
        // checked on this CPU just before.
        let fma = rate(&o, 1, 12e-9, || (), |_, n| unsafe { fma::fma(n) });
        println!("vfmadd231ps zmm: {fma:.2} instr/ns (16 FMA each: {:.1} G FMA/s)", fma * 16.0);
        if has("avx512vnni") {
            let d = rate(&o, 1, 12e-9, || (), |_, n| unsafe { imp::dpbusd(n) });
            println!("vpdpbusd zmm:    {d:.2} instr/ns ({:.2}x the FMA's; 64 MAC each: {:.1} G MAC/s)", d / fma, d * 64.0);
            let m = rate(&o, 1, 10e-9, || (), |_, n| unsafe { imp::mix(n) });
            println!("1 vpdpbusd : 4 vfmadd231ps: {m:.2} instr/ns ({:.2}x the FMA's)", m / fma);
        } else {
            println!("SKIPPED vpdpbusd: no avx512_vnni");
        }
        table::run(&o);
    }
    #[cfg(not(target_arch = "x86_64"))]
    println!("SKIPPED: not x86-64 (threads {:?})", o.threads);
}
