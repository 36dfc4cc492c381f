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
/// backoff (5 ms doubling to 500 ms) and re-read the map from the metadata store; an
/// unavailable PG (no up device holds its data) waits for the next map, up to the timeout,
/// then fails with [`ClientError::Unavailable`].
async fn with_retry(
    cluster: &Cluster,
    route: impl Fn(&ClusterMap) -> Result<NodeId, ClientError>,
    make: impl Fn(Epoch) -> Request,
) -> Result<Response, ClientError> {
    let timeout = cluster.config().op_timeout;
    let deadline = Instant::now() + timeout;
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
            Err(e @ ClientError::Unavailable(_)) => Failure::Unavailable(e),
            Err(e) => Failure::Wait(e.to_string()),
        };
        let last = match failure {
            Failure::Fatal(e) => return Err(e),
            Failure::NewerMap(epoch, why) => {
                cluster.refresh_map(epoch).await?;
                why
            }
            Failure::Unavailable(e) => {
                // Only a new map can cure it: wait for one (the watch brings it).
                if Instant::now() + backoff > deadline {
                    return Err(unavailable_after(e, timeout));
                }
                cluster.wait_for_map(map.epoch.next(), backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
                e.to_string()
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

/// The error of an operation that found its PG unavailable until its timeout.
fn unavailable_after(e: ClientError, timeout: Duration) -> ClientError {
    match e {
        ClientError::Unavailable(why) => {
            ClientError::Unavailable(format!("{why}; gave up after {timeout:?}"))
        }
        other => other,
    }
}

enum Failure {
    /// Not curable by retrying.
    Fatal(ClientError),
    /// Retry once the map has reached this epoch.
    NewerMap(Epoch, String),
    /// Retry after a pause.
    Wait(String),
    /// The PG has no serving device in this map: retry when a newer map arrives.
    Unavailable(ClientError),
}

/// The node of the primary of `oid`'s PG: the first up member of its acting set. A PG with no
/// up acting member is unavailable: the caller waits for a map in which it is served again
/// (its data is never read from, or written to, a device that may not hold it).
fn primary_node(map: &ClusterMap, oid: &ObjectId) -> Result<NodeId, ClientError> {
    if map.epoch == Epoch(0) {
        return Err(ClientError::NoMap);
    }
    let (pg, entry) = map
        .locate(oid)
        .ok_or_else(|| ClientError::Unavailable(format!("pool {} is not in the map", oid.pool)))?;
    let primary = map.pg_primary(entry).ok_or_else(|| {
        ClientError::Unavailable(format!(
            "{pg}: none of the devices holding its data ({}) is up in map epoch {}",
            list(&entry.acting),
            map.epoch.0
        ))
    })?;
    map.devices
        .get(&primary)
        .map(|d| d.node)
        .ok_or_else(|| ClientError::Unavailable(format!("{primary} of {pg} is not in the map")))
}

fn list(devices: &[basalt_types::DeviceId]) -> String {
    if devices.is_empty() {
        return "none".into();
    }
    let names: Vec<String> = devices.iter().map(ToString::to_string).collect();
    names.join(", ")
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
        // The node is not in the map (it is gone): wait for a map that says where to go.
        Err(e @ ClientError::Unavailable(_)) => return Err(Failure::Unavailable(e)),
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
