//! The backend seam: [`Export`] (one open volume) and [`Catalog`] (the set of volumes).
//!
//! The NBD server knows nothing of storage; the Basalt client library implements these traits
//! for its volumes, and [`crate::mem`] implements them in RAM for tests and benchmarks.

use crate::wire::errno;
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;

/// One open block device of `size()` bytes, shared by every connection that chose it.
///
/// Every method may be called concurrently from many requests and connections. The server has
/// already checked offsets and lengths against [`Export::size`], refused writes to a read-only
/// export, and only calls a method whose capability (`can_*`) is true.
///
/// Durability contract (what the server promises NBD clients rests on it):
/// - A `write`/`trim`/`write_zeroes` future that completes `Ok` has made its change visible to
///   every later `read` on every connection.
/// - With `fua == true` the change is durable when the future completes.
/// - `flush` completes only when every write whose future completed before `flush` was *called*
///   is durable. The server calls `flush` after it received the NBD `FLUSH` request, so every
///   write it had already answered is covered, which is what the protocol demands.
pub trait Export: Send + Sync + 'static {
    /// Size in bytes.
    fn size(&self) -> u64;

    /// True when every write must be refused (`EPERM`); the export is advertised read-only.
    fn read_only(&self) -> bool {
        false
    }

    /// True when writes from one connection are visible to, and flushes cover, all connections
    /// to this export (NBD `CAN_MULTI_CONN`).
    fn can_multi_conn(&self) -> bool;

    /// True when [`Export::flush`] makes completed writes durable (advertises `SEND_FLUSH`).
    fn can_flush(&self) -> bool {
        true
    }

    /// True when `fua` on writes is honoured (advertises `SEND_FUA`).
    fn can_fua(&self) -> bool {
        true
    }

    /// True when [`Export::trim`] is supported (advertises `SEND_TRIM`).
    fn can_trim(&self) -> bool {
        true
    }

    /// True when [`Export::write_zeroes`] is supported (advertises `SEND_WRITE_ZEROES`).
    fn can_write_zeroes(&self) -> bool {
        true
    }

    /// Optional text shown to clients that ask for `NBD_INFO_DESCRIPTION`.
    fn description(&self) -> Option<String> {
        None
    }

    /// Reads `len` bytes at `offset`. The result must be exactly `len` bytes long.
    fn read(
        &self,
        offset: u64,
        len: u32,
    ) -> impl Future<Output = Result<Bytes, ExportError>> + Send;

    /// Writes `data` at `offset`; durable on completion when `fua`.
    ///
    /// `data` is a slice of the connection's receive buffer (no copy was made); a backend that
    /// keeps it for long after the call should copy it, or it pins the larger buffer.
    fn write(
        &self,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), ExportError>> + Send;

    /// Makes every completed write durable (see the trait's durability contract).
    fn flush(&self) -> impl Future<Output = Result<(), ExportError>> + Send;

    /// Hints that `len` bytes at `offset` are no longer needed; they may read back as anything.
    fn trim(&self, offset: u64, len: u32) -> impl Future<Output = Result<(), ExportError>> + Send;

    /// Makes `len` bytes at `offset` read as zeroes. With `no_hole` the range must stay
    /// allocated (no deallocation); without it the backend may punch a hole.
    fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    ) -> impl Future<Output = Result<(), ExportError>> + Send;
}

/// What `NBD_OPT_LIST` shows for one export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub size: u64,
    /// Empty when there is nothing to say.
    pub description: String,
}

/// The set of exports a server offers: one per volume.
pub trait Catalog: Send + Sync + 'static {
    type Export: Export;

    /// Every export, for `NBD_OPT_LIST`.
    fn list(&self) -> impl Future<Output = Result<Vec<ExportInfo>, ExportError>> + Send;

    /// Opens the export called `name`; [`ExportErrorKind::NotFound`] when there is none.
    fn open(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Arc<Self::Export>, ExportError>> + Send;

    /// The export an empty name means, if any.
    fn default_export(&self) -> Option<String> {
        None
    }
}

/// What went wrong in a backend, which decides the NBD error value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExportErrorKind {
    /// No such export (option phase: `NBD_REP_ERR_UNKNOWN`).
    NotFound,
    /// The request was malformed for this backend (`EINVAL`).
    InvalidArgument,
    /// Out of space or quota (`ENOSPC`).
    NoSpace,
    /// The data could not be read or written (`EIO`).
    Io,
    /// The export refuses writes (`EPERM`).
    ReadOnly,
    /// The backend is shutting down (`ESHUTDOWN`; option phase: `NBD_REP_ERR_SHUTDOWN`).
    Shutdown,
    /// The backend cannot do this operation (`ENOTSUP`).
    Unsupported,
    /// A value (length, offset) was too large for the backend (`EOVERFLOW`).
    TooLarge,
}

impl ExportErrorKind {
    /// The NBD error value sent to the client.
    pub fn errno(self) -> u32 {
        match self {
            ExportErrorKind::NotFound | ExportErrorKind::Io => errno::EIO,
            ExportErrorKind::InvalidArgument => errno::EINVAL,
            ExportErrorKind::NoSpace => errno::ENOSPC,
            ExportErrorKind::ReadOnly => errno::EPERM,
            ExportErrorKind::Shutdown => errno::ESHUTDOWN,
            ExportErrorKind::Unsupported => errno::ENOTSUP,
            ExportErrorKind::TooLarge => errno::EOVERFLOW,
        }
    }
}

/// A backend error: a kind (which decides the NBD error value) and a message for logs and for
/// option-phase error replies.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ExportError {
    pub kind: ExportErrorKind,
    pub message: String,
}

impl ExportError {
    pub fn new(kind: ExportErrorKind, message: impl Into<String>) -> Self {
        ExportError {
            kind,
            message: message.into(),
        }
    }

    pub fn not_found(name: &str) -> Self {
        ExportError::new(
            ExportErrorKind::NotFound,
            format!(
                "no export named {name:?}; list the exports with NBD_OPT_LIST (nbdinfo --list)"
            ),
        )
    }

    pub fn io(message: impl Into<String>) -> Self {
        ExportError::new(ExportErrorKind::Io, message)
    }

    /// The NBD error value sent to the client.
    pub fn errno(&self) -> u32 {
        self.kind.errno()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_maps_to_a_protocol_error_value() {
        let kinds = [
            (ExportErrorKind::NotFound, errno::EIO),
            (ExportErrorKind::InvalidArgument, errno::EINVAL),
            (ExportErrorKind::NoSpace, errno::ENOSPC),
            (ExportErrorKind::Io, errno::EIO),
            (ExportErrorKind::ReadOnly, errno::EPERM),
            (ExportErrorKind::Shutdown, errno::ESHUTDOWN),
            (ExportErrorKind::Unsupported, errno::ENOTSUP),
            (ExportErrorKind::TooLarge, errno::EOVERFLOW),
        ];
        for (kind, value) in kinds {
            assert_eq!(ExportError::new(kind, "x").errno(), value, "{kind:?}");
        }
    }
}
