//! A write its client gave up on never lands after a write that client sent later, with real
//! nodes in one process over simulated disks and the client library over TCP
//! (failure-model.md, "a client gives up on a write"; the node's `sessions.rs`).

use basalt_engine::sim::SimDisk;
use basalt_node::{DeviceConfig, Node, NodeConfig};
use basalt_types::ObjectId;
use bytes::Bytes;
use std::time::Duration;

mod common;

use common::{Cluster, OBJECT, PGS, device_of, pattern, until};

const DISK: u64 = 64 << 20;

/// Stops the disks' stall when a failing test drops them, so that the stores can close.
struct Unstall(Vec<SimDisk>);

impl Drop for Unstall {
    fn drop(&mut self) {
        for d in &self.0 {
            d.stall(false);
        }
    }
}

async fn start(c: &Cluster, i: usize, disk: &SimDisk) -> Node {
    // No write-back while the test looks at the disk's writes (the engine's would start 2 ms
    // after a write, and flush).
    let device = |data: &std::path::Path| DeviceConfig {
        sim: Some(disk.clone()),
        writeback_idle: Some(Duration::from_secs(3600)),
        ..DeviceConfig::new(data.join("dev.img"))
    };
    let tune = |config: &mut NodeConfig| {
        config.scrub_bytes_per_sec = 0;
        // The test's stall is not a fault: the device stays up.
        config.device_stall_timeout = Duration::ZERO;
    };
    c.start_node(&format!("n{i}"), device, tune).await
}

/// The primary's disk hangs while a 512-byte write waits there to read the block it merges
/// into; the client gives up on it (its operation timeout), then writes the whole block. The
/// disk comes back: the later write is acknowledged, and the block reads back as it wrote it.
/// Before the session fence, the abandoned write was versioned after it and landed on top:
/// the block read back with the given-up write's bytes in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_its_client_gave_up_on_does_not_land_after_a_later_write() {
    let c = Cluster::new().await;
    let disks = Unstall((0..2).map(|_| SimDisk::new(DISK)).collect());
    let mut nodes = Vec::new();
    for (i, disk) in disks.0.iter().enumerate() {
        nodes.push(start(&c, i, disk).await);
    }
    c.pool(2, 1).await;
    until("every PG clean", || {
        let clean = nodes.iter().flat_map(|n| n.status().pgs);
        clean
            .filter(|p| p.status.state == "active" && p.clean)
            .count()
            == PGS as usize
    })
    .await;
    // Long enough for the later write to be acknowledged on a loaded machine; the given-up
    // write waits it out.
    let client = c.client(Duration::from_secs(5)).await;
    let vol = c.volume(&client, "v", 8 * OBJECT).await;
    let dev = device_of(&nodes[0]);
    let map = client.map();
    let i = (0..8)
        .find(|i| map.primary(&ObjectId::new(vol.pool(), vol.id(), *i)) == Some(dev))
        .expect("node 0 is the primary of some object");
    let at = i * OBJECT;
    vol.write(at, pattern(i, 1), false).await.unwrap();

    disks.0[0].stall(true);
    let before = disks.0[0].writes_in_flight();
    // A partial block: the primary reads the block first, from its hung disk.
    let gave_up = vol
        .write(at + 512, Bytes::from(vec![0xAA; 512]), false)
        .await;
    assert!(
        gave_up.is_err(),
        "the write waits for the hung disk: {gave_up:?}"
    );
    let newer = Bytes::from(vec![0xBB; 4096]);
    let later = tokio::spawn({
        let vol = std::sync::Arc::new(vol);
        let data = newer.clone();
        let v = vol.clone();
        async move { (v.write(at, data, false).await, vol) }
    });
    until("the later write reached the hung disk", || {
        disks.0[0].writes_in_flight() > before
    })
    .await;
    disks.0[0].stall(false);
    let (acked, vol) = later.await.unwrap();
    acked.expect("the later write is acknowledged");
    until("node 0 ended the given-up write", || {
        nodes[0].requests_in_flight() == 0
    })
    .await;
    let block = vol.read(at, 4096).await.unwrap();
    assert!(
        block == newer,
        "the block does not read back as the acknowledged write: bytes 512..520 are {:x?}",
        &block[512..520]
    );
    // And the object's other blocks are as they were.
    let rest = vol.read(at + 4096, (OBJECT - 4096) as u32).await.unwrap();
    assert!(
        rest == pattern(i, 1).slice(4096..),
        "the rest of the object changed"
    );
    for n in nodes {
        n.shutdown().await;
    }
}
