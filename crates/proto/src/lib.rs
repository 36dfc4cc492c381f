//! The Basalt client/node wire protocol, sans-io.
//!
//! Every message travels in a [`frame`]: a fixed 32-byte header (magic, protocol version, opcode,
//! flags, request id, lengths, payload CRC-32C and header CRC-32C) followed by a small fixed-layout
//! *body* and a bulk *data* part (write payloads, read results). The byte layout is in
//! `docs/design/wire-protocol.md`.
//!
//! Flow of one operation:
//! 1. The client encodes a [`Request`] with [`encode_request`] into a header+body buffer and a data
//!    `Bytes` that is written after it without copying.
//! 2. The node feeds received bytes to a [`FrameDecoder`], which returns whole [`Frame`]s (checked
//!    header CRC, length limits and payload CRC) split off the receive buffer without copying.
//! 3. [`Request::decode`] turns the frame into a typed request; the node answers with
//!    [`encode_response`] carrying the same request id, so replies may come back in any order.
//!
//! Every data-path request carries the sender's cluster-map [`Epoch`]; a node refuses a stale epoch
//! with [`ErrorCode::StaleEpoch`] and the epoch it knows.
//!
//! Start here: [`message`] (what is said), [`frame`] (how it is framed), [`decoder`].

pub mod decoder;
pub mod error;
pub mod frame;
mod fuzzing;
pub mod message;
pub mod outqueue;
pub mod replication;
pub mod service;

pub use basalt_types::Epoch;
pub use decoder::{Frame, FrameDecoder};
pub use error::{ErrorCode, ProtoError, WireError};
pub use frame::{FrameHeader, HEADER_LEN, MAGIC, MAX_BODY_LEN, MAX_DATA_LEN, PROTOCOL_VERSION};
pub use fuzzing::fuzz_decode_stream;
pub use message::{Request, RequestKind, Response, Session, encode_request, encode_response};
pub use outqueue::OutQueue;
pub use replication::{RepKind, RepOp};
pub use service::{ResponseFuture, Service};

/// CRC-32C (Castagnoli), the checksum used on the wire and on disk.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// CRC-32C over two buffers as if they were one, without concatenating them: the second
/// continues the first's state (combining two separate CRCs cost a quarter of a replicated
/// write's CPU).
pub fn crc32c_two(a: &[u8], b: &[u8]) -> u32 {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    digest.update(a);
    digest.update(b);
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_an_independent_implementation() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        assert_eq!(crc32c(&data), crc32c::crc32c(&data));
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        for split in [0, 1, 4095, 4096, 9999, 10_000] {
            let (a, b) = data.split_at(split);
            assert_eq!(crc32c_two(a, b), crc32c::crc32c(&data), "split at {split}");
        }
    }
}
