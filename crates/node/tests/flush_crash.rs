//! `--durability flush` across a node's crash, with a real node in one process over a simulated
//! disk that loses its unflushed writes when it loses power: a PG served by one copy
//! acknowledges writes before they are durable, and a flush after the node crashed and started
//! again must fail (the writes may be lost), while one after a clean restart succeeds
//! (failure-model.md, "a node restarted between a write and the flush"; the node's
//! `incarnation.rs`, the client's `flushset.rs`).

use basalt_client::{ClientError, Durability, Volume, VolumeOptions};
use basalt_engine::sim::SimDisk;
use basalt_node::{DeviceConfig, Node, NodeConfig};
use std::time::Duration;

mod common;

use common::{Cluster, OBJECT, PGS, pattern, until};

async fn start(c: &Cluster, disk: &SimDisk) -> Node {
    start_named(c, "n0", disk).await
}

async fn start_named(c: &Cluster, name: &str, disk: &SimDisk) -> Node {
    // No write-back while the test looks at the disk's writes (the engine's would start 2 ms
    // after a write, and flush).
    let device = |data: &std::path::Path| DeviceConfig {
        sim: Some(disk.clone()),
        writeback_idle: Some(Duration::from_secs(3600)),
        ..DeviceConfig::new(data.join("dev.img"))
    };
    let tune = |config: &mut NodeConfig| config.scrub_bytes_per_sec = 0;
    c.start_node(name, device, tune).await
}

async fn serving(node: &Node) {
    until("every PG active", || {
        let pgs = node.status().pgs;
        pgs.iter().filter(|p| p.status.state == "active").count() == PGS as usize
    })
    .await;
}

async fn serving_all(nodes: &[Node]) {
    until("every PG active", || {
        let pgs = nodes.iter().flat_map(|n| n.status().pgs);
        pgs.filter(|p| p.status.state == "active").count() == PGS as usize
    })
    .await;
}

/// Volume "v" of 4 objects, its writes durable once flushed.
async fn flushed_volume(c: &Cluster) -> Volume {
    let client = c.client(Duration::from_secs(30)).await;
    client
        .create_volume("v", 4 * OBJECT, "default")
        .await
        .unwrap();
    let options = VolumeOptions {
        durability: Durability::Flush,
    };
    client.open_volume("v", options).await.unwrap()
}

async fn read_object(vol: &Volume, i: u64) -> bytes::Bytes {
    vol.read(i * OBJECT, OBJECT as u32).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_after_a_crash_fails_and_one_after_a_clean_restart_succeeds() {
    let c = Cluster::new().await;
    let disk = SimDisk::new(64 << 20);
    let node = start(&c, &disk).await;
    c.pool(1, 1).await;
    serving(&node).await;
    let vol = flushed_volume(&c).await;
    vol.write(0, pattern(0, 1), false).await.unwrap();
    vol.flush().await.unwrap();

    // Acknowledged, not durable; the node loses power and starts again.
    vol.write(0, pattern(0, 2), false).await.unwrap();
    assert!(disk.unflushed_writes() > 0, "the write is at risk");
    let image = disk.crash(7);
    node.kill();
    let node = start(&c, &image).await;
    serving(&node).await;
    match vol.flush().await {
        Err(ClientError::WritesLost { why, .. }) => {
            assert!(why.contains("may be lost"), "{why}");
        }
        other => panic!("the flush after the crash answered {other:?}"),
    }
    let got = read_object(&vol, 0).await;
    assert!(
        got == pattern(0, 1) || got == pattern(0, 2),
        "the object reads as neither write"
    );
    vol.flush().await.unwrap();

    // A clean stop writes everything back and keeps the incarnation: nothing is lost, the
    // flush after the restart succeeds.
    vol.write(OBJECT, pattern(1, 3), false).await.unwrap();
    node.shutdown().await;
    let node = start(&c, &image).await;
    serving(&node).await;
    vol.flush().await.unwrap();
    assert!(read_object(&vol, 1).await == pattern(1, 3));
    node.shutdown().await;
}

/// Writes to a PG with other members are durable before they are acknowledged (whatever the
/// durability mode) and answered so: a crash of their primary fails no flush, and every one
/// reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_write_owes_no_flush_across_its_primarys_crash() {
    let c = Cluster::new().await;
    let disks: Vec<SimDisk> = (0..2).map(|_| SimDisk::new(64 << 20)).collect();
    let mut nodes = vec![
        start_named(&c, "n0", &disks[0]).await,
        start_named(&c, "n1", &disks[1]).await,
    ];
    c.pool(2, 1).await;
    serving_all(&nodes).await;
    let vol = flushed_volume(&c).await;
    for i in 0..4 {
        vol.write(i * OBJECT, pattern(i, 1), false).await.unwrap();
    }
    let image = disks[0].crash(3);
    nodes.remove(0).kill();
    nodes.insert(0, start_named(&c, "n0", &image).await);
    vol.flush().await.unwrap();
    for i in 0..4 {
        assert!(read_object(&vol, i).await == pattern(i, 1), "object {i}");
    }
    for n in nodes {
        n.shutdown().await;
    }
}
