//! The disk tier (`offload::disk`), tested from its specification: the on-disk format
//! (header offsets, stable dtype codes, the manifest), round trips of every dtype and
//! several payload sizes, warm restarts, a folder of another fingerprint refused and left
//! untouched, damaged files (a flipped byte, truncation, a garbage header, leftover
//! temporary files) removed and never served, the byte budget, permissions, the mapping
//! of I/O errors, and a crash test: a writer process killed with SIGKILL 100 times while
//! it stores blocks (and removes some, so that later puts rewrite their files), after
//! which no block is ever served wrong and no committed block is lost. Removed block files
//! kept as spares are rewritten by later puts, cut to length, and removed at the next open.

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use pykvpool::error::StorageFault;
use pykvpool::offload::disk::{
    dtype_code, dtype_from_code, storage_fault, BlockMeta, DiskTier, Durability, FORMAT_VERSION, HEADER_BYTES,
    MAX_SPARES, SPARES_AHEAD,
};
use pykvpool::{DType, KvError};
use xxhash_rust::xxh3::xxh3_64;

const FP: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
const BIG: u64 = 1 << 40;
const HEADER: u64 = HEADER_BYTES as u64;

// ---------------------------------------------------------------------------------------
// Helpers

/// A fresh folder under the system's temporary folder, removed (permissions restored
/// first) when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = env::temp_dir().join(format!("pykvpool-disk-{name}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn tier(&self) -> PathBuf {
        self.0.join("tier")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        make_writable(&self.0);
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn make_writable(path: &Path) {
    let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o755));
    if let Ok(entries) = fs::read_dir(path) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&e.path());
            } else {
                let _ = fs::set_permissions(e.path(), fs::Permissions::from_mode(0o644));
            }
        }
    }
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `len` pseudo-random bytes, a function of `seed`.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&splitmix(&mut s).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The seed of block (`group`, `key`)'s content.
fn seed_of(group: u32, key: u128) -> u64 {
    let mut s = (key as u64) ^ ((key >> 64) as u64).rotate_left(17) ^ u64::from(group).rotate_left(41);
    splitmix(&mut s)
}

fn fault(r: Result<impl std::fmt::Debug, KvError>) -> StorageFault {
    match r {
        Err(KvError::Storage { fault, .. }) => fault,
        other => panic!("expected a storage error, got {other:?}"),
    }
}

/// Every file under `root` with its bytes (relative paths), for "left untouched".
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                files.insert(p.strip_prefix(root).unwrap().to_path_buf(), Vec::new());
                stack.push(p);
            } else {
                files.insert(p.strip_prefix(root).unwrap().to_path_buf(), fs::read(&p).unwrap());
            }
        }
    }
    files
}

/// The names of files under `root` ending in `suffix`.
fn files_ending(root: &Path, suffix: &str) -> Vec<PathBuf> {
    snapshot(root).into_keys().filter(|p| p.to_string_lossy().ends_with(suffix)).collect()
}

fn put_seeded(tier: &mut DiskTier, group: u32, key: u128, len: usize, dtype: DType) -> Vec<u8> {
    let payload = bytes(seed_of(group, key), len);
    tier.put(group, key, (key % 17) as u32, dtype, &payload).unwrap();
    payload
}

fn get(tier: &mut DiskTier, group: u32, key: u128) -> Option<(BlockMeta, Vec<u8>)> {
    let mut out = Vec::new();
    tier.get(group, key, &mut out).unwrap().map(|m| (m, out))
}

// ---------------------------------------------------------------------------------------
// Format

#[test]
fn dtype_codes_are_stable() {
    let expected = [
        (DType::F32, 1),
        (DType::F16, 2),
        (DType::BF16, 3),
        (DType::I8, 4),
        (DType::E4M3, 5),
        (DType::E5M2, 6),
    ];
    assert_eq!(expected.len(), DType::ALL.len(), "a new dtype needs its code here");
    for (dtype, code) in expected {
        assert_eq!(dtype_code(dtype), code, "{dtype:?}");
        assert_eq!(dtype_from_code(code), Some(dtype));
    }
    for code in [0u8, 7, 8, 0x80, 0xff] {
        assert_eq!(dtype_from_code(code), None);
    }
    assert_eq!((FORMAT_VERSION, HEADER_BYTES), (1, 72));
}

#[test]
fn header_and_manifest_layout_on_disk() {
    let dir = TempDir::new("layout");
    let mut tier = DiskTier::open(dir.tier(), FP, BIG).unwrap();
    let (group, key) = (7u32, 0x0011_2233_4455_6677_8899_aabb_ccdd_eeffu128);
    let payload = bytes(1, 100);
    tier.put(group, key, 13, DType::I8, &payload).unwrap();

    let path = tier.block_path(group, key);
    let name = format!("{group:08x}-{key:032x}.blk");
    assert_eq!(path.file_name().unwrap().to_str().unwrap(), name);
    let fan = path.parent().unwrap();
    assert_eq!(fan.parent().unwrap(), dir.tier());
    let fan = fan.file_name().unwrap().to_str().unwrap();
    assert!(fan.len() == 2 && fan.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));

    let b = fs::read(&path).unwrap();
    assert_eq!(b.len(), 72 + 100);
    assert_eq!(&b[0..8], b"PKVBLOCK");
    assert_eq!(b[8..12], 1u32.to_le_bytes());
    assert_eq!(b[12..28], FP.to_le_bytes());
    assert_eq!(b[28..32], group.to_le_bytes());
    assert_eq!(b[32..48], key.to_le_bytes());
    assert_eq!(b[48..52], 13u32.to_le_bytes());
    assert_eq!(b[52], 4, "int8's code");
    assert_eq!(b[53..56], [0, 0, 0]);
    assert_eq!(b[56..64], 100u64.to_le_bytes());
    let mut covered = b[..64].to_vec();
    covered.extend_from_slice(&payload);
    assert_eq!(b[64..72], xxh3_64(&covered).to_le_bytes());
    assert_eq!(&b[72..], &payload[..]);

    let m = fs::read(dir.tier().join("pykvpool-disk.manifest")).unwrap();
    assert_eq!(m.len(), 36);
    assert_eq!(&m[0..8], b"PKVDISKM");
    assert_eq!(m[8..12], 1u32.to_le_bytes());
    assert_eq!(m[12..28], FP.to_le_bytes());
    assert_eq!(m[28..36], xxh3_64(&m[..28]).to_le_bytes());
}

#[test]
fn paths_are_a_function_of_group_and_key() {
    let (a, b) = (TempDir::new("paths-a"), TempDir::new("paths-b"));
    let ta = DiskTier::open(a.tier(), FP, BIG).unwrap();
    let tb = DiskTier::open(b.tier(), FP ^ 1, BIG).unwrap();
    let mut seen = BTreeSet::new();
    let mut fans = BTreeSet::new();
    for group in [0u32, 1, 63, u32::MAX] {
        for key in (0u128..64).chain([u128::MAX, 1 << 127]) {
            let pa = ta.block_path(group, key);
            assert!(pa.starts_with(a.tier()));
            let rel = pa.strip_prefix(a.tier()).unwrap().to_path_buf();
            assert_eq!(tb.block_path(group, key).strip_prefix(b.tier()).unwrap(), rel);
            assert_eq!(rel.components().count(), 2);
            fans.insert(rel.parent().unwrap().to_path_buf());
            assert!(seen.insert(rel), "two blocks share a path");
        }
    }
    assert!(fans.len() > 64, "sequential keys spread over the fan-out folders: {}", fans.len());
}

#[test]
fn io_errors_map_to_storage_faults() {
    let of = |code| storage_fault(&io::Error::from_raw_os_error(code));
    assert_eq!(of(libc::ENOSPC), StorageFault::Full);
    assert_eq!(of(libc::EDQUOT), StorageFault::Full);
    assert_eq!(of(libc::EACCES), StorageFault::PermissionDenied);
    assert_eq!(of(libc::EPERM), StorageFault::PermissionDenied);
    assert_eq!(of(libc::EROFS), StorageFault::PermissionDenied);
    assert_eq!(of(libc::EIO), StorageFault::Io);
    assert_eq!(of(libc::ENOENT), StorageFault::Io);
}

// ---------------------------------------------------------------------------------------
// Round trips

#[test]
fn round_trip_every_dtype_size_and_group() {
    let dir = TempDir::new("roundtrip");
    let mut tier = DiskTier::open_with(dir.tier(), FP, BIG, Durability::NoFsync).unwrap();
    let sizes = [0usize, 1, 4095, 4096, 65_537, 1 << 20];
    let groups = [0u32, 3, u32::MAX];
    let mut stored = Vec::new();
    let (mut used, mut written) = (0u64, 0u64);
    for (d, &dtype) in DType::ALL.iter().enumerate() {
        for (s, &len) in sizes.iter().enumerate() {
            for &group in &groups {
                let key = (u128::MAX - 1000) + (d * 100 + s) as u128;
                let fill = (d * 31 + s) as u32;
                let payload = bytes(seed_of(group, key), len);
                tier.put(group, key, fill, dtype, &payload).unwrap();
                stored.push((group, key, BlockMeta { fill, dtype, payload_len: len as u64 }, payload));
                used += HEADER + len as u64;
                written += len as u64;
            }
        }
    }
    assert_eq!((tier.len(), tier.bytes_used()), (stored.len(), used));
    let keys: BTreeSet<_> = tier.keys().collect();
    assert_eq!(keys, stored.iter().map(|s| (s.0, s.1)).collect());
    for (group, key, meta, payload) in &stored {
        assert!(tier.contains(*group, *key));
        assert_eq!(tier.meta(*group, *key), Some(*meta));
        // `get` appends to what `out` holds.
        let mut out = b"prefix".to_vec();
        assert_eq!(tier.get(*group, *key, &mut out).unwrap(), Some(*meta));
        assert_eq!(&out[..6], b"prefix");
        assert!(out[6..] == payload[..], "payload of {group} {key:x}");
    }
    let s = tier.stats();
    assert_eq!((s.blocks_written, s.bytes_written), (stored.len() as u64, written));
    assert_eq!((s.reads, s.bytes_read, s.misses, s.corrupt_removed), (stored.len() as u64, written, 0, 0));
}

#[test]
fn misses_replacement_and_removal() {
    let dir = TempDir::new("remove");
    let mut tier = DiskTier::open(dir.tier(), FP, BIG).unwrap();
    let mut out = b"keep".to_vec();
    assert_eq!(tier.get(0, 1, &mut out).unwrap(), None);
    assert_eq!(out, b"keep");
    put_seeded(&mut tier, 0, 1, 1000, DType::F16);
    assert_eq!(tier.get(1, 1, &mut out).unwrap(), None, "a key of another group is a miss");
    assert_eq!(out, b"keep");

    // A put of a stored key replaces its block and its bytes.
    let newer = bytes(99, 3000);
    tier.put(0, 1, 5, DType::BF16, &newer).unwrap();
    assert_eq!((tier.len(), tier.bytes_used()), (1, HEADER + 3000));
    assert_eq!(get(&mut tier, 0, 1), Some((BlockMeta { fill: 5, dtype: DType::BF16, payload_len: 3000 }, newer)));

    let path = tier.block_path(0, 1);
    assert!(tier.remove(0, 1).unwrap());
    assert!(!tier.remove(0, 1).unwrap());
    assert!(!path.exists() && !tier.contains(0, 1));
    assert_eq!((tier.len(), tier.bytes_used(), tier.is_empty()), (0, 0, true));
    assert_eq!(get(&mut tier, 0, 1), None);
    assert_eq!(tier.stats().misses, 3);
}

#[test]
fn a_removed_block_file_is_rewritten_by_the_next_put() {
    let dir = TempDir::new("spare");
    let root = dir.tier();
    let mut tier = DiskTier::open(&root, FP, BIG).unwrap();
    put_seeded(&mut tier, 0, 1, 5000, DType::F16);
    let a = tier.block_path(0, 1);
    tier.remove(0, 1).unwrap();
    assert!(!a.exists() && !tier.contains(0, 1));
    assert_eq!(files_ending(&root, ".tmp").len(), 1, "kept as a spare under its temporary name");
    // A shorter block rewrites it: the file is cut to the new block's length.
    let b = put_seeded(&mut tier, 2, 7, 1000, DType::BF16);
    assert!(files_ending(&root, ".tmp").is_empty());
    assert_eq!(fs::metadata(tier.block_path(2, 7)).unwrap().len(), HEADER + 1000);
    assert_eq!(get(&mut tier, 2, 7).map(|(_, out)| out), Some(b));
    // A spare removed behind the tier's back: the put writes a new file.
    put_seeded(&mut tier, 0, 3, 800, DType::F32);
    tier.remove(0, 3).unwrap();
    for f in files_ending(&root, ".tmp") {
        fs::remove_file(root.join(f)).unwrap();
    }
    let c = put_seeded(&mut tier, 0, 4, 900, DType::F32);
    assert_eq!(get(&mut tier, 0, 4).map(|(_, out)| out), Some(c));
    // At most MAX_SPARES wait; the next open removes them as leftovers.
    for k in 100..100 + MAX_SPARES as u128 + 8 {
        put_seeded(&mut tier, 1, k, 600, DType::F16);
    }
    for k in 100..100 + MAX_SPARES as u128 + 8 {
        tier.remove(1, k).unwrap();
    }
    assert_eq!(files_ending(&root, ".tmp").len(), MAX_SPARES);
    drop(tier);
    let mut tier = DiskTier::open(&root, FP, BIG).unwrap();
    assert_eq!((tier.stats().temp_removed_at_open, tier.len()), (MAX_SPARES as u64, 2));
    assert!(files_ending(&root, ".tmp").is_empty());
    assert!(get(&mut tier, 2, 7).is_some() && get(&mut tier, 0, 4).is_some());
}

#[test]
fn spares_made_ahead_are_written_into_by_puts() {
    use std::os::unix::fs::MetadataExt;
    let dir = TempDir::new("ahead");
    let root = dir.tier();
    let file = HEADER + 1000;
    let mut tier = DiskTier::open(&root, FP, 10 * file).unwrap();
    put_seeded(&mut tier, 0, 1, 1000, DType::F16);
    // The caller's budget in blocks bounds the spares, then the byte capacity does.
    while tier.make_spare(1000, 4).unwrap() {}
    assert_eq!(tier.spares(), 3, "1 block and 3 spares: the budget of 4");
    while tier.make_spare(1000, 100).unwrap() {}
    assert_eq!(tier.spares(), 9, "1 block and 9 spares: 10 block files' bytes");
    let spares = files_ending(&root, ".tmp");
    let inode = |p: &Path| fs::metadata(root.join(p)).unwrap().ino();
    assert_eq!(spares.len(), 9);
    assert!(spares.iter().all(|p| fs::metadata(root.join(p)).unwrap().len() == 0), "spares are empty");
    let ahead: BTreeSet<u64> = spares.iter().map(|p| inode(p)).collect();
    // Nine puts write into the nine spares: the block files are the spares' inodes.
    let blocks: Vec<_> = (2..11).map(|k| (k, put_seeded(&mut tier, 3, k, 1000, DType::BF16))).collect();
    assert_eq!(tier.spares(), 0);
    assert!(files_ending(&root, ".tmp").is_empty());
    let written: BTreeSet<u64> = (2..11).map(|k| inode(&tier.block_path(3, k))).collect();
    assert_eq!(written, ahead);
    for (k, b) in blocks {
        assert_eq!(get(&mut tier, 3, k).map(|(_, out)| out), Some(b));
    }
    assert!(!tier.make_spare(1000, 100).unwrap(), "a full tier makes none");
    // A spare removed behind the tier's back is skipped by the put.
    tier.remove(3, 10).unwrap();
    tier.remove(3, 9).unwrap();
    fs::remove_file(root.join(&files_ending(&root, ".tmp")[0])).unwrap();
    let b = put_seeded(&mut tier, 3, 12, 1000, DType::BF16);
    assert_eq!(get(&mut tier, 3, 12).map(|(_, out)| out), Some(b));
    // At most SPARES_AHEAD; the next open removes them as leftovers.
    drop(tier);
    let mut tier = DiskTier::open(&root, FP, BIG).unwrap();
    while tier.make_spare(1000, usize::MAX).unwrap() {}
    assert_eq!(tier.spares(), SPARES_AHEAD);
    assert_eq!(files_ending(&root, ".tmp").len(), SPARES_AHEAD);
    drop(tier);
    let tier = DiskTier::open(&root, FP, BIG).unwrap();
    assert_eq!((tier.stats().temp_removed_at_open, tier.len()), (SPARES_AHEAD as u64, 9));
}

#[test]
fn prefetch_is_advice_only() {
    let dir = TempDir::new("ahead");
    let mut tier = DiskTier::open(dir.tier(), FP, BIG).unwrap();
    let a = put_seeded(&mut tier, 0, 1, 3000, DType::F16);
    put_seeded(&mut tier, 0, 2, 3000, DType::F16);
    fs::remove_file(tier.block_path(0, 2)).unwrap();
    // Stored, stored but vanished, never stored: nothing fails, nothing is counted.
    let before = tier.stats();
    tier.prefetch(&[(0, 1), (0, 2), (5, 9)]);
    assert_eq!(tier.stats(), before);
    assert_eq!(get(&mut tier, 0, 1).map(|(_, out)| out), Some(a));
    assert_eq!(get(&mut tier, 0, 2), None);
    assert_eq!(tier.stats().corrupt_removed, 1);
}

// ---------------------------------------------------------------------------------------
// Restarts and foreign folders

#[test]
fn warm_restart_serves_every_block_bit_identical() {
    for durability in [Durability::Fsync, Durability::NoFsync] {
        let dir = TempDir::new("warm");
        let mut blocks = Vec::new();
        let used = {
            let mut tier = DiskTier::open_with(dir.tier(), FP, BIG, durability).unwrap();
            for i in 0..40u128 {
                let (group, key) = ((i % 3) as u32, i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835));
                let dtype = DType::ALL[(i % 6) as usize];
                blocks.push((group, key, dtype, put_seeded(&mut tier, group, key, 1000 + 997 * i as usize, dtype)));
            }
            tier.bytes_used()
        };
        let mut tier = DiskTier::open_with(dir.tier(), FP, BIG, durability).unwrap();
        let s = tier.stats();
        assert_eq!((s.recovered_at_open, s.invalid_removed_at_open, s.temp_removed_at_open), (40, 0, 0));
        assert_eq!((tier.len(), tier.bytes_used()), (40, used));
        for (group, key, dtype, payload) in blocks {
            let (meta, out) = get(&mut tier, group, key).unwrap();
            assert_eq!(meta, BlockMeta { fill: (key % 17) as u32, dtype, payload_len: payload.len() as u64 });
            assert!(out == payload);
        }
    }
}

#[test]
fn a_folder_of_another_fingerprint_or_version_is_refused_untouched() {
    let dir = TempDir::new("foreign");
    {
        let mut tier = DiskTier::open(dir.tier(), FP, BIG).unwrap();
        put_seeded(&mut tier, 0, 42, 5000, DType::F32);
    }
    let before = snapshot(&dir.tier());
    assert_eq!(fault(DiskTier::open(dir.tier(), FP ^ 1, BIG)), StorageFault::ForeignFolder);
    assert_eq!(snapshot(&dir.tier()), before);

    // A manifest of another format version (with a valid checksum), or garbage.
    let manifest = dir.tier().join("pykvpool-disk.manifest");
    let original = fs::read(&manifest).unwrap();
    let mut v2 = original.clone();
    v2[8..12].copy_from_slice(&2u32.to_le_bytes());
    let sum = xxh3_64(&v2[..28]);
    v2[28..].copy_from_slice(&sum.to_le_bytes());
    for bad in [v2, b"not a manifest".to_vec(), Vec::new()] {
        fs::write(&manifest, &bad).unwrap();
        let before = snapshot(&dir.tier());
        assert_eq!(fault(DiskTier::open(dir.tier(), FP, BIG)), StorageFault::ForeignFolder);
        assert_eq!(snapshot(&dir.tier()), before);
    }
    fs::write(&manifest, &original).unwrap();
    assert_eq!(get(&mut DiskTier::open(dir.tier(), FP, BIG).unwrap(), 0, 42).unwrap().1, bytes(seed_of(0, 42), 5000));

    // A folder that holds anything but no manifest is no tier's.
    let other = dir.0.join("other");
    fs::create_dir_all(other.join("ab")).unwrap();
    fs::write(other.join("notes.txt"), b"mine").unwrap();
    let before = snapshot(&other);
    assert_eq!(fault(DiskTier::open(&other, FP, BIG)), StorageFault::ForeignFolder);
    assert_eq!(snapshot(&other), before);
}

#[test]
fn one_tier_per_folder_at_a_time() {
    let dir = TempDir::new("lock");
    let tier = DiskTier::open(dir.tier(), FP, BIG).unwrap();
    assert_eq!(fault(DiskTier::open(dir.tier(), FP, BIG)), StorageFault::Io);
    drop(tier);
    DiskTier::open(dir.tier(), FP, BIG).unwrap();
}

// ---------------------------------------------------------------------------------------
// Damage

fn flip(path: &Path, at: usize) {
    let mut b = fs::read(path).unwrap();
    b[at] ^= 0x10;
    fs::write(path, b).unwrap();
}

fn truncate(path: &Path, len: u64) {
    OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

#[test]
fn damaged_files_are_removed_and_never_served() {
    let dir = TempDir::new("damage");
    let root = dir.tier();
    let mut tier = DiskTier::open(&root, FP, BIG).unwrap();
    let keys: Vec<u128> = (100..112).collect();
    let payloads: Vec<Vec<u8>> = keys.iter().map(|&k| put_seeded(&mut tier, 1, k, 8192, DType::F16)).collect();
    let paths: Vec<PathBuf> = keys.iter().map(|&k| tier.block_path(1, k)).collect();
    drop(tier);

    flip(&paths[0], 72 + 4000); // a payload byte: the header is fine, the checksum is not
    flip(&paths[1], 48); // the fill in the header: covered by the checksum
    truncate(&paths[2], 72 + 100); // a truncated payload
    truncate(&paths[3], 10); // a truncated header
    fs::write(&paths[4], bytes(7, 8192 + 72)).unwrap(); // a garbage header
    let tmp = |p: &Path| PathBuf::from(format!("{}.tmp", p.display()));
    fs::copy(&paths[5], tmp(&paths[5])).unwrap(); // an interrupted write beside its block
    fs::copy(&paths[6], tmp(&paths[6])).unwrap();
    fs::remove_file(&paths[6]).unwrap(); // an interrupted first write
    fs::write(root.join("pykvpool-disk.manifest.tmp"), b"torn").unwrap();
    // A valid block file in the wrong fan-out folder.
    let wrong = (0..=255u8).map(|f| root.join(format!("{f:02x}"))).find(|d| Some(d.as_path()) != paths[7].parent());
    let wrong = wrong.unwrap();
    fs::create_dir_all(&wrong).unwrap();
    fs::rename(&paths[7], wrong.join(paths[7].file_name().unwrap())).unwrap();
    // Names of neither kind are left alone.
    fs::write(root.join("notes.txt"), b"mine").unwrap();
    fs::write(paths[8].with_file_name("notes.tmp"), b"mine").unwrap();

    let mut tier = DiskTier::open(&root, FP, BIG).unwrap();
    let s = tier.stats();
    assert_eq!((s.recovered_at_open, s.invalid_removed_at_open, s.temp_removed_at_open), (7, 4, 3));
    assert_eq!(tier.len(), 7, "the two blocks with a bad checksum are found by get");
    assert!(files_ending(&root, ".tmp").iter().all(|p| p.ends_with("notes.tmp")));
    assert!(root.join("notes.txt").exists());
    for i in [2, 3, 4, 6, 7] {
        assert!(!tier.contains(1, keys[i]) && !paths[i].exists(), "block {i}");
    }
    for i in [0, 1] {
        assert!(tier.contains(1, keys[i]));
        let mut out = b"keep".to_vec();
        assert_eq!(tier.get(1, keys[i], &mut out).unwrap(), None, "block {i} served damaged");
        assert_eq!(out, b"keep");
        assert!(!tier.contains(1, keys[i]) && !paths[i].exists());
    }
    assert_eq!((tier.stats().corrupt_removed, tier.len()), (2, 5));
    assert_eq!(tier.bytes_used(), 5 * (HEADER + 8192));
    for i in [5, 8, 9, 10, 11] {
        assert!(get(&mut tier, 1, keys[i]).unwrap().1 == payloads[i]);
    }

    // Damage while the tier is open: a flipped byte, a file swapped for another block's,
    // a file gone.
    flip(&paths[8], 72 + 8191);
    fs::copy(&paths[10], &paths[9]).unwrap();
    fs::remove_file(&paths[11]).unwrap();
    for i in [8, 9, 11] {
        assert_eq!(get(&mut tier, 1, keys[i]), None, "block {i}");
    }
    assert_eq!((tier.stats().corrupt_removed, tier.len()), (5, 2));
    assert!(get(&mut tier, 1, keys[10]).unwrap().1 == payloads[10]);
}

// ---------------------------------------------------------------------------------------
// Budget and permissions

#[test]
fn a_put_beyond_the_capacity_is_full_and_changes_nothing() {
    let dir = TempDir::new("full");
    let block = HEADER + 1000;
    let mut tier = DiskTier::open(dir.tier(), FP, 3 * block).unwrap();
    for key in 0..3 {
        put_seeded(&mut tier, 0, key, 1000, DType::F32);
    }
    assert_eq!(tier.bytes_used(), tier.capacity_bytes());
    let (stats, before) = (tier.stats(), snapshot(&dir.tier()));
    assert_eq!(fault(tier.put(0, 3, 0, DType::F32, &[0; 1])), StorageFault::Full);
    assert_eq!(fault(tier.put(0, 3, 0, DType::F32, &[])), StorageFault::Full);
    assert_eq!(fault(tier.put(0, 2, 0, DType::F32, &[0; 1001])), StorageFault::Full, "a larger replacement");
    assert_eq!((tier.len(), tier.bytes_used(), tier.stats()), (3, 3 * block, stats));
    assert_eq!(snapshot(&dir.tier()), before, "no file left behind");
    assert!(get(&mut tier, 0, 2).unwrap().1 == bytes(seed_of(0, 2), 1000));

    // A replacement of the same size fits; a removal makes room.
    tier.put(0, 2, 1, DType::F16, &[5; 1000]).unwrap();
    assert!(tier.remove(0, 0).unwrap());
    tier.put(0, 3, 0, DType::F32, &[6; 1000]).unwrap();
    assert_eq!(tier.bytes_used(), 3 * block);

    // Blocks beyond a smaller budget are kept at open; every put is refused.
    drop(tier);
    let mut tier = DiskTier::open(dir.tier(), FP, block).unwrap();
    assert_eq!((tier.len(), tier.bytes_used()), (3, 3 * block));
    assert_eq!(fault(tier.put(0, 9, 0, DType::F32, &[])), StorageFault::Full);
}

/// Whether files may be created in `dir` (whose mode forbids it): the permission tests'
/// assertions hold only where permissions apply, i.e. not for root.
fn permissions_ignored(dir: &Path) -> bool {
    let probe = dir.join("probe");
    let ignored = File::create(&probe).is_ok();
    let _ = fs::remove_file(&probe);
    if ignored {
        eprintln!("permission assertions skipped: this user may write a read-only folder (root)");
    }
    ignored
}

#[test]
fn a_folder_that_may_not_be_written_is_permission_denied() {
    let dir = TempDir::new("perm");
    let root = dir.tier();
    let mut tier = DiskTier::open(&root, FP, BIG).unwrap();
    let payload = put_seeded(&mut tier, 0, 1, 4096, DType::F16);
    let fan = tier.block_path(0, 1).parent().unwrap().to_path_buf();
    drop(tier);

    set_mode(&root, 0o555);
    if permissions_ignored(&root) {
        return;
    }
    assert_eq!(fault(DiskTier::open(&root, FP, BIG)), StorageFault::PermissionDenied);
    let new = root.join("new");
    assert_eq!(fault(DiskTier::open(&new, FP, BIG)), StorageFault::PermissionDenied);
    set_mode(&root, 0o755);

    // A fan-out folder that may not be written: the put fails, nothing changes.
    let mut tier = DiskTier::open(&root, FP, BIG).unwrap();
    let key = (2u128..).find(|&k| tier.block_path(0, k).parent() == Some(fan.as_path())).unwrap();
    set_mode(&fan, 0o555);
    let before = snapshot(&root);
    assert_eq!(fault(tier.put(0, key, 0, DType::F16, &[1; 100])), StorageFault::PermissionDenied);
    assert_eq!(snapshot(&root), before);
    assert!(!tier.contains(0, key) && tier.len() == 1 && tier.stats().blocks_written == 0);
    set_mode(&fan, 0o755);

    // A block file that may not be read: an error, and the block stays.
    let path = tier.block_path(0, 1);
    set_mode(&path, 0o000);
    let mut out = Vec::new();
    assert_eq!(fault(tier.get(0, 1, &mut out)), StorageFault::PermissionDenied);
    assert!(out.is_empty() && tier.contains(0, 1));
    set_mode(&path, 0o644);
    assert!(get(&mut tier, 0, 1).unwrap().1 == payload);
}

// ---------------------------------------------------------------------------------------
// Crash test: a writer process killed with SIGKILL at random points

const CRASH_DIR: &str = "PYKVPOOL_DISK_CRASH_DIR";
const CRASH_LOG: &str = "PYKVPOOL_DISK_CRASH_LOG";
const CRASH_ROUND: &str = "PYKVPOOL_DISK_CRASH_ROUND";
const CRASH_FSYNC: &str = "PYKVPOOL_DISK_CRASH_FSYNC";
/// Puts of one writer (it is usually killed long before).
const CHILD_PUTS: u64 = 200;
const CHILD_TIMEOUT: Duration = Duration::from_secs(20);

/// The `i`-th block of writer `round`: the key names both, so a key says what to expect.
fn crash_block(round: u64, i: u64) -> (u32, u128) {
    ((i % 3) as u32, (0xC7A5 << 112) | (u128::from(round) << 32) | u128::from(i))
}

fn crash_round(key: u128) -> u64 {
    ((key >> 32) & 0xffff_ffff) as u64
}

/// What block (`group`, `key`) holds: 4-64 KiB of bytes, fill and dtype from the key.
fn crash_payload(group: u32, key: u128) -> (BlockMeta, Vec<u8>) {
    let seed = seed_of(group, key);
    let len = 4096 + (seed % (60 * 1024 + 1)) as usize;
    let meta = BlockMeta { fill: (key % 17) as u32, dtype: DType::ALL[(seed % 6) as usize], payload_len: len as u64 };
    (meta, bytes(seed, len))
}

/// The writer, run by `crash_kill_*` in a child process (the test binary itself, with the
/// crash variables set); without them it does nothing.
#[test]
#[ignore = "the crash test's writer process: crash_kill_* runs it"]
fn crash_child_writer() {
    let (Ok(dir), Ok(log), Ok(round), Ok(fsync)) =
        (env::var(CRASH_DIR), env::var(CRASH_LOG), env::var(CRASH_ROUND), env::var(CRASH_FSYNC))
    else {
        return;
    };
    let round: u64 = round.parse().unwrap();
    let durability = if fsync == "1" { Durability::Fsync } else { Durability::NoFsync };
    let mut tier = DiskTier::open_with(&dir, FP, BIG, durability).unwrap();
    // The log's existence tells the parent the tier is open.
    let mut log = OpenOptions::new().create(true).append(true).open(log).unwrap();
    for i in 0..CHILD_PUTS {
        let (group, key) = crash_block(round, i);
        let (meta, payload) = crash_payload(group, key);
        tier.put(group, key, meta.fill, meta.dtype, &payload).unwrap();
        // One write per line: a kill leaves whole lines.
        log.write_all(format!("+ {group} {key}\n").as_bytes()).unwrap();
        if i % 3 == 2 {
            // Every third put removes the block before it (logged first): the next puts
            // rewrite its file, and a kill may land in that rewrite.
            let (group, key) = crash_block(round, i - 1);
            log.write_all(format!("- {group} {key}\n").as_bytes()).unwrap();
            tier.remove(group, key).unwrap();
        }
    }
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the writer process hung for {timeout:?}");
        }
        sleep(Duration::from_micros(200));
    }
}

#[derive(Debug, Default)]
struct Tally {
    /// Blocks the writers logged as stored.
    committed: u64,
    /// Logged blocks missing after the crash.
    lost: u64,
    /// Blocks stored by a writer killed before it logged them (in flight).
    unlogged: u64,
    /// Blocks found and served, checked against their keys, over all rounds.
    served: u64,
    /// Blocks `get` found damaged.
    damaged: u64,
    /// Files the reopen removed: temporary ones, invalid block files.
    temps: u64,
    invalid: u64,
    /// Writers that finished before the kill.
    finished: u64,
}

/// Kills the writer of `round` at a random point: `delay` after it logged `lines` stored
/// blocks, or (`None`) `delay` after it was started, maybe while it opens the folder.
fn crash_round_once(
    (root, work): (&Path, &Path),
    round: u64,
    durability: Durability,
    (lines, delay): (Option<usize>, Duration),
    tally: &mut Tally,
) {
    let log = work.join(format!("log-{round}"));
    let output = work.join(format!("output-{round}"));
    let output_file = File::create(&output).unwrap();
    let mut child = Command::new(env::current_exe().unwrap())
        .args(["--exact", "crash_child_writer", "--ignored", "--test-threads=1", "-q"])
        .env(CRASH_DIR, root)
        .env(CRASH_LOG, &log)
        .env(CRASH_ROUND, round.to_string())
        .env(CRASH_FSYNC, if durability == Durability::Fsync { "1" } else { "0" })
        .stdout(output_file.try_clone().unwrap())
        .stderr(output_file)
        .spawn()
        .unwrap();
    let logged = || fs::read(&log).ok().map(|b| b.iter().filter(|&&c| c == b'\n').count());
    let deadline = Instant::now() + CHILD_TIMEOUT;
    while lines.is_some_and(|n| logged().is_none_or(|l| l < n))
        && child.try_wait().unwrap().is_none()
        && Instant::now() < deadline
    {
        sleep(Duration::from_micros(100));
    }
    sleep(delay);
    let _ = child.kill(); // SIGKILL
    let status = wait_timeout(&mut child, CHILD_TIMEOUT);
    let killed = status.signal() == Some(libc::SIGKILL);
    let why = fs::read_to_string(&output).unwrap_or_default();
    assert!(killed || status.success(), "writer {round} failed ({status}): {why}");
    tally.finished += u64::from(!killed);
    verify_after_crash(root, &log, round, tally);
}

/// Reopens the folder: every block served is the one its key implies, every logged one
/// is there. Keeps the folder small by removing the oldest rounds' blocks.
fn verify_after_crash(root: &Path, log: &Path, round: u64, tally: &mut Tally) {
    let mut tier = DiskTier::open(root, FP, BIG).unwrap();
    let s = tier.stats();
    tally.temps += s.temp_removed_at_open;
    tally.invalid += s.invalid_removed_at_open;
    let text = fs::read_to_string(log).unwrap_or_default();
    let line = |l: &str| -> (bool, (u32, u128)) {
        let mut w = l.split(' ');
        let (op, g, k) = (w.next().unwrap(), w.next().unwrap(), w.next().unwrap());
        (op == "+", (g.parse().unwrap(), k.parse().unwrap()))
    };
    let (put, removed): (Vec<_>, Vec<_>) = text.split_terminator('\n').map(line).partition(|&(p, _)| p);
    let removed: BTreeSet<(u32, u128)> = removed.into_iter().map(|(_, b)| b).collect();
    let logged: BTreeSet<(u32, u128)> = put.into_iter().map(|(_, b)| b).filter(|b| !removed.contains(b)).collect();
    tally.committed += logged.len() as u64;
    tally.lost += logged.iter().filter(|&&(g, k)| !tier.contains(g, k)).count() as u64;
    let mut keys: Vec<(u32, u128)> = tier.keys().collect();
    keys.sort_by_key(|&(g, k)| (crash_round(k), k, g));
    let mut out = Vec::new();
    for &(group, key) in &keys {
        out.clear();
        match tier.get(group, key, &mut out).unwrap() {
            Some(meta) => {
                let (want_meta, want) = crash_payload(group, key);
                assert_eq!(meta, want_meta, "block {group} {key:x}");
                assert!(out == want, "block {group} {key:x} served with other bytes");
                tally.served += 1;
                let ours = crash_round(key) == round && !logged.contains(&(group, key));
                tally.unlogged += u64::from(ours);
            }
            None => tally.damaged += 1,
        }
    }
    if keys.len() > 160 {
        for &(group, key) in &keys[..keys.len() - 96] {
            tier.remove(group, key).unwrap();
        }
    }
}

fn crash_test(name: &str, rounds: u64, durability: Durability) {
    let dir = TempDir::new(name);
    let root = dir.tier();
    let mut rng = 0x5eed_u64 ^ rounds;
    let mut tally = Tally::default();
    let start = Instant::now();
    let mut least = 0;
    for round in 0..rounds {
        // Mostly once the writer stored 0-2 blocks; every tenth time maybe before it opened.
        let lines = (round % 10 != 9).then_some((round % 3) as usize);
        least += lines.unwrap_or(0) as u64;
        let delay = Duration::from_micros(splitmix(&mut rng) % 6000);
        crash_round_once((&root, &dir.0), round, durability, (lines, delay), &mut tally);
    }
    eprintln!("{name}: {rounds} kills in {:.1} s, {durability:?}: {tally:?}", start.elapsed().as_secs_f64());
    assert_eq!(tally.lost, 0, "blocks lost after their put returned");
    assert_eq!(tally.damaged, 0, "a kill cannot tear a renamed file");
    assert!(tally.committed >= least, "the parent waited for {least} logged blocks: {tally:?}");
}

#[test]
fn crash_kill_with_fsync_never_serves_a_wrong_block_nor_loses_one() {
    crash_test("crash-fsync", 100, Durability::Fsync);
}

#[test]
fn crash_kill_without_fsync_never_serves_a_wrong_block_nor_loses_one() {
    crash_test("crash-nofsync", 30, Durability::NoFsync);
}
