//! Links to nodes: how a request reaches the node that must answer it.
//!
//! Every link is a [`basalt_proto::Service`]: a TCP connection with pipelining ([`TcpLink`]), or
//! whatever a [`Connector`] hands out (the deterministic simulator connects nodes through an
//! in-memory network). Clients reach nodes through links, and nodes reach each other (a PG's
//! primary forwarding writes to the other members, peering, recovery) through the same links.
//!
//! Requests on one link are sent in the order they are called: a primary that sends a PG's
//! sub-operations on one link can rely on them arriving in that order.

pub mod tcp;

pub use tcp::TcpLink;

use basalt_proto::Service;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// A connected link: a [`Service`] that can tell when it broke.
pub trait Link: Service {
    /// False once the connection has failed; the owner should connect again.
    fn is_open(&self) -> bool;
}

impl Link for TcpLink {
    fn is_open(&self) -> bool {
        TcpLink::is_open(self)
    }
}

/// Opens links to nodes by address.
pub trait Connector: Send + Sync + 'static {
    fn connect(
        &self,
        addr: &str,
        name: &str,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Arc<dyn Link>, String>>;
}

/// Connects over TCP.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    fn connect(
        &self,
        addr: &str,
        name: &str,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Arc<dyn Link>, String>> {
        let (addr, name) = (addr.to_string(), name.to_string());
        Box::pin(async move {
            let link = TcpLink::connect(&addr, &name, timeout).await?;
            Ok(Arc::new(link) as Arc<dyn Link>)
        })
    }
}
