//! Little-endian field access for the on-disk formats. Every format in this crate is a fixed
//! little-endian layout (see docs/design/on-disk-format.md); no serde on disk.

/// Reads fixed-width little-endian fields from a slice at explicit offsets.
/// Every getter returns `None` past the end, so decoders never panic on short input.
#[derive(Clone, Copy)]
pub(crate) struct Le<'a>(pub &'a [u8]);

impl Le<'_> {
    pub fn u8(&self, at: usize) -> Option<u8> {
        self.0.get(at).copied()
    }
    pub fn u16(&self, at: usize) -> Option<u16> {
        Some(u16::from_le_bytes(self.0.get(at..at + 2)?.try_into().ok()?))
    }
    pub fn u32(&self, at: usize) -> Option<u32> {
        Some(u32::from_le_bytes(self.0.get(at..at + 4)?.try_into().ok()?))
    }
    pub fn u64(&self, at: usize) -> Option<u64> {
        Some(u64::from_le_bytes(self.0.get(at..at + 8)?.try_into().ok()?))
    }
    pub fn bytes16(&self, at: usize) -> Option<[u8; 16]> {
        self.0.get(at..at + 16)?.try_into().ok()
    }
}

/// Writes little-endian fields into a zeroed buffer at explicit offsets.
pub(crate) struct LeMut<'a>(pub &'a mut [u8]);

impl LeMut<'_> {
    pub fn u8(&mut self, at: usize, v: u8) {
        self.0[at] = v;
    }
    pub fn u16(&mut self, at: usize, v: u16) {
        self.0[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, at: usize, v: &[u8]) {
        self.0[at..at + v.len()].copy_from_slice(v);
    }
}
