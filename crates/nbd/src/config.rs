//! [`ServerConfig`]: limits and timeouts of the NBD server.

use std::time::Duration;

/// Largest payload of one READ or WRITE (advertised as the maximum block size): 32 MiB.
pub const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;

/// How requests run (`docs/design/nbd.md` has the measurements behind the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dispatch {
    /// Every request is a future polled by the connection's own task.
    #[default]
    Inline,
    /// Every request is spawned as its own tokio task.
    Spawn,
}

/// Limits and timeouts. `ServerConfig::default()` suits a block volume server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest READ/WRITE length accepted and advertised (`NBD_INFO_BLOCK_SIZE` maximum).
    /// Longer requests get `EINVAL` (a WRITE's payload is read and dropped first).
    pub max_payload: u32,
    /// Advertised preferred block size (requests smaller or unaligned still work).
    pub preferred_block_size: u32,
    /// Requests in flight per connection before the server stops reading from it.
    pub max_inflight_requests: usize,
    /// Bytes (request payloads, read lengths and unsent replies) in flight per connection
    /// before the server stops reading from it. One request may exceed it by its own size.
    pub max_inflight_bytes: usize,
    /// Connections served at once; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// The whole option phase must end within this time, or the connection is closed.
    pub handshake_timeout: Duration,
    /// On shutdown, how long in-flight requests may take to finish before connections are cut.
    pub shutdown_grace: Duration,
    /// How requests run within a connection.
    pub dispatch: Dispatch,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_payload: DEFAULT_MAX_PAYLOAD,
            preferred_block_size: basalt_types::BLOCK_SIZE as u32,
            max_inflight_requests: 256,
            max_inflight_bytes: 64 << 20,
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            dispatch: Dispatch::Inline,
        }
    }
}
