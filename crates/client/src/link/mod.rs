//! Links to nodes: how a request reaches the node that must answer it.
//!
//! Every link is a [`basalt_proto::Service`]: a TCP connection with pipelining ([`tcp::TcpLink`])
//! or, for a node running in the same process, the node's own service object, called directly.

pub mod tcp;

pub use tcp::TcpLink;
