//! The frame header: 32 bytes, little-endian, checksummed.
//!
//! ```text
//!  0       4   5   6       8               16      20      24      28      32
//!  +-------+---+---+-------+---------------+-------+-------+-------+-------+
//!  | magic |ver|op | flags |  request id   | body  | data  |payload|header |
//!  |"BSLT" |   |   |       |               |  len  |  len  |  crc  |  crc  |
//!  +-------+---+---+-------+---------------+-------+-------+-------+-------+
//! ```
//! `payload crc` is CRC-32C over body ‖ data; `header crc` is CRC-32C over bytes 0..28.

use crate::error::ProtoError;
use bytes::{Buf, BufMut};

/// `"BSLT"` as the first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"BSLT";
/// The protocol version this build speaks. Bumped on any incompatible change.
pub const PROTOCOL_VERSION: u8 = 5;
/// Header length in bytes.
pub const HEADER_LEN: usize = 32;
/// Largest fixed-layout body accepted (bodies are a few dozen bytes; error messages are capped).
pub const MAX_BODY_LEN: u32 = 4096;
/// Largest data part accepted: 32 MiB (objects are at most 4 MiB; admin replies can be larger).
pub const MAX_DATA_LEN: u32 = 32 << 20;

/// Flag: the frame is a response to the request with the same id.
pub const FLAG_RESPONSE: u16 = 1 << 0;
/// Flag: the response is an error (the body is a [`crate::WireError`]).
pub const FLAG_ERROR: u16 = 1 << 1;
/// Flag: force unit access: the write is durable before it is acknowledged.
pub const FLAG_FUA: u16 = 1 << 2;
/// Every flag this version knows; others are refused.
pub const KNOWN_FLAGS: u16 = FLAG_RESPONSE | FLAG_ERROR | FLAG_FUA;

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub version: u8,
    pub opcode: u8,
    pub flags: u16,
    pub request_id: u64,
    pub body_len: u32,
    pub data_len: u32,
    pub payload_crc: u32,
}

impl FrameHeader {
    /// Total frame length on the wire.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.body_len as usize + self.data_len as usize
    }

    pub fn is_response(&self) -> bool {
        self.flags & FLAG_RESPONSE != 0
    }

    pub fn is_error(&self) -> bool {
        self.flags & FLAG_ERROR != 0
    }

    /// Appends the 32 header bytes to `out`.
    pub fn encode(&self, out: &mut impl BufMut) {
        let mut raw = [0u8; HEADER_LEN];
        let mut w = &mut raw[..];
        w.put_slice(&MAGIC);
        w.put_u8(self.version);
        w.put_u8(self.opcode);
        w.put_u16_le(self.flags);
        w.put_u64_le(self.request_id);
        w.put_u32_le(self.body_len);
        w.put_u32_le(self.data_len);
        w.put_u32_le(self.payload_crc);
        let crc = crate::crc32c(&raw[..28]);
        raw[28..].copy_from_slice(&crc.to_le_bytes());
        out.put_slice(&raw);
    }

    /// Decodes and checks a header: magic, header CRC, version, flags and length limits.
    pub fn decode(raw: &[u8; HEADER_LEN]) -> Result<FrameHeader, ProtoError> {
        if raw[..4] != MAGIC {
            return Err(ProtoError::BadMagic([raw[0], raw[1], raw[2], raw[3]]));
        }
        let stored_crc = u32::from_le_bytes([raw[28], raw[29], raw[30], raw[31]]);
        let crc = crate::crc32c(&raw[..28]);
        if crc != stored_crc {
            return Err(ProtoError::HeaderChecksum {
                expected: stored_crc,
                actual: crc,
            });
        }
        let mut r = &raw[4..28];
        let header = FrameHeader {
            version: r.get_u8(),
            opcode: r.get_u8(),
            flags: r.get_u16_le(),
            request_id: r.get_u64_le(),
            body_len: r.get_u32_le(),
            data_len: r.get_u32_le(),
            payload_crc: r.get_u32_le(),
        };
        if header.version != PROTOCOL_VERSION {
            return Err(ProtoError::UnsupportedVersion(header.version));
        }
        if header.flags & !KNOWN_FLAGS != 0 {
            return Err(ProtoError::UnknownFlags(header.flags));
        }
        if header.body_len > MAX_BODY_LEN {
            return Err(ProtoError::TooLarge {
                what: "body",
                len: header.body_len as u64,
                max: MAX_BODY_LEN as u64,
            });
        }
        if header.data_len > MAX_DATA_LEN {
            return Err(ProtoError::TooLarge {
                what: "data",
                len: header.data_len as u64,
                max: MAX_DATA_LEN as u64,
            });
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FrameHeader {
        FrameHeader {
            version: PROTOCOL_VERSION,
            opcode: 3,
            flags: FLAG_FUA,
            request_id: 0x0102_0304_0506_0708,
            body_len: 32,
            data_len: 4096,
            payload_crc: 0xdead_beef,
        }
    }

    #[test]
    fn round_trip_and_layout() {
        let mut out = Vec::new();
        sample().encode(&mut out);
        assert_eq!(out.len(), HEADER_LEN);
        assert_eq!(&out[..4], b"BSLT");
        assert_eq!(out[5], 3);
        assert_eq!(&out[8..16], &0x0102_0304_0506_0708u64.to_le_bytes());
        let raw: [u8; HEADER_LEN] = out.try_into().unwrap();
        assert_eq!(FrameHeader::decode(&raw).unwrap(), sample());
    }

    #[test]
    fn every_single_bit_flip_is_caught() {
        let mut out = Vec::new();
        sample().encode(&mut out);
        for bit in 0..HEADER_LEN * 8 {
            let mut raw: [u8; HEADER_LEN] = out.clone().try_into().unwrap();
            raw[bit / 8] ^= 1 << (bit % 8);
            assert!(
                FrameHeader::decode(&raw).is_err(),
                "bit {bit} flip accepted"
            );
        }
    }

    #[test]
    fn limits_are_enforced() {
        let mut h = sample();
        h.data_len = MAX_DATA_LEN + 1;
        let mut out = Vec::new();
        h.encode(&mut out);
        let raw: [u8; HEADER_LEN] = out.try_into().unwrap();
        assert!(matches!(
            FrameHeader::decode(&raw),
            Err(ProtoError::TooLarge { what: "data", .. })
        ));
        let mut h = sample();
        h.version = 9;
        let mut out = Vec::new();
        h.encode(&mut out);
        let raw: [u8; HEADER_LEN] = out.try_into().unwrap();
        assert_eq!(
            FrameHeader::decode(&raw),
            Err(ProtoError::UnsupportedVersion(9))
        );
    }
}
