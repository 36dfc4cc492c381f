//! Protocol errors: [`ProtoError`] for frames that cannot be decoded, [`WireError`] for errors a
//! node reports to a client inside a well-formed frame.

use basalt_types::Epoch;
use thiserror::Error;

/// A frame or message could not be decoded. The connection that produced it is not trustworthy
/// any more: the receiver replies with [`ErrorCode::Malformed`] if it can and closes it.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    #[error("bad frame magic {0:02x?}; the peer does not speak the Basalt protocol")]
    BadMagic([u8; 4]),
    #[error("frame header checksum mismatch (stored {expected:#010x}, computed {actual:#010x})")]
    HeaderChecksum { expected: u32, actual: u32 },
    #[error("frame payload checksum mismatch (stored {expected:#010x}, computed {actual:#010x})")]
    PayloadChecksum { expected: u32, actual: u32 },
    #[error("protocol version {0} is not supported (this build speaks version {v})", v = crate::PROTOCOL_VERSION)]
    UnsupportedVersion(u8),
    #[error("unknown frame flags {0:#06x}")]
    UnknownFlags(u16),
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
    #[error("frame {what} of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("{opcode} body is {len} bytes, expected {expected}")]
    BadBodyLength {
        opcode: &'static str,
        len: usize,
        expected: usize,
    },
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
}

/// Error codes carried in error responses. Stable on the wire: never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request is well-formed but its arguments are not (range past the object, bad size).
    InvalidArgument,
    /// The request carried an older cluster-map epoch than the node's; refresh the map and retry.
    StaleEpoch,
    /// This node is not the primary of the object's placement group in the current map.
    NotPrimary,
    /// The device has no room for the write.
    NoSpace,
    /// The device failed the I/O.
    Io,
    /// Stored data failed its checksum.
    Checksum,
    /// The object, volume or key does not exist.
    NotFound,
    /// The node does not implement this request.
    Unsupported,
    /// No common protocol version.
    VersionMismatch,
    /// The node is shutting down; retry elsewhere or later.
    ShuttingDown,
    /// The target is read-only.
    ReadOnly,
    /// The device has failed (a flush failed earlier) and refuses writes until repaired.
    DeviceFailed,
    /// A replica write carried a version not newer than the stored one.
    StaleVersion,
    /// The node is overloaded; retry later.
    Busy,
    /// The frame could not be decoded; the connection is closed after this reply.
    Malformed,
    /// An unexpected internal error.
    Internal,
    /// A code this build does not know (from a newer peer).
    Unknown(u16),
}

impl ErrorCode {
    pub fn to_wire(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 1,
            ErrorCode::StaleEpoch => 2,
            ErrorCode::NotPrimary => 3,
            ErrorCode::NoSpace => 4,
            ErrorCode::Io => 5,
            ErrorCode::Checksum => 6,
            ErrorCode::NotFound => 7,
            ErrorCode::Unsupported => 8,
            ErrorCode::VersionMismatch => 9,
            ErrorCode::ShuttingDown => 10,
            ErrorCode::ReadOnly => 11,
            ErrorCode::DeviceFailed => 12,
            ErrorCode::StaleVersion => 13,
            ErrorCode::Busy => 14,
            ErrorCode::Malformed => 15,
            ErrorCode::Internal => 16,
            ErrorCode::Unknown(code) => code,
        }
    }

    pub fn from_wire(code: u16) -> ErrorCode {
        match code {
            1 => ErrorCode::InvalidArgument,
            2 => ErrorCode::StaleEpoch,
            3 => ErrorCode::NotPrimary,
            4 => ErrorCode::NoSpace,
            5 => ErrorCode::Io,
            6 => ErrorCode::Checksum,
            7 => ErrorCode::NotFound,
            8 => ErrorCode::Unsupported,
            9 => ErrorCode::VersionMismatch,
            10 => ErrorCode::ShuttingDown,
            11 => ErrorCode::ReadOnly,
            12 => ErrorCode::DeviceFailed,
            13 => ErrorCode::StaleVersion,
            14 => ErrorCode::Busy,
            15 => ErrorCode::Malformed,
            16 => ErrorCode::Internal,
            other => ErrorCode::Unknown(other),
        }
    }

    /// Whether a client may retry the same request after refreshing its map or waiting.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::StaleEpoch
                | ErrorCode::NotPrimary
                | ErrorCode::ShuttingDown
                | ErrorCode::Busy
        )
    }
}

/// An error reported by a node: a code, the node's current epoch (meaningful for
/// [`ErrorCode::StaleEpoch`]) and a human-readable message.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{code:?}: {message}")]
pub struct WireError {
    pub code: ErrorCode,
    pub epoch: Epoch,
    pub message: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            epoch: Epoch(0),
            message: message.into(),
        }
    }

    pub fn stale_epoch(current: Epoch, sent: Epoch) -> Self {
        WireError {
            code: ErrorCode::StaleEpoch,
            epoch: current,
            message: format!(
                "request epoch {} is older than the node's map epoch {}",
                sent.0, current.0
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for code in 0..=40u16 {
            assert_eq!(ErrorCode::from_wire(code).to_wire(), code);
        }
        assert_eq!(ErrorCode::from_wire(2), ErrorCode::StaleEpoch);
        assert!(ErrorCode::StaleEpoch.is_retryable());
        assert!(!ErrorCode::Checksum.is_retryable());
    }
}
