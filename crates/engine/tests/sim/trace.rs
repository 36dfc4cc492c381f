//! A running hash of everything a simulated run did (operations, replies with their data,
//! virtual times, crash images, recovered states): two runs of one seed must give the same
//! hash, bit for bit.

/// FNV-1a over 64-bit words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trace(pub u64);

impl Default for Trace {
    fn default() -> Self {
        Trace(0xcbf2_9ce4_8422_2325)
    }
}

impl Trace {
    pub fn add(&mut self, tag: u64, vals: &[u64]) {
        for v in std::iter::once(tag).chain(vals.iter().copied()) {
            for b in v.to_le_bytes() {
                self.0 ^= u64::from(b);
                self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
            }
        }
    }

    /// A short digest of a byte buffer (hardware CRC-32C: fast for whole disk images).
    pub fn digest(bytes: &[u8]) -> u64 {
        u64::from(basalt_engine::crc32c(bytes)) | ((bytes.len() as u64) << 32)
    }
}
