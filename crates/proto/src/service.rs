//! The request/response service a node offers, independent of transport.
//!
//! The node implements [`Service`]; its TCP server decodes frames and calls it, and a client in
//! the same process (`basalt up`) calls it directly, skipping encoding and the socket.

use crate::{Request, Response, WireError};
use std::future::Future;
use std::pin::Pin;

/// A boxed response future.
pub type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response, WireError>> + Send>>;

/// Something that answers [`Request`]s: a node, or a connection to one.
pub trait Service: Send + Sync + 'static {
    fn call(&self, req: Request) -> ResponseFuture;
}
