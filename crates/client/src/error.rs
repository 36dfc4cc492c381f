//! Errors of the client library.

use basalt_meta::MetaError;
use basalt_proto::{ErrorCode, WireError};
use thiserror::Error;

/// What went wrong in a client operation.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("volume '{0}' does not exist; list volumes with `basalt volume list`")]
    NoSuchVolume(String),
    #[error("volume '{0}' was deleted while open; reconnect to use a volume of that name")]
    VolumeGone(String),
    #[error("volume '{0}' already exists; pick another name or delete it first")]
    VolumeExists(String),
    #[error("pool '{0}' does not exist; list pools with `basalt status`")]
    NoSuchPool(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("I/O at offset {offset} length {len} is beyond the end of the volume ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("no space left on device: {0}")]
    NoSpace(String),
    #[error("stored data failed its checksum: {0}")]
    Checksum(String),
    #[error("device I/O error: {0}")]
    Io(String),
    #[error("the cluster has no map yet (is a node running and has it registered its devices?)")]
    NoMap,
    #[error("no device serves placement group {0} (all its devices are down or out)")]
    Unavailable(String),
    #[error("could not reach node {node} at {addr}: {detail}")]
    Unreachable {
        node: String,
        addr: String,
        detail: String,
    },
    #[error("gave up after {attempts} attempts: {last}")]
    RetriesExhausted { attempts: u32, last: String },
    #[error("node answered: {0}")]
    Node(WireError),
    #[error(transparent)]
    Meta(#[from] basalt_meta::MetaError),
    /// A flush found that a node lost writes it had acknowledged before they were durable:
    /// it started again after a crash in between (`Volume::flush`).
    #[error("flush of volume '{volume}' failed: {why}")]
    WritesLost { volume: String, why: String },
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("the client is shut down")]
    Closed,
}

impl ClientError {
    /// Maps an error a node reported to the client error a caller can act on.
    pub fn from_wire(e: WireError) -> ClientError {
        match e.code {
            ErrorCode::NoSpace => ClientError::NoSpace(e.message),
            ErrorCode::Checksum => ClientError::Checksum(e.message),
            ErrorCode::Io | ErrorCode::DeviceFailed => ClientError::Io(e.message),
            ErrorCode::InvalidArgument => ClientError::InvalidArgument(e.message),
            _ => ClientError::Node(e),
        }
    }

    /// A short, stable classification for frontends mapping errors to their protocol.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::NoSuchVolume(_)
            | ClientError::NoSuchPool(_)
            | ClientError::VolumeGone(_) => ErrorKind::NotFound,
            ClientError::InvalidArgument(_) | ClientError::OutOfRange { .. } => {
                ErrorKind::InvalidArgument
            }
            ClientError::VolumeExists(_) => ErrorKind::Exists,
            ClientError::NoSpace(_) => ErrorKind::NoSpace,
            ClientError::Closed => ErrorKind::Shutdown,
            ClientError::Meta(m) => match m {
                MetaError::NoSuchVolume(_) | MetaError::NoSuchPool(_) => ErrorKind::NotFound,
                MetaError::VolumeExists(_) | MetaError::PoolExists(_) => ErrorKind::Exists,
                MetaError::InvalidName(_)
                | MetaError::InvalidSize { .. }
                | MetaError::InvalidPool { .. } => ErrorKind::InvalidArgument,
                _ => ErrorKind::Io,
            },
            _ => ErrorKind::Io,
        }
    }
}

/// Coarse error classes, for frontends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    NotFound,
    Exists,
    InvalidArgument,
    NoSpace,
    Shutdown,
    Io,
}
