//! Sending one object operation to its primary, with retries across map changes and reconnects.

use crate::cluster::Cluster;
use crate::error::ClientError;
use basalt_placement::ClusterMap;
use basalt_proto::{ErrorCode, Request, Response, Session, WireError};
use basalt_types::{Epoch, NodeId, ObjectId};
use std::time::Duration;
use tokio::time::Instant;

/// Sends the request built by `make(epoch)` to the primary of `oid`, and retries while the failure
/// is one a newer map or a reconnect can cure: `StaleEpoch`, `NotPrimary`, a lost connection, a
/// restarting node. Gives up after the cluster's `op_timeout`.
pub async fn call_primary(
    cluster: &Cluster,
    oid: ObjectId,
    make: impl Fn(Epoch) -> Request,
) -> Result<Response, ClientError> {
    Ok(call_primary_at(cluster, oid, make).await?.1)
}

/// [`call_primary`], also saying which node answered.
pub async fn call_primary_at(
    cluster: &Cluster,
    oid: ObjectId,
    make: impl Fn(Epoch) -> Request,
) -> Result<(NodeId, Response), ClientError> {
    with_retry(cluster, |map| primary_node(map, &oid), make, None).await
}

/// What a read tries before each attempt at the primary: the node of a near copy and the
/// request for it (`read.rs`), taken when it answers in time with `Ok`.
pub(crate) type Near<'a> = &'a (dyn Fn(&ClusterMap) -> Option<(NodeId, Request)> + Sync);

/// [`call_primary`] for a read: each attempt first asks the copy `near` names, if any.
pub(crate) async fn call_read(
    cluster: &Cluster,
    oid: ObjectId,
    near: Near<'_>,
    make: impl Fn(Epoch) -> Request,
) -> Result<Response, ClientError> {
    let route = |map: &ClusterMap| primary_node(map, &oid);
    Ok(with_retry(cluster, route, make, Some(near)).await?.1)
}

/// Sends one request to one node (no primary lookup), with the same retry rules.
pub async fn call_node_with_retry(
    cluster: &Cluster,
    node: NodeId,
    make: impl Fn(Epoch) -> Request,
) -> Result<Response, ClientError> {
    Ok(with_retry(cluster, |_| Ok(node), make, None).await?.1)
}

/// The retry loop: `route` picks the node from the current map for each attempt; an attempt
/// gets no longer than what is left of the timeout. A stale map is
/// refreshed and the request re-sent at once; other curable failures wait with exponential
/// backoff (5 ms doubling to 500 ms) and re-read the map from the metadata store; an
/// unavailable PG (no up device holds its data) waits for the next map, up to the timeout,
/// then fails with [`ClientError::Unavailable`]. `near`: a copy each attempt tries first
/// (a read's, [`call_read`]). Returns the node that answered, and its answer.
async fn with_retry(
    cluster: &Cluster,
    route: impl Fn(&ClusterMap) -> Result<NodeId, ClientError>,
    make: impl Fn(Epoch) -> Request,
    near: Option<Near<'_>>,
) -> Result<(NodeId, Response), ClientError> {
    let timeout = cluster.config().op_timeout;
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(5);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let map = cluster.map();
        if let Some((node, req)) = near.and_then(|near| near(&map))
            && let Some(resp) = call_near(cluster, &map, node, req, deadline).await
        {
            return Ok((node, resp));
        }
        let failure = match route(&map) {
            Ok(node) => {
                match call_node(cluster, &map, node, make(map.epoch), deadline, &route).await {
                    Ok(resp) => return Ok((node, resp)),
                    Err(f) => f,
                }
            }
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

/// One attempt, ending by `deadline` at the latest: a node that does not answer by then (a
/// network partition holds the connection attempt, the request or its answer) fails the
/// attempt, and a connection it does not answer on is dropped so that the next request to
/// it connects anew. An attempt also ends when a newer map routes the request to another node
/// (the node was marked down, say, while partitioned: it gives no reset, and the request
/// would otherwise wait out the whole timeout). Sending it again is safe: the old node can no
/// longer acknowledge it (its members promised the new primary's term, and its lease fence
/// stopped it), and peering decided whatever of it the members had applied.
///
/// A write carries this client's session at `node` ([`Cluster::session`]); a write attempt
/// that ends without the node's answer (its timeout, a reroute, a lost connection, or the
/// caller dropping the operation) is marked abandoned ([`Cluster::abandoned`], by
/// [`Unanswered`]), so that the node versions it after no later write of this client (the
/// node's `sessions.rs`).
async fn call_node(
    cluster: &Cluster,
    map: &ClusterMap,
    node: NodeId,
    mut req: Request,
    deadline: Instant,
    route: &impl Fn(&ClusterMap) -> Result<NodeId, ClientError>,
) -> Result<Response, Failure> {
    let connected = tokio::time::timeout_at(deadline, cluster.service(map, node)).await;
    let Ok(connected) = connected else {
        return Err(Failure::Wait(format!(
            "connecting to {node} did not finish within the operation timeout ({:?})",
            cluster.config().op_timeout
        )));
    };
    let svc = match connected {
        Ok(svc) => svc,
        Err(e @ ClientError::Unreachable { .. }) => return Err(Failure::Wait(e.to_string())),
        // The node is not in the map (it is gone): wait for a map that says where to go.
        Err(e @ ClientError::Unavailable(_)) => return Err(Failure::Unavailable(e)),
        Err(e) => return Err(Failure::Fatal(e)),
    };
    let session = cluster.session(node);
    // (`then`, not `then_some`: a guard made for a read would drop, and count, at once.)
    let unanswered = req.set_session(session).then(|| Unanswered {
        cluster,
        node,
        session,
    });
    let answer = tokio::select! {
        biased;
        a = tokio::time::timeout_at(deadline, svc.call(req)) => a,
        epoch = rerouted(cluster, map.epoch, node, route) => {
            return Err(Failure::NewerMap(
                epoch,
                format!("map epoch {} routes the request away from {node}", epoch.0),
            ));
        }
    };
    match answer {
        Ok(Ok(resp)) => {
            unanswered.into_iter().for_each(Unanswered::answered);
            Ok(resp)
        }
        Ok(Err(e)) => {
            // Also what a lost connection answers: the node may have the request.
            if e.code != ErrorCode::ShuttingDown {
                unanswered.into_iter().for_each(Unanswered::answered);
            }
            Err(classify(cluster, node, map.epoch, e))
        }
        Err(_) => {
            cluster.drop_link(node);
            Err(Failure::Wait(format!(
                "{node} did not answer within the operation timeout ({:?})",
                cluster.config().op_timeout
            )))
        }
    }
}

/// A write attempt sent to `node` in `session` that has no answer yet: dropped so (its
/// timeout, a reroute, a lost connection, or its caller giving up on the whole operation, a
/// sibling piece of a split write that failed), it marks the attempt abandoned
/// ([`Cluster::abandoned`]): the node may still hold it.
struct Unanswered<'a> {
    cluster: &'a Cluster,
    node: NodeId,
    session: Session,
}

impl Unanswered<'_> {
    /// The node answered: nothing of the attempt is left there.
    fn answered(self) {
        std::mem::forget(self);
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        self.cluster.abandoned(self.node, self.session);
    }
}

/// One try of a near copy ([`call_read`]): its answer if it gave one in time (by the near read
/// timeout and by `deadline`), else `None` (refused, unreachable, slow): the caller goes on
/// to the primary.
async fn call_near(
    cluster: &Cluster,
    map: &ClusterMap,
    node: NodeId,
    req: Request,
    deadline: Instant,
) -> Option<Response> {
    let until = deadline.min(Instant::now() + cluster.config().near_read_timeout);
    let answer = tokio::time::timeout_at(until, async {
        cluster.service(map, node).await.ok()?.call(req).await.ok()
    });
    answer.await.ok().flatten()
}

/// Resolves (with its epoch) once a map newer than `sent` routes the request to a node other
/// than `node`, or to none.
async fn rerouted(
    cluster: &Cluster,
    sent: Epoch,
    node: NodeId,
    route: &impl Fn(&ClusterMap) -> Result<NodeId, ClientError>,
) -> Epoch {
    let mut seen = sent;
    loop {
        cluster.wait_until_map(seen.next()).await;
        let map = cluster.map();
        if map.epoch <= seen {
            continue;
        }
        seen = map.epoch;
        if route(&map).ok() != Some(node) {
            return seen;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FakeNode, Fixture, fixture, map, two_nodes};
    use crate::{ClusterConfig, VolumeOptions};
    use basalt_types::{PoolId, VolumeId};
    use bytes::Bytes;

    const OID: ObjectId = ObjectId {
        pool: PoolId(1),
        volume: VolumeId(1),
        index: 0,
    };

    fn read(epoch: Epoch) -> Request {
        Request::Read {
            epoch,
            oid: OID,
            offset: 0,
            len: 512,
        }
    }

    fn busy() -> WireError {
        WireError::new(ErrorCode::Busy, "busy")
    }

    #[tokio::test]
    async fn failures_are_classified_by_what_cures_them() {
        let fx = fixture(1, ClusterConfig::default()).await;
        let c = &fx.cluster;
        let stale = WireError::stale_epoch(Epoch(7), Epoch(3));
        assert!(matches!(
            classify(c, NodeId(1), Epoch(3), stale),
            Failure::NewerMap(Epoch(7), _)
        ));
        // A node that reports no newer epoch still makes the client look for the next one.
        let stale = WireError::stale_epoch(Epoch(0), Epoch(3));
        assert!(matches!(
            classify(c, NodeId(1), Epoch(3), stale),
            Failure::NewerMap(Epoch(4), _)
        ));
        let not_primary = WireError::new(ErrorCode::NotPrimary, "moved");
        assert!(matches!(
            classify(c, NodeId(1), Epoch(3), not_primary),
            Failure::NewerMap(Epoch(4), _)
        ));
        for code in [ErrorCode::Busy, ErrorCode::ShuttingDown] {
            let f = classify(c, NodeId(1), Epoch(3), WireError::new(code, "later"));
            assert!(matches!(f, Failure::Wait(_)), "{code:?}");
        }
        for code in [
            ErrorCode::NoSpace,
            ErrorCode::Checksum,
            ErrorCode::DeviceFailed,
            ErrorCode::InvalidArgument,
            ErrorCode::Internal,
        ] {
            match classify(c, NodeId(1), Epoch(3), WireError::new(code, "no")) {
                Failure::Fatal(e) => assert!(!code.is_retryable(), "{code:?}: {e}"),
                _ => panic!("{code:?} was retried"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn busy_nodes_are_retried_with_doubling_backoff() {
        let fx = fixture(1, ClusterConfig::default()).await;
        let node = FakeNode::install(&fx.cluster, 1);
        fx.cluster.inner.maps.offer(map(1, &[1]));
        node.script.lock().extend([busy(), busy(), busy(), busy()]);
        let start = tokio::time::Instant::now();
        let (answered_by, resp) = call_primary_at(&fx.cluster, OID, read).await.unwrap();
        assert_eq!(answered_by, NodeId(1));
        assert!(matches!(resp, Response::Read { .. }));
        assert_eq!(node.seen.lock().len(), 5);
        // 5 + 10 + 20 + 40 ms of (virtual) waiting.
        assert_eq!(start.elapsed(), std::time::Duration::from_millis(75));
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_never_answers_fails_at_the_operation_timeout() {
        // A node cut off by the network: the request went out, no answer ever comes back.
        let timeout = std::time::Duration::from_secs(2);
        let config = ClusterConfig {
            op_timeout: timeout,
            ..ClusterConfig::default()
        };
        let fx = fixture(1, config).await;
        let node = FakeNode::install(&fx.cluster, 1);
        fx.cluster.inner.maps.offer(map(1, &[1]));
        *node.before_answer.lock() = Some(Box::pin(std::future::pending()));
        let start = tokio::time::Instant::now();
        let call = call_primary(&fx.cluster, OID, read);
        match tokio::time::timeout(timeout * 10, call).await {
            Ok(Err(ClientError::RetriesExhausted { last, .. })) => {
                assert!(last.contains("did not answer"), "{last}");
            }
            Ok(other) => panic!("expected RetriesExhausted, got {other:?}"),
            Err(_) => panic!("the call still waits {:?} later", timeout * 10),
        }
        assert_eq!(start.elapsed(), timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_to_a_silent_node_moves_when_a_new_map_routes_it_elsewhere() {
        // The primary is partitioned (no answer, no reset); the leader publishes a map with
        // another primary: the request goes there at once, not after the operation timeout.
        let config = ClusterConfig {
            op_timeout: std::time::Duration::from_secs(30),
            ..ClusterConfig::default()
        };
        let fx = fixture(1, config).await;
        let silent = FakeNode::install(&fx.cluster, 1);
        let next = FakeNode::install(&fx.cluster, 2);
        fx.cluster.inner.maps.offer(map(1, &[1]));
        *silent.before_answer.lock() = Some(Box::pin(std::future::pending()));
        let start = tokio::time::Instant::now();
        let call = tokio::spawn({
            let c = fx.cluster.clone();
            async move { call_primary_at(&c, OID, read).await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert_eq!(
            silent.seen.lock().len(),
            1,
            "the request reached the silent node"
        );
        fx.cluster.inner.maps.offer(map(2, &[2]));
        let (answered_by, resp) = call.await.unwrap().unwrap();
        assert_eq!(answered_by, NodeId(2));
        assert!(matches!(resp, Response::Read { .. }));
        assert!(matches!(
            next.seen.lock().as_slice(),
            [Request::Read {
                epoch: Epoch(2),
                ..
            }]
        ));
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn connecting_to_a_node_that_does_not_answer_ends_at_the_operation_timeout() {
        // The node's address takes connections but never answers Hello; connecting gives up
        // only after the (longer) connect timeout.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let timeout = std::time::Duration::from_secs(2);
        let config = ClusterConfig {
            op_timeout: timeout,
            connect_timeout: timeout * 3,
            ..ClusterConfig::default()
        };
        let fx = fixture(1, config).await;
        let mut m = map(1, &[1]);
        m.nodes.get_mut(&NodeId(1)).unwrap().addr = silent.local_addr().unwrap().to_string();
        fx.cluster.inner.maps.offer(m);
        let start = tokio::time::Instant::now();
        let r = call_primary(&fx.cluster, OID, read).await;
        assert!(
            matches!(r, Err(ClientError::RetriesExhausted { .. })),
            "{r:?}"
        );
        assert_eq!(start.elapsed(), timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_give_up_at_the_operation_timeout() {
        let config = ClusterConfig {
            op_timeout: std::time::Duration::from_secs(2),
            ..ClusterConfig::default()
        };
        let fx = fixture(1, config).await;
        let node = FakeNode::install(&fx.cluster, 1);
        fx.cluster.inner.maps.offer(map(1, &[1]));
        node.script.lock().extend((0..1000).map(|_| busy()));
        let start = tokio::time::Instant::now();
        match call_primary(&fx.cluster, OID, read).await {
            Err(ClientError::RetriesExhausted { attempts, last }) => {
                // Attempts at 0, 5, 15, 35, 75, 155, 315, 635, 1135 and 1635 ms (waits double
                // from 5 ms up to 500 ms); one more wait would end past the 2 s timeout.
                assert_eq!(attempts, 10, "{last}");
                assert_eq!(attempts as usize, node.seen.lock().len());
            }
            other => panic!("expected RetriesExhausted, got {other:?}"),
        }
        assert!(start.elapsed() <= std::time::Duration::from_secs(2));
    }

    fn write(epoch: Epoch) -> Request {
        Request::Write {
            epoch,
            oid: OID,
            offset: 0,
            version: basalt_types::Version::NONE,
            fua: false,
            data: Bytes::from_static(&[1; 512]),
            session: basalt_proto::Session::NONE,
        }
    }

    /// The session generation of every write `node` received, in order.
    fn generations(node: &FakeNode) -> Vec<u64> {
        let seen = node.seen.lock();
        let sessions = seen.iter().filter_map(|r| match r {
            Request::Write { session, .. } => Some(*session),
            _ => None,
        });
        sessions.map(|s| s.generation).collect()
    }

    /// An attempt at a node that ends without the node's answer (rerouted by a new map, or
    /// the connection lost) raises the client's session generation at that node: the next
    /// write there tells the node to version none of the older attempts (it may still hold
    /// them). Answered attempts, and other nodes, keep theirs.
    #[tokio::test(start_paused = true)]
    async fn an_attempt_left_without_an_answer_raises_the_session_generation_of_its_node() {
        let (fx, n1, n2) = two_nodes(ClusterConfig::default()).await;
        call_primary(&fx.cluster, OID, write).await.unwrap();
        *n1.before_answer.lock() = Some(Box::pin(std::future::pending()));
        let call = tokio::spawn({
            let c = fx.cluster.clone();
            async move { call_primary_at(&c, OID, write).await }
        });
        while generations(&n1).len() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        fx.cluster.inner.maps.offer(map(2, &[2]));
        assert_eq!(call.await.unwrap().unwrap().0, NodeId(2));
        fx.cluster.inner.maps.offer(map(3, &[1]));
        n1.script
            .lock()
            .push_back(WireError::new(ErrorCode::ShuttingDown, "connection lost"));
        call_primary(&fx.cluster, OID, write).await.unwrap();
        call_primary(&fx.cluster, OID, write).await.unwrap();
        // 1, 1 (left waiting), then 2 (answered ShuttingDown), then 3 twice.
        assert_eq!(generations(&n1), [1, 1, 2, 3, 3]);
        assert_eq!(generations(&n2), [1]);
        let ids: std::collections::BTreeSet<u64> = n1
            .seen
            .lock()
            .iter()
            .chain(n2.seen.lock().iter())
            .filter_map(|r| match r {
                Request::Write { session, .. } => Some(session.client),
                _ => None,
            })
            .collect();
        assert_eq!(ids.len(), 1, "one client id");
        assert!(!ids.contains(&0), "a client's writes carry a session");
    }

    /// A caller that drops a write's operation while the node holds the attempt (a timeout
    /// of its own, a sibling piece of a split write that failed) abandons it too; a dropped
    /// read raises nothing.
    #[tokio::test(start_paused = true)]
    async fn a_write_dropped_by_its_caller_is_abandoned() {
        let fx = fixture(1, ClusterConfig::default()).await;
        let n1 = FakeNode::install(&fx.cluster, 1);
        fx.cluster.inner.maps.offer(map(1, &[1]));
        let short = std::time::Duration::from_millis(100);
        *n1.before_answer.lock() = Some(Box::pin(std::future::pending()));
        let read = tokio::time::timeout(short, call_primary(&fx.cluster, OID, read)).await;
        assert!(read.is_err(), "the read waits for the node");
        call_primary(&fx.cluster, OID, write).await.unwrap();
        *n1.before_answer.lock() = Some(Box::pin(std::future::pending()));
        let gave_up = tokio::time::timeout(short, call_primary(&fx.cluster, OID, write)).await;
        assert!(gave_up.is_err(), "the write waits for the node");
        call_primary(&fx.cluster, OID, write).await.unwrap();
        assert_eq!(generations(&n1), [1, 1, 2]);
    }

    /// Publishes `next` in the store while `node` handles its next request (so the client
    /// cannot have seen it before it asked).
    fn publish_on_next_request(fx: &Fixture, node: &FakeNode, next: ClusterMap) {
        let catalog = fx.catalog.clone();
        *node.before_answer.lock() = Some(Box::pin(async move {
            catalog.put_map(&next, None).await.unwrap();
        }));
    }

    #[tokio::test]
    async fn a_stale_epoch_is_resent_at_once_with_the_published_map() {
        let fx = fixture(1, ClusterConfig::default()).await;
        let node = FakeNode::install(&fx.cluster, 1);
        fx.cluster.inner.maps.offer(map(1, &[1]));
        // The node has epoch 2 (published meanwhile) and says the client is behind.
        publish_on_next_request(&fx, &node, map(2, &[1]));
        node.script
            .lock()
            .push_back(WireError::stale_epoch(Epoch(2), Epoch(1)));
        call_primary(&fx.cluster, OID, read).await.unwrap();
        assert_eq!(node.epochs(), [Epoch(1), Epoch(2)]);
    }

    #[tokio::test]
    async fn not_primary_follows_the_map_to_the_new_primary() {
        let (fx, n1, n2) = two_nodes(ClusterConfig::default()).await;
        publish_on_next_request(&fx, &n1, map(2, &[2]));
        n1.script
            .lock()
            .push_back(WireError::new(ErrorCode::NotPrimary, "not me"));
        let vol = fx
            .cluster
            .open_volume("v", VolumeOptions::default())
            .await
            .unwrap();
        vol.write(0, Bytes::from(vec![2u8; 512]), true)
            .await
            .unwrap();
        assert_eq!(n1.epochs(), [Epoch(1)]);
        assert_eq!(n2.epochs(), [Epoch(2)]);
    }
}
