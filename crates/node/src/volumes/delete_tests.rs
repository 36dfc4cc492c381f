//! `DeleteVolume` against the node's view of the volumes (`delete.rs` calls
//! [`super::Volumes::before_delete`]): it sees a shrink, waits for the writes admitted before,
//! and never removes data inside an active volume's size.

use crate::delete::delete_volume;
use crate::testing::{Flaky, shared, sim_store};
use basalt_engine::WriteOptions;
use basalt_meta::{Catalog, PoolSpec};
use basalt_placement::{ClusterMap, DeviceInfo, FailureDomain, PgMap, PoolMap};
use basalt_proto::{ErrorCode, Response};
use basalt_types::{DeviceId, Epoch, NodeId, ObjectId, PgId};
use bytes::Bytes;
use std::time::Duration;

const OS: u32 = 128 << 10;

/// A shrink the node has not seen, and a stale write it admitted under its old view whose
/// data reaches the store only after the discard started: the discard waits for it and
/// removes it, and every later write past the end is refused.
#[tokio::test]
async fn a_discard_sees_the_new_end_and_waits_for_writes_admitted_before() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::new(Flaky::open(&dir.path().join("meta.redb")).await);
    catalog.create_pool(&PoolSpec::new("p")).await.unwrap();
    let v = catalog
        .create_volume("v", 4 * u64::from(OS), "p")
        .await
        .unwrap();
    let store = sim_store(1);
    let node = shared(
        NodeId(1),
        Duration::from_secs(3600),
        vec![store.clone()],
        catalog.clone(),
    );
    // At the interval the PG is served in below: a write whose epoch is older than its PG's
    // interval is refused.
    let mut map = ClusterMap {
        epoch: Epoch(1000),
        ..ClusterMap::default()
    };
    map.pools.insert(
        v.pool,
        PoolMap {
            pg_count: 1,
            replicas: 1,
            min_size: 1,
            object_size: OS,
            failure_domain: FailureDomain::Host,
            device_class: None,
            pgs: vec![PgMap {
                up: vec![DeviceId(1)],
                acting: vec![DeviceId(1)],
                since: Epoch(1000),
            }],
        },
    );
    map.devices
        .insert(DeviceId(1), DeviceInfo::new(NodeId(1), "ssd", 1, OS));
    node.maps.offer(map);
    node.volumes.list_now().await.unwrap();
    // Deletes go through the PG's primary (replicated tombstones).
    let pg = PgId {
        pool: v.pool,
        pg: 0,
    };
    node.pgs
        .get(DeviceId(1), pg)
        .unwrap()
        .serve_alone_for_test(Epoch(1000));
    let gone = |info: Option<basalt_engine::ObjectInfo>| info.is_none_or(|i| i.deleted);
    let oid = |i| ObjectId::new(v.pool, v.id, i);
    let stale = node
        .volumes
        .admit_write(&oid(3), 0, 4096, OS)
        .await
        .unwrap();
    catalog.resize_volume("v", u64::from(OS)).await.unwrap();
    let phase = node.volumes.drain_phase();
    let delete = {
        let node = node.clone();
        tokio::spawn(async move { delete_volume(&node, Epoch(1000), v.pool, v.id, 1).await })
    };
    while node.volumes.drain_phase() == phase && !delete.is_finished() {
        tokio::task::yield_now().await;
    }
    let data = Bytes::from(vec![7u8; 4096]);
    store
        .write(oid(3), 0, data, WriteOptions::default())
        .await
        .unwrap();
    drop(stale);
    assert!(matches!(
        delete.await.unwrap(),
        Ok(Response::Deleted { objects: 1 })
    ));
    assert!(gone(store.object_info(oid(3)).await.unwrap()));
    let e = node
        .volumes
        .admit_write(&oid(1), 0, 4096, OS)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    // Grown again (its discard done): a late discard of the shrink, or a delete of the
    // active volume, would remove data inside it and is refused; the data stays.
    catalog.resize_volume("v", 2 * u64::from(OS)).await.unwrap();
    let _admitted = node
        .volumes
        .admit_write(&oid(1), 0, 4096, OS)
        .await
        .unwrap();
    let data = Bytes::from(vec![8u8; 4096]);
    store
        .write(oid(1), 0, data, WriteOptions::default())
        .await
        .unwrap();
    drop(_admitted);
    for from in [1, 0] {
        let e = delete_volume(&node, Epoch(1000), v.pool, v.id, from)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument, "{e:?}");
        assert!(e.message.contains("resized since"), "{}", e.message);
    }
    assert!(matches!(
        delete_volume(&node, Epoch(1000), v.pool, v.id, 2).await,
        Ok(Response::Deleted { objects: 0 })
    ));
    assert_eq!(store.read(oid(1), 0, 4096).await.unwrap(), vec![8u8; 4096]);
    // Once it is marked deleting, everything goes.
    catalog.mark_volume_deleting("v").await.unwrap();
    assert!(matches!(
        delete_volume(&node, Epoch(1000), v.pool, v.id, 0).await,
        Ok(Response::Deleted { objects: 1 })
    ));
}
