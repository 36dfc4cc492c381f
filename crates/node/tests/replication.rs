//! Replication with real nodes in one process (real device files, the embedded metadata store,
//! TCP between nodes, the client library): every write is on every member, a stopped node's
//! PGs fail over to the others, a returning node is recovered, a new node is backfilled, and a
//! volume delete leaves tombstones on every member.

use basalt_client::Volume;
use basalt_meta::OutReason;
use basalt_node::{DeviceConfig, HeartbeatConfig, Node, NodeConfig, NodeStatus};
use basalt_proto::{Request, Response};
use basalt_types::{DeviceId, ObjectId};
use std::time::Duration;

mod common;

use common::{Cluster, OBJECT, PGS, WAIT, device_of, pattern, until};

impl Cluster {
    /// Starts (or restarts, with its data) node `name` with one 256 MiB device file.
    async fn node(&self, name: &str) -> Node {
        self.tuned_node(name, |_| {}).await
    }

    /// [`Cluster::node`] with `tune` adjusting its configuration.
    async fn tuned_node(&self, name: &str, tune: impl FnOnce(&mut NodeConfig)) -> Node {
        let device = |data: &std::path::Path| DeviceConfig {
            size: Some(256 << 20),
            journal_size: Some(16 << 20),
            ..DeviceConfig::new(data.join("dev.img"))
        };
        self.start_node(name, device, tune).await
    }

    /// Waits for a map placing every PG on `copies` devices.
    async fn every_pg_on(&self, copies: usize) {
        self.map_where(&format!("every PG on {copies} devices"), |m| {
            let mut pgs = m.pools.values().flat_map(|p| &p.pgs);
            pgs.all(|pg| pg.acting.len() == copies)
        })
        .await;
    }
}

/// Whether `nodes` together run every PG of the pool as active primaries (and, with `clean`,
/// every one is clean).
fn all_active(nodes: &[&Node], clean: bool) -> bool {
    let pgs: Vec<_> = nodes
        .iter()
        .flat_map(|n| n.status().pgs)
        .filter(|p| p.status.state == "active" && (!clean || p.clean))
        .collect();
    pgs.len() == PGS as usize
}

fn objects_on(status: &NodeStatus) -> u64 {
    status.devices.iter().map(|d| d.objects).sum()
}

async fn write_all(vol: &Volume, objects: u64, g: u64) {
    for i in 0..objects {
        vol.write(i * OBJECT, pattern(i, g), false).await.unwrap();
    }
}

async fn check_all(vol: &Volume, objects: u64, g: impl Fn(u64) -> u64) {
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(
            got == pattern(i, g(i)),
            "object {i}: expected generation {}",
            g(i)
        );
    }
}

/// Three nodes, three copies: writes land on every device; a cleanly stopped node's PGs go on
/// serving from the other two; writes made while it was away are recovered onto it when it
/// returns, so that it alone then serves all of them (the other two stopped, `min_size` 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_member_is_recovered_and_can_then_serve_alone() {
    let c = Cluster::new().await;
    let a = c.node("a").await;
    let b = c.node("b").await;
    let d = c.node("d").await;
    c.pool(3, 1).await;
    let devs = [device_of(&a), device_of(&b), device_of(&d)];
    c.map_where("every PG on all three devices", |m| {
        m.pools.values().all(|p| {
            p.pgs
                .iter()
                .all(|pg| pg.acting.len() == 3 && devs.iter().all(|d| m.is_up(*d)))
        })
    })
    .await;
    until("every PG active", || all_active(&[&a, &b, &d], false)).await;
    let client = c.client(WAIT).await;
    let objects = 24;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    check_all(&vol, objects, |_| 1).await;
    // One write at a time: each copy's journal record was written alone, with `RWF_DSYNC`.
    for n in [&a, &b, &d] {
        let dev = &n.status().devices[0];
        assert!(
            dev.durable_records > 0 && dev.durable_records <= dev.journal_records,
            "{} of {} records written durable by themselves",
            dev.durable_records,
            dev.journal_records
        );
    }
    for n in [&a, &b, &d] {
        assert_eq!(
            objects_on(&n.status()),
            objects,
            "every device holds every object"
        );
    }

    // Node a stops: its PGs fail over; half of the objects are rewritten meanwhile.
    let gone = device_of(&a);
    a.shutdown().await;
    c.map_where("a down", |m| !m.is_up(gone)).await;
    for i in (0..objects).step_by(2) {
        vol.write(i * OBJECT, pattern(i, 2), false).await.unwrap();
    }
    let generation = |i: u64| if i.is_multiple_of(2) { 2 } else { 1 };
    check_all(&vol, objects, generation).await;

    // a returns and is recovered; then it serves alone.
    let a = c.node("a").await;
    c.map_where("a up", |m| m.is_up(gone)).await;
    until("every PG clean", || all_active(&[&a, &b, &d], true)).await;
    let recovered: u64 = a.status().pgs.iter().map(|p| p.recovered_objects).sum();
    let others: u64 = [&b, &d]
        .iter()
        .flat_map(|n| n.status().pgs)
        .map(|p| p.recovered_objects)
        .sum();
    // By version: the objects rewritten while it was away, and only those.
    assert_eq!(
        recovered + others,
        objects / 2,
        "objects recovered onto a ({recovered} by a, {others} by the others)"
    );
    let (db, dd) = (device_of(&b), device_of(&d));
    b.shutdown().await;
    d.shutdown().await;
    c.map_where("only a up", |m| !m.is_up(db) && !m.is_up(dd))
        .await;
    until("a serves every PG", || all_active(&[&a], false)).await;
    check_all(&vol, objects, generation).await;
    a.shutdown().await;
}

/// Recovery throttled to 1 KiB/s (an object every two minutes per device) does not hold back a
/// client waiting for a missing object: a node returns having missed a rewrite of every object,
/// and a client's write to each of them (20 s timeout each) goes through, while the rest of the
/// recovery keeps to the throttle. Without the exception the writes time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_waiting_for_a_missing_object_is_not_held_back_by_the_recovery_throttle() {
    let c = Cluster::new().await;
    let slow = |cfg: &mut NodeConfig| {
        cfg.tuning.recovery_bytes_per_sec = 1024;
        cfg.tuning.recovery_parallel = 1;
    };
    let a = c.tuned_node("a", slow).await;
    let b = c.tuned_node("b", slow).await;
    let d = c.tuned_node("d", slow).await;
    c.pool(3, 2).await;
    c.every_pg_on(3).await;
    until("every PG clean", || all_active(&[&a, &b, &d], true)).await;
    let client = c.client(Duration::from_secs(20)).await;
    let objects = 12;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let away = device_of(&a);
    a.shutdown().await;
    c.map_where("a down", |m| !m.is_up(away)).await;
    write_all(&vol, objects, 2).await;
    let a = c.tuned_node("a", slow).await;
    c.map_where("a up", |m| m.is_up(away)).await;
    let nodes = [&a, &b, &d];
    let missing = || -> u64 {
        let pgs = nodes.iter().flat_map(|n| n.status().pgs);
        pgs.map(|p| p.missing_objects).sum()
    };
    until("the PGs recovering a", || missing() >= objects / 2).await;
    write_all(&vol, objects, 3).await;
    check_all(&vol, objects, |_| 3).await;
    for n in [a, b, d] {
        n.shutdown().await;
    }
}

/// Two nodes, two copies; a third node joins: the PGs that move to it are backfilled, become
/// acting there, and it then serves them with the other original node stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_is_backfilled_and_serves_what_moved_to_it() {
    let c = Cluster::new().await;
    let a = c.node("a").await;
    let b = c.node("b").await;
    c.pool(2, 1).await;
    c.every_pg_on(2).await;
    until("every PG active", || all_active(&[&a, &b], false)).await;
    let client = c.client(WAIT).await;
    let objects = 32;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;

    let from = c.store.revision().await.unwrap() + 1;
    let mut reports = c
        .store
        .watch_prefix(basalt_meta::keys::PG_READY, from)
        .await
        .unwrap();
    let n = c.node("n").await;
    let new = device_of(&n);
    let moved = c
        .map_where("PGs acting on the new device", |m| {
            m.pools
                .values()
                .all(|p| p.pgs.iter().all(|pg| pg.acting == pg.up))
                && m.pools
                    .values()
                    .any(|p| p.pgs.iter().any(|pg| pg.acting.contains(&new)))
        })
        .await;
    until("every PG clean", || all_active(&[&a, &b, &n], true)).await;
    assert!(objects_on(&n.status()) > 0, "the new device holds objects");
    // Each ready report names the interval of the term that made it (the leader applies it
    // only in that interval).
    let mut puts = 0;
    while let Ok(event) = reports.try_recv() {
        if let basalt_meta::WatchEvent::Put(kv) = event {
            let json = String::from_utf8(kv.value).unwrap();
            assert!(
                json.contains("\"interval\":") && !json.contains("\"interval\":null"),
                "{json}"
            );
            puts += 1;
        }
    }
    assert!(puts > 0, "the backfills reported");
    // Stop a: every PG it held goes on from its other member, b or the new node.
    let da = device_of(&a);
    let a_pgs = moved
        .pools
        .values()
        .flat_map(|p| p.pgs.iter())
        .filter(|pg| pg.acting.contains(&da) && pg.acting.contains(&new))
        .count();
    assert!(a_pgs > 0, "some PG is on a and the new device");
    a.shutdown().await;
    c.map_where("a down", |m| !m.is_up(da)).await;
    until("every PG active on b and n", || {
        all_active(&[&b, &n], false)
    })
    .await;
    check_all(&vol, objects, |_| 1).await;
    b.shutdown().await;
    n.shutdown().await;
}

/// Objects created while a new node is backfilled (after the walk listed their PG) reach it:
/// once the PG moved, the new device serves them alone. Backfill runs slowly under the
/// cluster-wide recovery throttle, which the nodes follow from the metadata store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_created_during_backfill_reach_the_new_member() {
    let c = Cluster::new().await;
    let a = c.node("a").await;
    let b = c.node("b").await;
    c.pool(2, 1).await;
    c.every_pg_on(2).await;
    until("every PG active", || all_active(&[&a, &b], false)).await;
    let client = c.client(WAIT).await;
    let objects = 64;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    for i in (0..objects).step_by(2) {
        vol.write(i * OBJECT, pattern(i, 1), false).await.unwrap();
    }
    // About one object per second per device: the walk is slow enough to write meanwhile.
    c.catalog
        .update_settings(|s| s.recovery_bytes_per_sec = Some(128 << 10))
        .await
        .unwrap();
    until("the nodes follow the throttle", || {
        [&a, &b]
            .iter()
            .all(|n| n.status().recovery.limits.bytes_per_sec == 128 << 10)
    })
    .await;
    let n = c.node("n").await;
    let new = device_of(&n);
    // A walk that listed its PG and copied an object, with more to copy.
    until("a backfill under way", || {
        [&a, &b]
            .iter()
            .flat_map(|n| n.status().pgs)
            .any(|p| p.backfilling > 0 && p.recovered_objects > 0 && p.misplaced_objects > 1)
    })
    .await;
    // New objects, between those the walk listed.
    for i in (1..objects).step_by(2) {
        vol.write(i * OBJECT, pattern(i, 1), false).await.unwrap();
    }
    c.catalog
        .update_settings(|s| s.recovery_bytes_per_sec = None)
        .await
        .unwrap();
    let moved = c
        .map_where("PGs acting on the new device", |m| {
            m.pools
                .values()
                .all(|p| p.pgs.iter().all(|pg| pg.acting == pg.up))
                && m.pools
                    .values()
                    .any(|p| p.pgs.iter().any(|pg| pg.acting.contains(&new)))
        })
        .await;
    until("every PG clean", || all_active(&[&a, &b, &n], true)).await;
    // Stop a: the PGs it shared with the new device are served by the new device alone.
    let da = device_of(&a);
    assert!(
        moved
            .pools
            .values()
            .flat_map(|p| p.pgs.iter())
            .any(|pg| pg.acting.contains(&da) && pg.acting.contains(&new)),
        "some PG is on a and the new device"
    );
    a.shutdown().await;
    c.map_where("a down", |m| !m.is_up(da)).await;
    until("every PG active on b and n", || {
        all_active(&[&b, &n], false)
    })
    .await;
    check_all(&vol, objects, |_| 1).await;
    b.shutdown().await;
    n.shutdown().await;
}

/// Deleting a volume of a replicated pool removes its objects from every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_volume_is_gone_from_every_member() {
    let c = Cluster::new().await;
    let a = c.node("a").await;
    let b = c.node("b").await;
    c.pool(2, 2).await;
    until("every PG active", || all_active(&[&a, &b], false)).await;
    let client = c.client(WAIT).await;
    let objects = 16;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    for n in [&a, &b] {
        assert_eq!(objects_on(&n.status()), objects);
    }
    drop(vol);
    assert_eq!(client.delete_volume("v").await.unwrap(), objects);
    for n in [&a, &b] {
        assert_eq!(objects_on(&n.status()), 0, "no live object is left");
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A member stopped while its volume is deleted (the others take the tombstones) returns with
/// its copies: peering finds the tombstones newer and recovery replaces its copies with them,
/// so nothing of the volume is served or copied back anywhere, and it holds none of it once
/// clean. The collector of deleted volumes' objects is off (an hour between passes): peering
/// alone must do it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_away_during_a_delete_brings_nothing_back() {
    let c = Cluster::new().await;
    let no_collector = |cfg: &mut NodeConfig| cfg.collect_interval = Duration::from_secs(3600);
    let a = c.tuned_node("a", no_collector).await;
    let b = c.tuned_node("b", no_collector).await;
    let d = c.tuned_node("d", no_collector).await;
    c.pool(3, 2).await;
    c.every_pg_on(3).await;
    until("every PG clean", || all_active(&[&a, &b, &d], true)).await;
    let client = c.client(WAIT).await;
    let objects = 16;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    drop(vol);
    let away = device_of(&d);
    d.shutdown().await;
    c.map_where("d down", |m| !m.is_up(away)).await;
    until("every PG active on a and b", || {
        all_active(&[&a, &b], false)
    })
    .await;
    // (The count leaves out objects a retried PG had deleted before it peered again.)
    let deleted = client.delete_volume("v").await.unwrap();
    assert!(deleted > 0 && deleted <= objects, "{deleted}");
    let d = c.tuned_node("d", no_collector).await;
    // With its copies (peering may already have replaced a few with tombstones).
    let back = objects_on(&d.status());
    assert!(back > 0, "d returns with its copies: {back}");
    c.map_where("d up", |m| m.is_up(away)).await;
    until("every PG clean, nothing of the volume anywhere", || {
        for n in [&a, &b] {
            let held = objects_on(&n.status());
            assert_eq!(
                held,
                0,
                "{} holds {held} objects of the deleted volume",
                n.id()
            );
        }
        all_active(&[&a, &b, &d], true) && objects_on(&d.status()) == 0
    })
    .await;
    for n in [a, b, d] {
        n.shutdown().await;
    }
}

/// A device that was down while its PGs were rebuilt elsewhere (the operator marked it out)
/// keeps its old copies, never served; when it is up again the PGs' primaries tell it to
/// forget them (stray copies), and the PG histories stop listing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stray_copies_are_forgotten_when_their_device_returns() {
    let c = Cluster::new().await;
    let a = c.node("a").await;
    let b = c.node("b").await;
    let d = c.node("d").await;
    c.pool(2, 1).await;
    c.every_pg_on(2).await;
    until("every PG clean", || all_active(&[&a, &b, &d], true)).await;
    let client = c.client(WAIT).await;
    let objects = 32;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    assert!(objects_on(&d.status()) > 0, "d holds copies");
    let dd = device_of(&d);
    d.shutdown().await;
    c.map_where("d down", |m| !m.is_up(dd)).await;
    c.catalog
        .set_device_out(dd, Some(OutReason::Operator))
        .await
        .unwrap();
    c.map_where("nothing placed on d", |m| {
        m.pools
            .values()
            .flat_map(|p| p.pgs.iter())
            .all(|pg| pg.acting == pg.up && !pg.up.contains(&dd) && pg.up.len() == 2)
    })
    .await;
    until("every PG clean on a and b", || all_active(&[&a, &b], true)).await;
    let strays = stray_histories(&c, dd).await;
    assert!(strays > 0, "the histories list d as a stray");

    let d = c.node("d").await;
    until("d forgot its stray copies", || objects_on(&d.status()) == 0).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while stray_histories(&c, dd).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "d still listed as a stray"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check_all(&vol, objects, |_| 1).await;
    for n in [a, b, d] {
        n.shutdown().await;
    }
}

/// How many PG histories list `dev` as a stray.
async fn stray_histories(c: &Cluster, dev: DeviceId) -> usize {
    let mut n = 0;
    for pg in 0..PGS {
        let id = basalt_types::PgId {
            pool: basalt_types::PoolId(1),
            pg,
        };
        let (history, _) = c.catalog.get_pg_history(id).await.unwrap();
        n += usize::from(history.strays.contains(&dev));
    }
    n
}

/// Two nodes, two copies, `min_size` 2: a device marked out while placement has no other
/// device for its copies stays in the acting set (it still serves, up and whole): the PGs stay
/// active and say why they do not move, reads and writes go on, nothing is removed from it;
/// marked in again, the PGs are clean. (Shrinking the acting set to the one device left would
/// put every PG below `min_size`: I/O would stop because of an operator's `out`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_out_with_no_room_for_its_copies_keeps_serving() {
    let c = Cluster::new().await;
    let a = c.node("a").await;
    let b = c.node("b").await;
    c.pool(2, 2).await;
    c.every_pg_on(2).await;
    until("every PG clean", || all_active(&[&a, &b], true)).await;
    let client = c.client(Duration::from_secs(10)).await;
    let objects = 16;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let db = device_of(&b);
    c.catalog
        .set_device_out(db, Some(OutReason::Operator))
        .await
        .unwrap();
    c.map_where("nothing placed on b", |m| {
        m.pools
            .values()
            .flat_map(|p| p.pgs.iter())
            .all(|pg| !pg.up.contains(&db) && pg.up.len() == 1)
    })
    .await;
    // Every primary decided: each PG active on both devices, saying why it does not move.
    until("every PG active and kept on both devices", || {
        let pgs: Vec<_> = [&a, &b].iter().flat_map(|n| n.status().pgs).collect();
        pgs.len() == PGS as usize
            && pgs.iter().all(|p| {
                p.status.state == "active"
                    && p.status
                        .why
                        .as_deref()
                        .is_some_and(|w| w.contains("the acting set stays"))
            })
    })
    .await;
    let map = c.map_where("b still acting", |_| true).await;
    for pg in map.pools.values().flat_map(|p| p.pgs.iter()) {
        assert!(pg.acting.contains(&db), "b left an acting set: {pg:?}");
    }
    for i in (0..objects).step_by(2) {
        vol.write(i * OBJECT, pattern(i, 2), false).await.unwrap();
    }
    let generation = |i: u64| if i.is_multiple_of(2) { 2 } else { 1 };
    check_all(&vol, objects, generation).await;
    assert_eq!(objects_on(&b.status()), objects, "b keeps every copy");

    c.catalog.set_device_out(db, None).await.unwrap();
    until("every PG clean again", || all_active(&[&a, &b], true)).await;
    check_all(&vol, objects, generation).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// A primary deposed while its map lags answers no read once the new primary may acknowledge
/// writes (read leases, `readlease.rs`). Three nodes, three copies; the primary of an object
/// (on a node that does not lead) stops installing maps, then the two others report it and the
/// leader marks it down: the new primary's peering waits until the read leases the others
/// granted it at the old epoch have run out, then takes a client's write of the object. A read
/// sent to the deposed primary with the old epoch (a second client whose map lags as much) is
/// refused instead of answered with the overwritten data. Before it was marked down, the same
/// read was answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_primary_whose_map_lags_answers_no_read_after_a_newer_write() {
    let c = Cluster::new().await;
    let nodes = [c.node("a").await, c.node("b").await, c.node("c").await];
    c.pool(3, 2).await;
    c.every_pg_on(3).await;
    let all: Vec<&Node> = nodes.iter().collect();
    until("every PG clean", || all_active(&all, true)).await;
    let client = c.client(Duration::from_secs(20)).await;
    let objects = 8;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let leader = c.catalog.leader().await.unwrap().expect("a leader").name;
    let leader = nodes
        .iter()
        .map(|n| n.id())
        .find(|id| leader.starts_with(&format!("{id}@")))
        .expect("a node leads");
    let map = c.map_where("the map", |_| true).await;
    let (i, primary) = (0..objects)
        .find_map(|i| {
            let oid = ObjectId::new(vol.pool(), vol.id(), i);
            let node = map.device_node(map.primary(&oid)?)?;
            (node != leader).then_some((i, node))
        })
        .expect("an object whose primary does not lead");
    let oid = ObjectId::new(vol.pool(), vol.id(), i);
    let deposed = nodes.iter().find(|n| n.id() == primary).unwrap();
    let old = map.epoch;
    let read_there = || {
        client.call_node(
            primary,
            Request::Read {
                epoch: old,
                oid,
                offset: 0,
                len: 4096,
            },
        )
    };
    match read_there().await {
        Ok(Response::Read { data }) => assert!(data == pattern(i, 1).slice(..4096)),
        other => panic!("read from the primary before: {other:?}"),
    }
    deposed.hold_back_maps(true);
    for reporter in nodes.iter().filter(|n| n.id() != primary) {
        let lease = c.catalog.node_lease(reporter.id()).await.unwrap().unwrap();
        c.catalog
            .put_failure_report(reporter.id(), primary, 0, lease)
            .await
            .unwrap();
    }
    let down_dev = device_of(deposed);
    c.map_where("the primary's device down", |m| !m.is_up(down_dev))
        .await;
    vol.write(i * OBJECT, pattern(i, 2), false).await.unwrap();
    match read_there().await {
        Err(e) => assert!(e.to_string().contains("read lease"), "{e}"),
        Ok(Response::Read { data }) => panic!(
            "the deposed primary answered after a newer write, with generation {}",
            if data == pattern(i, 1).slice(..4096) {
                "1 (stale)"
            } else {
                "2"
            }
        ),
        Ok(other) => panic!("unexpected answer {other:?}"),
    }
    deposed.hold_back_maps(false);
    check_all(&vol, objects, |k| if k == i { 2 } else { 1 }).await;
    for n in nodes {
        n.shutdown().await;
    }
}

/// The epochs of the running read-lease grants `node` made, by the node holding each.
fn grants(node: &Node) -> Vec<(basalt_types::NodeId, basalt_types::Epoch)> {
    let status = node.status().read_leases;
    status.granted.iter().map(|g| (g.node, g.epoch)).collect()
}

/// Read leases follow the map and a clean stop (failure-model.md rule 9), not only the
/// heartbeat interval (10 minutes here): a node new in the map is pinged, and so granted a
/// lease, at once; a new map makes every node ping again at once, so the grants carry the new
/// epoch (a new term's promise waits for grants made at older epochs); a node stopping cleanly
/// releases the leases it was granted, so none is left running on the others (its PGs' new
/// terms need not wait for them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_leases_follow_the_map_and_a_clean_stop_releases_them() {
    let c = Cluster::new().await;
    let slow = |cfg: &mut NodeConfig| {
        cfg.heartbeat = HeartbeatConfig {
            interval: Duration::from_secs(600),
            grace: Duration::from_secs(600),
        }
    };
    let nodes = [
        c.tuned_node("a", slow).await,
        c.tuned_node("b", slow).await,
        c.tuned_node("c", slow).await,
    ];
    let ids: Vec<_> = nodes.iter().map(|n| n.id()).collect();
    until("every node granted a lease to each other node", || {
        nodes.iter().all(|n| {
            let to: Vec<_> = grants(n).iter().map(|g| g.0).collect();
            ids.iter().all(|id| *id == n.id() || to.contains(id))
        })
    })
    .await;
    until("every node holds a lease of each other node", || {
        nodes.iter().all(|n| n.status().read_leases.held.len() == 2)
    })
    .await;
    c.pool(3, 2).await;
    let epoch = c.map_where("the pool", |m| !m.pools.is_empty()).await.epoch;
    until("every grant made at the new map or later", || {
        nodes.iter().all(|n| {
            n.epoch() >= epoch && grants(n).iter().all(|(_, e)| *e >= epoch) && grants(n).len() == 2
        })
    })
    .await;
    let [a, b, d] = nodes;
    let gone = a.id();
    a.shutdown().await;
    // Released (best effort, so within the test's wait, not at once); a grant that is not
    // would run for ten minutes.
    until("no grant to the stopped node left", || {
        [&b, &d]
            .iter()
            .all(|n| grants(n).iter().all(|(id, _)| *id != gone))
    })
    .await;
    b.shutdown().await;
    d.shutdown().await;
}

/// Two nodes, two copies (`min_size` 1): a killed node is reported by its one peer only, which
/// is never enough reporters (`reports.rs`), so it goes down when its lease expires; then the
/// survivor serves every PG alone and every acknowledged write reads back. The killed node,
/// started again, is recovered by version, and serves everything alone when the other one is
/// killed in turn (so one of the two kills took the leader).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_node_cluster_goes_on_after_either_node_is_killed() {
    let c = Cluster::new().await;
    let mut nodes = vec![c.node("a").await, c.node("b").await];
    c.pool(2, 1).await;
    c.every_pg_on(2).await;
    until("every PG clean", || {
        all_active(&nodes.iter().collect::<Vec<_>>(), true)
    })
    .await;
    let client = c.client(WAIT).await;
    let objects = 16;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    for (round, name) in [(2u64, "a"), (3, "b")] {
        let i = usize::from(name == "b");
        let victim = nodes.remove(i);
        let gone = device_of(&victim);
        victim.kill();
        c.map_where("the killed node's device down", |m| !m.is_up(gone))
            .await;
        // The survivor holds everything written so far (in the second round, what it got by
        // recovery), and takes every object written while the other is away.
        check_all(&vol, objects, |_| round - 1).await;
        write_all(&vol, objects, round).await;
        check_all(&vol, objects, |_| round).await;
        until("the survivor serves every PG", || {
            all_active(&[&nodes[0]], false)
        })
        .await;
        nodes.insert(i, c.node(name).await);
        c.map_where("the killed node's device up again", |m| m.is_up(gone))
            .await;
        until("every PG clean again", || {
            all_active(&nodes.iter().collect::<Vec<_>>(), true)
        })
        .await;
        check_all(&vol, objects, |_| round).await;
    }
    for n in nodes {
        n.shutdown().await;
    }
}
