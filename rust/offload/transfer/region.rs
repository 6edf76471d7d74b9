//! The device side of a transfer: memory holding blocks, each block a fixed list of byte
//! runs that a slot holds concatenated ([`DeviceRegion`]), implemented for [`KvCache`]
//! and for [`KvRegion`], a cache's storage seen apart from the cache (for an owner that
//! keeps the cache behind a lock).

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::Result;
use crate::kv::{BlockGeometry, KvCache};

/// Memory whose blocks the transfer engine copies to and from host slots, on its own
/// threads, through raw pointers.
///
/// A block is a list of byte runs inside [`Self::memory`] ([`Self::block_runs`]), the
/// same total length, [`Self::slot_bytes`], for every block; a slot holds them
/// concatenated in that order. The engine checks every run against the memory's length
/// and the total against `slot_bytes` before copying, so wrong runs are an error, never
/// an access outside the region.
///
/// # Safety
///
/// Implementors guarantee that [`Self::memory`] returns the same pointer and length for
/// the value's whole life, and that the pointer is valid for reads and writes (its
/// provenance permitting both) of that many bytes for as long as the value lives: the
/// memory is neither freed nor moved while the value exists. The engine holds the region
/// in an `Arc` for as long as a job may touch it. (Who else reads or writes a block while
/// a job copies it is the promise of `TransferEngine::submit`'s caller.)
pub unsafe trait DeviceRegion: Send + Sync + 'static {
    /// The region's first byte and its length in bytes.
    fn memory(&self) -> (NonNull<u8>, usize);

    /// Blocks in the region; a block index is in `0..num_blocks()`.
    fn num_blocks(&self) -> usize;

    /// Bytes of one block (the sum of its runs' lengths), the size of its slot.
    fn slot_bytes(&self) -> usize;

    /// Append `block`'s byte runs (offsets into [`Self::memory`]) to `runs`, in slot
    /// order.
    ///
    /// Errors (`InvalidArgument`, nothing appended): `block` out of range.
    fn block_runs(&self, block: usize, runs: &mut Vec<Range<usize>>) -> Result<()>;

    /// Whether the region may hold codes its own writes never make (see
    /// `KvCache::raw_writes`); a store passes this on to the slot.
    fn raw_writes(&self) -> bool {
        false
    }

    /// Record that a load may bring in such codes (see `KvCache::note_raw_writes`).
    fn note_raw_writes(&self) {}
}

// SAFETY: a `KvCache`'s storage is one mapping (`AlignedBuf`), allocated in `new`, freed
// only by its drop and never moved; `raw_parts` returns the mapping's own pointer (from
// `mmap`, valid for reads and writes) and its length.
unsafe impl DeviceRegion for KvCache {
    fn memory(&self) -> (NonNull<u8>, usize) {
        self.raw_parts()
    }

    fn num_blocks(&self) -> usize {
        self.shape().num_blocks
    }

    fn slot_bytes(&self) -> usize {
        slot_bytes_for(self)
    }

    fn block_runs(&self, block: usize, runs: &mut Vec<Range<usize>>) -> Result<()> {
        geometry_runs(&self.block_geometry(), block, runs)
    }

    fn raw_writes(&self) -> bool {
        KvCache::raw_writes(self)
    }

    fn note_raw_writes(&self) {
        KvCache::note_raw_writes(self)
    }
}

/// Bytes of one block of `cache` across all layers: its K and V codes and, for int8, its
/// per-token scales (fp8's per-layer scales belong to no block and are not included):
/// `num_layers * 2 * num_kv_heads * block_size * (head_dim * dtype.size() + 4 if int8)`.
pub fn slot_bytes_for(cache: &KvCache) -> usize {
    cache.block_geometry().slot_bytes()
}

/// Append `block`'s non-empty runs of every layer to `runs`, in slot order; nothing on
/// an error (`block` out of range).
fn geometry_runs(g: &BlockGeometry, block: usize, runs: &mut Vec<Range<usize>>) -> Result<()> {
    let start = runs.len();
    for layer in 0..g.num_layers {
        match g.block_bytes(layer, block) {
            Ok(ranges) => runs.extend(ranges.into_iter().filter(|r| !r.is_empty())),
            Err(e) => {
                runs.truncate(start);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// A [`KvCache`]'s storage as a [`DeviceRegion`], apart from the cache: its pointer,
/// length, block geometry and raw-writes flag, and an `Arc` of whatever owns the cache,
/// which keeps the storage alive while a transfer holds the region.
pub struct KvRegion<O: Send + Sync + 'static> {
    ptr: NonNull<u8>,
    len: usize,
    geometry: BlockGeometry,
    raw: Arc<AtomicBool>,
    _owner: Arc<O>,
}

// SAFETY: the region is a pointer into memory valid for reads and writes from any
// thread (the cache's mapping); sharing it across threads is what `DeviceRegion`
// describes, and who touches which bytes when is the transfer caller's promise.
unsafe impl<O: Send + Sync + 'static> Send for KvRegion<O> {}
// SAFETY: as for `Send`; `&KvRegion` only hands out the pointer and copies of its facts.
unsafe impl<O: Send + Sync + 'static> Sync for KvRegion<O> {}

impl<O: Send + Sync + 'static> KvRegion<O> {
    /// The region of `cache`, owned by `owner`.
    ///
    /// # Safety
    ///
    /// `owner` holds `cache` for as long as `owner` lives, and the cache is neither
    /// dropped nor replaced in it meanwhile (its storage mapping is then the same memory
    /// throughout: a `KvCache` never moves or frees its mapping before its drop).
    pub unsafe fn new(cache: &KvCache, owner: Arc<O>) -> Self {
        let (ptr, len) = cache.raw_parts();
        Self { ptr, len, geometry: cache.block_geometry(), raw: cache.raw_flag(), _owner: owner }
    }
}

// SAFETY: `ptr` and `len` are the cache's mapping (from `raw_parts`, valid for reads and
// writes), which lives as long as `_owner` (the promise of `KvRegion::new`), held here.
unsafe impl<O: Send + Sync + 'static> DeviceRegion for KvRegion<O> {
    fn memory(&self) -> (NonNull<u8>, usize) {
        (self.ptr, self.len)
    }

    fn num_blocks(&self) -> usize {
        self.geometry.num_blocks
    }

    fn slot_bytes(&self) -> usize {
        self.geometry.slot_bytes()
    }

    fn block_runs(&self, block: usize, runs: &mut Vec<Range<usize>>) -> Result<()> {
        geometry_runs(&self.geometry, block, runs)
    }

    fn raw_writes(&self) -> bool {
        self.raw.load(Ordering::Acquire)
    }

    fn note_raw_writes(&self) {
        self.raw.store(true, Ordering::Release);
    }
}

/// The whole storage of `cache`, writable.
pub(crate) fn cache_bytes_mut(cache: &mut KvCache) -> &mut [u8] {
    let (ptr, len) = cache.memory();
    // SAFETY: `memory` is valid for reads and writes of `len` bytes while the cache lives
    // (the `DeviceRegion` impl above), and the exclusive borrow of the cache, which the
    // slice keeps, excludes every other access to them: a job of the engine holds its
    // region in an `Arc`, out of reach of a `&mut`.
    unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) }
}
