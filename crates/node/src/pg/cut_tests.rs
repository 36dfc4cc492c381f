//! `Pgs::load` over a store whose journal chain broke at a damaged record: every PG the device
//! holds no record of is suspect, and stays so after another restart (the device note).

use super::super::info::MemberInfo;
use super::*;
use crate::testing::shared;
use basalt_engine::sim::SimDisk;
use basalt_engine::{DeviceId, FormatOptions, OpenOptions, Store};
use basalt_types::{Epoch, NodeId};
use std::time::Duration;

const DEV: DeviceId = DeviceId(4);

fn pg(n: u32) -> PgId {
    PgId {
        pool: PoolId(1),
        pg: n,
    }
}

/// A store on `disk` whose journal stays unwritten-back for the whole test.
fn open(disk: &SimDisk) -> Store {
    let opts = OpenOptions {
        writeback_idle: Duration::from_secs(3600),
        ..OpenOptions::default()
    };
    Store::open_sim(disk, &opts).unwrap()
}

/// Loads the PGs of `store` as a node starting on it would; `suspect(n)` tells whether PG n
/// of pool 1 is suspect there.
async fn load(store: Store) -> (impl Fn(u32) -> bool, Store) {
    let dir = tempfile::tempdir().unwrap();
    let meta = basalt_meta::EmbeddedStore::open(dir.path().join("meta.redb"))
        .await
        .unwrap();
    let catalog = basalt_meta::Catalog::new(std::sync::Arc::new(meta));
    let node = shared(
        NodeId(1),
        Duration::from_secs(60),
        vec![store.clone()],
        catalog,
    );
    node.pgs.load().await.unwrap();
    let suspect = move |n| node.pgs.get(DEV, pg(n)).unwrap().st.lock().info.suspect;
    (suspect, store)
}

/// A store on a fresh disk whose newest journal record, the only record of PG 2 (PG 1 has
/// one in an older record), is damaged in its header after a power loss: its checksum fails,
/// the chain breaks there and nothing after it can be read (a cut of unknown PGs). Returns
/// the crash image.
async fn damaged_image() -> SimDisk {
    let disk = SimDisk::new(64 << 20);
    let format = FormatOptions {
        device_id: DEV,
        ..FormatOptions::default()
    };
    basalt_engine::format_sim(&disk, &format).unwrap();
    let store = open(&disk);
    let info = |les| MemberInfo {
        les: Epoch(les),
        activated: Epoch(les),
        ..MemberInfo::default()
    };
    store
        .set_pg(pg(1), Some(info(3).encode()), true)
        .await
        .unwrap();
    // Its activation in interval 0x5eed...: a distinctive pattern to find it by.
    let newest = info(0x5eed_5eed_5eed);
    store
        .set_pg(pg(2), Some(newest.encode()), true)
        .await
        .unwrap();
    let image = disk.crash(1);
    store.detach(); // (its disk is halted: its loop cannot finish)
    drop(store);
    let raw = image.read(0, 64 << 20);
    let needle = newest.encode();
    let at: Vec<usize> = raw
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == &needle[..])
        .map(|(i, _)| i)
        .collect();
    let journal = image.regions().unwrap().journal;
    assert_eq!(at.len(), 1, "the record is in the journal only");
    assert!(journal.contains(&(at[0] as u64)));
    image.flip_bit(at[0] as u64 + 2, 5);
    image
}

#[tokio::test]
async fn a_pg_whose_only_record_was_in_an_unreadable_tail_is_suspect_for_good() {
    let image = damaged_image().await;
    let store = open(&image);
    let cut = store.info().replay_cut.clone();
    assert_eq!(cut.map(|c| c.pgs), Some(None), "a cut of unknown PGs");
    let (suspect, store) = load(store).await;
    assert!(suspect(1), "a PG with a record is marked as before");
    assert!(
        suspect(2),
        "the PG whose only record was dropped answers as a device that never took part"
    );
    assert!(suspect(9), "any PG the device holds no record of");
    store.close().await.unwrap();

    // Opened again: no cut any more, but the note keeps PGs without a record suspect.
    let store = open(&image);
    assert_eq!(store.info().replay_cut, None);
    let (suspect, store) = load(store).await;
    assert!(suspect(2) && suspect(9));
    store.close().await.unwrap();
}

/// The node opens the damaged device, then fails before it loads its PGs (here: the metadata
/// store is unreachable when it registers the device). The store erased the dropped records
/// when it opened, so the next start sees no cut: the marks must be durable already.
#[tokio::test]
async fn the_marks_are_durable_before_the_node_can_fail_on_anything_else() {
    let image = damaged_image().await;
    let dir = tempfile::tempdir().unwrap();
    let meta = crate::testing::Flaky::open(&dir.path().join("meta.redb")).await;
    meta.set_down(true);
    let catalog = basalt_meta::Catalog::new(meta.clone());
    let device = crate::config::DeviceConfig {
        sim: Some(image.clone()),
        writeback_idle: Some(Duration::from_secs(3600)),
        ..crate::config::DeviceConfig::new(dir.path().join("dev.img"))
    };
    let opened = crate::devices::open_all(
        &catalog,
        NodeId(1),
        &[device],
        4 << 20,
        basalt_engine::IoMode::Auto,
        true,
    )
    .await;
    assert!(opened.is_err(), "registration fails: the node stops");

    let store = open(&image);
    assert_eq!(store.info().replay_cut, None, "the cut is forgotten");
    let (suspect, store) = load(store).await;
    assert!(suspect(1) && suspect(2) && suspect(9));
    store.close().await.unwrap();
}
