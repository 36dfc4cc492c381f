//! [`NbdError`]: why a connection or the server stopped.

use crate::export::ExportError;

/// Errors of the NBD server. A connection's error ends that connection only; `serve` returns
/// one only when the listener itself fails.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NbdError {
    #[error("NBD socket I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// The client broke the protocol in a way that leaves no reply possible; the connection
    /// was closed.
    #[error("NBD protocol violation by the client: {0}")]
    Protocol(String),
    /// The client did not finish the option phase in time.
    #[error("NBD handshake did not finish within {0:?}; the client was disconnected")]
    HandshakeTimeout(std::time::Duration),
    /// The backend failed where the protocol has no error reply (`NBD_OPT_EXPORT_NAME`).
    #[error("NBD export failed: {0}")]
    Export(#[from] ExportError),
}

impl NbdError {
    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        NbdError::Protocol(message.into())
    }
}
