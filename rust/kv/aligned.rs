//! Zero-initialised, 2 MiB-aligned memory advised for transparent huge pages.
//!
//! Decode attention streams the whole KV cache once per step, so TLB misses on 4 KiB
//! pages cost a large share of the read bandwidth (measured on the target machine: about
//! 32 GB/s on one core with 2 MiB pages, 18-20 GB/s with 4 KiB pages). `madvise
//! (MADV_HUGEPAGE)` only applies to whole 2 MiB-aligned ranges, so the mapping is
//! over-allocated by 2 MiB and trimmed to an aligned start.
//!
//! Anonymous mappings are zero-filled lazily by the kernel, so nothing is touched here
//! and the first touch of each 2 MiB range can be served by a huge page. Where mmap or
//! madvise is unavailable (non-Linux, THP disabled) the buffer still works, just with
//! whatever pages the system gives: [`AlignedBuf::huge_pages`] says which.

use crate::error::Result;
use crate::invalid;

/// Huge-page size and alignment of every buffer, in bytes.
pub const HUGE_PAGE: usize = 2 << 20;

/// An owned, zeroed byte buffer whose start is [`HUGE_PAGE`]-aligned.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    /// Bytes actually reserved (len rounded up), what `drop` releases.
    cap: usize,
    huge: bool,
}

// SAFETY: AlignedBuf uniquely owns its memory (like Vec<u8>); shared access only hands
// out `&[u8]` and mutable access needs `&mut self`.
unsafe impl Send for AlignedBuf {}
// SAFETY: see `Send`; `&AlignedBuf` only allows reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocate `len` zeroed bytes (at least one huge page is reserved when `len > 0`).
    pub fn zeroed(len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Self { ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(), len: 0, cap: 0, huge: false });
        }
        let cap = len
            .checked_next_multiple_of(HUGE_PAGE)
            .filter(|&c| c <= isize::MAX as usize / 2)
            .ok_or_else(|| invalid!("cannot allocate {len} bytes"))?;
        let (ptr, huge) = sys::alloc(cap).ok_or_else(|| invalid!("out of memory allocating {cap} bytes"))?;
        Ok(Self { ptr, len, cap, huge })
    }

    /// Whether the kernel accepted the huge-page advice for the whole buffer.
    pub fn huge_pages(&self) -> bool {
        self.huge
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// The mapping's own pointer (valid for reads and writes of `len()` bytes while the
    /// buffer lives, never moved) and its length, for code that copies through raw
    /// pointers under its own rules (`offload::transfer`).
    pub fn raw_parts(&self) -> (std::ptr::NonNull<u8>, usize) {
        match std::ptr::NonNull::new(self.ptr) {
            Some(p) => (p, self.len),
            None => (std::ptr::NonNull::dangling(), 0),
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for `len` initialised (zeroed) bytes for the life of self;
        // for len == 0 it is a non-null dangling pointer, which from_raw_parts allows.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.cap > 0 {
            sys::free(self.ptr, self.cap);
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes, huge_pages={})", self.len, self.huge)
    }
}

#[cfg(unix)]
mod sys {
    use super::HUGE_PAGE;

    /// Map `cap + HUGE_PAGE` bytes, unmap the unaligned head and the tail, advise the rest.
    pub fn alloc(cap: usize) -> Option<(*mut u8, bool)> {
        let span = cap + HUGE_PAGE;
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let addr = base as usize;
        let start = addr.next_multiple_of(HUGE_PAGE);
        let head = start - addr;
        let tail = span - head - cap;
        // SAFETY: both ranges lie inside the mapping just created and are page-aligned
        // (mmap returns page-aligned addresses; HUGE_PAGE and cap are page multiples).
        unsafe {
            if head > 0 {
                libc::munmap(base, head);
            }
            if tail > 0 {
                libc::munmap((start + cap) as *mut libc::c_void, tail);
            }
        }
        let huge = advise(start as *mut libc::c_void, cap);
        Some((start as *mut u8, huge))
    }

    #[cfg(target_os = "linux")]
    fn advise(ptr: *mut libc::c_void, len: usize) -> bool {
        // SAFETY: [ptr, ptr+len) is a live mapping owned by the caller; madvise only
        // changes paging policy, and failure (THP disabled) is harmless.
        unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) == 0 }
    }

    #[cfg(not(target_os = "linux"))]
    fn advise(_ptr: *mut libc::c_void, _len: usize) -> bool {
        false
    }

    pub fn free(ptr: *mut u8, cap: usize) {
        // SAFETY: (ptr, cap) is exactly the aligned range kept by `alloc`.
        unsafe {
            libc::munmap(ptr.cast(), cap);
        }
    }
}

#[cfg(not(unix))]
mod sys {
    use super::HUGE_PAGE;
    use std::alloc::{alloc_zeroed, dealloc, Layout};

    pub fn alloc(cap: usize) -> Option<(*mut u8, bool)> {
        let layout = Layout::from_size_align(cap, HUGE_PAGE).ok()?;
        // SAFETY: cap > 0 (checked by the caller), the layout is valid.
        let p = unsafe { alloc_zeroed(layout) };
        (!p.is_null()).then_some((p, false))
    }

    pub fn free(ptr: *mut u8, cap: usize) {
        if let Ok(layout) = Layout::from_size_align(cap, HUGE_PAGE) {
            // SAFETY: allocated by `alloc` with this very layout.
            unsafe { dealloc(ptr, layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_writable_to_the_last_byte() {
        for len in [1usize, 4095, HUGE_PAGE, HUGE_PAGE + 1, 3 * HUGE_PAGE - 7] {
            let mut b = AlignedBuf::zeroed(len).unwrap();
            assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
            assert_eq!(b.len(), len);
            let s = b.as_mut_slice();
            assert!(s.iter().all(|&x| x == 0));
            s[0] = 1;
            s[len - 1] = 2;
            assert_eq!(b.as_slice()[len - 1], 2);
        }
    }

    #[test]
    fn empty_and_absurd_sizes() {
        let b = AlignedBuf::zeroed(0).unwrap();
        assert!(b.is_empty() && b.as_slice().is_empty());
        assert!(AlignedBuf::zeroed(usize::MAX - 5).is_err());
    }
}
