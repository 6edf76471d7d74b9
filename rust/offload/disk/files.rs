//! Where the disk tier's files live and how they are written and read: names derived
//! from (group, key) alone, the fan-out folders, atomic writes (a temporary file renamed
//! into place), folder syncs, the read of a block (its header checked against the index,
//! its length against the header, its payload against the checksum, before a byte counts
//! as served), and the mapping of I/O errors to [`StorageFault`]s.

use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, IoSlice, Read, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use super::format::{BlockMeta, Header, HEADER_BYTES};
use crate::error::{KvError, Result, StorageFault};
use crate::invalid;
use crate::prefix_cache::block_hash::BlockKey;

/// The manifest's file name, in the tier's folder.
pub(super) const MANIFEST: &str = "pykvpool-disk.manifest";

/// The write probe's file name, in the tier's folder (created and removed by `open`).
pub(super) const PROBE: &str = "pykvpool-disk.probe.tmp";

/// What a temporary file's name adds to the name of the file it becomes.
pub(super) const TMP: &str = ".tmp";

/// The suffix of a block file's name.
const BLOCK: &str = ".blk";

/// The fan-out folder of a block: the low byte of the XXH3-64 of its group and key
/// (little-endian), so that even sequential keys spread over the 256 folders.
pub(super) fn fan_out(group: u32, key: BlockKey) -> u8 {
    let mut b = [0u8; 20];
    b[..4].copy_from_slice(&group.to_le_bytes());
    b[4..].copy_from_slice(&key.to_le_bytes());
    xxh3_64(&b).to_le_bytes()[0]
}

/// The path of fan-out folder `fan`: two lowercase hex digits under `root`.
pub(super) fn subdir(root: &Path, fan: u8) -> PathBuf {
    root.join(format!("{fan:02x}"))
}

/// The fan-out byte a folder name stands for, or `None` for any other name.
pub(super) fn parse_subdir(name: &str) -> Option<u8> {
    u8::try_from(parse_hex(name, 2)?).ok()
}

/// The path of the block (`group`, `key`) under `root`:
/// `<fan>/<group: 8 hex digits>-<key: 32 hex digits>.blk`, all lowercase.
pub(super) fn block_path(root: &Path, group: u32, key: BlockKey) -> PathBuf {
    subdir(root, fan_out(group, key)).join(format!("{group:08x}-{key:032x}{BLOCK}"))
}

/// The temporary file a block file (or the manifest) is written to before its rename.
pub(super) fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(TMP);
    PathBuf::from(name)
}

/// The (group, key) a block file's name stands for, or `None` for any other name.
pub(super) fn parse_block_name(name: &str) -> Option<(u32, BlockKey)> {
    let stem = name.strip_suffix(BLOCK)?;
    let (group, key) = stem.split_once('-')?;
    Some((u32::try_from(parse_hex(group, 8)?).ok()?, parse_hex(key, 32)?))
}

/// Exactly `digits` lowercase hex digits (no sign, no prefix) as a number.
fn parse_hex(s: &str, digits: usize) -> Option<u128> {
    let hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    if s.len() != digits || !s.bytes().all(hex) {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

/// The [`StorageFault`] of an I/O error: [`StorageFault::Full`] for `ENOSPC` and
/// `EDQUOT`, [`StorageFault::PermissionDenied`] for `EACCES`, `EPERM` and `EROFS` (a
/// read-only file system), [`StorageFault::Io`] for anything else.
pub fn storage_fault(e: &io::Error) -> StorageFault {
    match e.kind() {
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => StorageFault::Full,
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => StorageFault::PermissionDenied,
        _ => StorageFault::Io,
    }
}

/// The [`KvError::Storage`] of failing to `what` the file or folder `path`.
pub(super) fn io_error(what: &str, path: &Path, e: io::Error) -> KvError {
    let message = format!("disk tier: cannot {what} {}: {e}", path.display());
    KvError::Storage { fault: storage_fault(&e), message }
}

/// A [`KvError::Storage`] of `fault` with `message` (prefixed with the tier's name).
pub(super) fn storage_error(fault: StorageFault, message: String) -> KvError {
    KvError::Storage { fault, message: format!("disk tier: {message}") }
}

/// Where [`write_atomic`] writes before its rename.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Staging {
    /// A new file (replacing a leftover one).
    New,
    /// An existing file of `len` bytes whose blocks the file system reuses (a spare),
    /// cut to the new length only when it was longer: `NotFound` when it is gone, with
    /// nothing else changed. (A file longer than `len` left uncut fails every read's
    /// length check: never served.)
    Reused { len: u64 },
}

/// Writes `parts` one after the other to the temporary file `tmp` (see [`Staging`]),
/// syncs its data when `sync`, and renames it to `path`. On an error `tmp` is removed
/// (as far as it can be) and `path` is untouched. The parts are written from the
/// caller's memory: nothing is copied.
pub(super) fn write_atomic(tmp: &Path, staging: Staging, path: &Path, parts: [&[u8]; 2], sync: bool) -> io::Result<()> {
    let new = staging == Staging::New;
    let file = OpenOptions::new().write(true).create(new).truncate(new).open(tmp)?;
    let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let cut = matches!(staging, Staging::Reused { len } if len > total).then_some(total);
    let written = write_parts(file, parts, cut, sync).and_then(|()| fs::rename(tmp, path));
    if written.is_err() {
        // Best effort: the error being reported is the write's, and the next `open`
        // removes a temporary file this could not.
        let _ = fs::remove_file(tmp);
    }
    written
}

/// Writes `parts` from the start of `file`, cuts it to length `cut` when given, and
/// syncs its data when `sync`.
fn write_parts(mut file: File, parts: [&[u8]; 2], cut: Option<u64>, sync: bool) -> io::Result<()> {
    // One vectored write where the file system takes it all (a small header written on
    // its own makes the payload's write that follows it markedly slower).
    let mut slices = parts.map(IoSlice::new);
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match file.write_vectored(rest) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if let Some(len) = cut {
        file.set_len(len)?;
    }
    if sync {
        file.sync_data()?;
    }
    Ok(())
}

/// Asks the kernel to start reading `path` into its page cache and returns at once
/// (`posix_fadvise(WILLNEED)`). Best effort: a file that cannot be opened is skipped.
pub(super) fn read_ahead(path: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(f) = File::open(path) {
        // SAFETY: `f` owns the descriptor, open for the whole call; the call reads and
        // writes no memory of ours, and any result is fine (advice only).
        let _ = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
    }
}

/// Syncs a folder, so that the names created, renamed or removed in it are durable.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes `path`; a file already gone is no error. Returns whether it was there.
pub(super) fn remove_if_present(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// What reading a block file found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The payload was appended to `out` and verified.
    Served,
    /// The file is gone, short, long, of another block or fails its checksum: nothing
    /// was served and `out` is as it was.
    Damaged,
}

/// The block (`group`, `key`) the index knows as `meta`, in a folder of `fingerprint`,
/// read from `path` and appended to `out`. On `Damaged` and on an error `out` is left
/// as it was (its length; its spare capacity may have grown). Errors: a file that may
/// not be read (`PermissionDenied`), another I/O failure (`Io`), a payload this host
/// cannot allocate (`InvalidArgument`).
pub(super) fn read_block(
    path: &Path,
    fingerprint: u128,
    (group, key): (u32, BlockKey),
    meta: BlockMeta,
    out: &mut Vec<u8>,
) -> Result<Outcome> {
    let old = out.len();
    let outcome = match read_into(path, meta, out) {
        Ok(Some(h)) => {
            let ours = h.fingerprint == fingerprint && (h.group, h.key) == (group, key);
            if ours && h.verifies(&out[old..]) {
                Outcome::Served
            } else {
                Outcome::Damaged
            }
        }
        Ok(None) => Outcome::Damaged,
        Err(e) => {
            out.truncate(old);
            return Err(e);
        }
    };
    if outcome == Outcome::Damaged {
        out.truncate(old);
    }
    Ok(outcome)
}

/// Reads the header of `path`, and when the file's length is the header's, its payload
/// onto the end of `out`. `None`: no such file, or one too short or of the wrong length.
fn read_into(path: &Path, meta: BlockMeta, out: &mut Vec<u8>) -> Result<Option<Header>> {
    let damaged = |e: &io::Error| matches!(e.kind(), ErrorKind::NotFound | ErrorKind::UnexpectedEof);
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if damaged(&e) => return Ok(None),
        Err(e) => return Err(io_error("open", path, e)),
    };
    let mut head = [0u8; HEADER_BYTES];
    let len = match file.read_exact(&mut head).and_then(|()| file.metadata()) {
        Ok(m) => m.len(),
        Err(e) if damaged(&e) => return Ok(None),
        Err(e) => return Err(io_error("read", path, e)),
    };
    let header = match Header::decode(&head) {
        Some(h) if h.meta == meta && len.checked_sub(HEADER_BYTES as u64) == Some(meta.payload_len) => h,
        _ => return Ok(None),
    };
    let n = usize::try_from(meta.payload_len).map_err(|_| invalid!("disk tier: a {len}-byte block file"))?;
    out.try_reserve_exact(n).map_err(|_| invalid!("disk tier: cannot allocate {n} bytes to read a block"))?;
    // Read into the reserved capacity (not zero-filled first); fewer bytes than the
    // header says is a damaged file.
    match (&mut file).take(n as u64).read_to_end(out) {
        Ok(got) if got == n => Ok(Some(header)),
        Ok(_) => Ok(None),
        Err(e) if damaged(&e) => Ok(None),
        Err(e) => Err(io_error("read", path, e)),
    }
}
