//! Reading a load plan's disk blocks ahead. The disk tier keeps a file per block, which
//! the kernel reads ahead within the file but not across files: the store asks for the
//! files of the next blocks, up to [`AHEAD_BYTES`] ahead, while it reads the current one
//! (`benches/offload_disk.rs`, `get cold ahead`: 256 KiB blocks read cold went from 0.47-0.50
//! to 0.79 of a raw sequential file). Blocks of [`WHOLE_BYTES`] or more are not read
//! ahead: the kernel's own readahead within their file did better there (0.77-0.97
//! against 0.69-0.86).

use super::disk_worker::DiskWorker;
use crate::prefix_cache::block_hash::BlockKey;

/// How far ahead of the block being read the files are asked for, in bytes.
pub const AHEAD_BYTES: usize = 8 << 20;
/// The block size from which nothing is read ahead, in bytes.
pub const WHOLE_BYTES: usize = 4 << 20;

/// The disk blocks of one load plan, in read order, and how many were asked for.
pub struct ReadAhead {
    keys: Vec<(u32, BlockKey)>,
    asked: usize,
    window: usize,
}

impl ReadAhead {
    /// The plan's disk blocks `keys` (file group, key), in the order they will be read,
    /// of `block_bytes` each.
    pub fn new(keys: Vec<(u32, BlockKey)>, block_bytes: usize) -> Self {
        let window = if block_bytes >= WHOLE_BYTES { 0 } else { (AHEAD_BYTES / block_bytes.max(1)).max(1) };
        Self { keys, asked: 0, window }
    }

    /// Ask for the first blocks' files (queued on the disk's thread, before any read).
    pub fn start(&mut self, disk: &DiskWorker) {
        self.ask(disk, self.window);
    }

    /// A block is about to be read: ask for one more, keeping the window ahead.
    pub fn step(&mut self, disk: &DiskWorker) {
        if self.window > 0 {
            self.ask(disk, 1);
        }
    }

    fn ask(&mut self, disk: &DiskWorker, n: usize) {
        let end = (self.asked + n).min(self.keys.len());
        if end > self.asked {
            let keys = self.keys[self.asked..end].to_vec();
            disk.send(move |d| {
                d.prefetch(&keys);
                Ok(())
            });
            self.asked = end;
        }
    }
}
