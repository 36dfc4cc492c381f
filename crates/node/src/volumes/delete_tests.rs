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

/// A node serving pool `p`'s one PG alone on a simulated device, and volume "v" of four
/// objects in it.
async fn setup() -> (
    tempfile::TempDir,
    Catalog,
    basalt_meta::VolumeRecord,
    basalt_engine::Store,
    std::sync::Arc<crate::service::NodeShared>,
) {
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
    (dir, catalog, v, store, node)
}

/// A shrink the node has not seen, and a stale write it admitted under its old view whose
/// data reaches the store only after the discard started: the discard waits for it and
/// removes it, and every later write past the end is refused.
#[tokio::test]
async fn a_discard_sees_the_new_end_and_waits_for_writes_admitted_before() {
    let (_dir, catalog, v, store, node) = setup().await;
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

/// A discard whose client gave up goes on in its task; the volume grown back meanwhile and
/// written past the old end must not lose that write to it (found by a review): a later
/// discard (the grow's) waits for one still removing, and a removal checks the size again
/// before each page of objects.
#[tokio::test]
async fn a_removal_stops_once_the_volume_grew_and_a_later_one_waits_for_it() {
    let (_dir, catalog, v, store, node) = setup().await;
    let oid = |i| ObjectId::new(v.pool, v.id, i);
    catalog.resize_volume("v", u64::from(OS)).await.unwrap();
    // An earlier removal still running (what `delete_volume` holds while it removes): the
    // next one waits for it.
    let running = node
        .volumes
        .before_delete(v.pool, v.id, 1, Some(OS))
        .await
        .unwrap();
    assert_eq!(node.volumes.in_flight(), 1, "a removal counts in flight");
    let phase = node.volumes.drain_phase();
    let next = {
        let node = node.clone();
        tokio::spawn(async move { delete_volume(&node, Epoch(1000), v.pool, v.id, 1).await })
    };
    while node.volumes.drain_phase() == phase {
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        !next.is_finished(),
        "a removal did not wait for the one before"
    );
    assert_eq!(
        node.volumes.in_flight(),
        1,
        "the next removal waits uncounted"
    );
    drop(running);
    assert!(matches!(
        next.await.unwrap(),
        Ok(Response::Deleted { objects: 0 })
    ));
    assert_eq!(
        node.volumes.in_flight(),
        0,
        "a finished removal no longer counts"
    );
    // Two pages of objects past the end; the volume grows back after the first page.
    for i in 1..=300 {
        let data = Bytes::from(vec![9u8; 4096]);
        store
            .write(oid(i), 0, data, WriteOptions::default())
            .await
            .unwrap();
    }
    let pg = node
        .pgs
        .get(
            DeviceId(1),
            PgId {
                pool: v.pool,
                pg: 0,
            },
        )
        .unwrap();
    let checks = std::sync::atomic::AtomicU32::new(0);
    let still = || match checks.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
        0 => Ok(()),
        _ => Err(basalt_proto::WireError::new(
            ErrorCode::InvalidArgument,
            "grown since".to_string(),
        )),
    };
    let e = pg
        .delete_volume(&node.pgs.ctx, Epoch(1000), v.id, 1, &still)
        .await
        .unwrap_err();
    assert!(e.message.contains("grown since"), "{e:?}");
    let all = store.list_objects().await.unwrap();
    let live = all
        .iter()
        .filter(|o| o.oid.volume == v.id && !o.deleted)
        .count();
    assert_eq!(live, 300 - 256, "only the first page removed");
    // Through the node: the size check itself stops it once the volume grew.
    catalog
        .resize_volume("v", 400 * u64::from(OS))
        .await
        .unwrap();
    node.volumes.sync().await.unwrap();
    assert!(
        node.volumes
            .admit_delete(v.pool, v.id, 1, Some(OS))
            .is_err()
    );
}
