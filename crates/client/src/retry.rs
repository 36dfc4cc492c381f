//! Sending one object operation to its primary, with retries across map changes and reconnects.

use crate::cluster::Cluster;
use crate::error::ClientError;
use basalt_placement::ClusterMap;
use basalt_proto::{ErrorCode, Request, Response, WireError};
use basalt_types::{Epoch, NodeId, ObjectId};
use std::time::{Duration, Instant};

/// Sends the request built by `make(epoch)` to the primary of `oid`, and retries while the failure
/// is one a newer map or a reconnect can cure: `StaleEpoch`, `NotPrimary`, a lost connection, a
/// restarting node. Gives up after the cluster's `op_timeout`.
pub async fn call_primary(
    cluster: &Cluster,
    oid: ObjectId,
    make: impl Fn(Epoch) -> Request,
) -> Result<Response, ClientError> {
    with_retry(cluster, |map| primary_node(map, &oid), make).await
}

/// Sends one request to one node (no primary lookup), with the same retry rules.
pub async fn call_node_with_retry(
    cluster: &Cluster,
    node: NodeId,
    make: impl Fn(Epoch) -> Request,
) -> Result<Response, ClientError> {
    with_retry(cluster, |_| Ok(node), make).await
}

/// The retry loop: `route` picks the node from the current map for each attempt. A stale map is
/// refreshed and the request re-sent at once; other curable failures wait with exponential
/// backoff (5 ms doubling to 500 ms) and re-read the map from the metadata store.
async fn with_retry(
    cluster: &Cluster,
    route: impl Fn(&ClusterMap) -> Result<NodeId, ClientError>,
    make: impl Fn(Epoch) -> Request,
) -> Result<Response, ClientError> {
    let deadline = Instant::now() + cluster.config().op_timeout;
    let mut backoff = Duration::from_millis(5);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let map = cluster.map();
        let failure = match route(&map) {
            Ok(node) => match call_node(cluster, &map, node, make(map.epoch)).await {
                Ok(resp) => return Ok(resp),
                Err(f) => f,
            },
            Err(e) => Failure::Wait(e.to_string()),
        };
        let last = match failure {
            Failure::Fatal(e) => return Err(e),
            Failure::NewerMap(epoch, why) => {
                cluster.refresh_map(epoch).await?;
                why
            }
            Failure::Wait(why) => {
                if Instant::now() + backoff > deadline {
                    return Err(ClientError::RetriesExhausted {
                        attempts,
                        last: why,
                    });
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
                cluster.reload_map().await;
                why
            }
        };
        if Instant::now() > deadline {
            return Err(ClientError::RetriesExhausted { attempts, last });
        }
        tracing::debug!(attempts, "retrying: {last}");
    }
}

enum Failure {
    /// Not curable by retrying.
    Fatal(ClientError),
    /// Retry once the map has reached this epoch.
    NewerMap(Epoch, String),
    /// Retry after a pause.
    Wait(String),
}

fn primary_node(map: &ClusterMap, oid: &ObjectId) -> Result<NodeId, ClientError> {
    if map.epoch == Epoch(0) {
        return Err(ClientError::NoMap);
    }
    let (pg, devices) = map
        .locate(oid)
        .ok_or_else(|| ClientError::Unavailable(format!("pool {} is not in the map", oid.pool)))?;
    let primary = devices
        .first()
        .ok_or_else(|| ClientError::Unavailable(pg.to_string()))?;
    map.devices
        .get(primary)
        .map(|d| d.node)
        .ok_or_else(|| ClientError::Unavailable(format!("{primary} of {pg} is not in the map")))
}

async fn call_node(
    cluster: &Cluster,
    map: &ClusterMap,
    node: NodeId,
    req: Request,
) -> Result<Response, Failure> {
    let svc = match cluster.service(map, node).await {
        Ok(svc) => svc,
        Err(e @ ClientError::Unreachable { .. }) => return Err(Failure::Wait(e.to_string())),
        Err(e) => return Err(Failure::Fatal(e)),
    };
    match svc.call(req).await {
        Ok(resp) => Ok(resp),
        Err(e) => Err(classify(cluster, node, map.epoch, e)),
    }
}

fn classify(cluster: &Cluster, node: NodeId, sent: Epoch, e: WireError) -> Failure {
    match e.code {
        ErrorCode::StaleEpoch => Failure::NewerMap(e.epoch.max(sent.next()), e.message),
        ErrorCode::NotPrimary => Failure::NewerMap(sent.next(), e.message),
        ErrorCode::ShuttingDown => {
            cluster.drop_link(node);
            Failure::Wait(e.message)
        }
        ErrorCode::Busy => Failure::Wait(e.message),
        _ => Failure::Fatal(ClientError::from_wire(e)),
    }
}
