//! Links from this node to the other nodes (and to itself, for members on its own devices):
//! what a PG's primary uses to forward sub-operations, peer and recover.
//!
//! One link per node, shared by every PG: the sub-operations a primary sends to one member go
//! out, and arrive, in the order they were sent.

use crate::pg::messages::{PeerAnswer, PeerMsg};
use basalt_link::{Connector, Link};
use basalt_placement::ClusterMap;
use basalt_proto::{Request, Response, ResponseFuture, Service, WireError};
use basalt_types::{DeviceId, NodeId};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use thiserror::Error;

/// Why a message to a member got no answer.
#[derive(Debug, Error)]
pub(crate) enum PeerError {
    #[error("{device} is not in the map")]
    Unknown { device: DeviceId },
    #[error("cannot reach {node} at {addr}: {detail}")]
    Unreachable {
        node: NodeId,
        addr: String,
        detail: String,
    },
    #[error("{0}")]
    Refused(WireError),
    #[error("no answer from {device} within {after:?}")]
    Timeout { device: DeviceId, after: Duration },
    #[error("bad answer from {device}: {detail}")]
    BadAnswer { device: DeviceId, detail: String },
}

/// The node's own service, reached without a socket (members on this node's devices). Each
/// request but a read runs as a task of its own, as over TCP (`drain.rs::Detached`): a caller
/// that gives up (its peer timeout, a term that ended) does not cancel a peering message or a
/// sub-operation halfway, between its store write and the member's state in memory.
struct LocalLink(Weak<dyn Service>);

impl Service for LocalLink {
    fn call(&self, req: Request) -> ResponseFuture {
        match self.0.upgrade() {
            Some(svc) => crate::drain::Detached(svc).call(req),
            None => Box::pin(async {
                Err(WireError::new(
                    basalt_proto::ErrorCode::ShuttingDown,
                    "the node is stopping",
                ))
            }),
        }
    }
}

impl Link for LocalLink {
    fn is_open(&self) -> bool {
        self.0.strong_count() > 0
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<dyn Link>>>>;

pub(crate) struct Peers {
    node: NodeId,
    connector: Arc<dyn Connector>,
    local: OnceLock<Arc<dyn Link>>,
    links: Mutex<HashMap<NodeId, Slot>>,
    /// How long one peering or recovery message may take.
    pub timeout: Duration,
}

impl Peers {
    pub fn new(node: NodeId, connector: Arc<dyn Connector>, timeout: Duration) -> Peers {
        Peers {
            node,
            connector,
            local: OnceLock::new(),
            links: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    /// Sets the node's own service (once, at start).
    pub fn set_local(&self, svc: Weak<dyn Service>) {
        let _ = self.local.set(Arc::new(LocalLink(svc)));
    }

    /// The link to the node holding `device` (connecting if needed).
    pub async fn link(
        &self,
        map: &ClusterMap,
        device: DeviceId,
    ) -> Result<Arc<dyn Link>, PeerError> {
        let node = map
            .device_node(device)
            .ok_or(PeerError::Unknown { device })?;
        if node == self.node {
            return Ok(self
                .local
                .get()
                .expect("local service set at start")
                .clone());
        }
        let addr = map
            .nodes
            .get(&node)
            .map(|n| n.addr.clone())
            .ok_or(PeerError::Unknown { device })?;
        let slot = self.links.lock().entry(node).or_default().clone();
        let mut guard = slot.lock().await;
        if let Some(link) = guard.as_ref()
            && link.is_open()
        {
            return Ok(link.clone());
        }
        let name = format!("{}-peer", self.node);
        let link = self
            .connector
            .connect(&addr, &name, self.timeout)
            .await
            .map_err(|detail| PeerError::Unreachable {
                node,
                addr: addr.clone(),
                detail,
            })?;
        *guard = Some(link.clone());
        Ok(link)
    }

    /// Forgets the link to `node` (it broke); the next use connects again.
    pub fn drop_link(&self, node: NodeId) {
        self.links.lock().remove(&node);
    }

    /// Sends a peering message to `device` and waits (bounded) for its answer.
    pub async fn ask(
        &self,
        map: &ClusterMap,
        device: DeviceId,
        msg: &PeerMsg,
        payload: Bytes,
    ) -> Result<(PeerAnswer, Bytes), PeerError> {
        let link = self.link(map, device).await?;
        let json = serde_json::to_vec(msg).expect("peer messages serialise");
        let req = Request::Peer {
            epoch: map.epoch,
            json: json.into(),
            payload,
        };
        let answer = tokio::time::timeout(self.timeout, link.call(req))
            .await
            .map_err(|_| PeerError::Timeout {
                device,
                after: self.timeout,
            })?;
        match answer {
            Ok(Response::Peer { json, payload }) => {
                let a = serde_json::from_slice(&json).map_err(|e| PeerError::BadAnswer {
                    device,
                    detail: e.to_string(),
                })?;
                Ok((a, payload))
            }
            Ok(other) => Err(PeerError::BadAnswer {
                device,
                detail: format!("{other:?}"),
            }),
            Err(e) => {
                if let Some(node) = map.device_node(device)
                    && e.code == basalt_proto::ErrorCode::ShuttingDown
                {
                    self.drop_link(node);
                }
                Err(PeerError::Refused(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Finish;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A peering message to the node's own device whose caller gives up still runs to its end.
    #[tokio::test]
    async fn a_local_message_whose_caller_gives_up_still_completes() {
        let release = Arc::new(tokio::sync::Notify::new());
        let finished = Arc::new(AtomicU64::new(0));
        let svc: Arc<dyn Service> = Arc::new(Finish {
            release: release.clone(),
            finished: finished.clone(),
        });
        let link = LocalLink(Arc::downgrade(&svc));
        let msg = Request::Peer {
            epoch: basalt_types::Epoch(1),
            json: bytes::Bytes::from_static(b"{}"),
            payload: bytes::Bytes::new(),
        };
        let gave_up = tokio::time::timeout(Duration::from_millis(10), link.call(msg)).await;
        assert!(gave_up.is_err(), "it waits for the test");
        release.notify_one();
        let ran = tokio::time::timeout(Duration::from_secs(10), async {
            while finished.load(Ordering::Relaxed) == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        assert!(
            ran.await.is_ok(),
            "the message was cancelled with its caller"
        );
    }
}
