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
    // No write-back while the test looks at the disk's writes (the engine's would start 2 ms
    // after a write, and flush).
    let device = |data: &std::path::Path| DeviceConfig {
        sim: Some(disk.clone()),
        writeback_idle: Some(Duration::from_secs(3600)),
        ..DeviceConfig::new(data.join("dev.img"))
    };
    let tune = |config: &mut NodeConfig| config.scrub_bytes_per_sec = 0;
    c.start_node("n0", device, tune).await
}

async fn serving(node: &Node) {
    until("every PG active", || {
        let pgs = node.status().pgs;
        pgs.iter().filter(|p| p.status.state == "active").count() == PGS as usize
    })
    .await;
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
    let client = c.client(Duration::from_secs(30)).await;
    client
        .create_volume("v", 4 * OBJECT, "default")
        .await
        .unwrap();
    let options = VolumeOptions {
        durability: Durability::Flush,
    };
    let vol = client.open_volume("v", options).await.unwrap();
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
