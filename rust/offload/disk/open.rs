//! Opening a folder: claiming it (created if missing; a manifest written into an empty
//! folder, checked in any other; an exclusive lock; a write probe) and the warm-restart
//! scan that indexes the valid block files and removes invalid ones and leftover
//! temporary files.

use std::fs::{self, File, TryLockError};
use std::io::{ErrorKind, Read};
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use super::files::{self, io_error, storage_error, MANIFEST, PROBE, TMP};
use super::format::{decode_manifest, encode_manifest, BlockMeta, Header, FORMAT_VERSION, HEADER_BYTES, MANIFEST_BYTES};
use crate::error::{Result, StorageFault};
use crate::prefix_cache::block_hash::BlockKey;

/// The blocks of a folder by (group, key).
pub(super) type Index = FxHashMap<(u32, BlockKey), BlockMeta>;

/// What a scan found.
#[derive(Debug)]
pub(super) struct Scan {
    /// The valid blocks.
    pub index: Index,
    /// Their files' bytes (headers and payloads).
    pub bytes: u64,
    /// Which fan-out folders exist.
    pub subdirs: [bool; 256],
    /// Block files whose header was invalid, truncated or torn, removed.
    pub invalid: u64,
    /// Leftover temporary files, removed.
    pub temps: u64,
}

/// Bytes a block of `payload_len` payload bytes takes on disk (`None`: more than a u64).
pub(super) fn file_bytes(payload_len: u64) -> Option<u64> {
    payload_len.checked_add(HEADER_BYTES as u64)
}

/// Claims `root` for a tier of `fingerprint`: creates the folder if missing, writes the
/// manifest into an empty folder or checks the one present, takes the folder's lock and
/// checks that it may be written. Returns the locked manifest (the lock lives as long as
/// it). Errors: `ForeignFolder` (another fingerprint or version, or a non-empty folder
/// without a manifest), `PermissionDenied`, `Io` (also: another tier holds the lock).
pub(super) fn claim(root: &Path, fingerprint: u128) -> Result<File> {
    fs::create_dir_all(root).map_err(|e| io_error("create the folder", root, e))?;
    let path = root.join(MANIFEST);
    if !path.try_exists().map_err(|e| io_error("look for", &path, e))? {
        create_manifest(root, fingerprint)?;
    }
    let manifest = File::open(&path).map_err(|e| io_error("open", &path, e))?;
    lock(&manifest, root)?;
    check_manifest(&manifest, &path, fingerprint)?;
    probe(root)?;
    Ok(manifest)
}

/// Writes the manifest of a new tier, after checking that the folder holds nothing else.
/// Always synced, whatever the tier's durability: a manifest lost or torn by a power loss
/// would make the folder foreign for good.
fn create_manifest(root: &Path, fingerprint: u128) -> Result<()> {
    let listing = fs::read_dir(root).map_err(|e| io_error("list", root, e))?;
    for entry in listing {
        let name = entry.map_err(|e| io_error("list", root, e))?.file_name();
        let ours = name.to_str().is_some_and(|n| n == PROBE || n.strip_suffix(TMP) == Some(MANIFEST));
        if !ours {
            let found = name.to_string_lossy();
            let message = format!("{} holds {found:?} but no manifest: not a disk tier folder", root.display());
            return Err(storage_error(StorageFault::ForeignFolder, message));
        }
    }
    let path = root.join(MANIFEST);
    let bytes = encode_manifest(fingerprint);
    files::write_atomic(&files::tmp_path(&path), files::Staging::New, &path, [&bytes, &[]], true)
        .and_then(|()| files::sync_dir(root))
        .map_err(|e| io_error("write", &path, e))
}

/// How long `open` waits for the folder's lock before it reports the folder in use: a
/// process that forks (to start another program) shares the lock until it execs, so a
/// tier dropped and reopened while another thread starts a process may find it held.
const LOCK_WAIT: Duration = Duration::from_millis(500);

/// Takes the folder's exclusive lock on its manifest (released when the file is closed,
/// also by a crash): one tier per folder at a time, in this process or another. Waits
/// up to [`LOCK_WAIT`] for a lock held elsewhere.
fn lock(manifest: &File, root: &Path) -> Result<()> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match manifest.try_lock() {
            Ok(()) => return Ok(()),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => sleep(Duration::from_millis(1)),
            Err(TryLockError::WouldBlock) => {
                let message = format!("{} is in use by another disk tier", root.display());
                return Err(storage_error(StorageFault::Io, message));
            }
            Err(TryLockError::Error(e)) => return Err(io_error("lock", root, e)),
        }
    }
}

/// Refuses a manifest of another format version or fingerprint, or none at all.
fn check_manifest(manifest: &File, path: &Path, fingerprint: u128) -> Result<()> {
    let mut bytes = Vec::new();
    let limit = (MANIFEST_BYTES + 1) as u64;
    manifest.take(limit).read_to_end(&mut bytes).map_err(|e| io_error("read", path, e))?;
    let refuse = |what: String| storage_error(StorageFault::ForeignFolder, format!("{}: {what}", path.display()));
    match decode_manifest(&bytes) {
        None => Err(refuse("not a disk tier manifest".into())),
        Some((v, _)) if v != FORMAT_VERSION => {
            Err(refuse(format!("format version {v}, this build reads version {FORMAT_VERSION}")))
        }
        Some((_, f)) if f != fingerprint => {
            Err(refuse(format!("fingerprint {f:032x}, the tier was opened with {fingerprint:032x}")))
        }
        Some(_) => Ok(()),
    }
}

/// Checks that files may be created in the folder (an error names `PermissionDenied`
/// for a read-only folder now rather than at the first `put`).
fn probe(root: &Path) -> Result<()> {
    let path = root.join(PROBE);
    File::create(&path)
        .and_then(|_| fs::remove_file(&path))
        .map_err(|e| io_error("create files in", root, e))
}

/// Indexes the valid blocks under `root` and removes invalid block files and leftover
/// temporary files; names of neither kind are left alone. Errors: a folder or file that
/// cannot be listed, read or removed.
pub(super) fn scan(root: &Path, fingerprint: u128) -> Result<Scan> {
    let mut found = Scan { index: Index::default(), bytes: 0, subdirs: [false; 256], invalid: 0, temps: 0 };
    for entry in fs::read_dir(root).map_err(|e| io_error("list", root, e))? {
        let entry = entry.map_err(|e| io_error("list", root, e))?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        match files::parse_subdir(&name) {
            Some(fan) if entry.file_type().is_ok_and(|t| t.is_dir()) => {
                found.subdirs[usize::from(fan)] = true;
                scan_subdir(&path, fan, fingerprint, &mut found)?;
            }
            _ if name.strip_suffix(TMP) == Some(MANIFEST) => remove(&path, &mut found.temps)?,
            _ => {}
        }
    }
    Ok(found)
}

/// Scans fan-out folder `fan` (at `dir`) into `found`.
fn scan_subdir(dir: &Path, fan: u8, fingerprint: u128, found: &mut Scan) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(|e| io_error("list", dir, e))? {
        let path = entry.map_err(|e| io_error("list", dir, e))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if let Some((group, key)) = files::parse_block_name(name) {
            match check_block(&path, fan, (group, key), fingerprint)? {
                Some(meta) => {
                    found.bytes += HEADER_BYTES as u64 + meta.payload_len;
                    found.index.insert((group, key), meta);
                }
                None => remove(&path, &mut found.invalid)?,
            }
        } else if name.strip_suffix(TMP).and_then(files::parse_block_name).is_some() {
            remove(&path, &mut found.temps)?;
        }
    }
    Ok(())
}

/// Removes a file the scan found invalid or left over, counting it in `count`.
fn remove(path: &Path, count: &mut u64) -> Result<()> {
    files::remove_if_present(path).map_err(|e| io_error("remove", path, e))?;
    *count += 1;
    Ok(())
}

/// The block a file named (`group`, `key`) in fan-out folder `fan` holds, or `None` when
/// it is in the wrong folder, or its header is unreadable, of another folder or block,
/// or its length is not the header's. The payload checksum is checked by `get`.
/// Errors: only a file that may not be read (`PermissionDenied`).
fn check_block(path: &Path, fan: u8, (group, key): (u32, BlockKey), fingerprint: u128) -> Result<Option<BlockMeta>> {
    if files::fan_out(group, key) != fan {
        return Ok(None);
    }
    let mut head = [0u8; HEADER_BYTES];
    let read = File::open(path).and_then(|mut f| f.read_exact(&mut head).and_then(|()| f.metadata()));
    let len = match read {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => return Err(io_error("read", path, e)),
        Err(_) => return Ok(None),
    };
    let Some(h) = Header::decode(&head) else { return Ok(None) };
    let same = h.fingerprint == fingerprint && h.group == group && h.key == key;
    Ok((same && file_bytes(h.meta.payload_len) == Some(len)).then_some(h.meta))
}
