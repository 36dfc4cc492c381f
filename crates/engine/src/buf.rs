//! Buffers of the store: [`AlignedBuf`] (from basalt-buf) for device I/O, [`SharedBuf`] for
//! data that lives in the cache and in a journal record at once, [`IoBuf`] for what a device
//! write holds until it completes.

pub use basalt_buf::{AlignedBuf, is_aligned};
use bytes::Bytes;

/// A shared, immutable aligned buffer: journaled blocks live in the cache and in the record
/// being written at the same time. Always starts on a 4 KiB boundary and is a multiple of 4 KiB
/// long, so it can be written with O_DIRECT.
#[derive(Clone, Debug)]
pub struct SharedBuf(Bytes);

impl AsRef<[u8]> for SharedBuf {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::Deref for SharedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl SharedBuf {
    pub fn new(buf: AlignedBuf) -> Self {
        SharedBuf(buf.into_bytes())
    }

    /// `data` itself, without copying, when it is aligned ([`is_aligned`]); else a copy.
    pub fn of(data: &Bytes) -> Self {
        if is_aligned(data) {
            SharedBuf(data.clone())
        } else {
            SharedBuf::new(AlignedBuf::copy_from(data))
        }
    }

    /// Whether both are the same memory (not merely equal bytes).
    pub fn same(&self, other: &SharedBuf) -> bool {
        self.0.as_ptr() == other.0.as_ptr() && self.0.len() == other.0.len()
    }

    /// Zero-copy `Bytes` view of `range` of the buffer.
    pub fn slice_bytes(&self, range: std::ops::Range<usize>) -> Bytes {
        self.0.slice(range)
    }
}

/// A buffer handed to a device write: owned or shared, its address is stable until completion.
#[derive(Debug)]
pub enum IoBuf {
    Owned(AlignedBuf),
    Shared(SharedBuf),
}

impl std::ops::Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            IoBuf::Owned(b) => b,
            IoBuf::Shared(b) => b,
        }
    }
}
