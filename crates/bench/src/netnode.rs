//! The network to a Basalt node, measured through Basalt's own protocol: `Ping` frames that the
//! node echoes (`basalt_proto::Request::Ping`). This is the path every data-path request takes
//! (frame encoding, CRCs, the node's server loop), so it is what a multi-node cluster's traffic
//! is bounded by.
//!
//! Throughput keeps 8 pings of 1 MiB in flight on one connection for the duration and counts
//! the payload once (each byte also comes back); round-trip time is sequential 64-byte pings.

use crate::error::BenchError;
use crate::net::{NetBaseline, NetProbe};
use basalt_client::link::TcpLink;
use basalt_proto::{Request, Response, Service};
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use std::time::{Duration, Instant};

const IN_FLIGHT: usize = 8;
const CHUNK: usize = 1 << 20;
const PING: usize = 64;

/// Probes one node at its data-path address.
#[derive(Debug, Clone)]
pub struct NodeProbe {
    pub name: String,
    pub addr: String,
}

impl NetProbe for NodeProbe {
    fn path(&self) -> String {
        format!("basalt protocol to {} at {}", self.name, self.addr)
    }

    fn measure(&self, duration: Duration, pings: usize) -> Result<NetBaseline, BenchError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| BenchError::Net(format!("runtime: {e}")))?;
        let mut b = rt.block_on(measure(&self.addr, duration, pings))?;
        b.path = self.path();
        Ok(b)
    }
}

fn net_err(addr: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Net(format!("{addr}: {e}"))
}

async fn ping(link: &TcpLink, addr: &str, data: Bytes) -> Result<usize, BenchError> {
    let len = data.len();
    match link.call(Request::Ping { data }).await {
        Ok(Response::Pong { data }) if data.len() == len => Ok(len),
        Ok(other) => Err(net_err(addr, format!("unexpected answer {other:?}"))),
        Err(e) => Err(net_err(addr, e)),
    }
}

async fn measure(addr: &str, duration: Duration, pings: usize) -> Result<NetBaseline, BenchError> {
    let link = TcpLink::connect(addr, "basalt-bench", Duration::from_secs(5))
        .await
        .map_err(|e| net_err(addr, e))?;
    let chunk = Bytes::from(vec![0x5au8; CHUNK]);
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut inflight: FuturesUnordered<_> = (0..IN_FLIGHT)
        .map(|_| ping(&link, addr, chunk.clone()))
        .collect();
    while let Some(done) = inflight.next().await {
        bytes += done? as u64;
        if start.elapsed() < duration {
            inflight.push(ping(&link, addr, chunk.clone()));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let small = Bytes::from(vec![0xa5u8; PING]);
    let mut rtts = Vec::with_capacity(pings);
    for _ in 0..pings {
        let t = Instant::now();
        ping(&link, addr, small.clone()).await?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(crate::net::summarize(bytes as f64 / secs, rtts))
}
