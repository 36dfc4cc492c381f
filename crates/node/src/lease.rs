//! The node's lease: its registration in the metadata store, registering again after the lease
//! was lost, and the self-fence that keeps a node from acknowledging anything once the store
//! may have expired its lease.
//!
//! The rule: **a node never acknowledges a data-path request after the metadata store may have
//! expired its lease** (after which the leader may have handed its placement groups to other
//! nodes). The node knows a lower bound of its lease's life: the store received the request of
//! the last successful grant or renewal after it was sent, so it keeps the lease at least until
//! `sent + TTL`. The [`Fence`] allows acknowledgements until
//! `valid_until = sent + TTL - margin` ([`margin`]) on the monotonic clock, and every data-path
//! answer checks it right before it goes out (`service.rs`, and again in `server.rs` just
//! before the answer is written to the socket). Past it, requests get `Busy`, which clients
//! retry.
//!
//! [`maintain`] keeps the registration: it moves `valid_until` forward with every renewal, and
//! when the lease is lost (renewals failed for a TTL, or the store says it is gone) it closes
//! the fence, registers again under a new lease (the same node record), reads the current map,
//! and only then opens the fence again. When the node stops it closes the fence and then
//! revokes the lease, so that its record vanishes at once (`Node::shutdown`).

use crate::service::NodeShared;
use basalt_meta::{Catalog, KeepAlive, NodeRecord};
use basalt_placement::ClusterMap;
use basalt_proto::{ErrorCode, WireError};
use basalt_types::NodeId;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How much earlier than the store could expire the lease the node stops acknowledging:
/// a fifth of the TTL (0.8 s of the default 4 s). It covers the time between the fence check
/// and the answer leaving the process (microseconds, unless the process stalls), and any
/// difference in rate between this host's monotonic clock and the store's (parts per million:
/// well under a millisecond per TTL). It does not cover a process stalled for longer than the
/// margin between its last check and its write to the socket.
pub(crate) fn margin(ttl: Duration) -> Duration {
    ttl / 5
}

/// Until when the node may acknowledge data-path requests.
#[derive(Debug)]
pub(crate) struct Fence {
    node: NodeId,
    ttl: Duration,
    valid_until: Mutex<Option<Instant>>,
}

impl Fence {
    /// A closed fence: nothing is acknowledged until a grant is confirmed.
    pub(crate) fn new(node: NodeId, ttl: Duration) -> Fence {
        Fence {
            node,
            ttl,
            valid_until: Mutex::new(None),
        }
    }

    /// A grant or renewal whose request was sent at `sent` succeeded.
    pub(crate) fn confirmed(&self, sent: Instant) {
        let until = sent + self.ttl - margin(self.ttl);
        let mut v = self.valid_until.lock();
        if v.is_none_or(|cur| cur < until) {
            *v = Some(until);
        }
    }

    /// The lease is gone: acknowledge nothing until a new one is confirmed.
    pub(crate) fn close(&self) {
        *self.valid_until.lock() = None;
    }

    pub(crate) fn valid_until(&self) -> Option<Instant> {
        *self.valid_until.lock()
    }

    /// `Ok` while the node may acknowledge, else the `Busy` error to answer with.
    pub(crate) fn check(&self) -> Result<(), WireError> {
        match self.valid_until() {
            Some(until) if Instant::now() < until => Ok(()),
            Some(until) => Err(self.refusal(&format!(
                "its last confirmed renewal allows acknowledgements until {:?} ago",
                Instant::now().duration_since(until)
            ))),
            None => Err(self.refusal("it holds no lease (registering)")),
        }
    }

    fn refusal(&self, why: &str) -> WireError {
        WireError::new(
            ErrorCode::Busy,
            format!(
                "{} cannot confirm its lease with the metadata store ({why}); it acknowledges \
                 nothing until it does, retry",
                self.node
            ),
        )
    }
}

/// Keeps the node registered until `stop`, starting from the registration `keep`: feeds every
/// renewal to the fence; after losing the lease, closes the fence, registers again, catches up
/// with the map and opens the fence. On `stop`, closes the fence and revokes the lease (the
/// record vanishes at once: a clean leave).
pub(crate) async fn maintain(
    catalog: Catalog,
    record: NodeRecord,
    ttl: Duration,
    shared: Arc<NodeShared>,
    mut keep: KeepAlive,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let mut confirmed = keep.confirmed();
        let stopping = loop {
            shared.fence.confirmed(*confirmed.borrow_and_update());
            tokio::select! {
                biased;
                changed = confirmed.changed() => if changed.is_err() { break false },
                _ = keep.lost() => break false,
                _ = stop.wait_for(|s| *s) => break true,
            }
        };
        if stopping {
            // Nothing is acknowledged once the lease may be gone: close first, then revoke.
            shared.fence.close();
            let _ = keep.revoke().await;
            return;
        }
        shared.fence.close();
        tracing::warn!(
            node = %record.id,
            "lease {} lost: acknowledging nothing until registered again",
            keep.lease()
        );
        drop(keep);
        let again = match register_again(&catalog, &record, ttl, &mut stop).await {
            Again::Registered(keep) => keep,
            Again::Stopped => return,
            Again::Removed(why) => {
                // Removed while its lease had run out (cut off): it never serves again, and
                // the process is told to stop ([`crate::Node::removed`]).
                tracing::error!(node = %record.id, "{why}");
                shared.removed.send_replace(Some(why));
                return;
            }
        };
        keep = again;
        if !catch_up(&catalog, &shared, &mut stop).await {
            let _ = keep.revoke().await;
            return;
        }
        tracing::info!(node = %record.id, "registered again under {}", keep.lease());
    }
}

/// How [`register_again`] ended.
enum Again {
    Registered(KeepAlive),
    /// The node is stopping.
    Stopped,
    /// The node was removed from the cluster (`basalt node remove`): why, to tell the operator.
    Removed(String),
}

/// Registers until it succeeds (each attempt bounded by the TTL), the node stops, or the
/// cluster says the node was removed.
async fn register_again(
    catalog: &Catalog,
    record: &NodeRecord,
    ttl: Duration,
    stop: &mut watch::Receiver<bool>,
) -> Again {
    let mut backoff = Duration::from_millis(100);
    loop {
        let attempt = tokio::time::timeout(ttl, catalog.register_node(record, ttl));
        let failure = tokio::select! {
            biased;
            r = attempt => match r {
                Ok(Ok(keep)) => return Again::Registered(keep),
                Ok(Err(e @ basalt_meta::MetaError::NodeRemoved { .. })) => {
                    return Again::Removed(e.to_string());
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {ttl:?}"),
            },
            _ = stop.wait_for(|s| *s) => return Again::Stopped,
        };
        tracing::debug!(node = %record.id, "registering again failed: {failure}; retrying");
        tokio::select! {
            biased;
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return Again::Stopped,
        }
        backoff = (backoff * 2).min(ttl / 3);
    }
}

/// Installs the current map before the node serves again (maps published while it was away
/// may have moved its placement groups). Returns false on stop.
async fn catch_up(
    catalog: &Catalog,
    shared: &NodeShared,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let mut backoff = Duration::from_millis(100);
    loop {
        let failure = tokio::select! {
            biased;
            r = catalog.get_map::<ClusterMap>() => match r {
                Ok(map) => {
                    if let Some((map, _)) = map {
                        shared.maps.offer(map);
                    }
                    return true;
                }
                Err(e) => e,
            },
            _ = stop.wait_for(|s| *s) => return false,
        };
        tracing::debug!("reading the map after registering again failed: {failure}; retrying");
        tokio::select! {
            biased;
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return false,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
