//! A member whose store dropped the newest journal records as a torn tail (media damage to an
//! acknowledged record looks the same to the journal alone: `basalt_engine::ReplayCut`) must
//! not count as proof that a write it lacks was never acknowledged.

mod common;

use basalt_engine::sim::SimDisk;
use basalt_node::{DeviceConfig, Node, NodeConfig};
use basalt_placement::ClusterMap;
use std::time::Duration;

use common::{Cluster, OBJECT, PGS, blocks_holding, device_of, pattern, until};

const DISK: u64 = 64 << 20;

/// Starts node `name` on `disk`, its journal written back only after a minute without writes
/// (the newest records stay in the journal).
async fn node(c: &Cluster, name: &str, disk: &SimDisk) -> Node {
    let device = |data: &std::path::Path| DeviceConfig {
        sim: Some(disk.clone()),
        writeback_idle: Some(Duration::from_secs(60)),
        ..DeviceConfig::new(data.join("dev.img"))
    };
    c.start_node(name, device, |cfg: &mut NodeConfig| {
        cfg.scrub_bytes_per_sec = 0;
    })
    .await
}

fn all_active(nodes: &[&Node]) -> bool {
    let active = nodes
        .iter()
        .flat_map(|n| n.status().pgs)
        .filter(|p| p.status.state == "active")
        .count();
    active == PGS as usize
}

/// Three copies; an acknowledged 4 KiB write; one member stopped, another loses power and the
/// write's journal record is damaged on its disk; it comes back: its store drops the record as
/// a torn tail. The PG peers with the member that holds the write and the damaged one: the
/// write is kept (and recovered onto the damaged member), never rolled back. Without the
/// suspect mark the damaged member, a member of the write's interval lacking it, proved it was
/// never acknowledged (the test fails so: the older data reads back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_dropped_a_damaged_journal_tail_proves_nothing() {
    let c = Cluster::new().await;
    let disks: Vec<SimDisk> = (0..3).map(|_| SimDisk::new(DISK)).collect();
    let a = node(&c, "n0", &disks[0]).await;
    let b = node(&c, "n1", &disks[1]).await;
    let cc = node(&c, "n2", &disks[2]).await;
    c.pool(3, 2).await;
    until("every PG active", || all_active(&[&a, &b, &cc])).await;
    let client = c.client(Duration::from_secs(30)).await;
    let objects = 4;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    for i in 0..objects {
        vol.write(i * OBJECT, pattern(i, 1), false).await.unwrap();
    }
    // The acknowledged write: one block of object 2, durable on all three members.
    let block = pattern(2, 2).slice(..4096);
    vol.write(2 * OBJECT, block.clone(), true).await.unwrap();
    let (dev_b, dev_c) = (device_of(&b), device_of(&cc));
    // The third member loses power (its disk keeps what was flushed: the write among it).
    let image = disks[2].crash(1);
    b.shutdown().await;
    cc.shutdown().await; // (its disk is halted: nothing more reaches it)
    // Media damage to the write's record in the journal of the third member.
    let hits = blocks_holding(&image, &block);
    let journal = image.regions().unwrap().journal;
    assert_eq!(hits.len(), 1, "the block is in the journal record only");
    assert!(
        journal.contains(&hits[0]),
        "{hits:?} not in the journal {journal:?}"
    );
    image.flip_bit(hits[0] + 100, 2);
    c.map_where("two members down", |m: &ClusterMap| {
        !m.is_up(dev_b) && !m.is_up(dev_c)
    })
    .await;
    let cc = node(&c, "n2", &image).await;
    let cut = cc.store_for_test(dev_c).unwrap().info().replay_cut.clone();
    assert!(
        cut.is_some(),
        "the damaged record was not dropped: the test tests nothing"
    );
    until("every PG active again", || all_active(&[&a, &cc])).await;
    let got = vol.read(2 * OBJECT, 4096).await.unwrap();
    assert!(
        got == block,
        "an acknowledged write was rolled back to the older data"
    );
    // Recovered onto the damaged member: with the holder gone too, it still reads back.
    // Every PG active in the same snapshot: a PG peering again shows nothing missing before its
    // recovery has run.
    until("the PGs active and clean of missing objects", || {
        let pgs: Vec<_> = [&a, &cc].iter().flat_map(|n| n.status().pgs).collect();
        pgs.iter().filter(|p| p.status.state == "active").count() == PGS as usize
            && pgs.iter().all(|p| p.missing_objects == 0)
    })
    .await;
    // Its PGs peered with it since: no longer suspect.
    until("the suspect marks cleared", || {
        cc.status().devices[0].suspect_pgs == 0
    })
    .await;
    a.shutdown().await;
    cc.shutdown().await;
}
