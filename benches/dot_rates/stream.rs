//! `dot_rates --stream`: each decode path's minimal sequence ([`super::paths`]) on tiles
//! read from memory, against the same sequence on one L1-resident tile and a plain read
//! of the same tiles, in the same run, under software prefetch policies given on the
//! command line: how much of a path's compute this machine hides behind its reads, and
//! which prefetch lets it hide the most, without the kernel's other work (softmax, walk,
//! accumulators) in the way. A policy is measured here in seconds; the kernel's A/B
//! (`benches/ab_decode.py`) takes minutes.
//!
//! The tiles lie in one buffer of 2 MiB pages, at least four times the last-level cache
//! (1 GiB at least), laid out as a cache layer (`rust/kv/storage.rs`): blocks of
//! `--heads` K tiles then their V tiles, the blocks in a scattered table (`--in-order`:
//! in slot order), read head by head within a block as the kernel's walk does. Threads
//! claim runs of [`super::memory::RUN`] pairs from one counter, so no pair is read twice
//! before the whole buffer has been and every read comes from memory, not from the
//! last-level cache.
//!
//! A policy (`--prefetch`, repeated; `none` by default) is `+`-joined prefetches
//! `hint:dist:lines[:s|:l]`: the first `lines` lines of the K and of the V tile `dist`
//! pairs ahead, with hint `t0`, `t1`, `t2` or `nta`, in a burst at each tile's start,
//! spread over both loops' steps (`s`) or the K lines over the K loop and the V lines
//! over the V loop (`l`), as the kernel spreads its own ([`super::memory::When`]). The
//! kernel's policy at head_dim 128 and 8-bit codes is `t0:1:32:l+t1:2:32:l`.
//!
//! Per path and g, with C, R and M the seconds per code of the L1-resident sequence, of
//! the plain read of the tiles in the table's order and of the sequence on the streamed
//! tiles: `memory / probe` (the share of a plain read of the whole buffer in address
//! order the path keeps: `bench_quant.py`'s "% of the stream probe"), `memory / read` =
//! R / M and `exposed` = (M - max(C, R)) / min(C, R), `bench_overlap.py`'s measure:
//! the share of the shorter part not hidden (above 1: slower than compute and read one
//! after the other, the reads then having fewer misses in flight than the plain read's).
//! `C / R` is the compute's share of the read time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use pykvpool::kv::aligned::AlignedBuf;

use super::memory::{Ahead, Layout, When};
use super::paths::{Tile, D, T};
use super::table::{all_paths, Path, GS};
use super::{rate, Opts};

/// The streamed buffer, made once (every path and thread reads the same one).
static BUFFER: OnceLock<&'static [u8]> = OnceLock::new();
/// The next run of tile pairs to read (see the module doc).
static NEXT_RUN: AtomicUsize = AtomicUsize::new(0);

fn claim() -> usize {
    NEXT_RUN.fetch_add(1, Ordering::Relaxed)
}

/// Block slots in table order for blocks of `block` bytes in a buffer of `len`: in
/// order, or a fixed pseudo-random permutation (`scatter`, as `bench_quant.py`'s tables).
fn table(len: usize, block: usize, scatter: bool) -> &'static [u32] {
    let mut order: Vec<u32> = (0..(len / block) as u32).collect();
    if scatter {
        // Fisher-Yates with a xorshift generator (a fixed seed: the same table every run).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
    }
    let mut seen = vec![false; order.len()];
    assert!(order.iter().all(|&b| !std::mem::replace(&mut seen[b as usize], true)), "a table names each slot once");
    Box::leak(order.into_boxed_slice())
}

/// The last-level cache's bytes as sysfs gives them for CPU 0 (None where it does not).
fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let mut best: Option<(u32, usize)> = None;
    for e in dir.flatten() {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok().map(|s| s.trim().to_string());
        let (Some(level), Some(size)) = (read("level"), read("size")) else { continue };
        let (Ok(level), Some(kib)) = (level.parse::<u32>(), size.strip_suffix('K').and_then(|k| k.parse::<usize>().ok())) else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, kib << 10));
        }
    }
    best.map(|(_, b)| b)
}

/// The buffer: `mib` MiB, or four times the last-level cache and at least 1 GiB, every
/// byte `0x3c + i % 8` (normal numbers as f32, bf16, e4m3 and e5m2 elements alike).
fn buffer(mib: Option<usize>) -> &'static [u8] {
    BUFFER.get_or_init(|| {
        let bytes = mib.map(|m| m << 20).unwrap_or_else(|| (4 * last_level_cache_bytes().unwrap_or(0)).max(1 << 30));
        let bytes = bytes.next_multiple_of(2 << 20);
        let mut b = AlignedBuf::zeroed(bytes).expect("the stream buffer");
        let word = u64::from_le_bytes(std::array::from_fn(|i| 0x3c + i as u8));
        for w in b.as_mut_slice().chunks_exact_mut(8) {
            w.copy_from_slice(&word.to_le_bytes());
        }
        let b: &'static AlignedBuf = Box::leak(Box::new(b));
        b.as_slice()
    })
}

/// `n` tiles read: every line of the K and the V tile summed into 8 accumulators.
///
/// # Safety
/// AVX-512 F.
#[target_feature(enable = "avx512f")]
unsafe fn sum_tiles(t: &mut Tile<true>, n: u64) {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 8];
    for _ in 0..n {
        let t = std::hint::black_box(&mut *t);
        t.next_tile();
        for p in [t.kp(), t.vp()] {
            let mut off = 0;
            while off < t.tile_bytes() {
                for (u, a) in acc.iter_mut().enumerate() {
                    // SAFETY: tiles are multiples of 512 bytes (D x T codes of at least one
                    // byte), so lines off + 64 u < tile_bytes are inside the tile.
                    *a = _mm512_add_epi32(*a, unsafe { _mm512_loadu_si512(p.add(off + 64 * u).cast()) });
                }
                off += 512;
            }
        }
    }
    std::hint::black_box(acc);
}

/// A prefetch policy: `none`, or `+`-joined `hint:dist:lines[:s|:l]` ([`Ahead`]: the
/// first `lines` lines of the K and of the V tile `dist` pairs on; hint `t0`, `t1`, `t2`
/// or `nta`; a burst at the tile's start, `s` spread over both loops' steps, `l` each
/// tile's lines over its own loop).
pub fn parse_policy(spec: &str) -> Result<Vec<Ahead>, String> {
    if spec == "none" {
        return Ok(Vec::new());
    }
    spec.split('+')
        .map(|a| {
            let f: Vec<&str> = a.split(':').collect();
            let hint = ["t0", "t1", "t2", "nta"].iter().position(|h| Some(h) == f.first());
            let when = match f.get(3) {
                None => Some(When::Burst),
                Some(&"s") => Some(When::Spread),
                Some(&"l") => Some(When::PerLoop),
                Some(_) => None,
            };
            match (hint, f.get(1).and_then(|x| x.parse().ok()), f.get(2).and_then(|x| x.parse().ok()), when, f.len()) {
                (Some(h), Some(dist), Some(lines), Some(when), 3 | 4) => Ok(Ahead { hint: h as u8, dist, lines, when }),
                _ => Err(format!("a prefetch is hint:dist:lines[:s|:l] (hint t0, t1, t2 or nta), got {a:?}")),
            }
        })
        .collect()
}

/// One row: codes/s of the path on the L1 tile, of the plain read of the whole buffer
/// in address order (the stream probe), of the plain read of the tiles in the table's
/// order and, per policy, of the path on the streamed tiles.
struct Row {
    l1: f64,
    probe: f64,
    read: f64,
    memory: Vec<f64>,
}

impl Row {
    fn measure(o: &Opts, threads: usize, p: &Path, gi: usize, buf: &'static [u8], [sweep, layout]: [Layout; 2],
               policies: &'static [Vec<Ahead>]) -> Self {
        let codes = (2 * D * T) as f64;
        let bytes = p.bytes;
        let kv = p.runs[gi][2];
        // SAFETY (both sequences): `main` checked the base features, `run` the path's own;
        // the sequences read only inside their tiles.
        let l1 = rate(o, threads, codes, || Tile::new(bytes, |i| 0x3c + (i % 8) as u8), |t, n| unsafe { kv(t, n) });
        // SAFETY: `sum_tiles` reads only inside its tiles (`main` checked avx512f).
        let sum = |l: Layout| rate(o, threads, codes, || Tile::streaming(bytes, buf, l, claim, &[]), |t, n| unsafe { sum_tiles(t, n) });
        let (probe, read) = (sum(sweep), sum(layout));
        let memory = policies
            .iter()
            .map(|a| {
                let f = p.stream[gi];
                // SAFETY: as above.
                rate(o, threads, codes, || Tile::streaming(bytes, buf, layout, claim, a), |t, n| unsafe { f(t, n) })
            })
            .collect();
        Row { l1, probe, read, memory }
    }

    fn exposed(&self, memory: f64) -> f64 {
        let (c, r, m) = (1.0 / self.l1, 1.0 / self.read, 1.0 / memory);
        (m - c.max(r)) / c.min(r)
    }
}

/// Per code width (1 and 2 bytes): the sweep (one tile pair per block, in slot order: the
/// buffer in address order) and the table's layout (blocks of `heads` K and V tiles, in
/// a scattered table with `scatter`), over a buffer of `len` bytes.
fn layouts(len: usize, heads: usize, scatter: bool) -> Vec<(usize, [Layout; 2])> {
    [1, 2]
        .iter()
        .map(|&b| {
            let pair = 2 * D * T * b;
            let sweep = Layout { heads: 1, order: table(len, pair, false) };
            (b, [sweep, Layout { heads, order: table(len, heads * pair, scatter) }])
        })
        .collect()
}

/// Measure and print the 8-bit and bf16 paths named in `only` (all when empty),
/// streamed under each of `policies` ([`parse_policy`]) from blocks of `heads` KV heads
/// (`scatter`: in a scattered table), at every thread count of `o`.
pub fn run(o: &Opts, mib: Option<usize>, only: &[String], policies: &[String], heads: usize, scatter: bool) {
    let has = |f: &str| pykvpool::attention::cpu_features().contains(&f);
    let paths: Vec<Path> = all_paths()
        .into_iter()
        .filter(|p| p.bytes <= 2 && p.needs.iter().all(|f| has(f)))
        .filter(|p| only.is_empty() || only.iter().any(|n| p.name == n))
        .collect();
    if let Some(n) = only.iter().find(|n| !paths.iter().any(|p| p.name == n.as_str())) {
        eprintln!("dot_rates: error: --paths: no 8-bit or bf16 path {n:?} on this CPU");
        std::process::exit(2);
    }
    let parsed: Result<Vec<Vec<Ahead>>, String> = policies.iter().map(|s| parse_policy(s)).collect();
    let parsed: &'static [Vec<Ahead>] = match parsed {
        Ok(p) => Box::leak(p.into_boxed_slice()),
        Err(e) => {
            eprintln!("dot_rates: error: {e}");
            std::process::exit(2);
        }
    };
    let buf = buffer(mib);
    let tables = layouts(buf.len(), heads, scatter);
    let layout = |bytes: usize| tables.iter().find(|t| t.0 == bytes).expect("1 or 2 bytes").1;
    println!("stream buffer: {} MiB (last-level cache {} MiB); blocks of {heads} heads' K and V tiles, {}; \
              prefetch policies: {}", buf.len() >> 20,
             last_level_cache_bytes().map_or("unknown".into(), |b| (b >> 20).to_string()),
             if scatter { "scattered" } else { "in order" }, policies.join(", "));
    let mut json = Vec::new();
    for &t in &o.threads {
        let cols: String = policies.iter().map(|p| format!(" {p}: memory / probe | / read | exposed |")).collect();
        println!("\n{t} thread(s):\n| path | g | L1 G codes/s | probe G codes/s | read G codes/s | C / R |{cols}\n\
                  |---|---|---|---|---|---|{}", "---|---|---|".repeat(policies.len()));
        for p in &paths {
            for (gi, &g) in GS.iter().enumerate() {
                let r = Row::measure(o, t, p, gi, buf, layout(p.bytes), parsed);
                let cells: String = r
                    .memory
                    .iter()
                    .map(|&m| format!(" {:.0}% | {:.0}% | {:.2} |", 100.0 * m / r.probe, 100.0 * m / r.read, r.exposed(m)))
                    .collect();
                println!("| {} | {g} | {:.2} | {:.2} | {:.2} | {:.2} |{cells}", p.name, r.l1 / 1e9, r.probe / 1e9,
                         r.read / 1e9, r.read / r.l1);
                let mem: Vec<String> = r.memory.iter().map(|m| format!("{m:.6e}")).collect();
                json.push(format!("{{\"threads\": {t}, \"path\": \"{}\", \"g\": {g}, \"l1\": {:.6e}, \"probe\": {:.6e}, \
                                   \"read\": {:.6e}, \"memory\": [{}]}}", p.name, r.l1, r.probe, r.read, mem.join(", ")));
            }
        }
    }
    println!("\nG codes/s of K + V (both tiles' codes); probe: the buffer summed in address order (the stream \
              probe); read: the tiles summed in the table's order, nothing computed; memory / probe, / read: the \
              path streamed over those rates; exposed: (M - max(C, R)) / min(C, R) in seconds per code (C: L1, R: \
              read, M: streamed); C / R: compute over read time");
    let pol: Vec<String> = policies.iter().map(|p| format!("\"{p}\"")).collect();
    println!("{{\"stream_rates\": 1, \"d\": {D}, \"tile_tokens\": {T}, \"buffer_bytes\": {}, \"heads\": {heads}, \
              \"scatter\": {scatter}, \"quick\": {}, \"clock\": \"thread_cpu\", \"policies\": [{}], \"rates\": [{}]}}",
             buf.len(), o.quick, pol.join(", "),
             json.join(", "));
}
