//! The leader's rounds over the real embedded metadata store.

use super::*;
use basalt_meta::{DeviceRegistration, EmbeddedStore, NodeRecord, PoolSpec};
use basalt_types::DeviceId;

const TTL: Duration = Duration::from_secs(30);

fn config(mutual_after: Duration) -> LeaderConfig {
    LeaderConfig {
        name: "test".into(),
        ttl: TTL,
        down_out_interval: Duration::from_secs(3600),
        computations: Arc::default(),
        reports: ReportRules {
            min_reporters: 2,
            min_down: Duration::from_secs(3600),
            mutual_after,
        },
    }
}

async fn fresh_state(catalog: &Catalog) -> State {
    State {
        current: load(catalog).await.unwrap(),
        reports: Reports::default(),
        reported_down: BTreeMap::new(),
        seeded: false,
    }
}

/// Whether every device of `node` is up in `state`'s published map.
fn node_up(state: &State, node: NodeId) -> bool {
    let (map, _) = state.current.as_ref().expect("a published map");
    let mut devices = map.devices.values().filter(|d| d.node == node).peekable();
    assert!(devices.peek().is_some(), "{node} has no device in the map");
    devices.all(|d| d.up)
}

#[tokio::test]
async fn a_new_leader_keeps_a_node_its_predecessor_marked_down_for_a_broken_link_down() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("meta.redb"))
        .await
        .unwrap();
    let catalog = Catalog::new(Arc::new(store));
    let mut spec = PoolSpec::new("p");
    spec.replicas = 3;
    spec.pg_count = 8;
    catalog.create_pool(&spec).await.unwrap();
    let mut keeps = Vec::new();
    for i in 1..=3u32 {
        let record = NodeRecord::new(NodeId(i), format!("n{i}"), format!("127.0.0.1:{i}"));
        keeps.push(catalog.register_node(&record, TTL).await.unwrap());
        let reg = DeviceRegistration {
            id: DeviceId(10 + i),
            node: NodeId(i),
            path: format!("/d{i}"),
            class: "ssd".into(),
            capacity: 1 << 30,
            object_size: spec.object_size,
        };
        catalog.register_device(&reg).await.unwrap();
    }
    // Nodes 2 and 3 cannot reach each other; node 1 reaches both.
    let lease = |n: usize| keeps[n - 1].lease();
    catalog
        .put_failure_report(NodeId(2), NodeId(3), 0, lease(2))
        .await
        .unwrap();
    catalog
        .put_failure_report(NodeId(3), NodeId(2), 0, lease(3))
        .await
        .unwrap();
    let leadership = catalog.campaign("test", TTL).await.unwrap().unwrap();

    // The first leader marks node 3 (the higher id) down for the broken link.
    let mut first = fresh_state(&catalog).await;
    step(&catalog, &leadership, &config(Duration::ZERO), &mut first)
        .await
        .unwrap();
    assert!(
        !node_up(&first, NodeId(3)),
        "the broken link marks node 3 down"
    );
    assert!(node_up(&first, NodeId(2)));

    // Its successor, whose delay for the link has not run yet, publishes no map with node 3
    // up again in between (its PGs would move back to a node half the cluster cannot reach).
    let mut next = fresh_state(&catalog).await;
    let epoch = next.current.as_ref().unwrap().0.epoch;
    step(
        &catalog,
        &leadership,
        &config(Duration::from_secs(3600)),
        &mut next,
    )
    .await
    .unwrap();
    assert!(
        !node_up(&next, NodeId(3)),
        "the new leader lifted the marking"
    );
    assert_eq!(
        next.current.as_ref().unwrap().0.epoch,
        epoch,
        "a map was published"
    );
    assert!(next.reported_down.contains_key(&NodeId(3)));
}
