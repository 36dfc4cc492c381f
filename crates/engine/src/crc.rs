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

    /// crc-fast against the independent `crc32c` crate, on every length up to 9 KiB and
    /// unaligned starts.
    #[test]
    fn matches_crc32c_crate() {
        let data: Vec<u8> = (0..9000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for start in 0..8 {
            for len in (0..data.len() - start).step_by(37) {
                let s = &data[start..start + len];
                assert_eq!(crc32c(s), crc32c::crc32c(s), "start {start} len {len}");
            }
        }
    }

    #[test]
    fn skipping_equals_zeroed_field() {
        let mut buf: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let skipped = crc32c_skipping(&buf, 100);
        buf[100..104].copy_from_slice(&[0; 4]);
        assert_eq!(skipped, crc32c(&buf));
    }
}
