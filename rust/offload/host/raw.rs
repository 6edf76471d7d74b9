//! A byte range reached through a raw pointer: memory that the transfer engine's threads
//! copy into and out of while its owner is elsewhere (a host tier's slots, a device
//! region's blocks). Bounds are checked here; who else may touch the bytes is the
//! caller's promise, made at each `unsafe` access.

use std::ops::Range;
use std::ptr::NonNull;

use crate::error::Result;
use crate::invalid;

/// `len` bytes from `ptr`: an address, not an owner. The value is only as good as the
/// promise made by [`RawBytes::new`]'s caller, so it is kept beside (in the same struct
/// as) whatever keeps the memory alive, and slices made from it borrow that struct.
#[derive(Clone, Copy, Debug)]
pub struct RawBytes {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `RawBytes` is an address and a length; every read or write through it is an
// `unsafe fn` whose caller guarantees, on whatever thread it runs, that the memory is
// alive and that no access conflicts with it.
unsafe impl Send for RawBytes {}
// SAFETY: as for `Send`: shared use hands out nothing without an `unsafe` promise.
unsafe impl Sync for RawBytes {}

impl RawBytes {
    /// The range of `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for reads and writes (its provenance permitting both) of `len`
    /// bytes for as long as the result, or any slice made from it, is used.
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        Self { ptr, len }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `Ok` when `r` lies inside `0..len` (an empty `r` anywhere up to `len` included).
    fn check(&self, r: &Range<usize>) -> Result<()> {
        if r.start > r.end || r.end > self.len {
            return Err(invalid!("byte range {r:?} outside 0..{}", self.len));
        }
        Ok(())
    }

    /// Bytes `r`, to read.
    ///
    /// Errors: `r` not inside `0..len`.
    ///
    /// # Safety
    ///
    /// Nothing may write bytes `r` while the slice lives.
    pub unsafe fn get(&self, r: Range<usize>) -> Result<&[u8]> {
        self.check(&r)?;
        // SAFETY: `r` lies inside the range `new` was promised valid for reads (checked
        // just above), and the caller promises no write to it while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(r.start), r.len()) })
    }

    /// Bytes `r`, to write.
    ///
    /// Errors: `r` not inside `0..len`.
    ///
    /// # Safety
    ///
    /// Nothing else may read or write bytes `r` while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get_mut(&self, r: Range<usize>) -> Result<&mut [u8]> {
        self.check(&r)?;
        // SAFETY: `r` lies inside the range `new` was promised valid for writes (checked
        // just above), and the caller promises this slice is the only access to it.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(r.start), r.len()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last byte is reachable, one past it is refused, empty ranges at the end pass.
    #[test]
    fn bounds_are_checked_at_the_last_byte() {
        let mut buf = vec![0u8; 16];
        let ptr = NonNull::new(buf.as_mut_ptr()).unwrap();
        // SAFETY: `buf` outlives `raw` and is only used through it below.
        let raw = unsafe { RawBytes::new(ptr, buf.len()) };
        // SAFETY: no other access to `buf` while these slices live.
        unsafe {
            raw.get_mut(15..16).unwrap()[0] = 7;
            assert_eq!(raw.get(0..16).unwrap()[15], 7);
            assert!(raw.get(16..16).unwrap().is_empty());
            assert!(raw.get(15..17).is_err());
            assert!(raw.get_mut(16..17).is_err());
            #[allow(clippy::reversed_empty_ranges)]
            let backwards = raw.get(3..2);
            assert!(backwards.is_err());
        }
        assert_eq!(buf[15], 7);
    }
}
