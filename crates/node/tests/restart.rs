//! Read leases across a node's restarts (failure-model.md rule 9), with real nodes in one
//! process over simulated disks: a process forgets the leases its predecessor granted, so it
//! promises new terms only a lease length after it starts, unless that predecessor stopped
//! cleanly: it left a mark in the data directory saying until when its grants run, and the next
//! start (which takes the mark) waits only for what is left of them (`stopmark.rs`).

use basalt_engine::sim::SimDisk;
use basalt_node::{DeviceConfig, HeartbeatConfig, Node, NodeConfig};
use std::time::Duration;

mod common;

use common::{Cluster, PGS, until};

/// The heartbeat grace, and so the lease length: long enough that a node restarted after a
/// kill surely starts within half of it.
const GRACE: Duration = Duration::from_secs(5);

async fn node(c: &Cluster, name: &str, disk: &SimDisk) -> Node {
    Node::start(config(c, name, disk, GRACE), c.store.clone(), false)
        .await
        .unwrap()
}

/// Node `name`'s configuration on `disk`, with heartbeat grace (and lease length) `grace`.
fn config(c: &Cluster, name: &str, disk: &SimDisk, grace: Duration) -> NodeConfig {
    let device = |data: &std::path::Path| DeviceConfig {
        sim: Some(disk.clone()),
        ..DeviceConfig::new(data.join("dev.img"))
    };
    c.node_config(name, device, |config| {
        config.heartbeat = HeartbeatConfig {
            interval: Duration::from_millis(500),
            grace,
        };
    })
}

fn all_clean(nodes: &[&Node]) -> bool {
    let clean = nodes
        .iter()
        .flat_map(|n| n.status().pgs)
        .filter(|p| p.status.state == "active" && p.clean)
        .count();
    clean == PGS as usize
}

/// Stops `a` cleanly once `b` and `d` hold read leases of it; returns once those ran out (the
/// grants end at most an eighth of a length later).
async fn stop_cleanly_and_wait_out(a: Node, b: &Node, d: &Node) {
    let id = a.id();
    let holds_a = |n: &Node| n.status().read_leases.held.contains(&id);
    until("the others hold leases of a", || holds_a(b) && holds_a(d)).await;
    a.shutdown().await;
    until("the others' leases of a ran out", || {
        !holds_a(b) && !holds_a(d)
    })
    .await;
}

fn restart_wait(node: &Node) -> Duration {
    Duration::from_millis(node.status().read_leases.restart_wait_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_cleanly_waits_only_for_what_is_left_of_its_grants_and_a_killed_one_a_lease_length()
 {
    let c = Cluster::new().await;
    let disks: Vec<SimDisk> = (0..3).map(|_| SimDisk::new(64 << 20)).collect();
    let a = node(&c, "a", &disks[0]).await;
    let b = node(&c, "b", &disks[1]).await;
    let d = node(&c, "d", &disks[2]).await;
    assert_eq!(restart_wait(&a), Duration::ZERO, "a node that never ran");
    c.pool(3, 2).await;
    until("every PG clean", || all_clean(&[&a, &b, &d])).await;
    until("a granted leases", || {
        a.status().read_leases.granted.len() == 2
    })
    .await;

    // A clean stop says until when its grants run: the next process waits only for what is
    // left. Started once the others' leases of it ran out, it waits next to nothing.
    stop_cleanly_and_wait_out(a, &b, &d).await;
    let a = node(&c, "a", &disks[0]).await;
    let wait = restart_wait(&a);
    assert!(wait < GRACE / 2, "after a clean stop: {wait:?}");
    until("every PG clean again", || all_clean(&[&a, &b, &d])).await;
    until("a granted leases again", || {
        a.status().read_leases.granted.len() == 2
    })
    .await;

    // Killed (its disk loses power), it leaves no mark (the last start took it): the next
    // process waits.
    let image = disks[0].crash(1);
    a.kill();
    let starting = std::time::Instant::now();
    let a = node(&c, "a", &image).await;
    let (wait, since) = (restart_wait(&a), starting.elapsed());
    // A lease length from its start, which was within `since` (ms rounding aside).
    assert!(
        wait <= GRACE && wait + since + Duration::from_millis(1) >= GRACE,
        "after a kill the restarted node waits a lease length: {wait:?} ({since:?} after the call)"
    );
    assert!(
        wait > Duration::ZERO || since >= GRACE,
        "the mark of the clean stop before was used again"
    );
    // Stopped cleanly before that wait is over, it still answers for its predecessor's
    // grants: its mark makes the next process wait for the rest of them.
    a.shutdown().await;
    let a = node(&c, "a", &image).await;
    let (wait, since) = (restart_wait(&a), starting.elapsed());
    assert!(
        wait + since + Duration::from_millis(1) >= GRACE,
        "a clean stop right after a restart forgot the killed process's grants: {wait:?} \
         ({since:?} after the kill)"
    );
    until("every PG clean at the end", || all_clean(&[&a, &b, &d])).await;
    for n in [a, b, d] {
        n.shutdown().await;
    }
}

/// Two restarts the clean-stop mark alone got wrong (failure-model.md, rule 9): a start that
/// failed after taking the mark (here: its listen address in use) puts it back, so the start
/// after it waits only for what is left of the grants, not a lease length; and a process
/// started after a kill with a shorter heartbeat grace still waits for the killed process's
/// longer grants (`leasebound.rs`), which its peers may hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_keeps_the_clean_stop_mark_and_a_shorter_grace_after_a_kill_waits_the_longer_one()
 {
    const SHORT: Duration = Duration::from_millis(1500);
    let c = Cluster::new().await;
    let disks: Vec<SimDisk> = (0..3).map(|_| SimDisk::new(64 << 20)).collect();
    let a = node(&c, "a", &disks[0]).await;
    let b = node(&c, "b", &disks[1]).await;
    let d = node(&c, "d", &disks[2]).await;
    c.pool(3, 2).await;
    until("every PG clean", || all_clean(&[&a, &b, &d])).await;
    let id = a.id();
    let holds_a = |n: &Node| n.status().read_leases.held.contains(&id);
    stop_cleanly_and_wait_out(a, &b, &d).await;

    // A start that fails once it took the mark.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = config(&c, "a", &disks[0], GRACE);
    cfg.listen = taken.local_addr().unwrap();
    let failed = Node::start(cfg, c.store.clone(), false).await;
    assert!(failed.is_err(), "the listen address is in use");
    drop(taken);
    let a = node(&c, "a", &disks[0]).await;
    let wait = restart_wait(&a);
    assert!(
        wait < GRACE / 2,
        "a failed start lost the clean-stop mark: the next start waits {wait:?}"
    );
    until("every PG clean again", || all_clean(&[&a, &b, &d])).await;
    until("the others hold leases of a again", || {
        holds_a(&b) && holds_a(&d)
    })
    .await;

    // Killed while its peers hold leases of a grace's length; started again with a shorter one.
    let image = disks[0].crash(1);
    a.kill();
    let starting = std::time::Instant::now();
    let a = Node::start(config(&c, "a", &image, SHORT), c.store.clone(), false)
        .await
        .unwrap();
    let (wait, since) = (restart_wait(&a), starting.elapsed());
    assert!(
        wait + since + Duration::from_millis(1) >= GRACE,
        "started with a {SHORT:?} grace after a kill, it waits {wait:?} ({since:?} after the \
         kill) for grants of {GRACE:?}"
    );
    until("every PG clean at the end", || all_clean(&[&a, &b, &d])).await;
    for n in [a, b, d] {
        n.shutdown().await;
    }
}
