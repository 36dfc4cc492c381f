//! 4 KiB-aligned heap buffers for O_DIRECT I/O, and their zero-copy conversion to `Bytes`.
//!
//! A frontend that receives write data into an [`AlignedBuf`] (the NBD server does, for WRITE
//! payloads whole 4 KiB blocks long) hands the store `Bytes` it can write to the device as is;
//! [`is_aligned`] tells the store whether it can.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::Mutex;

/// Alignment of every buffer handed to the device (O_DIRECT needs the logical block size; 4 KiB
/// covers every device we support).
pub const ALIGN: usize = 4096;

/// An owned, zero-initialised, 4 KiB-aligned byte buffer whose length is a multiple of 4 KiB.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

/// Freed buffers of power-of-two sizes from 4 KiB to 4 MiB are kept for reuse: large
/// allocations would otherwise be mmap'ed, page-faulted and unmapped on every I/O.
const CLASSES: usize = 11;
const POOL_BYTES_PER_CLASS: usize = 64 << 20;
static POOL: [Mutex<Vec<usize>>; CLASSES] = [const { Mutex::new(Vec::new()) }; CLASSES];

fn class(len: usize) -> Option<usize> {
    (len.is_power_of_two() && (ALIGN..=ALIGN << (CLASSES - 1)).contains(&len))
        .then(|| (len.trailing_zeros() - ALIGN.trailing_zeros()) as usize)
}

impl AlignedBuf {
    /// A buffer of `len` bytes rounded up to a multiple of 4 KiB (at least 4 KiB) whose content
    /// is unspecified (initialised, possibly stale): for device reads that overwrite all of it.
    pub fn for_read(len: usize) -> AlignedBuf {
        let len = len.max(1).next_multiple_of(ALIGN);
        if let Some(c) = class(len)
            && let Some(addr) = POOL[c].lock().unwrap_or_else(|e| e.into_inner()).pop()
        {
            let ptr = NonNull::new(addr as *mut u8).expect("pooled pointers are non-null");
            return AlignedBuf { ptr, len };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer layout");
        // SAFETY: layout has non-zero size. Zeroed, so the memory is always initialised.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len }
    }

    /// A zeroed buffer of `len` bytes rounded up to a multiple of 4 KiB (at least 4 KiB).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let mut b = AlignedBuf::for_read(len);
        b.fill(0);
        b
    }

    /// A buffer holding a copy of `data`, zero-padded to a multiple of 4 KiB.
    pub fn copy_from(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::for_read(data.len());
        b[..data.len()].copy_from_slice(data);
        b[data.len()..].fill(0);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a buffer is at least 4 KiB.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Converts into `Bytes` without copying (the buffer becomes the owner).
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(c) = class(self.len) {
            let mut pool = POOL[c].lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() * self.len < POOL_BYTES_PER_CLASS {
                pool.push(self.ptr.as_ptr() as usize);
                return;
            }
        }
        let layout = Layout::from_size_align(self.len, ALIGN).expect("buffer layout");
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Whether `data` can go to an O_DIRECT device write as is: it starts on a 4 KiB boundary and
/// is a non-zero multiple of 4 KiB long.
pub fn is_aligned(data: &[u8]) -> bool {
    !data.is_empty()
        && (data.as_ptr() as usize).is_multiple_of(ALIGN)
        && data.len().is_multiple_of(ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let b = AlignedBuf::zeroed(5000);
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert!(b.iter().all(|&x| x == 0));
        let c = AlignedBuf::copy_from(b"abc");
        assert_eq!(&c[..3], b"abc");
        let bytes = c.into_bytes();
        assert_eq!(bytes.len(), 4096);
        assert_eq!(&bytes[..3], b"abc");
        assert!(is_aligned(&bytes));
        assert!(is_aligned(&bytes.slice(..4096)));
        assert!(!is_aligned(&bytes.slice(1..)));
        assert!(!is_aligned(&bytes.slice(..100)));
        assert!(!is_aligned(&[]));
    }
}
