//! Transmission requests, sans-io: [`RequestDecoder`] cuts the client's byte stream into
//! requests (a WRITE payload of whole 4 KiB blocks lands in a 4 KiB-aligned buffer, which the
//! store writes to the device without copying; the connection reads large ones straight into
//! it, see [`RequestDecoder::direct_buf`]), and [`validate`]
//! checks one against the export's [`ExportCaps`], giving a [`Command`] or an error value.
//!
//! ```text
//! request: magic 0x25609513 u32 | flags u16 | type u16 | cookie u64 | offset u64 | length u32
//!          | length bytes of data (WRITE only)
//! ```

use crate::caps::ExportCaps;
use crate::wire::{self, REQUEST_HEADER_LEN, cflag, cmd, errno};
use basalt_buf::AlignedBuf;
use bytes::{Buf, Bytes, BytesMut};

/// The fixed 28-byte part of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl RequestHeader {
    /// Parses a header; `Err(magic)` when the magic is wrong.
    pub fn parse(b: &[u8]) -> Result<Self, u32> {
        let mut b = &b[..REQUEST_HEADER_LEN];
        let magic = b.get_u32();
        if magic != wire::REQUEST_MAGIC {
            return Err(magic);
        }
        Ok(RequestHeader {
            flags: b.get_u16(),
            kind: b.get_u16(),
            cookie: b.get_u64(),
            offset: b.get_u64(),
            len: b.get_u32(),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut b = [0u8; REQUEST_HEADER_LEN];
        b[0..4].copy_from_slice(&wire::REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// What the decoder produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A whole request; `payload` is the WRITE data (empty for other commands).
    Request(RequestHeader, Bytes),
    /// A WRITE longer than the maximum payload; its data was read and dropped.
    Oversized(RequestHeader),
}

/// The stream cannot be parsed any further; the connection must be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("request magic {0:#010x} is not 0x25609513; the stream is out of step")]
    BadMagic(u32),
}

/// A skipped payload is read in pieces of at most this size.
const SKIP_CHUNK: usize = 64 << 10;

#[derive(Debug, Clone, Copy)]
enum State {
    Header,
    /// A payload cut from the receive buffer.
    Payload(RequestHeader),
    /// A payload of whole 4 KiB blocks, filled into `RequestDecoder::aligned` up to `.1`.
    Aligned(RequestHeader, usize),
    Skip(RequestHeader, u32),
}

/// Incremental request decoder.
#[derive(Debug)]
pub struct RequestDecoder {
    max_payload: u32,
    state: State,
    /// The buffer of an `Aligned` payload being received.
    aligned: Option<AlignedBuf>,
}

impl RequestDecoder {
    pub fn new(max_payload: u32) -> Self {
        RequestDecoder {
            max_payload,
            state: State::Header,
            aligned: None,
        }
    }

    /// The unfilled part of the aligned payload being received, when the receive buffer has
    /// nothing more for it (call after [`RequestDecoder::decode`] returned `None`): the caller may
    /// read the socket straight into it and report the bytes with [`RequestDecoder::filled`].
    pub fn direct_buf(&mut self) -> Option<&mut [u8]> {
        let State::Aligned(h, done) = self.state else {
            return None;
        };
        let buf = self.aligned.as_mut()?;
        Some(&mut buf[done..h.len as usize])
    }

    /// Records `n` bytes read into [`RequestDecoder::direct_buf`].
    pub fn filled(&mut self, n: usize) {
        if let State::Aligned(h, done) = self.state {
            self.state = State::Aligned(h, (done + n).min(h.len as usize));
        }
    }

    /// Takes the next request out of `buf`; `Ok(None)` when more bytes are needed.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Incoming>, DecodeError> {
        loop {
            match self.state {
                State::Header => {
                    if buf.len() < REQUEST_HEADER_LEN {
                        return Ok(None);
                    }
                    let h = RequestHeader::parse(buf).map_err(DecodeError::BadMagic)?;
                    buf.advance(REQUEST_HEADER_LEN);
                    if h.kind != cmd::WRITE || h.len == 0 {
                        return Ok(Some(Incoming::Request(h, Bytes::new())));
                    }
                    self.state = if h.len > self.max_payload {
                        State::Skip(h, h.len)
                    } else if (h.len as usize).is_multiple_of(basalt_buf::ALIGN) {
                        self.aligned = Some(AlignedBuf::for_read(h.len as usize));
                        State::Aligned(h, 0)
                    } else {
                        State::Payload(h)
                    };
                }
                State::Aligned(h, done) => {
                    let len = h.len as usize;
                    let n = (len - done).min(buf.len());
                    let dst = self
                        .aligned
                        .as_mut()
                        .expect("an aligned payload has its buffer");
                    dst[done..done + n].copy_from_slice(&buf[..n]);
                    buf.advance(n);
                    if done + n < len {
                        self.state = State::Aligned(h, done + n);
                        return Ok(None);
                    }
                    self.state = State::Header;
                    let data = self.aligned.take().expect("checked above").into_bytes();
                    return Ok(Some(Incoming::Request(h, data)));
                }
                State::Payload(h) => {
                    if buf.len() < h.len as usize {
                        return Ok(None);
                    }
                    self.state = State::Header;
                    let data = buf.split_to(h.len as usize).freeze();
                    return Ok(Some(Incoming::Request(h, data)));
                }
                State::Skip(h, remaining) => {
                    let n = (remaining as usize).min(buf.len());
                    buf.advance(n);
                    let remaining = remaining - n as u32;
                    if remaining > 0 {
                        self.state = State::Skip(h, remaining);
                        return Ok(None);
                    }
                    self.state = State::Header;
                    return Ok(Some(Incoming::Oversized(h)));
                }
            }
        }
    }

    /// Bytes still needed to finish the request being decoded, beyond the `buffered` ones
    /// (a header's length when between requests; at most 64 KiB of a payload being skipped).
    /// Sizes the next read.
    pub fn needed(&self, buffered: usize) -> usize {
        let total = match self.state {
            State::Header => REQUEST_HEADER_LEN,
            State::Payload(h) => h.len as usize,
            State::Aligned(h, done) => h.len as usize - done,
            State::Skip(_, remaining) => (remaining as usize).min(SKIP_CHUNK),
        };
        total.saturating_sub(buffered)
    }

    /// True when no request is partly received (with an empty buffer, EOF here is clean).
    pub fn at_boundary(&self) -> bool {
        matches!(self.state, State::Header)
    }
}

/// A validated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        data: Bytes,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    },
    Disconnect,
}

/// Checks a request against the export: known command, flags allowed for it and advertised,
/// write access, and range. The error is the NBD error value to reply with:
/// - unknown command, unknown or misplaced flag, unadvertised feature, READ longer than the
///   maximum payload: `EINVAL`;
/// - any request past the end (or `offset + length` overflowing): `EINVAL`. The protocol
///   allows this for writes too (it only recommends `ENOSPC` there), and one error for "outside
///   the export" is what Basalt documents;
/// - WRITE/TRIM/WRITE_ZEROES on a read-only export: `EPERM`.
pub fn validate(h: &RequestHeader, payload: Bytes, caps: &ExportCaps) -> Result<Command, u32> {
    let allowed = match h.kind {
        cmd::READ | cmd::WRITE | cmd::DISC | cmd::FLUSH | cmd::TRIM => cflag::FUA,
        cmd::WRITE_ZEROES => cflag::FUA | cflag::NO_HOLE,
        _ => return Err(errno::EINVAL),
    };
    if h.flags & !allowed != 0 {
        return Err(errno::EINVAL);
    }
    let writes = matches!(h.kind, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES);
    if writes && caps.read_only {
        return Err(errno::EPERM);
    }
    let fua = h.flags & cflag::FUA != 0;
    if fua && !caps.fua {
        return Err(errno::EINVAL);
    }
    let in_range = h
        .offset
        .checked_add(h.len as u64)
        .is_some_and(|end| end <= caps.size);
    let (offset, len) = (h.offset, h.len);
    match h.kind {
        cmd::READ if len > caps.max_payload || !in_range => Err(errno::EINVAL),
        cmd::READ => Ok(Command::Read { offset, len }),
        cmd::WRITE if !in_range => Err(errno::EINVAL),
        cmd::WRITE => Ok(Command::Write {
            offset,
            data: payload,
            fua,
        }),
        cmd::DISC => Ok(Command::Disconnect),
        cmd::FLUSH if !caps.flush => Err(errno::EINVAL),
        cmd::FLUSH => Ok(Command::Flush),
        cmd::TRIM if !caps.trim || !in_range => Err(errno::EINVAL),
        cmd::TRIM => Ok(Command::Trim { offset, len, fua }),
        cmd::WRITE_ZEROES if !caps.write_zeroes => Err(errno::EINVAL),
        cmd::WRITE_ZEROES if !in_range => Err(errno::EINVAL),
        _ => Ok(Command::WriteZeroes {
            offset,
            len,
            fua,
            no_hole: h.flags & cflag::NO_HOLE != 0,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u16, flags: u16, offset: u64, len: u32) -> RequestHeader {
        RequestHeader {
            flags,
            kind,
            cookie: 0xC0FFEE,
            offset,
            len,
        }
    }

    fn caps() -> ExportCaps {
        ExportCaps {
            size: 1 << 20,
            read_only: false,
            flush: true,
            fua: true,
            trim: true,
            write_zeroes: true,
            multi_conn: true,
            max_payload: 64 << 10,
        }
    }

    #[test]
    fn decoder_splits_a_pipelined_stream_byte_by_byte() {
        let reqs = [
            (header(cmd::READ, 0, 0, 4096), Vec::new()),
            (header(cmd::WRITE, cflag::FUA, 512, 5), b"hello".to_vec()),
            (header(cmd::FLUSH, 0, 0, 0), Vec::new()),
            (header(cmd::WRITE, 0, 0, 0), Vec::new()),
        ];
        let mut stream = Vec::new();
        for (h, data) in &reqs {
            stream.extend_from_slice(&h.encode());
            stream.extend_from_slice(data);
        }
        let mut dec = RequestDecoder::new(1 << 20);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for byte in stream {
            buf.extend_from_slice(&[byte]);
            while let Some(inc) = dec.decode(&mut buf).unwrap() {
                got.push(inc);
            }
        }
        let want: Vec<_> = reqs
            .iter()
            .map(|(h, d)| Incoming::Request(*h, Bytes::from(d.clone())))
            .collect();
        assert_eq!(got, want);
        assert!(dec.at_boundary() && buf.is_empty());
    }

    /// Whole-block WRITE payloads come out 4 KiB-aligned, whether their bytes arrived through
    /// the receive buffer, straight into the decoder's buffer, or both.
    #[test]
    fn block_payloads_are_aligned_and_can_be_read_in_place() {
        let data: Vec<u8> = (0..16384u32).map(|i| (i * 7 + i / 4096) as u8).collect();
        let w = header(cmd::WRITE, 0, 4096, 16384);
        let next = header(cmd::READ, 0, 0, 512);
        for direct_from in [0, 1, 4096, 16383] {
            let mut dec = RequestDecoder::new(1 << 20);
            let mut buf = BytesMut::new();
            buf.extend_from_slice(&w.encode());
            buf.extend_from_slice(&data[..direct_from]);
            assert_eq!(dec.decode(&mut buf).unwrap(), None);
            assert!(buf.is_empty());
            // The rest goes straight into the payload buffer, in two reads.
            let rest = &data[direct_from..];
            let half = rest.len() / 2;
            for part in [&rest[..half], &rest[half..]] {
                let dst = dec.direct_buf().expect("a payload is being received");
                dst[..part.len()].copy_from_slice(part);
                dec.filled(part.len());
            }
            assert_eq!(dec.direct_buf().map(|b| b.len()), Some(0));
            buf.extend_from_slice(&next.encode());
            let Some(Incoming::Request(h, payload)) = dec.decode(&mut buf).unwrap() else {
                panic!("the write is complete");
            };
            assert_eq!(h, w);
            assert_eq!(&payload[..], &data[..], "direct from {direct_from}");
            assert!(basalt_buf::is_aligned(&payload));
            assert_eq!(
                dec.decode(&mut buf).unwrap(),
                Some(Incoming::Request(next, Bytes::new()))
            );
            assert!(dec.at_boundary() && dec.direct_buf().is_none());
        }
    }

    #[test]
    fn oversized_write_payload_is_skipped_and_the_stream_stays_in_step() {
        let big = header(cmd::WRITE, 0, 0, 100);
        let next = header(cmd::READ, 0, 8, 8);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&big.encode());
        buf.extend_from_slice(&[0xAB; 60]);
        let mut dec = RequestDecoder::new(64);
        assert_eq!(dec.decode(&mut buf), Ok(None));
        assert_eq!(dec.needed(0), 40);
        buf.extend_from_slice(&[0xAB; 40]);
        buf.extend_from_slice(&next.encode());
        assert_eq!(dec.decode(&mut buf), Ok(Some(Incoming::Oversized(big))));
        assert_eq!(
            dec.decode(&mut buf),
            Ok(Some(Incoming::Request(next, Bytes::new())))
        );
    }

    #[test]
    fn bad_magic_is_an_error() {
        let mut raw = header(cmd::READ, 0, 0, 1).encode();
        raw[0] = 0;
        let mut buf = BytesMut::from(&raw[..]);
        let err = RequestDecoder::new(64).decode(&mut buf).unwrap_err();
        assert_eq!(err, DecodeError::BadMagic(0x0060_9513));
    }

    #[test]
    fn validate_accepts_well_formed_commands() {
        let c = caps();
        let data = Bytes::from_static(b"abcd");
        assert_eq!(
            validate(&header(cmd::READ, 0, 4096, 512), Bytes::new(), &c),
            Ok(Command::Read {
                offset: 4096,
                len: 512
            })
        );
        assert_eq!(
            validate(
                &header(cmd::WRITE, cflag::FUA, (1 << 20) - 4, 4),
                data.clone(),
                &c
            ),
            Ok(Command::Write {
                offset: (1 << 20) - 4,
                data,
                fua: true
            })
        );
        let wz = header(cmd::WRITE_ZEROES, cflag::NO_HOLE, 0, 1 << 20);
        assert_eq!(
            validate(&wz, Bytes::new(), &c),
            Ok(Command::WriteZeroes {
                offset: 0,
                len: 1 << 20,
                fua: false,
                no_hole: true
            })
        );
        let flush = header(cmd::FLUSH, 0, 0, 0);
        assert_eq!(validate(&flush, Bytes::new(), &c), Ok(Command::Flush));
        let disc = header(cmd::DISC, 0, 0, 0);
        assert_eq!(validate(&disc, Bytes::new(), &c), Ok(Command::Disconnect));
    }

    #[test]
    fn validate_refuses_bad_requests_with_the_documented_errors() {
        let c = caps();
        let v = |h: RequestHeader| validate(&h, Bytes::new(), &c);
        let end = 1u64 << 20;
        // Past the end and overflowing.
        assert_eq!(v(header(cmd::READ, 0, end - 1, 2)), Err(errno::EINVAL));
        assert_eq!(v(header(cmd::READ, 0, u64::MAX, 2)), Err(errno::EINVAL));
        assert_eq!(v(header(cmd::TRIM, 0, end, 1)), Err(errno::EINVAL));
        assert_eq!(v(header(cmd::WRITE, 0, end, 1)), Err(errno::EINVAL));
        assert_eq!(v(header(cmd::WRITE, 0, u64::MAX, 1)), Err(errno::EINVAL));
        assert_eq!(
            v(header(cmd::WRITE_ZEROES, 0, 1, u32::MAX)),
            Err(errno::EINVAL)
        );
        // Read longer than the maximum payload, even inside the export.
        assert_eq!(
            v(header(cmd::READ, 0, 0, (64 << 10) + 1)),
            Err(errno::EINVAL)
        );
        // Unknown commands and flags, NO_HOLE outside WRITE_ZEROES.
        assert_eq!(v(header(cmd::CACHE, 0, 0, 1)), Err(errno::EINVAL));
        assert_eq!(v(header(cmd::BLOCK_STATUS, 0, 0, 1)), Err(errno::EINVAL));
        assert_eq!(v(header(99, 0, 0, 1)), Err(errno::EINVAL));
        assert_eq!(v(header(cmd::READ, cflag::DF, 0, 1)), Err(errno::EINVAL));
        assert_eq!(
            v(header(cmd::WRITE, cflag::NO_HOLE, 0, 1)),
            Err(errno::EINVAL)
        );
        assert_eq!(
            v(header(cmd::WRITE_ZEROES, cflag::FAST_ZERO, 0, 1)),
            Err(errno::EINVAL)
        );
    }

    #[test]
    fn validate_honours_capabilities() {
        let bare = ExportCaps {
            flush: false,
            fua: false,
            trim: false,
            write_zeroes: false,
            ..caps()
        };
        let v = |h: RequestHeader| validate(&h, Bytes::new(), &bare);
        assert_eq!(v(header(cmd::FLUSH, 0, 0, 0)), Err(errno::EINVAL));
        assert_eq!(v(header(cmd::TRIM, 0, 0, 1)), Err(errno::EINVAL));
        assert_eq!(v(header(cmd::WRITE_ZEROES, 0, 0, 1)), Err(errno::EINVAL));
        assert_eq!(v(header(cmd::WRITE, cflag::FUA, 0, 1)), Err(errno::EINVAL));
        let ro = ExportCaps {
            read_only: true,
            ..bare
        };
        let v = |h: RequestHeader| validate(&h, Bytes::new(), &ro);
        assert_eq!(v(header(cmd::WRITE, 0, 0, 1)), Err(errno::EPERM));
        assert_eq!(v(header(cmd::TRIM, 0, 0, 1)), Err(errno::EPERM));
        assert_eq!(v(header(cmd::WRITE_ZEROES, 0, 0, 1)), Err(errno::EPERM));
        assert!(v(header(cmd::READ, 0, 0, 1)).is_ok());
    }
}
