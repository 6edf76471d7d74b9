//! The host tier (G2): cached KV blocks evicted from the device pool, kept in host memory
//! until a prefix hit copies them back.
//!
//! A [`HostTier`] is a slab of fixed-size slots in its own memory budget (given in slots
//! or in bytes), one aligned, huge-page advised mapping (as a `KvCache`'s), zeroed lazily
//! by the kernel. A slot holds one block's bytes across all layers in the order of
//! [`crate::offload::transfer::pack`]; the tier only stores bytes and knows nothing of
//! layouts. Which blocks live here, and which slot is freed when the tier is full, is the
//! caller's policy: [`HostTier::alloc`] returns `None` when every slot is taken.
//!
//! A [`Slot`] is a small `Copy` ticket (tier, index, generation): freeing it twice, using
//! it after its slot was freed (and perhaps handed out again), or giving it to another
//! tier is a typed error, never a panic or another block's bytes.
//!
//! The transfer engine copies into and out of slots on its own threads; while a job is
//! in flight its slots are marked in the shared memory, and the tier refuses what would
//! race with it: reading a slot being written, writing or freeing a slot in use.

pub(crate) mod memory;
pub(crate) mod raw;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use self::memory::{stride_for, HostMemory, Use};
use crate::error::{filled, vec_for, Result};
use crate::invalid;

pub use self::memory::SLOT_ALIGN;

/// Source of tier identities (a counter, so `Relaxed`): a [`Slot`] names its tier.
static NEXT_TIER: AtomicU64 = AtomicU64::new(1);

/// One allocated slot of one [`HostTier`]: a ticket, valid from [`HostTier::alloc`] to
/// its [`HostTier::free`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    tier: u64,
    index: u32,
    generation: u32,
}

impl Slot {
    /// Position of the slot in its tier, `0..capacity` (reused after a free).
    pub fn index(&self) -> usize {
        self.index as usize
    }
}

/// Bookkeeping of one slot.
#[derive(Clone, Copy, Debug, Default)]
struct SlotState {
    /// Bumped at each `alloc`, so a ticket of an earlier allocation no longer matches.
    generation: u32,
    live: bool,
    /// The bytes may hold codes a `KvCache` write never makes (written through
    /// [`HostTier::slot_mut`], or stored from a cache that noted raw writes): a load
    /// must pass the note on (`KvCache::note_raw_writes`).
    raw_codes: bool,
}

/// A slab of `capacity` slots of `slot_bytes` bytes in host memory.
pub struct HostTier {
    id: u64,
    memory: Arc<HostMemory>,
    slots: Vec<SlotState>,
    /// Free slot indices, popped from the end (so the lowest index goes first).
    free: Vec<u32>,
}

impl std::fmt::Debug for HostTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, used, bytes) = (self.capacity(), self.used(), self.slot_bytes());
        write!(f, "HostTier({used}/{n} slots of {bytes} bytes)")
    }
}

impl HostTier {
    /// A tier of `capacity_slots` slots of `slot_bytes` bytes each (slots start
    /// [`SLOT_ALIGN`] bytes apart at least: [`Self::bytes`] is the memory it maps).
    ///
    /// Errors (`InvalidArgument` naming the argument, nothing allocated): `slot_bytes` or
    /// `capacity_slots` zero, `capacity_slots > u32::MAX`, or a budget the host cannot
    /// map.
    pub fn new(slot_bytes: usize, capacity_slots: usize) -> Result<Self> {
        let memory = Arc::new(HostMemory::new(slot_bytes, capacity_slots)?);
        let slots = filled(SlotState::default(), capacity_slots, "capacity_slots")?;
        let mut free = vec_for(capacity_slots, "capacity_slots")?;
        free.extend((0..capacity_slots as u32).rev());
        Ok(Self { id: NEXT_TIER.fetch_add(1, Ordering::Relaxed), memory, slots, free })
    }

    /// A tier of as many slots of `slot_bytes` bytes as `budget_bytes` holds (each slot
    /// taking its size rounded up to [`SLOT_ALIGN`]).
    ///
    /// Errors (`InvalidArgument`): a budget that holds no slot, and those of [`Self::new`].
    pub fn with_budget_bytes(slot_bytes: usize, budget_bytes: usize) -> Result<Self> {
        if slot_bytes == 0 {
            return Err(invalid!("slot_bytes must be >= 1, got 0"));
        }
        let stride = stride_for(slot_bytes)?;
        let n = budget_bytes / stride;
        if n == 0 {
            return Err(invalid!("budget_bytes: {budget_bytes} bytes hold no slot of {slot_bytes} bytes ({stride} with alignment)"));
        }
        Self::new(slot_bytes, n)
    }

    /// Bytes of one slot (one block across all layers).
    pub fn slot_bytes(&self) -> usize {
        self.memory.slot_bytes()
    }

    /// Slots in the tier.
    pub fn capacity(&self) -> usize {
        self.memory.capacity()
    }

    /// Slots allocated now.
    pub fn used(&self) -> usize {
        self.capacity() - self.free.len()
    }

    /// Bytes of host memory the tier maps: `capacity` slots at their aligned stride.
    pub fn bytes(&self) -> usize {
        self.memory.bytes()
    }

    /// Whether the kernel took the huge-page advice for the tier's memory.
    pub fn huge_pages(&self) -> bool {
        self.memory.huge_pages()
    }

    /// A free slot, or `None` when all `capacity` are allocated. Its bytes are what the
    /// slot last held (zero at first): a store or [`Self::slot_mut`] fills it.
    pub fn alloc(&mut self) -> Option<Slot> {
        let index = self.free.pop()?;
        let s = &mut self.slots[index as usize];
        s.generation = s.generation.wrapping_add(1);
        s.live = true;
        Some(Slot { tier: self.id, index, generation: s.generation })
    }

    /// Return `slot` to the free list.
    ///
    /// Errors (`InvalidArgument`, nothing changed): a slot of another tier, one already
    /// freed (double free) or reallocated since, or one a transfer in flight uses.
    pub fn free(&mut self, slot: Slot) -> Result<()> {
        let i = self.check(&slot)?;
        if self.memory.use_of(i) != Use::Idle {
            return Err(invalid!("slot {i} is used by a transfer in flight: wait for its handle before freeing it"));
        }
        self.slots[i].live = false;
        self.free.push(slot.index);
        Ok(())
    }

    /// The `slot_bytes` bytes of `slot`.
    ///
    /// Errors (`InvalidArgument`): a slot not live in this tier (see [`Self::free`]), or
    /// one a transfer in flight is writing.
    pub fn slot(&self, slot: &Slot) -> Result<&[u8]> {
        let i = self.check(slot)?;
        if self.memory.use_of(i) == Use::Writing {
            return Err(invalid!("slot {i} is being written by a transfer in flight"));
        }
        // SAFETY: no job writes slot `i` now (checked above), and none can start while
        // the returned slice borrows `self`: submitting a job takes `&mut HostTier`.
        unsafe { self.memory.raw().get(self.memory.slot_range(i)) }
    }

    /// The `slot_bytes` bytes of `slot`, to fill (e.g. by `pack`). The slot is then taken
    /// to hold any bytes: a later engine load from it marks the cache
    /// (`KvCache::note_raw_writes`).
    ///
    /// Errors (`InvalidArgument`): a slot not live in this tier, or one a transfer in
    /// flight uses.
    pub fn slot_mut(&mut self, slot: &Slot) -> Result<&mut [u8]> {
        let i = self.check(slot)?;
        if self.memory.use_of(i) != Use::Idle {
            return Err(invalid!("slot {i} is used by a transfer in flight"));
        }
        self.slots[i].raw_codes = true;
        // SAFETY: no job reads or writes slot `i` now (checked above), none can start
        // while the slice borrows `self` mutably, and `&mut self` excludes every other
        // borrow of the tier's slots.
        unsafe { self.memory.raw().get_mut(self.memory.slot_range(i)) }
    }

    /// Whether a transfer in flight reads or writes `slot`.
    ///
    /// Errors: a slot not live in this tier.
    pub fn in_flight(&self, slot: &Slot) -> Result<bool> {
        let i = self.check(slot)?;
        Ok(self.memory.use_of(i) != Use::Idle)
    }

    /// The index of a live slot of this tier.
    ///
    /// Errors (`InvalidArgument`): another tier's slot, a freed one (double free), or a
    /// ticket of an earlier allocation of the same index.
    pub(crate) fn check(&self, slot: &Slot) -> Result<usize> {
        if slot.tier != self.id {
            return Err(invalid!("slot {} belongs to another host tier", slot.index));
        }
        let i = slot.index as usize;
        match self.slots.get(i) {
            None => Err(invalid!("slot {i} out of range 0..{}", self.capacity())),
            Some(s) if !s.live => Err(invalid!("slot {i} is free (double free, or used after free)")),
            Some(s) if s.generation != slot.generation => Err(invalid!("slot {i} was freed and allocated again since this ticket")),
            Some(_) => Ok(i),
        }
    }

    /// The memory the engine's jobs hold.
    pub(crate) fn memory(&self) -> &Arc<HostMemory> {
        &self.memory
    }

    /// Whether slot `index` may hold codes a cache write never makes.
    pub(crate) fn raw_codes(&self, index: usize) -> bool {
        self.slots.get(index).is_some_and(|s| s.raw_codes)
    }

    /// Record what slot `index` will hold once a store completes.
    pub(crate) fn set_raw_codes(&mut self, index: usize, raw: bool) {
        if let Some(s) = self.slots.get_mut(index) {
            s.raw_codes = raw;
        }
    }
}
