//! The collector's rules on a real store (simulated disk) and the real embedded metadata store:
//! which volumes' objects a pass removes, and which it must never touch.

use super::*;
use crate::testing::{Flaky, shared, sim_store};
use basalt_engine::{DeviceId, ObjectInfo, Store, WriteOptions};
use basalt_meta::{PoolSpec, keys};
use basalt_proto::ErrorCode;
use basalt_types::{Epoch, NodeId, PgId, PoolId, VolumeId};
use bytes::Bytes;

const OS: u32 = 128 << 10;

/// More than one listing page of a volume delete.
const PAGE: usize = 256;

/// Makes device 1 the active primary of PGs 0 and 1 of pool 1 (the collector works through
/// primaries), in an interval above every version the store assigned itself, and gives the
/// node the map of that interval (the collector's deletes carry the node's epoch, and a write
/// whose epoch is older than its PG's interval is refused).
fn serve(node: &NodeShared) {
    node.maps.offer(basalt_placement::ClusterMap {
        epoch: Epoch(1000),
        ..Default::default()
    });
    for pg in 0..2 {
        let id = PgId {
            pool: PoolId(1),
            pg,
        };
        node.pgs
            .get(DeviceId(1), id)
            .unwrap()
            .serve_alone_for_test(Epoch(1000));
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    catalog: Catalog,
    store: Store,
}

impl Fixture {
    async fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let meta = Flaky::open(&dir.path().join("meta.redb")).await;
        let catalog = Catalog::new(meta);
        catalog.create_pool(&PoolSpec::new("p")).await.unwrap();
        Fixture {
            _dir: dir,
            catalog,
            store: sim_store(1),
        }
    }

    /// A node over the store whose view of the volumes is listed now.
    async fn node(&self) -> Arc<NodeShared> {
        let node = shared(
            NodeId(1),
            Duration::from_secs(3600),
            vec![self.store.clone()],
            self.catalog.clone(),
        );
        node.volumes.list_now().await.unwrap();
        serve(&node);
        node
    }

    async fn create(&self, name: &str) -> VolumeId {
        self.catalog
            .create_volume(name, 64 << 20, "p")
            .await
            .unwrap()
            .id
    }

    async fn delete(&self, name: &str) {
        self.catalog.mark_volume_deleting(name).await.unwrap();
        self.catalog.remove_volume(name).await.unwrap();
    }

    /// Objects `0..n` of `volume` straight into the store (as a node that did not check, or
    /// an earlier process, put them there), spread over two PGs, each holding its index.
    async fn put(&self, volume: VolumeId, n: u64) {
        for i in 0..n {
            let opts = WriteOptions::buffered().in_pg((i % 2) as u32);
            let data = Bytes::from(vec![i as u8 + 1; 4096]);
            self.store
                .write(oid(volume, i), 0, data, opts)
                .await
                .unwrap();
        }
    }

    /// Tombstones `from..from + n` of `volume` (written, then deleted).
    async fn tombstones(&self, volume: VolumeId, from: u64, n: u64) {
        for i in from..from + n {
            let opts = WriteOptions::buffered().in_pg(0);
            let data = Bytes::from(vec![1u8; 4096]);
            self.store
                .write(oid(volume, i), 0, data, opts)
                .await
                .unwrap();
            self.store.delete(oid(volume, i), opts).await.unwrap();
        }
    }

    /// The objects of `volume` the store holds (tombstones not counted).
    async fn held(&self, volume: VolumeId) -> Vec<ObjectInfo> {
        let all = self.store.list_objects().await.unwrap();
        all.into_iter()
            .filter(|o| o.oid.volume == volume && !o.deleted)
            .collect()
    }

    /// Checks that the store holds exactly objects `0..n` of `volume`, object `i` filled with
    /// `i + 1` as written.
    async fn assert_intact(&self, volume: VolumeId, n: usize) {
        let held = self.held(volume).await;
        assert_eq!(held.len(), n, "{volume}: {held:?}");
        for i in 0..n as u64 {
            let got = self.store.read(oid(volume, i), 0, 4096).await.unwrap();
            assert_eq!(got, vec![i as u8 + 1; 4096], "{volume} object {i}");
        }
    }
}

fn oid(volume: VolumeId, index: u64) -> ObjectId {
    ObjectId::new(PoolId(1), volume, index)
}

async fn run_pass(fx: &Fixture, node: &NodeShared) -> u64 {
    let mut pacer = Pacer::new(1_000_000);
    pass(&fx.catalog, node, &mut pacer).await.unwrap()
}

#[tokio::test]
async fn a_pass_deletes_the_objects_of_volumes_that_no_longer_exist_and_nothing_else() {
    let fx = Fixture::new().await;
    // Deleted before the node (re)started: the node never saw it. Objects, and more tombstones
    // than one listing page holds.
    let before = fx.create("before").await;
    fx.put(before, 3).await;
    fx.tombstones(before, 10, PAGE as u64 + 44).await;
    fx.delete("before").await;
    let active = fx.create("active").await;
    fx.put(active, 4).await;
    let deleting = fx.create("deleting").await;
    fx.put(deleting, 2).await;
    fx.catalog.mark_volume_deleting("deleting").await.unwrap();
    let removed = fx.create("removed").await;
    fx.put(removed, 3).await;
    fx.tombstones(removed, 3, 2).await;
    // Never handed out: left alone (the metadata store may have gone back in time).
    let future = VolumeId(1000);
    fx.put(future, 2).await;
    // A record this version cannot read: no id without a record can be judged.
    let unreadable = keys::volume("zz");
    (fx.catalog.store())
        .put(&unreadable, b"from a newer version".to_vec(), None)
        .await
        .unwrap();
    let node = fx.node().await;
    fx.delete("removed").await;
    // Created after the node's last listing, with objects: the pass lists first.
    let late = fx.create("late").await;
    fx.put(late, 2).await;

    // Deleted as replicated writes: tombstones at the primary's versions.
    assert_eq!(run_pass(&fx, &node).await, 3, "only the removed volume");
    assert!(fx.held(removed).await.is_empty());
    assert_eq!(fx.held(before).await.len(), 3, "undecided");
    fx.catalog.store().delete(&unreadable).await.unwrap();
    assert_eq!(run_pass(&fx, &node).await, 3);
    assert!(fx.held(before).await.is_empty());
    assert_eq!(node.collector.passes.load(Relaxed), 2);
    assert_eq!(node.collector.objects.load(Relaxed), 6);
    let tombstone = fx.store.list_objects().await.unwrap();
    assert!(
        tombstone
            .iter()
            .any(|o| o.oid == oid(before, 0) && o.deleted && o.version.epoch == 1000),
        "deleted at a version of the primary's term"
    );

    // Everything else is intact, data included.
    for (volume, n) in [(active, 4), (deleting, 2), (future, 2), (late, 2)] {
        fx.assert_intact(volume, n).await;
    }
    // A collected volume stays refused.
    let e = node
        .volumes
        .admit_write(&oid(before, 0), 0, 4096, OS)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    // Nothing left to do.
    assert_eq!(run_pass(&fx, &node).await, 0);
}

#[tokio::test]
async fn a_pass_needs_the_metadata_store() {
    let dir = tempfile::tempdir().unwrap();
    let meta = Flaky::open(&dir.path().join("meta.redb")).await;
    let catalog = Catalog::new(meta.clone());
    catalog.create_pool(&PoolSpec::new("p")).await.unwrap();
    let v = catalog.create_volume("v", 1 << 20, "p").await.unwrap();
    let store = sim_store(1);
    let node = shared(
        NodeId(1),
        Duration::from_secs(3600),
        vec![store.clone()],
        catalog.clone(),
    );
    node.volumes.list_now().await.unwrap();
    serve(&node);
    store
        .write(
            oid(v.id, 0),
            0,
            Bytes::from(vec![1u8; 4096]),
            WriteOptions::buffered(),
        )
        .await
        .unwrap();
    catalog.mark_volume_deleting("v").await.unwrap();
    catalog.remove_volume("v").await.unwrap();
    meta.set_down(true);
    let mut pacer = Pacer::new(1_000_000);
    assert!(pass(&catalog, &node, &mut pacer).await.is_err());
    assert_eq!(store.list_objects().await.unwrap().len(), 1);
    assert!(!store.list_objects().await.unwrap()[0].deleted);
    assert_eq!(node.collector.passes.load(Relaxed), 0);
    meta.set_down(false);
    assert_eq!(pass(&catalog, &node, &mut pacer).await.unwrap(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_pacer_spaces_calls() {
    let mut pacer = Pacer::new(100);
    let start = Instant::now();
    for _ in 0..11 {
        pacer.tick().await;
    }
    assert_eq!(start.elapsed(), Duration::from_millis(100));
}

#[tokio::test]
async fn only_a_pgs_active_primary_collects_it() {
    let fx = Fixture::new().await;
    let gone = fx.create("gone").await;
    fx.put(gone, 2).await;
    fx.delete("gone").await;
    let node = shared(
        NodeId(1),
        Duration::from_secs(3600),
        vec![fx.store.clone()],
        fx.catalog.clone(),
    );
    node.volumes.list_now().await.unwrap();
    // A member that is not the primary leaves the objects to the primary's replicated delete.
    assert_eq!(run_pass(&fx, &node).await, 0);
    assert_eq!(fx.held(gone).await.len(), 2);
    serve(&node);
    assert_eq!(run_pass(&fx, &node).await, 2);
    assert!(fx.held(gone).await.is_empty());
}

/// A volume created after the pass listed the records, whose objects reached this node as a
/// member's writes (through another primary, whose view had it) while this node's watch
/// lagged: the pass's listing lacks it though it is alive. The walk lists again before it
/// judges such an id dead (a review found it purged: acknowledged writes lost), and a volume
/// that is really gone is still collected on the way.
#[tokio::test]
async fn a_volume_created_after_the_pass_listed_is_not_collected() {
    let fx = Fixture::new().await;
    let dead = fx.create("dead").await;
    fx.put(dead, 2).await;
    fx.delete("dead").await;
    // The pass's listing (the node's view follows no watch here: it lags for good).
    let node = fx.node().await;
    let late = fx.create("late").await;
    fx.put(late, 4).await;
    let mut last_id = fx.catalog.last_id(IdKind::Volume).await.unwrap();
    assert!(last_id >= late.0);
    let mut pacer = Pacer::new(1_000_000);
    let mut removed = 0;
    for pg in 0..2 {
        let id = PgId {
            pool: PoolId(1),
            pg,
        };
        let primary = node.pgs.existing(DeviceId(1), id).unwrap();
        removed += walk(&fx.catalog, &node, &primary, &mut last_id, &mut pacer)
            .await
            .unwrap();
    }
    assert_eq!(removed, 2, "only the dead volume's objects");
    assert!(fx.held(dead).await.is_empty());
    fx.assert_intact(late, 4).await;
    // And it takes writes: not marked gone.
    let _admitted = node
        .volumes
        .admit_write(&oid(late, 0), 0, 4096, OS)
        .await
        .expect("the live volume takes writes");
}

/// A PG whose collection fails (here an object of the dead volume still to recover onto its
/// primary: the delete answers `Busy`) does not keep the pass from the PGs after it; the pass
/// reports the failure, and the next one, once the PG is whole, collects the rest.
#[tokio::test]
async fn a_pg_that_fails_does_not_stop_the_pass_for_the_others() {
    let fx = Fixture::new().await;
    let gone = fx.create("gone").await;
    fx.put(gone, 4).await;
    fx.delete("gone").await;
    let node = fx.node().await;
    let pg0 = node
        .pgs
        .get(
            DeviceId(1),
            PgId {
                pool: PoolId(1),
                pg: 0,
            },
        )
        .unwrap();
    let lacking = crate::pg::Missing {
        version: basalt_types::Term::new(Epoch(1000), 0).version(1).unwrap(),
        deleted: false,
        sources: vec![DeviceId(2)],
        need: vec![DeviceId(1)],
    };
    pg0.with_primary_for_test(|p| p.missing.insert(oid(gone, 100), lacking));
    let mut pacer = Pacer::new(1_000_000);
    assert!(pass(&fx.catalog, &node, &mut pacer).await.is_err());
    let left: Vec<u64> = fx.held(gone).await.iter().map(|o| o.oid.index).collect();
    assert_eq!(
        left,
        vec![0, 2],
        "PG 1's objects (odd indexes) were not collected"
    );
    pg0.with_primary_for_test(|p| p.missing.clear());
    assert_eq!(run_pass(&fx, &node).await, 2);
    assert!(fx.held(gone).await.is_empty());
}
