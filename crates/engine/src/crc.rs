//! CRC-32C (Castagnoli, the iSCSI polynomial), hardware accelerated by `crc-fast`.
//! A test checks it against the independent `crc32c` crate.

/// CRC-32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// CRC-32C of a buffer whose 4-byte checksum field at `field` is treated as zero.
pub(crate) fn crc32c_skipping(data: &[u8], field: usize) -> u32 {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    d.update(&data[..field]);
    d.update(&[0u8; 4]);
    d.update(&data[field + 4..]);
    d.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn skipping_equals_zeroed_field() {
        let mut buf: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let skipped = crc32c_skipping(&buf, 100);
        buf[100..104].copy_from_slice(&[0; 4]);
        assert_eq!(skipped, crc32c(&buf));
    }
}
