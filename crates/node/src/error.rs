//! Node errors, and the one place where storage errors become wire errors.

use basalt_engine::EngineError;
use basalt_proto::{ErrorCode, WireError};
use thiserror::Error;

/// Why a node could not start or stopped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error("device {path}: {source}")]
    Device {
        path: String,
        #[source]
        source: EngineError,
    },
    #[error("data directory: {0}")]
    DataDir(#[source] EngineError),
    #[error("metadata: {0}")]
    Meta(#[from] basalt_meta::MetaError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Maps a store error to the error code a client acts on.
pub fn engine_to_wire(e: EngineError) -> WireError {
    let code = match &e {
        EngineError::InvalidArgument(_) => ErrorCode::InvalidArgument,
        EngineError::OutOfSpace { .. } => ErrorCode::NoSpace,
        // A copy that cannot be read is as bad as one failing its checksum: peers look for
        // another copy (`pg/repair.rs`); a client's read fails with `Checksum` (NBD: `EIO`).
        EngineError::Checksum { .. } | EngineError::Unreadable { .. } => ErrorCode::Checksum,
        EngineError::StaleVersion { .. } | EngineError::PriorVersion { .. } => {
            ErrorCode::StaleVersion
        }
        EngineError::Poisoned(_) => ErrorCode::DeviceFailed,
        EngineError::Io(_) => ErrorCode::Io,
        EngineError::Closed => ErrorCode::ShuttingDown,
        _ => ErrorCode::Internal,
    };
    WireError::new(code, e.to_string())
}
