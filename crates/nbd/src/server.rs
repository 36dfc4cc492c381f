//! [`NbdServer`]: accepts connections, runs each one's handshake and transmission in its own
//! task, and shuts down cleanly.
//!
//! Shutdown: stop accepting; connections still negotiating are closed; connections in
//! transmission stop reading, answer requests already received with `ESHUTDOWN`, let started
//! requests finish and send their replies, then close. Whatever is still running after
//! [`ServerConfig::shutdown_grace`] is cut off.

use crate::config::ServerConfig;
use crate::error::NbdError;
use crate::export::Catalog;
use crate::negotiate::negotiate;
use crate::transmit::transmit;
use std::future::Future;
use std::io::ErrorKind;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Pause after an accept error such as running out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// An NBD server offering the exports of one [`Catalog`].
pub struct NbdServer<C: Catalog> {
    catalog: Arc<C>,
    config: Arc<ServerConfig>,
}

impl<C: Catalog> Clone for NbdServer<C> {
    fn clone(&self) -> Self {
        NbdServer {
            catalog: Arc::clone(&self.catalog),
            config: Arc::clone(&self.config),
        }
    }
}

impl<C: Catalog> std::fmt::Debug for NbdServer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdServer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<C: Catalog> NbdServer<C> {
    pub fn new(catalog: Arc<C>, config: ServerConfig) -> Self {
        NbdServer {
            catalog,
            config: Arc::new(config),
        }
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Serves clients from `listener` until `shutdown` completes, then shuts down cleanly
    /// (see the module docs). Errors only when the listener itself fails.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), NbdError> {
        let token = CancellationToken::new();
        let slots = Arc::new(Semaphore::new(self.config.max_connections.max(1)));
        let mut conns = JoinSet::new();
        let mut shutdown = pin!(shutdown);
        let outcome = loop {
            let accept = async {
                let slot = Arc::clone(&slots).acquire_owned().await;
                (slot, listener.accept().await)
            };
            tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                Some(joined) = conns.join_next(), if !conns.is_empty() => {
                    if let Err(e) = joined {
                        tracing::error!("NBD connection task failed: {e}");
                    }
                }
                (slot, accepted) = accept => match accepted {
                    Ok((stream, peer)) => {
                        let server = self.clone();
                        let token = token.clone();
                        let span = tracing::debug_span!("nbd", %peer);
                        conns.spawn(
                            async move {
                                let _slot = slot;
                                server.serve_tcp(stream, token).await;
                            }
                            .instrument(span),
                        );
                    }
                    Err(e) if is_transient(&e) => {
                        tracing::warn!("NBD accept failed, retrying: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                    Err(e) => break Err(NbdError::Io(e)),
                },
            }
        };
        drop(listener);
        token.cancel();
        let drained = tokio::time::timeout(self.config.shutdown_grace, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                "{} NBD connection(s) still busy after {:?}; cutting them off",
                conns.len(),
                self.config.shutdown_grace
            );
            conns.shutdown().await;
        }
        outcome
    }

    /// Serves one TCP connection to its end, logging how it ended.
    pub async fn serve_tcp(&self, mut stream: TcpStream, shutdown: CancellationToken) {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let (mut rd, mut wr) = stream.split();
        log_end(self.serve_io(&mut rd, &mut wr, &shutdown).await);
    }

    /// Serves one connection over any byte stream (tests, Unix sockets).
    pub async fn serve_connection<S>(
        &self,
        stream: S,
        shutdown: CancellationToken,
    ) -> Result<(), NbdError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let (mut rd, mut wr) = tokio::io::split(stream);
        self.serve_io(&mut rd, &mut wr, &shutdown).await
    }

    async fn serve_io<R, W>(
        &self,
        rd: &mut R,
        wr: &mut W,
        shutdown: &CancellationToken,
    ) -> Result<(), NbdError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let config = &*self.config;
        let handshake = tokio::time::timeout(
            config.handshake_timeout,
            negotiate(rd, wr, &*self.catalog, config, shutdown),
        );
        let negotiated = tokio::select! {
            r = handshake => r.map_err(|_| NbdError::HandshakeTimeout(config.handshake_timeout))??,
            () = shutdown.cancelled() => {
                return Err(NbdError::protocol("server shutting down during the handshake"));
            }
        };
        let Some(n) = negotiated else {
            tracing::debug!("client aborted the negotiation");
            return Ok(());
        };
        tracing::debug!(export = %n.name, flags = n.caps.transmission_flags(), "transmission");
        let result = transmit(&n.export, n.caps, rd, wr, config, config.dispatch, shutdown).await;
        // FIN after the last reply; the peer may be gone already.
        let _ = wr.shutdown().await;
        result
    }
}

/// Serves `catalog` on `listener` with `config` until `shutdown` completes.
pub async fn serve<C: Catalog>(
    listener: TcpListener,
    catalog: Arc<C>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), NbdError> {
    NbdServer::new(catalog, config)
        .serve(listener, shutdown)
        .await
}

fn log_end(result: Result<(), NbdError>) {
    match result {
        Ok(()) => tracing::debug!("connection closed"),
        Err(NbdError::Io(e)) if e.kind() == ErrorKind::UnexpectedEof => {
            tracing::debug!("client left during the handshake")
        }
        Err(e) => tracing::info!("connection ended: {e}"),
    }
}

/// Accept errors that concern one connection or a passing shortage, not the listener.
fn is_transient(e: &std::io::Error) -> bool {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    const ENOBUFS: i32 = 105;
    const ENOMEM: i32 = 12;
    const EPROTO: i32 = 71;
    matches!(
        e.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::Interrupted
            | ErrorKind::WouldBlock
            | ErrorKind::TimedOut
    ) || matches!(
        e.raw_os_error(),
        Some(EMFILE | ENFILE | ENOBUFS | ENOMEM | EPROTO)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemCatalog;

    fn assert_send<T: Send + 'static>(_: &T) {}

    #[test]
    fn server_futures_can_be_spawned() {
        // Compile-time check: the lead spawns these on a multi-thread runtime.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let server = NbdServer::new(Arc::new(MemCatalog::new()), ServerConfig::default());
            let s = server.clone();
            let fut = async move { s.serve(listener, async {}).await };
            assert_send(&fut);
            // The shutdown future is already complete: serve returns at once, cleanly.
            fut.await.expect("clean shutdown");
        });
    }
}
