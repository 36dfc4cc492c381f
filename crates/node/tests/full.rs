//! A replicated pool with one member's device full (real nodes in one process, real device
//! files): new data is refused with `NoSpace` and nothing acknowledged is lost or torn; data
//! already there stays readable and can be overwritten; every PG stays active; once space is
//! freed, writes go on.

use basalt_client::{ClientError, Volume};
use basalt_node::{DeviceConfig, Node};
use std::time::Duration;

mod common;

use common::{Cluster, OBJECT, PGS, pattern, until};

/// Starts node `name` with one device file of `size` bytes and a 4 MiB journal.
async fn node(c: &Cluster, name: &str, size: u64) -> Node {
    let device = |data: &std::path::Path| DeviceConfig {
        size: Some(size),
        journal_size: Some(4 << 20),
        ..DeviceConfig::new(data.join("dev.img"))
    };
    c.start_node(name, device, |_| {}).await
}

/// Whether every PG is active (and, with `clean`, clean: no copy missing anything).
fn all_active<'a>(nodes: impl IntoIterator<Item = &'a Node>, clean: bool) -> bool {
    let active = nodes
        .into_iter()
        .flat_map(|n| n.status().pgs)
        .filter(|p| p.status.state == "active" && (p.clean || !clean))
        .count();
    active == PGS as usize
}

/// What object `i` holds now: `Some(g)` for generation `g`, `None` for zeros; panics on
/// anything else (a torn or foreign object).
async fn generation(vol: &Volume, i: u64, gens: &[u64]) -> Option<u64> {
    let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
    if got.iter().all(|b| *b == 0) {
        return None;
    }
    let g = gens.iter().copied().find(|g| got == pattern(i, *g));
    assert!(
        g.is_some(),
        "object {i} is neither zeros nor one of {gens:?}"
    );
    g
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_member_refuses_new_data_and_loses_nothing() {
    let c = Cluster::new().await;
    let nodes = [
        node(&c, "a", 128 << 20).await,
        node(&c, "b", 128 << 20).await,
        node(&c, "small", 24 << 20).await,
    ];
    c.pool(3, 2).await;
    until("every PG clean", || all_active(&nodes, true)).await;
    let client = c.client(Duration::from_secs(20)).await;
    let objects = 512;
    let vol = c.volume(&client, "v", objects * OBJECT).await;

    // Fill until the small device refuses.
    let mut full_at = None;
    for i in 0..objects {
        match vol.write(i * OBJECT, pattern(i, 1), false).await {
            Ok(()) => {}
            Err(ClientError::NoSpace(why)) => {
                full_at = Some((i, why));
                break;
            }
            Err(e) => panic!("write of object {i}: {e}"),
        }
    }
    let (full, why) = full_at.expect("a 24 MiB device never ran out of space");
    assert!(full >= 32, "only {full} objects fit");
    assert!(why.contains("space"), "the error says why: {why}");

    // Nothing acknowledged is lost; the refused object is whole or absent, never torn.
    for i in 0..full {
        assert_eq!(generation(&vol, i, &[1]).await, Some(1), "object {i}");
    }
    generation(&vol, full, &[1]).await;
    // Still full for new data; the cluster keeps serving what it has.
    let next = full + 1;
    match vol.write(next * OBJECT, pattern(next, 1), false).await {
        Err(ClientError::NoSpace(_)) => {}
        other => panic!("a new object on a full member: {other:?}"),
    }
    // The refused writes were rolled back where members had applied them (none was
    // acknowledged): no copy is left missing an object the full device cannot take.
    until("every PG clean while full", || all_active(&nodes, true)).await;

    // Overwrites of data already there: a block, and a whole object.
    let block = pattern(0, 2).slice(..4096);
    vol.write(0, block.clone(), false).await.unwrap();
    let got = vol.read(0, OBJECT as u32).await.unwrap();
    assert!(got.slice(..4096) == block && got.slice(4096..) == pattern(0, 1).slice(4096..));
    vol.write(OBJECT, pattern(1, 2), false).await.unwrap();
    assert_eq!(generation(&vol, 1, &[1, 2]).await, Some(2));

    // Trimming frees space: the refused object can be written now, and all of it reads back.
    for i in 2..18 {
        vol.trim(i * OBJECT, OBJECT).await.unwrap();
    }
    vol.write(full * OBJECT, pattern(full, 3), false)
        .await
        .unwrap();
    let got = vol.read(0, OBJECT as u32).await.unwrap();
    assert!(got.slice(..4096) == block && got.slice(4096..) == pattern(0, 1).slice(4096..));
    assert_eq!(generation(&vol, 1, &[2]).await, Some(2));
    for i in 2..18 {
        assert_eq!(generation(&vol, i, &[1]).await, None, "trimmed object {i}");
    }
    for i in 18..full {
        assert_eq!(generation(&vol, i, &[1]).await, Some(1), "object {i}");
    }
    assert_eq!(generation(&vol, full, &[1, 3]).await, Some(3));
    until("every PG clean at the end", || all_active(&nodes, true)).await;
    for n in nodes {
        n.shutdown().await;
    }
}

/// The percent of `node`'s first device in use.
fn used_percent(node: &Node) -> u64 {
    let d = &node.status().devices[0];
    d.used_bytes * 100 / d.capacity_bytes
}

/// Whether some PG of `nodes` reports its backfill stopped by a backfill-full target.
fn toofull(nodes: &[&Node]) -> bool {
    nodes
        .iter()
        .flat_map(|n| n.status().pgs)
        .any(|p| p.backfill_toofull)
}

/// A device placement moves more data to than it has room for: backfill stops once it is used
/// past the backfill-full limit (the PGs stay on their old devices and say why) instead of
/// filling it, so the writes of the PGs it serves keep their room; every object reads back.
/// Moved elsewhere, the PGs get clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_stops_at_a_device_used_past_the_backfill_full_limit() {
    let c = Cluster::new().await;
    c.catalog
        .update_settings(|s| s.backfill_full_percent = Some(60))
        .await
        .unwrap();
    let a = node(&c, "a", 128 << 20).await;
    let b = node(&c, "b", 128 << 20).await;
    c.pool(2, 1).await;
    until("every PG clean", || all_active([&a, &b], true)).await;
    let client = c.client(Duration::from_secs(20)).await;
    // 25 MiB of data: more than the small device below holds.
    let objects = 200;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    for i in 0..objects {
        vol.write(i * OBJECT, pattern(i, 1), false).await.unwrap();
    }

    // A small device joins and b is marked out: every PG moves to {a, small}.
    let small = node(&c, "small", 24 << 20).await;
    let (db, ds) = (common::device_of(&b), common::device_of(&small));
    c.catalog
        .set_device_out(db, Some(basalt_meta::OutReason::Operator))
        .await
        .unwrap();
    until("a backfill stopped by the backfill-full limit", || {
        toofull(&[&a, &b, &small])
    })
    .await;
    // It stops at the limit (copies in flight count: it passes it by one object at most), far
    // from full; without the limit the device fills up.
    let used = used_percent(&small);
    assert!(used <= 61, "the small device is {used}% used");
    let map = c
        .map_where("b out", |m| m.devices.get(&db).is_some_and(|d| !d.r#in))
        .await;
    let waiting = map
        .pools
        .values()
        .flat_map(|p| &p.pgs)
        .filter(|p| p.acting.contains(&db));
    assert!(waiting.count() > 0, "some PG still served by b");
    for i in 0..objects {
        assert_eq!(generation(&vol, i, &[1]).await, Some(1), "object {i}");
    }
    assert!(used_percent(&small) <= 61);

    // The operator moves the data back: b in, the small device out. Every PG gets clean on
    // {a, b}, and nothing reports a stopped backfill.
    c.catalog.set_device_out(db, None).await.unwrap();
    c.catalog
        .set_device_out(ds, Some(basalt_meta::OutReason::Operator))
        .await
        .unwrap();
    until("every PG clean on a and b, no backfill stopped", || {
        all_active([&a, &b, &small], true) && !toofull(&[&a, &b, &small])
    })
    .await;
    for i in 0..objects {
        assert_eq!(generation(&vol, i, &[1]).await, Some(1), "object {i}");
    }
    for n in [a, b, small] {
        n.shutdown().await;
    }
}
