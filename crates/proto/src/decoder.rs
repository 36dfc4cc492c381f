//! Incremental frame decoding from a receive buffer.

use crate::error::ProtoError;
use crate::frame::{FrameHeader, HEADER_LEN};
use bytes::{Buf, Bytes, BytesMut};

/// One whole frame: its checked header, body and data. `body` and `data` share the receive
/// buffer's allocation (no copy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub header: FrameHeader,
    pub body: Bytes,
    pub data: Bytes,
}

/// Splits frames off a byte stream.
///
/// Feed it the bytes read from a socket (append them to the `BytesMut` you pass in) and call
/// [`FrameDecoder::decode`] until it returns `Ok(None)`. An `Err` means the stream is corrupt or
/// hostile and the connection should be closed after an error reply.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    pending: Option<FrameHeader>,
}

impl FrameDecoder {
    pub fn new() -> Self {
        FrameDecoder::default()
    }

    /// Bytes still needed before the next frame can be returned (a hint for read sizing).
    pub fn bytes_needed(&self, buf: &BytesMut) -> usize {
        match &self.pending {
            Some(h) => (h.frame_len() - HEADER_LEN).saturating_sub(buf.len()),
            None => HEADER_LEN.saturating_sub(buf.len()),
        }
    }

    /// The body + data length of the frame whose header was decoded but whose payload has not
    /// fully arrived yet (a receiver can budget for it before reading it).
    pub fn pending_payload(&self) -> Option<usize> {
        self.pending
            .map(|h| h.body_len as usize + h.data_len as usize)
    }

    /// Returns the next whole frame in `buf`, removing its bytes, or `None` if more bytes are needed.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, ProtoError> {
        let header = match self.pending {
            Some(h) => h,
            None => {
                if buf.len() < HEADER_LEN {
                    return Ok(None);
                }
                let raw: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("length checked");
                let h = FrameHeader::decode(&raw)?;
                buf.advance(HEADER_LEN);
                self.pending = Some(h);
                h
            }
        };
        let payload_len = header.body_len as usize + header.data_len as usize;
        if buf.len() < payload_len {
            buf.reserve(payload_len - buf.len());
            return Ok(None);
        }
        self.pending = None;
        let mut payload = buf.split_to(payload_len).freeze();
        let body = payload.split_to(header.body_len as usize);
        let crc = crate::crc32c_two(&body, &payload);
        if crc != header.payload_crc {
            return Err(ProtoError::PayloadChecksum {
                expected: header.payload_crc,
                actual: crc,
            });
        }
        Ok(Some(Frame {
            header,
            body,
            data: payload,
        }))
    }
}
