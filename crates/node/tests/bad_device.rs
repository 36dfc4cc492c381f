//! A node with several devices, one of which no longer opens (both superblock copies damaged:
//! `Corrupt`), still starts: that device is reported faulty (down until an operator clears it)
//! and the node serves its other devices; cleared by an operator, it is reported down again
//! while the node runs (nobody serves it). Before, one bad device kept the whole node, and
//! with it every copy on its other devices, from starting.

use basalt_client::{Cluster as Client, Volume};
use basalt_engine::sim::SimDisk;
use basalt_meta::{DeviceState, OutReason, PoolSpec};
use basalt_node::{DeviceConfig, Node, NodeConfig};
use basalt_placement::ClusterMap;
use basalt_types::FailureDomain;
use std::time::Duration;

mod common;

use common::{Cluster, OBJECT, PGS, WAIT, pattern, until};

const DISK: u64 = 64 << 20;

/// Starts node n0 on both disks (device `a` first).
async fn node(c: &Cluster, disks: &[SimDisk; 2]) -> Node {
    node_on(c, [(&disks[0], "dev0.img"), (&disks[1], "dev1.img")]).await
}

/// Starts node n0 on two disks, each at the given file name in its data directory.
async fn node_on(c: &Cluster, disks: [(&SimDisk, &str); 2]) -> Node {
    Node::start(config_on(c, disks), c.store.clone(), false)
        .await
        .unwrap()
}

fn config_on(c: &Cluster, disks: [(&SimDisk, &str); 2]) -> NodeConfig {
    let device = |data: &std::path::Path, i: usize| DeviceConfig {
        sim: Some(disks[i].0.clone()),
        ..DeviceConfig::new(data.join(disks[i].1))
    };
    c.node_config(
        "n0",
        |data| device(data, 0),
        |cfg: &mut NodeConfig| {
            cfg.scrub_bytes_per_sec = 0;
            cfg.devices.push(device(&cfg.data_dir.clone(), 1));
        },
    )
}

/// Objects each test writes.
const OBJECTS: u64 = 6;

/// Starts n0 on both disks with a pool of two copies on its two devices (RAID-1-like; one copy
/// is enough to serve), and writes [`OBJECTS`] objects of pattern 1.
async fn two_copies(c: &Cluster, disks: &[SimDisk; 2]) -> (Node, Client, Volume) {
    let n = node(c, disks).await;
    let mut spec = PoolSpec::new("default");
    spec.replicas = 2;
    spec.min_size = Some(1);
    spec.pg_count = PGS;
    spec.failure_domain = FailureDomain::Device;
    c.catalog.create_pool(&spec).await.unwrap();
    until("every PG active", || all_active(&n)).await;
    let client = c.client(Duration::from_secs(30)).await;
    let vol = c.volume(&client, "v", OBJECTS * OBJECT).await;
    for i in 0..OBJECTS {
        vol.write(i * OBJECT, pattern(i, 1), true).await.unwrap();
    }
    (n, client, vol)
}

fn all_active(n: &Node) -> bool {
    let pgs = n.status().pgs;
    pgs.iter().filter(|p| p.status.state == "active").count() == PGS as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_no_longer_opens_is_reported_faulty_and_the_node_serves_the_others() {
    let c = Cluster::new().await;
    let disks = [SimDisk::new(DISK), SimDisk::new(DISK)];
    let (n, client, vol) = two_copies(&c, &disks).await;
    let bad = n.status().devices[1].id;
    n.shutdown().await;
    // Both superblock copies of the second device damaged: the store refuses to open.
    disks[1].corrupt(100);
    disks[1].corrupt(DISK - 4096 + 100);

    let n = node(&c, &disks).await;
    let devices: Vec<_> = n.status().devices.iter().map(|d| d.id).collect();
    assert!(!devices.contains(&bad), "{devices:?}");
    let rec = c.catalog.get_device(bad).await.unwrap().unwrap();
    assert_eq!(rec.state, DeviceState::Down);
    let fault = rec.fault.expect("the device is marked faulty");
    assert!(fault.contains("did not open"), "{fault}");
    until("every PG active on the good device", || all_active(&n)).await;
    for i in 0..OBJECTS {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 1), "object {i} reads back wrong");
    }
    vol.write(0, pattern(0, 2), true).await.unwrap();
    assert!(vol.read(0, OBJECT as u32).await.unwrap() == pattern(0, 2));
    // Cleared by an operator while its store is still not open: reported down again (it would
    // otherwise be up in the map with nobody serving it), until the node restarts.
    c.catalog.clear_device_fault(bad).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let rec = c.catalog.get_device(bad).await.unwrap().unwrap();
        if rec.state == DeviceState::Down && rec.fault.is_some() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not reported down again: {rec:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Out, but still on its node (a drive that would register again at the next start, its
    // fault forgotten): it may not be removed.
    c.catalog
        .set_device_out(bad, Some(OutReason::Operator))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let e = match client.remove_device(bad).await {
            Ok(rec) => panic!("removed while still on its node: {rec:?}"),
            Err(e) => e.to_string(),
        };
        if e.contains("has not started without it") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{e}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(c.catalog.get_device(bad).await.unwrap().is_some());
    n.shutdown().await;
}

/// A drive replaced while its node was down: the node starts on its other device and a blank
/// one (a new device) in place of the old. The old device's record still said up, so the map
/// kept routing its PGs to a node that no longer had it, for good (found by the cluster
/// simulation's drive replacements). Now the node reports it faulty as it starts: its PGs
/// fail over to the other copies, and once the operator marks it out they are rebuilt onto
/// the new device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_drive_is_reported_faulty_and_its_copies_are_rebuilt_on_the_new_one() {
    let c = Cluster::new().await;
    let disks = [SimDisk::new(DISK), SimDisk::new(DISK)];
    let (n, client, vol) = two_copies(&c, &disks).await;
    let old = n.status().devices[1].id;
    n.shutdown().await;

    let blank = SimDisk::new(DISK);
    let n = node_on(&c, [(&disks[0], "dev0.img"), (&blank, "dev2.img")]).await;
    let devices: Vec<_> = n.status().devices.iter().map(|d| d.id).collect();
    assert!(!devices.contains(&old), "{devices:?}");
    let new = *devices
        .iter()
        .find(|d| **d != devices[0])
        .expect("the new device");
    let rec = c.catalog.get_device(old).await.unwrap().unwrap();
    assert_eq!(rec.state, DeviceState::Down, "{rec:?}");
    let fault = rec.fault.expect("the old device is marked faulty");
    assert!(fault.contains("not among the devices"), "{fault}");
    until("every PG active on the device left", || all_active(&n)).await;
    for i in 0..OBJECTS {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 1), "object {i} reads back wrong");
    }
    // Still in: it may not be removed yet.
    let refused = client.remove_device(old).await.unwrap_err().to_string();
    assert!(refused.contains("it is in"), "{refused}");
    // The operator marks the old device out: every PG gets its second copy on the new device.
    c.catalog
        .set_device_out(old, Some(OutReason::Operator))
        .await
        .unwrap();
    until("every PG active and clean", || {
        let pgs = n.status().pgs;
        pgs.len() == PGS as usize && pgs.iter().all(|p| p.status.state == "active" && p.clean)
    })
    .await;
    let map = c
        .catalog
        .get_map::<ClusterMap>()
        .await
        .unwrap()
        .expect("a map")
        .0;
    let pgs = map.pgs_of_device(new);
    assert_eq!(pgs.len(), PGS as usize, "every PG on the new device");
    for (pg, _) in pgs {
        let acting = &map.pg(pg).expect("pg").acting;
        assert!(
            !acting.contains(&old) && acting.contains(&new),
            "{pg}: {acting:?}"
        );
    }
    vol.write(0, pattern(0, 2), true).await.unwrap();
    assert!(vol.read(0, OBJECT as u32).await.unwrap() == pattern(0, 2));
    for i in 1..OBJECTS {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(
            got == pattern(i, 1),
            "object {i} reads back wrong after the rebuild"
        );
    }
    // Nothing needs it any more: the operator removes it (once every PG's history has moved
    // past it), and neither the running node nor a restart brings its record back.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match client.remove_device(old).await {
            Ok(rec) => {
                assert_eq!(rec.id, old);
                break;
            }
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "not removable: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(c.catalog.get_device(old).await.unwrap().is_none());
    let gone = client.remove_device(old).await.unwrap_err().to_string();
    assert!(gone.contains("removed already"), "{gone}");
    n.shutdown().await;
    // The old drive put back (its data is stale): the node refuses to start with it, saying
    // why, and registers nothing of it.
    let stale = [(&disks[0], "dev0.img"), (&disks[1], "dev1.img")];
    let refused = match Node::start(config_on(&c, stale), c.store.clone(), false).await {
        Ok(_) => panic!("the node started with a removed device"),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains(&format!("{old} was removed from the cluster")),
        "{refused}"
    );
    assert!(c.catalog.get_device(old).await.unwrap().is_none());
    let n = node_on(&c, [(&disks[0], "dev0.img"), (&blank, "dev2.img")]).await;
    until("every PG active after the restart", || all_active(&n)).await;
    assert!(c.catalog.get_device(old).await.unwrap().is_none());
    let listed = c.catalog.list_devices().await.unwrap();
    assert!(listed.iter().all(|d| d.fault.is_none()), "{listed:?}");
    n.shutdown().await;
}
