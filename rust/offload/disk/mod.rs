//! The disk tier (G3): cached KV blocks spilled to a folder, one checksummed file per
//! block, read back on a prefix hit and found again after a restart.
//!
//! A block is an opaque payload (a block's K and V across all layers, plus the scales of
//! an 8-bit dtype, as the caller packed them) stored under (layer group, block key) with
//! its fill and dtype. Which blocks go to disk, and which are evicted when the tier is
//! full, is the caller's policy: [`DiskTier`] stores, reads, removes, lists and recovers,
//! and refuses a `put` beyond its byte budget instead of evicting.
//!
//! # Folder
//!
//! ```text
//! <dir>/pykvpool-disk.manifest                    format version and fingerprint
//! <dir>/<fan>/<group>-<key>.blk                   one block
//! <dir>/<fan>/<group>-<key>.blk.tmp               a block being written, or a spare (removed at open)
//! ```
//!
//! `<group>` is 8 and `<key>` 32 lowercase hex digits; `<fan>` is two, the low byte of
//! the XXH3-64 of the group and key (4 and 16 bytes little-endian), which spreads blocks
//! over at most 256 folders. A path is a function of (group, key) alone: no caller
//! string ever reaches one. Other names in the folder are left alone.
//!
//! # Block file (little-endian)
//!
//! | offset | bytes | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `PKVBLOCK` |
//! | 8 | 4 | format version, u32 ([`FORMAT_VERSION`]) |
//! | 12 | 16 | fingerprint, u128: the model/layout identity of the folder |
//! | 28 | 4 | layer group, u32 |
//! | 32 | 16 | block key, u128 |
//! | 48 | 4 | fill (tokens in the block), u32 |
//! | 52 | 1 | dtype code, u8 ([`dtype_code`]: 1 f32, 2 f16, 3 bf16, 4 int8, 5 fp8 e4m3, 6 fp8 e5m2) |
//! | 53 | 3 | reserved, zero |
//! | 56 | 8 | payload length in bytes, u64 |
//! | 64 | 8 | checksum, u64: XXH3-64 of bytes 0..64 followed by the payload |
//! | 72 | payload length | the payload |
//!
//! The manifest (36 bytes): magic `PKVDISKM`, format version (u32), fingerprint (u128),
//! and the XXH3-64 of those 28 bytes. A folder whose manifest holds another version or
//! fingerprint, or that holds anything but no manifest, is refused
//! ([`StorageFault::ForeignFolder`]) and left untouched.
//!
//! # Integrity
//!
//! [`DiskTier::open`] checks every block file's header (magic, version, fingerprint, dtype
//! code, the group and key its name says, a length of exactly header + payload) and
//! removes the files that fail, and leftover `.tmp` files. The payload checksum is
//! verified lazily, by every [`DiskTier::get`] before it returns: a block that fails it
//! (or whose file changed or vanished since) is removed and is a miss. No damaged block
//! is ever served; a damaged block may count in [`DiskTier::len`] until it is read.
//!
//! # Writes and durability
//!
//! A `put` writes the header and then the payload, straight from the caller's slice (no
//! copy), to `<name>.tmp`, and renames it over `<name>`: the rename is the commit, so a
//! crash at any point loses at most the block being written and never leaves a block
//! half old and half new. With [`Durability::Fsync`] (the default) the file's data is
//! synced before the rename and its folder after it, so a returned `put` survives a power
//! loss too. [`Durability::NoFsync`] skips both syncs: a returned `put` survives the
//! process being killed (the data is in the kernel's page cache) but not a power loss or a
//! kernel crash, where recently written blocks may be lost or torn (and then removed by
//! the checks above, never served). `remove` never syncs: a removed block that reappears
//! after a power loss is still a valid block of its key. The manifest, written once when
//! a folder becomes a tier, is synced whatever the durability. A fan-out folder, once
//! created, stays (also when the `put` that created it failed).
//!
//! Creating a file costs the file system far more than rewriting one (on ext4 here,
//! about 300 us to create an inode against 42 us to rewrite 256 KiB), so a `put` writes
//! into a *spare* when there is one (over its old bytes, cut to the new length) before
//! the same rename commits it. Spares come from two places:
//!
//! - `remove` keeps up to [`MAX_SPARES`] removed block files, renamed to their `.tmp`
//!   name (so a full tier, whose every put follows a removal, creates no files);
//! - [`DiskTier::make_spare`] creates empty ones ahead of the puts into free capacity,
//!   up to [`SPARES_AHEAD`], as block `.tmp` files of layer group [`SPARE_GROUP`]; the
//!   tier store's disk thread calls it whenever it is idle.
//!
//! A spare is a temporary file like any other: never read, and removed by the next
//! `open`. Spares are not counted in `capacity_bytes`.
//!
//! One tier per folder: `open` takes an exclusive lock on the manifest (released when
//! the tier is dropped or its process dies); a second `open` waits up to half a second
//! (a process starting another program holds a copy of the lock until its `exec`) and
//! then fails with [`StorageFault::Io`].

mod files;
mod format;
mod open;

use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

pub use files::storage_fault;
use files::{io_error, storage_error, Outcome, Staging};
use format::Header;
pub use format::{dtype_code, dtype_from_code, BlockMeta, FORMAT_VERSION, HEADER_BYTES};
use open::{file_bytes, Index};

use crate::error::{Result, StorageFault};
use crate::kv::DType;
use crate::prefix_cache::block_hash::BlockKey;

/// Most removed block files a tier keeps to rewrite (see the module doc).
pub const MAX_SPARES: usize = 32;

/// Most spare files [`DiskTier::make_spare`] keeps ready (see the module doc).
pub const SPARES_AHEAD: usize = 1024;

/// The layer group in the names of the spare files [`DiskTier::make_spare`] creates.
pub const SPARE_GROUP: u32 = u32::MAX;

/// Whether a `put` syncs to the device before it returns (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Sync the block file before its rename and its folder after: a returned `put`
    /// survives a power loss.
    #[default]
    Fsync,
    /// No syncs: a returned `put` survives the process being killed, not a power loss.
    /// Faster; for tests, benchmarks and caches that may start cold after a crash.
    NoFsync,
}

/// Counters of a [`DiskTier`] since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Blocks stored by `put`.
    pub blocks_written: u64,
    /// Payload bytes stored by `put` (headers not counted).
    pub bytes_written: u64,
    /// Blocks served by `get`.
    pub reads: u64,
    /// Payload bytes served by `get`.
    pub bytes_read: u64,
    /// `get` calls that served nothing (no such block, or a damaged one).
    pub misses: u64,
    /// Blocks `get` found damaged (checksum, length or header wrong, or the file gone) and
    /// removed.
    pub corrupt_removed: u64,
    /// Valid blocks found by `open`'s scan.
    pub recovered_at_open: u64,
    /// Block files `open`'s scan found unreadable, truncated or torn and removed.
    pub invalid_removed_at_open: u64,
    /// Leftover temporary files (interrupted writes) `open`'s scan removed.
    pub temp_removed_at_open: u64,
}

/// The disk tier: a folder of block files with an in-memory index of them by
/// (group, key). Every method leaves the folder and the index consistent: an error
/// leaves both as they were (see [`DiskTier::put`] for the one exception).
#[derive(Debug)]
pub struct DiskTier {
    root: PathBuf,
    fingerprint: u128,
    capacity_bytes: u64,
    durability: Durability,
    index: Index,
    bytes_used: u64,
    /// Which fan-out folders exist.
    subdirs: [bool; 256],
    /// Removed block files kept (under their `.tmp` names) and empty files made ahead,
    /// for the next puts to write into.
    spares: Vec<(PathBuf, u64)>,
    /// The key in the name of the next spare `make_spare` creates.
    next_spare: BlockKey,
    stats: DiskStats,
    /// The locked manifest: the folder is this tier's while it is open.
    _lock: File,
}

impl DiskTier {
    /// Opens (or creates) the tier in folder `dir` for blocks of `fingerprint` (the
    /// caller's identity of the model and KV layout), holding at most `capacity_bytes`
    /// bytes of block files (headers included), with [`Durability::Fsync`]. Existing
    /// blocks are indexed (a warm restart); invalid block files and leftover temporary
    /// files are removed and counted in [`DiskTier::stats`]. Existing blocks are kept even
    /// beyond `capacity_bytes` (then every `put` is refused until the caller removes some).
    ///
    /// Errors ([`crate::KvError::Storage`]): `ForeignFolder` when the folder's manifest
    /// holds another fingerprint or format version, or the folder holds files but no
    /// manifest (the folder is left untouched); `PermissionDenied` when the folder may not
    /// be created, read or written; `Io` for another I/O failure, or when another open
    /// tier (in any process) still holds the folder after half a second.
    pub fn open(dir: impl AsRef<Path>, fingerprint: u128, capacity_bytes: u64) -> Result<Self> {
        Self::open_with(dir, fingerprint, capacity_bytes, Durability::default())
    }

    /// [`DiskTier::open`] with the given durability of `put` (same errors).
    pub fn open_with(
        dir: impl AsRef<Path>,
        fingerprint: u128,
        capacity_bytes: u64,
        durability: Durability,
    ) -> Result<Self> {
        let root = dir.as_ref().to_path_buf();
        let lock = open::claim(&root, fingerprint)?;
        let scan = open::scan(&root, fingerprint)?;
        let stats = DiskStats {
            recovered_at_open: scan.index.len() as u64,
            invalid_removed_at_open: scan.invalid,
            temp_removed_at_open: scan.temps,
            ..DiskStats::default()
        };
        let (index, bytes_used, subdirs) = (scan.index, scan.bytes, scan.subdirs);
        let spares = Vec::new();
        let next_spare = 0;
        Ok(DiskTier {
            root,
            fingerprint,
            capacity_bytes,
            durability,
            index,
            bytes_used,
            subdirs,
            spares,
            next_spare,
            stats,
            _lock: lock,
        })
    }

    /// Stores `payload` (bytes; empty allowed) as block (`group`, `key`) with its `fill`
    /// (tokens) and `dtype`, replacing the block of that key if there is one. It takes
    /// [`HEADER_BYTES`] + `payload.len()` bytes of the capacity. The payload is written
    /// from the slice (no copy) and committed by a rename; see the module doc for what
    /// survives a crash.
    ///
    /// Errors ([`crate::KvError::Storage`]): `Full` when the block would take the tier
    /// past its `capacity_bytes` (checked first: evicting is the caller's job) or the
    /// device is full; `PermissionDenied`; `Io`. On an error no file is left behind and
    /// the tier is unchanged, except in one case: when syncing the folder fails after the
    /// rename, the new file is removed and the key is no longer stored (the block it
    /// replaced, if any, is gone too).
    pub fn put(&mut self, group: u32, key: BlockKey, fill: u32, dtype: DType, payload: &[u8]) -> Result<()> {
        let meta = BlockMeta { fill, dtype, payload_len: payload.len() as u64 };
        let used = self.used_after(group, key, meta.payload_len)?;
        let path = self.make_subdir(group, key)?;
        let header = Header::new(self.fingerprint, group, key, meta, payload).encode();
        self.commit(&path, (group, key), [&header, payload])?;
        self.index.insert((group, key), meta);
        self.bytes_used = used;
        self.stats.blocks_written += 1;
        self.stats.bytes_written += meta.payload_len;
        Ok(())
    }

    /// Appends block (`group`, `key`)'s payload to `out` and returns its metadata, or
    /// returns `None` (a miss) when the tier has no such block or its file is damaged
    /// (checksum, length or header wrong, or gone): a damaged block is removed, counted
    /// in [`DiskStats::corrupt_removed`], and never served. On a miss and on an error
    /// `out`'s length and contents are unchanged.
    ///
    /// Errors: `Storage` `PermissionDenied` or `Io` when the file may not be read (the
    /// block stays); `InvalidArgument` when `out` cannot grow by the payload's length.
    pub fn get(&mut self, group: u32, key: BlockKey, out: &mut Vec<u8>) -> Result<Option<BlockMeta>> {
        let Some(&meta) = self.index.get(&(group, key)) else {
            self.stats.misses += 1;
            return Ok(None);
        };
        let path = self.block_path(group, key);
        match files::read_block(&path, self.fingerprint, (group, key), meta, out)? {
            Outcome::Served => {
                self.stats.reads += 1;
                self.stats.bytes_read += meta.payload_len;
                Ok(Some(meta))
            }
            Outcome::Damaged => {
                self.drop_damaged(group, key, &path);
                Ok(None)
            }
        }
    }

    /// The last `n` payload bytes of block (`group`, `key`), read without checking the
    /// checksum (a later [`Self::get`] checks the whole block): what a caller stored at
    /// the payload's end to find the block again after a restart. `None` when the tier
    /// has no such block or its payload is shorter than `n`, or the file reads short.
    ///
    /// Errors: `Storage` `PermissionDenied` or `Io` when the file may not be read.
    pub fn peek_tail(&self, group: u32, key: BlockKey, n: usize) -> Result<Option<Vec<u8>>> {
        use std::io::{Read, Seek, SeekFrom};
        let Some(meta) = self.index.get(&(group, key)).filter(|m| m.payload_len >= n as u64) else { return Ok(None) };
        let path = self.block_path(group, key);
        let read = || -> std::io::Result<Option<Vec<u8>>> {
            let mut f = File::open(&path)?;
            f.seek(SeekFrom::Start(HEADER_BYTES as u64 + meta.payload_len - n as u64))?;
            let mut tail = vec![0u8; n];
            match f.read_exact(&mut tail) {
                Ok(()) => Ok(Some(tail)),
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(None),
                Err(e) => Err(e),
            }
        };
        match read() {
            Ok(t) => Ok(t),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("read", &path, e)),
        }
    }

    /// Starts the device reads of `blocks`' files (those the tier stores) without waiting,
    /// so that the `get`s of a load plan that follow overlap them: a file per block cannot
    /// be read ahead by the kernel across files. Advice only: nothing is checked or
    /// counted here, and a file that cannot be opened is left to its `get`.
    pub fn prefetch(&self, blocks: &[(u32, BlockKey)]) {
        for &(group, key) in blocks.iter().filter(|b| self.index.contains_key(b)) {
            files::read_ahead(&self.block_path(group, key));
        }
    }

    /// Removes block (`group`, `key`); returns whether the tier had it. Does not sync
    /// (see the module doc). Errors: `Storage` `PermissionDenied` or `Io` when the file
    /// may not be removed (the block stays).
    pub fn remove(&mut self, group: u32, key: BlockKey) -> Result<bool> {
        if !self.index.contains_key(&(group, key)) {
            return Ok(false);
        }
        let path = self.block_path(group, key);
        let len = self.index.get(&(group, key)).map_or(0, |m| HEADER_BYTES as u64 + m.payload_len);
        self.retire(&path, len).map_err(|e| io_error("remove", &path, e))?;
        self.forget(group, key);
        Ok(true)
    }

    /// Takes block file `path` (of `len` bytes) away: kept as a spare while there are
    /// fewer than [`MAX_SPARES`] (and none of its name), else deleted. A file already
    /// gone is fine.
    fn retire(&mut self, path: &Path, len: u64) -> std::io::Result<()> {
        let spare = files::tmp_path(path);
        if self.spares.len() >= MAX_SPARES || self.spares.iter().any(|(p, _)| *p == spare) {
            return files::remove_if_present(path).map(|_| ());
        }
        match fs::rename(path, &spare) {
            Ok(()) => {
                self.spares.push((spare, len));
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates one empty spare file, for a later `put` to write into instead of creating
    /// its file (see the module doc), and returns whether it made one. It makes one while
    /// the tier has fewer than [`SPARES_AHEAD`] spares, fewer blocks and spares together
    /// than `capacity_blocks` (the caller's budget), and the free part of its byte
    /// capacity holds a block of `payload_len` bytes per spare and one more. For the idle
    /// time of the thread that owns the tier: the tier store's disk thread calls it while
    /// its queue is empty.
    ///
    /// Errors ([`crate::KvError::Storage`]): `Full` when the device is full,
    /// `PermissionDenied`, `Io`; the tier is unchanged (a fan-out folder may have been
    /// created).
    pub fn make_spare(&mut self, payload_len: u64, capacity_blocks: usize) -> Result<bool> {
        let n = self.spares.len();
        let room = file_bytes(payload_len).and_then(|b| b.checked_mul(n as u64 + 1));
        let fits = room.and_then(|r| self.bytes_used.checked_add(r)).is_some_and(|u| u <= self.capacity_bytes);
        if n >= SPARES_AHEAD || self.index.len().saturating_add(n) >= capacity_blocks || !fits {
            return Ok(false);
        }
        let key = self.next_spare;
        self.next_spare += 1;
        let spare = files::tmp_path(&self.make_subdir(SPARE_GROUP, key)?);
        match File::create_new(&spare) {
            Ok(_) => self.spares.push((spare, 0)),
            // A file of that name (a put of the spares' group): the next call tries the next.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_error("create", &spare, e)),
        }
        Ok(true)
    }

    /// Spare files ready for puts to write into (see [`DiskTier::make_spare`]).
    pub fn spares(&self) -> usize {
        self.spares.len()
    }

    /// Whether the tier stores block (`group`, `key`) (its payload is checked by `get`).
    pub fn contains(&self, group: u32, key: BlockKey) -> bool {
        self.index.contains_key(&(group, key))
    }

    /// The metadata of block (`group`, `key`), without reading it.
    pub fn meta(&self, group: u32, key: BlockKey) -> Option<BlockMeta> {
        self.index.get(&(group, key)).copied()
    }

    /// Blocks stored.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no block is stored.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Bytes of the stored blocks' files (headers and payloads), the measure of
    /// `capacity_bytes`.
    pub fn bytes_used(&self) -> u64 {
        self.bytes_used
    }

    /// The byte budget of the block files the tier was opened with.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// The (group, key) of every stored block, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = (u32, BlockKey)> + '_ {
        self.index.keys().copied()
    }

    /// The counters since `open`.
    pub fn stats(&self) -> DiskStats {
        self.stats
    }

    /// The tier's folder.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// The durability of `put` the tier was opened with.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The file block (`group`, `key`) is (or would be) stored in: a function of the two
    /// numbers and the folder only.
    pub fn block_path(&self, group: u32, key: BlockKey) -> PathBuf {
        files::block_path(&self.root, group, key)
    }

    /// `bytes_used` once block (`group`, `key`) is stored with `payload_len` payload
    /// bytes (replacing its current version), or `Full` beyond the capacity.
    fn used_after(&self, group: u32, key: BlockKey, payload_len: u64) -> Result<u64> {
        let old = self.index.get(&(group, key)).map_or(0, |m| HEADER_BYTES as u64 + m.payload_len);
        let after = file_bytes(payload_len).and_then(|need| (self.bytes_used - old).checked_add(need));
        match after {
            Some(a) if a <= self.capacity_bytes => Ok(a),
            _ => Err(storage_error(
                StorageFault::Full,
                format!(
                    "full: a block of {payload_len} payload bytes does not fit ({} of {} bytes used)",
                    self.bytes_used, self.capacity_bytes
                ),
            )),
        }
    }

    /// Creates block (`group`, `key`)'s fan-out folder if it does not exist yet (synced
    /// into the tier's folder when durable) and returns the block's path.
    fn make_subdir(&mut self, group: u32, key: BlockKey) -> Result<PathBuf> {
        let fan = files::fan_out(group, key);
        if !self.subdirs[usize::from(fan)] {
            let dir = files::subdir(&self.root, fan);
            let created = match fs::create_dir(&dir) {
                Ok(()) if self.durable() => files::sync_dir(&self.root),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
                other => other,
            };
            created.map_err(|e| io_error("create the folder", &dir, e))?;
            self.subdirs[usize::from(fan)] = true;
        }
        Ok(self.block_path(group, key))
    }

    /// Writes `parts` to `path` atomically, synced as the tier's durability says. When
    /// only the folder sync fails, the file is removed and the key forgotten.
    fn commit(&mut self, path: &Path, (group, key): (u32, BlockKey), parts: [&[u8]; 2]) -> Result<()> {
        let sync = self.durable();
        // A spare if there is one (one that vanished is skipped), else a new file.
        let written = loop {
            let Some((spare, len)) = self.spares.pop() else {
                break files::write_atomic(&files::tmp_path(path), Staging::New, path, parts, sync);
            };
            match files::write_atomic(&spare, Staging::Reused { len }, path, parts, sync) {
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                other => break other,
            }
        };
        written.map_err(|e| io_error("write", path, e))?;
        let Some(dir) = path.parent().filter(|_| sync) else { return Ok(()) };
        files::sync_dir(dir).map_err(|e| {
            // Best effort: the sync's error is the one reported.
            let _ = files::remove_if_present(path);
            self.forget(group, key);
            io_error("sync the folder", dir, e)
        })
    }

    /// Drops a block `get` found damaged: its file (as far as it can be removed) and its
    /// index entry.
    fn drop_damaged(&mut self, group: u32, key: BlockKey, path: &Path) {
        // Best effort: the block is no longer indexed, so it is never served either way,
        // and the next `open` checks the file again.
        let _ = files::remove_if_present(path);
        self.forget(group, key);
        self.stats.corrupt_removed += 1;
        self.stats.misses += 1;
    }

    /// Removes block (`group`, `key`) from the index and its bytes from `bytes_used`.
    fn forget(&mut self, group: u32, key: BlockKey) {
        if let Some(m) = self.index.remove(&(group, key)) {
            self.bytes_used -= HEADER_BYTES as u64 + m.payload_len;
        }
    }

    /// Whether `put` syncs.
    fn durable(&self) -> bool {
        self.durability == Durability::Fsync
    }
}
