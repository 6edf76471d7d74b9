//! Disk tier bandwidth: `DiskTier` (G3) puts and gets of whole blocks, against a raw
//! sequential file probe of the same folder (the figure behind "G2<->G3 at least 70% of a
//! raw sequential file read/write probe of the same folder").
//!
//! For each block size S in 256 KiB, 1 MiB and 4 MiB, a pass moves a 256 MiB working set
//! (1024, 256 and 64 blocks) of pseudo-random bytes held in one host buffer (filled once);
//! the rows are:
//!
//! - `raw write nosync`: the working set written as one new sequential file, one
//!   `write_all` of S bytes per block, not synced: the baseline of `put nofsync`;
//! - `raw write`: the same, then one `sync_data` at the end (durable): the baseline of
//!   `put fsync`;
//! - `put nofsync`: `DiskTier::put` of every block (bf16, layer group 0) with
//!   `Durability::NoFsync`: a file per block, written then renamed, no syncs;
//! - `put fsync`: the same with `Durability::Fsync`: each put syncs its file and its
//!   folder, so this row pays two device flushes per block where `raw write` pays one per
//!   pass: the measured cost of per-block durability, largest for small blocks;
//! - `put ahead nofsync`: `put nofsync` into an empty tier that made its spare files
//!   ahead (`DiskTier::make_spare` until it makes no more, not timed), as the tier
//!   store's disk thread does while idle: a burst of puts after an idle spell;
//! - `put full nofsync` / `put full fsync`: a disk tier at steady state: the tier holds a
//!   working set, and each block put first removes the oldest block (timed too), as a
//!   full tier evicting does; the removed files are rewritten by the next puts (the
//!   tier's spares) instead of new files being created;
//! - `raw files nosync` / `raw files`: the working set written as one new file per
//!   block (`create_new`, one `write_all`), the second syncing each file's data and the
//!   folder after it: what creating a file per block costs this file system whatever
//!   the store, the floor of `put nofsync` / `put fsync` (their "vs floor" column);
//! - `raw read`: the sequential file read back, one `read_exact` of S bytes per block into
//!   a reused buffer: the baseline of `get`;
//! - `raw read sum`: `raw read` with the XXH3-64 of every block: the floor of `get`,
//!   which verifies every payload;
//! - `get`: `DiskTier::get` of every block into a reused `Vec` (header checks and the
//!   XXH3-64 checksum of every payload included);
//! - `raw read cold` / `get cold`: the same two after dropping their files from the page
//!   cache (`posix_fadvise(DONTNEED)` of files synced when written, not timed), so the
//!   bytes come from the device (under a virtual machine the host may still cache them);
//! - `get cold ahead`: `get cold` with `DiskTier::prefetch` of the blocks up to 8 MiB
//!   ahead of each read, as the tier store does for the disk blocks of a load plan.
//!
//! The warm reads read files written in the page cache; both sides are warm alike. The
//! read rows read a sequential file and a tier written (and synced) once per block size;
//! the write rows write a new file (removed after the pass) or every block into an empty
//! tier (every key removed after the pass); removals and cache drops are not timed. The
//! folder is a new folder under `std::env::temp_dir()` (`--dir PATH`: under PATH), removed
//! at the end. GB/s is 10^9 payload bytes per second (a block file's 72-byte header not
//! counted).
//!
//! Timed by hand (`harness = false`), not by divan: the figure is the ratio of rows
//! measured in the same round. Each round runs every row of a size once, in alternating
//! order (forward, then backward), so the rows share the machine's noise; the output is
//! each row's median GB/s and, for a put or get row, the median of the per-round ratios to
//! its baseline row, with their interquartile range, and the same against its floor row
//! where it has one. A warm-up pass of each row (not
//! timed) creates the tiers' fan-out folders first.
//!
//! `cargo bench --bench offload_disk` (`-- --rounds N`, default 5; `-- --dir PATH`).

#[path = "paired/rounds.rs"]
mod paired;
use paired::{alternate, arg, arg_value, quantile, ratio};

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pykvpool::kv::DType;
use pykvpool::offload::disk::{DiskTier, Durability};
use xxhash_rust::xxh3::xxh3_64;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Payload bytes moved per pass.
const SET: usize = 256 * MIB;
const SIZES: [usize; 3] = [256 * KIB, MIB, 4 * MIB];
const FINGERPRINT: u128 = 0x6f66_666c_6f61_645f_6469_736b;
const CAPACITY: u64 = 1 << 40;

/// A row of the table: one way to move `SET` bytes to or from the folder.
#[derive(Clone, Copy, PartialEq)]
enum Row {
    RawWrite { sync: bool },
    RawFiles { sync: bool },
    Put { fsync: bool },
    PutAhead,
    PutFull { fsync: bool },
    RawRead { cold: bool },
    RawReadSum,
    Get { cold: bool },
    GetAhead,
}

const ROWS: [Row; 15] = [
    Row::RawWrite { sync: false },
    Row::RawWrite { sync: true },
    Row::RawFiles { sync: false },
    Row::RawFiles { sync: true },
    Row::Put { fsync: false },
    Row::Put { fsync: true },
    Row::PutAhead,
    Row::PutFull { fsync: false },
    Row::PutFull { fsync: true },
    Row::RawRead { cold: false },
    Row::RawReadSum,
    Row::Get { cold: false },
    Row::RawRead { cold: true },
    Row::Get { cold: true },
    Row::GetAhead,
];

impl Row {
    fn name(self) -> &'static str {
        match self {
            Self::RawWrite { sync } => ["raw write nosync", "raw write"][usize::from(sync)],
            Self::RawFiles { sync } => ["raw files nosync", "raw files"][usize::from(sync)],
            Self::Put { fsync } => ["put nofsync", "put fsync"][usize::from(fsync)],
            Self::PutAhead => "put ahead nofsync",
            Self::PutFull { fsync } => ["put full nofsync", "put full fsync"][usize::from(fsync)],
            Self::RawRead { cold } => ["raw read", "raw read cold"][usize::from(cold)],
            Self::RawReadSum => "raw read sum",
            Self::Get { cold } => ["get", "get cold"][usize::from(cold)],
            Self::GetAhead => "get cold ahead",
        }
    }

    /// The raw sequential row this row is compared with.
    fn baseline(self) -> Option<Row> {
        match self {
            Self::Put { fsync } | Self::PutFull { fsync } | Self::RawFiles { sync: fsync } => {
                Some(Self::RawWrite { sync: fsync })
            }
            Self::Get { cold } => Some(Self::RawRead { cold }),
            Self::GetAhead => Some(Self::RawRead { cold: true }),
            Self::PutAhead => Some(Self::RawWrite { sync: false }),
            Self::RawReadSum => Some(Self::RawRead { cold: false }),
            _ => None,
        }
    }

    /// The raw row doing the least any store of this format must do for this row.
    fn floor(self) -> Option<Row> {
        match self {
            Self::Put { fsync } => Some(Self::RawFiles { sync: fsync }),
            Self::Get { cold: false } => Some(Self::RawReadSum),
            _ => None,
        }
    }
}

/// The folder, tiers and buffers of one block size.
struct Setup<'a> {
    data: &'a [u8],
    block: usize,
    dir: PathBuf,
    /// The raw write rows' file (removed after each pass) and the raw read rows' file.
    write_file: PathBuf,
    /// The raw files rows' folder (emptied after each pass).
    files_dir: PathBuf,
    read_file: PathBuf,
    /// The put rows' tiers (emptied after each pass), by `fsync`, then `put ahead`'s.
    put: [DiskTier; 3],
    /// The steady-state rows' tiers, by `fsync`, each full of one working set; the key
    /// of its oldest block.
    full: [(DiskTier, u128); 2],
    get: DiskTier,
    chunk: Vec<u8>,
    out: Vec<u8>,
}

impl<'a> Setup<'a> {
    fn new(root: &Path, data: &'a [u8], block: usize) -> Self {
        let dir = root.join(format!("{}k", block / KIB));
        fs::create_dir_all(&dir).expect("folder");
        let tier = |name: &str, d| DiskTier::open_with(dir.join(name), FINGERPRINT, CAPACITY, d).expect("tier");
        let put = [
            tier("put-nofsync", Durability::NoFsync),
            tier("put-fsync", Durability::Fsync),
            tier("put-ahead", Durability::NoFsync),
        ];
        let mut full = [(tier("full-nofsync", Durability::NoFsync), 0), (tier("full-fsync", Durability::Fsync), 0)];
        full.iter_mut().for_each(|(t, _)| put_all(t, data, block));
        let mut get = tier("get", Durability::NoFsync);
        let (write_file, read_file) = (dir.join("raw-write.bin"), dir.join("raw-read.bin"));
        let files_dir = dir.join("raw-files");
        fs::create_dir_all(&files_dir).expect("folder");
        // The read side, written once and synced so that its pages are clean (droppable).
        write_raw(&read_file, data, block, true);
        put_all(&mut get, data, block);
        for key in 0..(SET / block) as u128 {
            File::open(get.block_path(0, key)).and_then(|f| f.sync_data()).expect("sync");
        }
        let (chunk, out) = (vec![0; block], Vec::with_capacity(block));
        Self { data, block, dir, write_file, files_dir, read_file, put, full, get, chunk, out }
    }

    /// Run `row` once; seconds (of the row's I/O alone).
    fn run(&mut self, row: Row) -> f64 {
        let blocks = SET / self.block;
        if matches!(row, Row::RawRead { cold: true }) {
            drop_cached(&self.read_file);
        } else if matches!(row, Row::Get { cold: true } | Row::GetAhead) {
            (0..blocks as u128).for_each(|key| drop_cached(&self.get.block_path(0, key)));
        } else if row == Row::PutAhead {
            while self.put[2].make_spare(self.block as u64, blocks).expect("spare") {}
        }
        let t = Instant::now();
        match row {
            Row::RawWrite { sync } => write_raw(&self.write_file, self.data, self.block, sync),
            Row::RawFiles { sync } => write_files(&self.files_dir, self.data, self.block, sync),
            Row::Put { fsync } => put_all(&mut self.put[usize::from(fsync)], self.data, self.block),
            Row::PutAhead => put_all(&mut self.put[2], self.data, self.block),
            Row::PutFull { fsync } => put_evicting(&mut self.full[usize::from(fsync)], self.data, self.block),
            Row::RawRead { .. } => read_raw(&self.read_file, &mut self.chunk, blocks),
            Row::RawReadSum => read_raw_sum(&self.read_file, &mut self.chunk, blocks),
            Row::Get { .. } => get_all(&mut self.get, &mut self.out, blocks),
            Row::GetAhead => get_ahead(&mut self.get, &mut self.out, blocks),
        }
        let secs = t.elapsed().as_secs_f64();
        match row {
            Row::RawWrite { .. } => fs::remove_file(&self.write_file).expect("remove"),
            Row::RawFiles { .. } => (0..blocks).for_each(|i| fs::remove_file(self.files_dir.join(i.to_string())).expect("remove")),
            Row::Put { fsync } => remove_all(&mut self.put[usize::from(fsync)], blocks),
            Row::PutAhead => remove_all(&mut self.put[2], blocks),
            _ => {}
        }
        secs
    }
}

impl Drop for Setup<'_> {
    fn drop(&mut self) {
        // Best effort: the tiers' locked manifests go with the folder (Unix unlinks open files).
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `data` as a new file `path`, one `write_all` per block, synced once at the end when `sync`.
fn write_raw(path: &Path, data: &[u8], block: usize, sync: bool) {
    let mut f = File::create_new(path).expect("create");
    data.chunks(block).for_each(|b| f.write_all(b).expect("write"));
    if sync {
        f.sync_data().expect("sync");
    }
}

/// `data` as a new file per block in folder `dir` (named by block index), each synced
/// with the folder after it when `sync`.
fn write_files(dir: &Path, data: &[u8], block: usize, sync: bool) {
    for (i, b) in data.chunks(block).enumerate() {
        let mut f = File::create_new(dir.join(i.to_string())).expect("create");
        f.write_all(b).expect("write");
        if sync {
            f.sync_data().expect("sync");
            File::open(dir).and_then(|d| d.sync_all()).expect("sync the folder");
        }
    }
}

/// [`read_raw`], each block's XXH3-64 computed as it is read.
fn read_raw_sum(path: &Path, chunk: &mut [u8], blocks: usize) {
    let mut f = File::open(path).expect("open");
    let mut sum = 0;
    for _ in 0..blocks {
        f.read_exact(chunk).expect("read");
        sum ^= xxh3_64(chunk);
    }
    std::hint::black_box(sum);
}

/// `path` read from start to end, `blocks` reads of `chunk.len()` bytes.
fn read_raw(path: &Path, chunk: &mut [u8], blocks: usize) {
    let mut f = File::open(path).expect("open");
    (0..blocks).for_each(|_| f.read_exact(chunk).expect("read"));
}

/// Every block of `data` put into `tier` as (0, block index).
fn put_all(tier: &mut DiskTier, data: &[u8], block: usize) {
    for (key, b) in data.chunks(block).enumerate() {
        tier.put(0, key as u128, 16, DType::BF16, b).expect("put");
    }
}

/// Every block of `data` put into the full `tier`, each after removing the oldest block
/// (`oldest`, advanced): the working set stays the same size.
fn put_evicting((tier, oldest): &mut (DiskTier, u128), data: &[u8], block: usize) {
    let n = (data.len() / block) as u128;
    for b in data.chunks(block) {
        assert!(tier.remove(0, *oldest).expect("remove"));
        tier.put(0, *oldest + n, 16, DType::BF16, b).expect("put");
        *oldest += 1;
    }
}

/// Every block of a pass read (and verified) from `tier` into `out`.
fn get_all(tier: &mut DiskTier, out: &mut Vec<u8>, blocks: usize) {
    for key in 0..blocks as u128 {
        out.clear();
        assert!(tier.get(0, key, out).expect("get").is_some(), "block {key} missing");
    }
}

/// [`get_all`], the files of the blocks up to 8 MiB ahead read ahead first.
fn get_ahead(tier: &mut DiskTier, out: &mut Vec<u8>, blocks: usize) {
    let block = SET / blocks;
    let ahead = (8 * MIB / block).max(1) as u128;
    let n = blocks as u128;
    tier.prefetch(&(0..ahead.min(n)).map(|k| (0, k)).collect::<Vec<_>>());
    for key in 0..n {
        if key + ahead < n {
            tier.prefetch(&[(0, key + ahead)]);
        }
        out.clear();
        assert!(tier.get(0, key, out).expect("get").is_some(), "block {key} missing");
    }
}

fn remove_all(tier: &mut DiskTier, blocks: usize) {
    (0..blocks as u128).for_each(|key| assert!(tier.remove(0, key).expect("remove")));
}

/// Drops the (clean) pages of file `path` from the page cache.
fn drop_cached(path: &Path) {
    let f = File::open(path).expect("open");
    // SAFETY: `f` owns the descriptor, open for the whole call; the call reads no memory.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise");
}

/// `n` pseudo-random bytes (splitmix64).
fn random_bytes(n: usize) -> Vec<u8> {
    let mut s = 0x9e37_79b9_7f4a_7c15_u64;
    let mut v = vec![0u8; n];
    for w in v.chunks_exact_mut(8) {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let z = (s ^ (s >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        w.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    v
}

/// Seconds of each row (by `ROWS` index) in each of `rounds` rounds.
fn measure(root: &Path, data: &[u8], block: usize, rounds: usize) -> Vec<Vec<f64>> {
    let mut s = Setup::new(root, data, block);
    for &row in &ROWS {
        s.run(row); // warm-up: the fan-out folders, the code paths
    }
    alternate(ROWS.len(), rounds, |i| s.run(ROWS[i]))
}

fn print_table(secs: &[Vec<f64>]) {
    println!("  {:<18} {:>6}   {:>24}   {:<18} {:>24}   floor", "row", "GB/s", "vs baseline [IQR]", "baseline", "vs floor [IQR]");
    let index = |r: Option<Row>| r.and_then(|r| ROWS.iter().position(|&x| x == r));
    for (i, row) in ROWS.iter().enumerate() {
        let gbs: Vec<f64> = secs[i].iter().map(|t| SET as f64 / t / 1e9).collect();
        let vs = |b: Option<usize>| b.map_or((String::new(), ""), |b| (ratio(secs, b, i), ROWS[b].name()));
        let ((base, base_name), (floor, floor_name)) = (vs(index(row.baseline())), vs(index(row.floor())));
        println!(
            "  {:<18} {:>6.2}   {:>24}   {:<18} {:>24}   {}",
            row.name(),
            quantile(&gbs, 0.5),
            base,
            base_name,
            floor,
            floor_name
        );
    }
}

fn main() {
    let rounds = arg("--rounds", 5).max(3);
    let parent = arg_value("--dir").map_or_else(std::env::temp_dir, PathBuf::from);
    let root = parent.join(format!("pykvpool-offload-disk-{}", std::process::id()));
    let data = random_bytes(SET);
    println!("offload_disk: {rounds} rounds, {} MiB per pass, in {}; GB/s = 1e9 B/s", SET / MIB, root.display());
    for block in SIZES {
        let secs = measure(&root, &data, block, rounds);
        println!("\nblock {} KiB ({} blocks)", block / KIB, SET / block);
        print_table(&secs);
    }
    fs::remove_dir_all(&root).expect("clean up");
}
