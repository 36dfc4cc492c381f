//! The leader with real nodes (real device files, the embedded metadata store): what wakes it,
//! operator state across restarts, the down-out rule, PG-ready reports, failure reports.

use basalt_meta::{
    Catalog, DeviceState, EmbeddedStore, MetaStore, OutReason, PgReadyRecord, PoolSpec,
};
use basalt_node::{DeviceConfig, Node, NodeConfig, ReportRules};
use basalt_placement::ClusterMap;
use basalt_types::{DeviceId, Epoch, NodeId, PgId};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

struct Cluster {
    dir: tempfile::TempDir,
    store: Arc<dyn MetaStore>,
    catalog: Catalog,
}

impl Cluster {
    async fn new() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn MetaStore> = Arc::new(
            EmbeddedStore::open(dir.path().join("meta.redb"))
                .await
                .unwrap(),
        );
        let catalog = Catalog::new(store.clone());
        Cluster {
            dir,
            store,
            catalog,
        }
    }

    /// A one-copy pool: its PGs start on the devices registered when it is first placed.
    async fn pool(&self, pgs: u32) {
        let mut spec = PoolSpec::new("default");
        spec.replicas = 1;
        spec.pg_count = pgs;
        self.catalog.create_pool(&spec).await.unwrap();
    }

    /// Starts node `name` with one 256 MiB device file.
    async fn node(&self, name: &str, leader: bool, down_out: Duration) -> Node {
        self.node_with(name, leader, down_out, ReportRules::default())
            .await
    }

    /// Starts node `name` with one 256 MiB device file and the failure-report `rules`.
    async fn node_with(
        &self,
        name: &str,
        leader: bool,
        down_out: Duration,
        rules: ReportRules,
    ) -> Node {
        let data = self.dir.path().join(name);
        let mut config = NodeConfig::new(&data, "127.0.0.1:0".parse().unwrap());
        config.name = name.into();
        config.leader_eligible = leader;
        config.lease_ttl = Duration::from_secs(2);
        config.down_out_interval = down_out;
        config.reports = rules;
        config.devices.push(device(&data));
        Node::start(config, self.store.clone(), false)
            .await
            .unwrap()
    }

    /// Waits (on the map watch, no sleeps) for a map satisfying `pred`.
    async fn map_where(&self, what: &str, pred: impl Fn(&ClusterMap) -> bool) -> ClusterMap {
        self.maps().await.next_where(what, pred).await
    }

    /// A map watch that has read the current map: every later map comes through it, in order
    /// (a watch opened after a change may start past a map the test must see).
    async fn maps(&self) -> Maps {
        let mut rx = self.catalog.watch_map::<ClusterMap>().await.unwrap();
        let current = tokio::time::timeout(WAIT, rx.recv()).await;
        let Ok(Some(current)) = current else {
            panic!("no current map within {WAIT:?}")
        };
        Maps {
            rx,
            current: Some(current),
        }
    }
}

struct Maps {
    rx: tokio::sync::mpsc::Receiver<ClusterMap>,
    current: Option<ClusterMap>,
}

impl Maps {
    /// The first map from the current one on satisfying `pred`.
    async fn next_where(&mut self, what: &str, pred: impl Fn(&ClusterMap) -> bool) -> ClusterMap {
        if let Some(m) = self.current.take().filter(&pred) {
            return m;
        }
        let found = tokio::time::timeout(WAIT, async {
            while let Some(m) = self.rx.recv().await {
                if pred(&m) {
                    return m;
                }
            }
            panic!("the map watch ended");
        })
        .await;
        found.unwrap_or_else(|_| panic!("no map with {what} within {WAIT:?}"))
    }
}

fn device(data: &Path) -> DeviceConfig {
    DeviceConfig {
        size: Some(256 << 20),
        journal_size: Some(16 << 20),
        ..DeviceConfig::new(data.join("dev.img"))
    }
}

fn only_device(node: &Node) -> DeviceId {
    let status = node.status();
    assert_eq!(status.devices.len(), 1);
    status.devices[0].id
}

/// PGs of pool 1 by where their data is.
fn acting_on(map: &ClusterMap, d: DeviceId) -> Vec<usize> {
    map.pools
        .values()
        .flat_map(|p| p.pgs.iter().enumerate())
        .filter(|(_, pg)| pg.acting == [d])
        .map(|(i, _)| i)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_records_and_its_own_map_writes_do_not_wake_the_leader() {
    let c = Cluster::new().await;
    c.pool(16).await;
    let node = c.node("a", true, Duration::from_secs(600)).await;
    assert!(node.wait_until_placed(WAIT).await);
    let dev = only_device(&node);
    let first = c.map_where("the device placed", |m| m.is_up(dev)).await;
    let before = node.map_computations();
    for i in 0..5 {
        c.catalog
            .create_volume(&format!("v{i}"), 1 << 20, "default")
            .await
            .unwrap();
    }
    // A change that matters comes after them (events arrive in order): when its map is out,
    // the leader has seen everything before it.
    c.catalog.set_device_weight(dev, 77).await.unwrap();
    let after = c
        .map_where("the new weight", |m| m.devices[&dev].weight == 77)
        .await;
    assert_eq!(
        after.epoch,
        first.epoch.next(),
        "volume creation made no new epoch"
    );
    assert_eq!(
        node.map_computations() - before,
        1,
        "one computation: for the weight, none for the volumes or the map write"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_operators_out_and_weight() {
    let c = Cluster::new().await;
    c.pool(16).await;
    let node = c.node("a", true, Duration::from_secs(600)).await;
    assert!(node.wait_until_placed(WAIT).await);
    let dev = only_device(&node);
    c.catalog
        .set_device_out(dev, Some(OutReason::Operator))
        .await
        .unwrap();
    c.catalog.set_device_weight(dev, 3).await.unwrap();
    c.map_where("the device out", |m| {
        m.devices
            .get(&dev)
            .is_some_and(|d| !d.r#in && d.weight == 3)
    })
    .await;
    node.shutdown().await;

    let node = c.node("a", true, Duration::from_secs(600)).await;
    let rec = c.catalog.get_device(dev).await.unwrap().unwrap();
    assert_eq!(rec.out, Some(OutReason::Operator), "{rec:?}");
    assert_eq!(rec.weight, 3, "{rec:?}");
    assert_eq!(rec.state, DeviceState::Up);
    let map = c.map_where("the device up again", |m| m.is_up(dev)).await;
    let d = &map.devices[&dev];
    assert!(!d.r#in && d.weight == 3, "{d:?}");
    // Out, but the only holder of the data: it still serves every PG.
    assert_eq!(acting_on(&map, dev).len(), 16);
    node.shutdown().await;
}

/// Nodes a (eligible to lead) and b, down-out interval 1 s, and a pool of `pgs` PGs created
/// after both devices are up, so its PGs start spread over both.
async fn two_nodes(pgs: u32) -> (Cluster, Node, Node) {
    let c = Cluster::new().await;
    let a = c.node("a", true, Duration::from_secs(1)).await;
    let b = c.node("b", false, Duration::from_secs(1)).await;
    c.map_where("both devices up", |m| {
        m.devices.len() == 2 && m.devices.values().all(|d| d.up)
    })
    .await;
    c.pool(pgs).await;
    assert!(a.wait_until_placed(WAIT).await && b.wait_until_placed(WAIT).await);
    (c, a, b)
}

/// Node b goes away: its device is down, keeps its PGs (unavailable, never handed to a), is
/// marked out after the down-out interval (up sets move, acting sets stay), and comes back in
/// with its PGs when b returns. A PG-ready report for the new up set moves one PG's acting set;
/// a stale one does nothing; both are consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_device_keeps_its_data_goes_out_after_the_interval_and_comes_back() {
    let (c, a, b) = two_nodes(32).await;
    let (da, db) = (only_device(&a), only_device(&b));
    let placed = c
        .map_where("both devices holding PGs", |m| {
            !acting_on(m, da).is_empty() && !acting_on(m, db).is_empty()
        })
        .await;
    let on_b = acting_on(&placed, db);
    // Watched from before the stop: the map that marks the device out (1 s later, or right
    // after the down map in the same leader round) must not hide the down map.
    let mut maps = c.maps().await;
    b.shutdown().await;

    let down = maps.next_where("b's device down", |m| !m.is_up(db)).await;
    assert_eq!(
        acting_on(&down, db),
        on_b,
        "down is not out: b's PGs stay on b"
    );
    let pool = &down.pools.values().next().unwrap();
    assert_eq!(pool.unavailable(&down), on_b.len());
    for &i in &on_b {
        assert_eq!(
            pool.pgs[i].up,
            [db],
            "pg {i}: a down device keeps its up sets"
        );
    }
    let out = c
        .map_where("b's device out automatically", |m| {
            m.devices.get(&db).is_some_and(|d| !d.r#in && d.auto_out)
        })
        .await;
    assert_eq!(acting_on(&out, db), on_b, "out moves up, not acting");
    let pool = out.pools.values().next().unwrap();
    for &i in &on_b {
        assert_eq!(pool.pgs[i].up, [da], "pg {i}: up moved to a");
        assert_eq!(out.pg_primary(&pool.pgs[i]), None, "pg {i} unavailable");
    }

    // The primary of one of them reports it complete on its new up set, in its interval;
    // another report names a set that is not the up set; a third the up set, but from an
    // older interval than the PG's (a primary whose term had ended).
    let pool_id = *out.pools.keys().next().unwrap();
    let pg = |i: usize| PgId {
        pool: pool_id,
        pg: i as u32,
    };
    assert!(on_b.len() >= 3, "{on_b:?}");
    let (moved, stale, older) = (on_b[0], on_b[1], on_b[2]);
    let since = |i: usize| out.pools[&pool_id].pgs[i].since;
    c.catalog
        .put_pg_ready(&PgReadyRecord::new(pg(stale), out.epoch, vec![db]))
        .await
        .unwrap();
    let before = Epoch(since(older).0 - 1);
    let report = PgReadyRecord::new(pg(older), out.epoch, vec![da]).in_interval(before);
    c.catalog.put_pg_ready(&report).await.unwrap();
    let report = PgReadyRecord::new(pg(moved), out.epoch, vec![da]).in_interval(since(moved));
    c.catalog.put_pg_ready(&report).await.unwrap();
    let ready = c
        .map_where("the report applied", |m| {
            m.pools[&pool_id].pgs[moved].acting == [da]
        })
        .await;
    let entry = &ready.pools[&pool_id].pgs[moved];
    assert_eq!(entry.since, ready.epoch, "its serving set changed");
    assert_eq!(ready.pools[&pool_id].pgs[stale].acting, [db]);
    assert_eq!(
        ready.pools[&pool_id].pgs[older].acting,
        [db],
        "a report of an older interval is not applied"
    );
    // Consumed: nothing is left once the leader has seen them.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut reports = c
        .store
        .watch_prefix(basalt_meta::keys::PG_READY, 0)
        .await
        .unwrap();
    while !c.catalog.list_pg_ready().await.unwrap().is_empty() {
        tokio::time::timeout_at(deadline, reports.recv())
            .await
            .expect("reports consumed");
    }

    // b returns: its device is up and in again, and serves its PGs (but the one that moved).
    let b = c.node("b", false, Duration::from_secs(1)).await;
    let back = c
        .map_where("b's device back in", |m| {
            m.is_up(db) && m.devices[&db].r#in && !m.devices[&db].auto_out
        })
        .await;
    let expect: Vec<usize> = on_b.iter().copied().filter(|&i| i != moved).collect();
    assert_eq!(acting_on(&back, db), expect);
    assert_eq!(back.pools[&pool_id].unavailable(&back), 0);
    b.shutdown().await;
    a.shutdown().await;
}

/// Maintenance (`basalt config set noout on`): a device down past the down-out interval stays
/// in while the flag is set, and goes out once it is unset (the leader watches the settings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noout_keeps_a_down_device_in_until_it_is_unset() {
    let (c, a, b) = two_nodes(8).await;
    let (da, db) = (only_device(&a), only_device(&b));
    c.catalog.update_settings(|s| s.noout = true).await.unwrap();
    b.shutdown().await;
    let down = c.map_where("b's device down", |m| !m.is_up(db)).await;
    let due = down.devices[&db].down_since.expect("down since") + 1;
    // Past the interval by the leader's clock (whole seconds).
    let deadline = tokio::time::Instant::now() + WAIT;
    while basalt_meta::clock::unix_secs() <= due {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the clock stands still"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Two computations after it (each applies the down-out rule after publishing): b stays in.
    for w in [5, 6] {
        c.catalog.set_device_weight(da, w).await.unwrap();
        let m = c
            .map_where("the new weight", |m| m.devices[&da].weight == w)
            .await;
        assert!(m.devices[&db].r#in, "noout: b's device stays in");
    }
    let rec = c.catalog.get_device(db).await.unwrap().unwrap();
    assert_eq!(rec.out, None, "{rec:?}");
    c.catalog
        .update_settings(|s| s.noout = false)
        .await
        .unwrap();
    c.map_where("b's device out once noout is unset", |m| {
        !m.devices[&db].r#in && m.devices[&db].auto_out
    })
    .await;
    a.shutdown().await;
}

/// Writes `reporter`'s failure report of `accused` under `reporter`'s lease.
async fn report(c: &Cluster, reporter: &Node, accused: &Node) {
    let lease = c.catalog.node_lease(reporter.id()).await.unwrap().unwrap();
    c.catalog
        .put_failure_report(reporter.id(), accused.id(), 0, lease)
        .await
        .unwrap();
}

/// Node b is reported by a alone (not enough), then by c too: its device goes down (the map
/// right after the one where it was up); c withdraws: b stays down for `min_down` (damping),
/// then comes back up. Reported again by a and c, then c leaves (its lease is revoked, its
/// report vanishes with it): b is up again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reported_by_two_live_peers_is_down_until_the_reports_go() {
    let c = Cluster::new().await;
    let min_down = Duration::from_secs(2);
    let rules = ReportRules {
        min_reporters: 2,
        min_down,
        mutual_after: Duration::from_secs(600),
    };
    let down_out = Duration::from_secs(600);
    let a = c.node_with("a", true, down_out, rules.clone()).await;
    let b = c.node_with("b", false, down_out, rules.clone()).await;
    let n3 = c.node_with("c", false, down_out, rules).await;
    c.map_where("three devices up", |m| {
        m.devices.len() == 3 && m.devices.values().all(|d| d.up)
    })
    .await;
    c.pool(16).await;
    for n in [&a, &b, &n3] {
        assert!(n.wait_until_placed(WAIT).await);
    }
    let db = only_device(&b);
    let before = c.map_where("b up", |m| m.is_up(db)).await;

    report(&c, &a, &b).await;
    // One reporter is not enough; a change the leader must publish comes after it (events
    // arrive in order), so when that map is out the leader has judged the report.
    let da = only_device(&a);
    c.catalog.set_device_weight(da, 77).await.unwrap();
    let judged = c
        .map_where("the new weight", |m| m.devices[&da].weight == 77)
        .await;
    assert!(judged.is_up(db), "one reporter took b down");
    // (The weight moves PGs to a: maps of their new acting sets may come in between, so the
    // epochs are not checked one by one.)
    assert!(judged.epoch > before.epoch);

    // Before the report: the leader marks b down after it reads the report, so the damping
    // runs from later than this.
    let marked = std::time::Instant::now();
    report(&c, &n3, &b).await;
    let down = c.map_where("b down", |m| !m.is_up(db)).await;
    assert!(down.epoch > judged.epoch, "{down:?}");
    assert!(
        down.nodes.contains_key(&b.id()),
        "b is still registered (it holds its lease)"
    );

    assert!(
        c.catalog
            .remove_failure_report(n3.id(), b.id())
            .await
            .unwrap()
    );
    c.map_where("b up again", |m| m.is_up(db)).await;
    let after = marked.elapsed();
    assert!(
        after >= min_down,
        "b came back {after:?} after it was marked down (damping {min_down:?})"
    );

    // Reported again, then a reporter dies: its report goes with its lease.
    report(&c, &n3, &b).await;
    c.map_where("b down again", |m| !m.is_up(db)).await;
    let gone = n3.id();
    n3.shutdown().await;
    c.map_where("b up once c is gone", |m| {
        m.is_up(db) && !m.nodes.contains_key(&gone)
    })
    .await;
    let left: Vec<(NodeId, NodeId)> = c
        .catalog
        .list_failure_reports()
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.reporter, r.accused))
        .collect();
    assert_eq!(left, vec![(a.id(), b.id())], "c's report vanished with it");
    b.shutdown().await;
    a.shutdown().await;
}

/// A leader of a cluster larger than it computes inline (more than 64 devices: the map is
/// computed on a blocking thread, so that its own I/O keeps being served): the map is published
/// all the same and places the pool over every device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_places_a_large_cluster_computed_off_its_thread() {
    let c = Cluster::new().await;
    for k in 0..99u32 {
        c.catalog
            .register_device(&basalt_meta::DeviceRegistration {
                id: DeviceId(1000 + k),
                node: NodeId(100 + k / 3),
                path: format!("/dev/fake{k}"),
                class: "ssd".into(),
                capacity: 1 << 30,
                object_size: 128 << 10,
            })
            .await
            .unwrap();
    }
    c.pool(1024).await;
    let node = c.node("a", true, Duration::from_secs(600)).await;
    let own = only_device(&node);
    let map = c
        .map_where("the pool placed over 100 devices", |m| {
            m.devices.len() == 100 && m.pools.values().all(|p| !p.pgs.is_empty())
        })
        .await;
    let used: std::collections::BTreeSet<DeviceId> = map
        .pools
        .values()
        .flat_map(|p| p.pgs.iter().flat_map(|pg| pg.up.iter().copied()))
        .collect();
    assert_eq!(used.len(), 100, "every device holds PGs: {used:?}");
    assert!(used.contains(&own));
    node.shutdown().await;
}
