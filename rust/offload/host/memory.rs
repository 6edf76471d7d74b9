//! The host tier's memory, shared with the transfer engine: one aligned, huge-page
//! advised buffer of `capacity` slots `stride` bytes apart, and what the engine is doing
//! with each slot ([`Use`]). The tier ([`super::HostTier`]) owns the allocation state;
//! the engine's jobs hold this by `Arc`, so the bytes outlive every job even if the tier
//! is dropped first.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use super::raw::RawBytes;
use crate::error::{filled, Result};
use crate::invalid;
use crate::kv::aligned::AlignedBuf;

/// Slots start this many bytes apart at least (a cache line): a slot's stride is its size
/// rounded up to it.
pub const SLOT_ALIGN: usize = 64;

/// What the transfer engine does with a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// No job touches it.
    Idle,
    /// This many jobs read it (loads into the device).
    Reading(u32),
    /// One job writes it (a store from the device).
    Writing,
}

/// The slots' bytes and their [`Use`]s.
pub struct HostMemory {
    /// The whole buffer, through the mapping's own pointer (see [`HostMemory::new`]).
    raw: RawBytes,
    slot_bytes: usize,
    stride: usize,
    capacity: usize,
    huge: bool,
    /// Locked to check or change a slot's use, never while copying.
    uses: Mutex<Vec<Use>>,
    /// Owns the mapping `raw` points into; never read through after `new`.
    _buf: AlignedBuf,
}

impl HostMemory {
    /// `capacity` zeroed slots of `slot_bytes` bytes.
    ///
    /// Errors (`InvalidArgument`): `slot_bytes` or `capacity` zero, `capacity` above
    /// `u32::MAX`, or more bytes than the host can map.
    pub fn new(slot_bytes: usize, capacity: usize) -> Result<Self> {
        if slot_bytes == 0 {
            return Err(invalid!("slot_bytes must be >= 1, got 0"));
        }
        if capacity == 0 || capacity > u32::MAX as usize {
            return Err(invalid!("capacity_slots must be in 1..={}, got {capacity}", u32::MAX));
        }
        let stride = stride_for(slot_bytes)?;
        let total = stride
            .checked_mul(capacity)
            .ok_or_else(|| invalid!("capacity_slots: {capacity} slots of {stride} bytes overflow the address space"))?;
        let mut buf = AlignedBuf::zeroed(total).map_err(|_| {
            invalid!("capacity_slots: cannot allocate {capacity} slots of {stride} bytes ({:.1} GiB)", total as f64 / (1u64 << 30) as f64)
        })?;
        let uses = Mutex::new(filled(Use::Idle, capacity, "capacity_slots")?);
        let ptr = NonNull::new(buf.as_mut_ptr()).ok_or_else(|| invalid!("capacity_slots: the host returned no memory"))?;
        // SAFETY: `as_mut_ptr` is the mapping's own pointer (write provenance over all
        // `total` bytes); the mapping lives, unmoved, as long as `_buf`, i.e. as long as
        // `self`, and `raw` is a field of `self`.
        let raw = unsafe { RawBytes::new(ptr, total) };
        let huge = buf.huge_pages();
        Ok(Self { raw, slot_bytes, stride, capacity, huge, uses, _buf: buf })
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes mapped: `capacity * stride`.
    pub fn bytes(&self) -> usize {
        self.raw.len()
    }

    /// Whether the kernel took the huge-page advice.
    pub fn huge_pages(&self) -> bool {
        self.huge
    }

    /// Where slot `index` sits in the buffer (an empty range past the end when out of
    /// range, which every access refuses).
    pub fn slot_range(&self, index: usize) -> Range<usize> {
        match index.checked_mul(self.stride) {
            Some(at) if index < self.capacity => at..at + self.slot_bytes,
            _ => self.raw.len() + 1..self.raw.len() + 1,
        }
    }

    /// The whole buffer, for the engine's copies (offsets from [`Self::slot_range`]).
    pub fn raw(&self) -> &RawBytes {
        &self.raw
    }

    fn uses(&self) -> MutexGuard<'_, Vec<Use>> {
        self.uses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Slot `index`'s use now.
    pub fn use_of(&self, index: usize) -> Use {
        self.uses().get(index).copied().unwrap_or(Use::Idle)
    }

    /// Mark `reads` as read and `writes` as written by one more job each: all or none.
    ///
    /// Errors: a slot out of range, a read of a slot being written, a write of a slot
    /// in use (nothing marked).
    pub fn acquire(&self, reads: &[u32], writes: &[u32]) -> Result<()> {
        let mut uses = self.uses();
        for &i in reads {
            match uses.get(i as usize) {
                None => return Err(invalid!("slot {i} out of range 0..{}", self.capacity)),
                Some(Use::Writing) => return Err(invalid!("slot {i} is being written by a transfer in flight")),
                Some(_) => {}
            }
        }
        for &i in writes {
            match uses.get(i as usize) {
                None => return Err(invalid!("slot {i} out of range 0..{}", self.capacity)),
                Some(Use::Idle) => {}
                Some(_) => return Err(invalid!("slot {i} is used by a transfer in flight")),
            }
        }
        for &i in reads {
            let u = &mut uses[i as usize];
            *u = match *u {
                Use::Reading(n) => Use::Reading(n.saturating_add(1)),
                _ => Use::Reading(1),
            };
        }
        for &i in writes {
            uses[i as usize] = Use::Writing;
        }
        Ok(())
    }

    /// Undo one [`Self::acquire`] of the same slots (a job finished).
    pub fn release(&self, reads: &[u32], writes: &[u32]) {
        let mut uses = self.uses();
        for &i in reads {
            if let Some(u) = uses.get_mut(i as usize) {
                *u = match *u {
                    Use::Reading(n) if n > 1 => Use::Reading(n - 1),
                    _ => Use::Idle,
                };
            }
        }
        for &i in writes {
            if let Some(u) = uses.get_mut(i as usize) {
                *u = Use::Idle;
            }
        }
    }
}

/// `slot_bytes` rounded up to [`SLOT_ALIGN`].
pub fn stride_for(slot_bytes: usize) -> Result<usize> {
    slot_bytes
        .checked_next_multiple_of(SLOT_ALIGN)
        .ok_or_else(|| invalid!("slot_bytes: {slot_bytes} bytes overflow the address space"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uses_are_all_or_none_and_counted() {
        let m = HostMemory::new(100, 4).unwrap();
        assert_eq!(m.bytes(), 512);
        assert_eq!(m.slot_range(3), 384..484);
        assert!(m.slot_range(4).start > m.bytes());
        m.acquire(&[0, 1], &[2]).unwrap();
        m.acquire(&[0], &[]).unwrap();
        assert_eq!(m.use_of(0), Use::Reading(2));
        // A write of a read slot, a read of a written one, an index out of range: refused
        // and nothing else marked.
        assert!(m.acquire(&[], &[3, 0]).is_err());
        assert!(m.acquire(&[3, 2], &[]).is_err());
        assert!(m.acquire(&[4], &[]).is_err());
        assert_eq!(m.use_of(3), Use::Idle);
        m.release(&[0, 1], &[2]);
        assert_eq!((m.use_of(0), m.use_of(1), m.use_of(2)), (Use::Reading(1), Use::Idle, Use::Idle));
        m.release(&[0], &[]);
        assert_eq!(m.use_of(0), Use::Idle);
    }
}
