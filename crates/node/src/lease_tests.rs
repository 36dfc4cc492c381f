//! The fence and re-registration, in paused (virtual, deterministic) time, over the real
//! embedded metadata store made unreachable on demand.

use super::*;
use crate::testing::{Flaky, shared};
use basalt_meta::{MetaStore, WatchEvent, keys};

const TTL: Duration = Duration::from_secs(10);

/// Waits (in virtual time) until `cond` holds; fails after `limit`.
async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_fence_opens_until_ttl_minus_margin_after_the_confirmed_request() {
    let fence = Fence::new(NodeId(4), TTL);
    let e = fence.check().unwrap_err();
    assert_eq!(e.code, ErrorCode::Busy, "closed before any grant");
    assert!(
        e.message.contains("node.4") && e.message.contains("lease"),
        "{e:?}"
    );
    let sent = Instant::now();
    fence.confirmed(sent);
    let until = sent + TTL - margin(TTL);
    assert_eq!(fence.valid_until(), Some(until));
    assert_eq!(margin(TTL), Duration::from_secs(2));
    // An older confirmation (a late answer) never moves it back.
    fence.confirmed(sent - Duration::from_secs(1));
    assert_eq!(fence.valid_until(), Some(until));
    tokio::time::sleep_until(until - Duration::from_millis(1)).await;
    assert!(fence.check().is_ok());
    tokio::time::sleep_until(until).await;
    assert_eq!(fence.check().unwrap_err().code, ErrorCode::Busy);
    fence.confirmed(Instant::now());
    assert!(fence.check().is_ok());
    fence.close();
    assert_eq!(fence.check().unwrap_err().code, ErrorCode::Busy);
}

#[tokio::test(start_paused = true)]
async fn a_cut_off_node_stops_acknowledging_before_its_lease_expires_and_registers_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Flaky::open(&dir.path().join("meta.redb")).await;
    let catalog = Catalog::new(store.clone());
    let id = NodeId(1);
    let node = shared(id, TTL, Vec::new(), catalog.clone());
    let record = NodeRecord::new(id, "n1", "127.0.0.1:1");
    let keep = catalog.register_node(&record, TTL).await.unwrap();
    let first_lease = keep.lease();
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(maintain(
        catalog.clone(),
        record.clone(),
        TTL,
        node.clone(),
        keep,
        stop_rx,
    ));
    // Renewals move the fence forward: it stays TTL - margin after the last one was sent.
    wait_until("three renewals", TTL * 2, || store.renewals() >= 3).await;
    let last = store.last_renewal().unwrap();
    wait_until("the fence to follow", TTL, || {
        node.fence.valid_until() == store.last_renewal().map(|t| t + TTL - margin(TTL))
    })
    .await;
    assert!(node.fence.check().is_ok());
    assert!(last + TTL - margin(TTL) > Instant::now());

    // The store becomes unreachable. It expires the lease (deleting the node record) a TTL
    // after it received the last renewal; the node must have stopped acknowledging a margin
    // before that.
    let mut events = store.watch_prefix(keys::NODES, 0).await.unwrap();
    store.set_down(true);
    let until = node.fence.valid_until().unwrap();
    tokio::time::sleep_until(until - Duration::from_millis(1)).await;
    assert!(node.fence.check().is_ok(), "fenced before the margin");
    tokio::time::sleep_until(until).await;
    assert_eq!(node.fence.check().unwrap_err().code, ErrorCode::Busy);
    let deleted = match events.recv().await {
        Some(WatchEvent::Delete(kv)) => kv,
        other => panic!("expected the node record to expire, got {other:?}"),
    };
    assert_eq!(deleted.key, keys::node(id));
    let expired_at = Instant::now();
    assert!(
        until + margin(TTL) <= expired_at,
        "the lease expired {:?} before the fence closed",
        (until + margin(TTL)).duration_since(expired_at)
    );
    assert!(node.fence.check().is_err());

    // The store comes back: the node registers again (same record, new lease) and serves.
    store.set_down(false);
    wait_until("the fence to open again", TTL * 3, || {
        node.fence.check().is_ok()
    })
    .await;
    let kv = store
        .get(&keys::node(id))
        .await
        .unwrap()
        .expect("registered again");
    assert_ne!(kv.lease, Some(first_lease), "still the old lease");
    let again = catalog.get_node(id).await.unwrap().expect("a node record");
    assert_eq!(again, record, "the same record");
    let _ = stop_tx.send(true);
    task.await.unwrap();
    assert!(
        store.get(&keys::node(id)).await.unwrap().is_none(),
        "stopping revokes the lease"
    );
}

#[tokio::test(start_paused = true)]
async fn a_registration_attempt_applied_after_its_timeout_does_not_move_the_record_to_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = Flaky::open(&dir.path().join("meta.redb")).await;
    let catalog = Catalog::new(store.clone());
    let id = NodeId(3);
    let record = NodeRecord::new(id, "n3", "127.0.0.1:3");
    // The first attempt's write reaches the store but is applied only after the node gave
    // up on it (its timeout, the TTL) and registered again under a new lease. Its lease is
    // renewed meanwhile, as etcd renews every lease when a new etcd leader takes over (the
    // election that held the request up).
    store.delay_next_txn();
    let attempts = {
        let (catalog, record) = (catalog.clone(), record.clone());
        tokio::spawn(async move {
            let (_stop_tx, mut stop_rx) = watch::channel(false);
            register_again(&catalog, &record, TTL, &mut stop_rx).await
        })
    };
    wait_until("the first attempt to be held", TTL, || {
        store.late_waiting() == 1
    })
    .await;
    let first = store.granted()[0];
    tokio::time::sleep(TTL / 2).await;
    store.keep_alive(first).await.unwrap();
    let keep = match attempts.await.unwrap() {
        Again::Registered(keep) => keep,
        Again::Stopped => panic!("stopped"),
        Again::Removed(why) => panic!("removed: {why}"),
    };
    assert_ne!(keep.lease(), first);
    assert_eq!(held(&store, id).await, Some(keep.lease()));
    store.apply_late_txn();
    wait_until("the late write to be tried", TTL, || {
        store.late_applied() == 1
    })
    .await;
    assert_eq!(
        held(&store, id).await,
        Some(keep.lease()),
        "the late attempt moved the record to a lease nobody renews"
    );
    // And the record stays while the node's own lease is renewed.
    tokio::time::sleep(TTL * 2).await;
    assert_eq!(held(&store, id).await, Some(keep.lease()));
}

/// The lease holding node `id`'s record.
async fn held(store: &Flaky, id: NodeId) -> Option<basalt_meta::LeaseId> {
    let kv = store.get(&keys::node(id)).await.unwrap();
    kv.expect("the node record").lease
}
