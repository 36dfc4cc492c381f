//! A node that stops cleanly leaves the cluster at once, but only after the requests it is
//! answering have finished: its lease (and with it its record, which tells the leader that its
//! devices are up) goes away after the last of them, and requests that arrive meanwhile are
//! refused with `ShuttingDown` (clients retry them elsewhere).

use basalt_engine::IoMode;
use basalt_meta::{Catalog, EmbeddedStore, MetaStore, PoolSpec, WatchEvent, keys};
use basalt_node::{DeviceConfig, Node, NodeConfig};
use basalt_proto::{ErrorCode, Request};
use basalt_types::{Epoch, ObjectId, PoolId, VolumeId};
use std::sync::Arc;
use std::time::Duration;

fn read(epoch: Epoch) -> Request {
    Request::Read {
        epoch,
        oid: ObjectId::new(PoolId(1), VolumeId(1), 0),
        offset: 0,
        len: 4096,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_node_finishes_requests_in_flight_before_revoking_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let meta: Arc<dyn MetaStore> = Arc::new(
        EmbeddedStore::open(&dir.path().join("meta.redb"))
            .await
            .unwrap(),
    );
    let catalog = Catalog::new(meta.clone());
    let mut spec = PoolSpec::new("p");
    spec.replicas = 1;
    spec.pg_count = 8;
    catalog.create_pool(&spec).await.unwrap();
    let mut config = NodeConfig::new(dir.path().join("node"), "127.0.0.1:0".parse().unwrap());
    config.io = IoMode::Psync;
    config.devices.push(DeviceConfig {
        size: Some(256 << 20),
        ..DeviceConfig::new(dir.path().join("dev0.img"))
    });
    let node = Node::start(config, meta.clone(), false).await.unwrap();
    assert!(node.wait_until_placed(Duration::from_secs(30)).await);
    let id = node.id();
    let key = keys::node(id);
    assert!(meta.get(&key).await.unwrap().is_some(), "registered");
    let mut events = meta
        .watch_prefix(keys::NODES, meta.revision().await.unwrap() + 1)
        .await
        .unwrap();

    // A request for a map epoch the node has not seen waits for it (up to 2 s): in flight.
    // Far ahead, so that maps the leader publishes meanwhile do not answer it early.
    let svc = node.service();
    let epoch = node.epoch();
    let mut call = svc.call(read(Epoch(epoch.0 + 1_000_000)));
    // Polled once before the node starts leaving: past the check that refuses new requests.
    assert!(futures::poll!(&mut call).is_pending());
    let in_flight = tokio::spawn(call);
    let leave = tokio::spawn(node.shutdown());

    // New requests are refused once the node is leaving.
    let refused = loop {
        match svc.call(read(epoch)).await {
            Err(e) if e.code == ErrorCode::ShuttingDown => break e,
            _ => tokio::task::yield_now().await,
        }
    };
    assert!(refused.message.contains("shutting down"), "{refused:?}");
    assert!(
        !in_flight.is_finished(),
        "the request in flight is still waiting"
    );

    // The record vanishes (the lease is revoked) only once the request in flight is answered.
    loop {
        match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
            Ok(Some(WatchEvent::Delete(kv))) if kv.key == key => break,
            Ok(Some(WatchEvent::Lost(why))) => panic!("watch lost: {why}"),
            Ok(Some(_)) => {}
            other => panic!("the node record did not vanish: {other:?}"),
        }
    }
    assert!(
        in_flight.is_finished(),
        "the node revoked its lease while a request was in flight"
    );
    let answer = in_flight.await.unwrap();
    let busy = answer.expect_err("a map epoch the node never saw");
    assert_eq!(busy.code, ErrorCode::Busy, "{busy:?}");
    tokio::time::timeout(Duration::from_secs(30), leave)
        .await
        .expect("the node stops")
        .unwrap();
    assert!(meta.get(&key).await.unwrap().is_none());
}
