//! Failures of a replicated pool with real processes: `basalt up --nodes 3` (its own etcd,
//! three `basalt node` processes, the NBD gateway), pool `default` with 3 copies on different
//! nodes and `min_size` 2, a 3 s lease. Through the gateway, fio (`ioengine=nbd`, every block
//! checked with crc32c) and a checking writer (`common/writer.rs`: every acknowledged write is
//! recorded and read back at the end) run while a node is killed (SIGKILL), two nodes are
//! killed, or etcd is killed and started again. No I/O fails, no acknowledged write is lost,
//! a returning node is caught up.
//!
//! `net::` runs the cluster on hosts in network namespaces (needs root, iproute2, nftables)
//! and partitions the primary of most PGs: no acknowledged write is lost, and it catches up
//! when the partition heals.
//!
//! The longest I/O stall is printed (`STALL ...`, shown with `--nocapture`); it is not
//! asserted beyond the I/O timeout.

mod common;

use common::fio::{io_bytes, max_write_latency};
use common::nbd::NbdClient;
use common::upcluster::UpCluster;
use common::upio::{
    IO_TIMEOUT, Run, WAIT, WRITER_OBJECTS, fio_args, io_across, kill_and_wait_down, nbd, since,
    to_str, writer_objects,
};
use common::wait_until;
use common::writer::{Log, Writer};
use serde_json::Value;
use std::time::{Duration, Instant};

fn start(dir: &std::path::Path) -> UpCluster {
    let c = common::upio::start(dir, 3, &[]);
    let pool = c.up.cli_json(&["pool", "info", "default"]);
    assert_eq!(pool["replicas"], 3, "{pool}");
    assert_eq!(pool["min_size"], 2, "{pool}");
    c
}

/// A node of `candidates` that does not lead, else the first.
fn not_leader(c: &UpCluster, candidates: &[u64]) -> u64 {
    let leader = c.leader();
    *candidates
        .iter()
        .find(|id| Some(**id) != leader)
        .unwrap_or(&candidates[0])
}

/// Prints the longest stalls fio and the writer saw, relative to `origin`.
fn report_stall(what: &str, run: &Run, origin: Instant) {
    let slowest = run.log.slowest().unwrap();
    let (written, read) = io_bytes(&run.fio);
    eprintln!(
        "STALL {what}: fio's slowest write {:.3?} ({} MiB written, {} MiB checked); the \
         writer's slowest write {:.3?}, sent at {} (the failure at 0); {} writes acknowledged",
        max_write_latency(&run.fio),
        written >> 20,
        read >> 20,
        slowest.latency(),
        since(slowest.sent, origin),
        run.log.acks()
    );
    assert!(
        slowest.latency() < IO_TIMEOUT,
        "a write waited {:?}",
        slowest.latency()
    );
}

#[test]
fn a_replica_killed_during_fio_loses_nothing_and_is_caught_up_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path());
    // Every node holds a copy of every PG and is the primary of about a third of them: the
    // victim is the node (not the leader) that is primary of the fewest, and the writer
    // writes only to PGs it holds a copy of but does not serve.
    let mut by_primaries = c.primaries();
    by_primaries.sort_by_key(|(_, n)| *n);
    let ids: Vec<u64> = by_primaries.iter().map(|(id, _)| *id).collect();
    let victim = not_leader(&c, &ids);
    let device = c.node(victim).device;
    let acting = c.acting();
    let objects = writer_objects(&c, |pg| {
        acting[pg].contains(&device) && acting[pg][0] != device
    });
    let mut killed = None;
    let run = io_across(&mut c, objects, |c| {
        let at = kill_and_wait_down(c, victim);
        killed = Some(at);
        at
    });
    report_stall("replica killed", &run, killed.unwrap());
    let Run { log, mut nbd, .. } = run;
    log.verify(&mut nbd, c.object_size);

    // It returns and is caught up: every PG clean again.
    c.restart(victim);
    c.wait_clean(WAIT);
    // It alone has everything: with min_size 1, the two others killed, it serves every byte.
    only_node_serves_all(&mut c, victim, &log, &mut nbd);
    nbd.disconnect();
    c.stop();
}

#[test]
fn the_primary_of_most_pgs_killed_during_fio_io_stalls_then_resumes_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path());
    let primaries = c.primaries();
    let (victim, count) = *primaries.iter().max_by_key(|(_, n)| *n).unwrap();
    let device = c.node(victim).device;
    let leader = c.leader();
    eprintln!(
        "primaries by node: {primaries:?}; victim node {victim} ({count} PGs), leader {leader:?}"
    );
    // The writer writes to PGs the victim serves.
    let acting = c.acting();
    let objects = writer_objects(&c, |pg| acting[pg][0] == device);
    let mut killed = None;
    let run = io_across(&mut c, objects, |c| {
        let at = kill_and_wait_down(c, victim);
        killed = Some(at);
        at
    });
    report_stall("primary killed", &run, killed.unwrap());
    let Run { log, mut nbd, .. } = run;
    log.verify(&mut nbd, c.object_size);

    c.restart(victim);
    c.wait_clean(WAIT);
    common::tool_ok("fio", &to_str(&fio_args(&c, true)), WAIT * 3);
    log.verify(&mut nbd, c.object_size);
    nbd.disconnect();
    c.stop();
}

/// A primary frozen with SIGSTOP while it holds requests (a hung process, a paused VM): its
/// peers and its lease give it up, the next copies serve, and when it runs again (SIGCONT, the
/// same process: its timers late, its sockets full of what arrived meanwhile) it acknowledges
/// nothing of the old term, rolls back what it applied alone, and is caught up. Then it alone
/// serves every byte.
#[test]
fn a_frozen_primary_loses_no_acknowledged_write_and_is_caught_up_when_it_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path());
    // The node (not the leader) that is primary of the most PGs.
    let mut by_primaries = c.primaries();
    by_primaries.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let ids: Vec<u64> = by_primaries.iter().map(|(id, _)| *id).collect();
    let victim = not_leader(&c, &ids);
    let device = c.node(victim).device;
    let acting = c.acting();
    let objects = writer_objects(&c, |pg| acting[pg][0] == device);
    let (mut frozen, mut struck) = (None, None);
    let run = io_across(&mut c, objects, |c| {
        let at = Instant::now();
        frozen = Some(c.freeze(victim));
        struck = Some(at);
        wait_until("the frozen node's device down", WAIT, || {
            !c.device_up(device)
        });
        at
    });
    report_stall("primary frozen", &run, struck.unwrap());
    let Run { log, mut nbd, .. } = run;
    log.verify(&mut nbd, c.object_size);

    // It runs again and is caught up, without a restart.
    drop(frozen.take());
    wait_until("the continued node's device up", WAIT, || {
        c.device_up(device)
    });
    c.wait_clean(WAIT);
    common::tool_ok("fio", &to_str(&fio_args(&c, true)), WAIT * 3);
    log.verify(&mut nbd, c.object_size);
    only_node_serves_all(&mut c, victim, &log, &mut nbd);
    nbd.disconnect();
    c.stop();
}

/// With `min_size` 1 and the other nodes killed, `node` alone holds and serves every byte fio
/// and the writer's log wrote.
fn only_node_serves_all(c: &mut UpCluster, node: u64, log: &Log, nbd: &mut NbdClient) {
    let device = c.node(node).device;
    let epoch = c.up.cli_json(&["status"])["epoch"].as_u64().unwrap();
    c.up.cli_json(&["pool", "set", "default", "--min-size", "1"]);
    wait_until("a map with min_size 1", WAIT, || {
        c.up.cli_json(&["status"])["epoch"].as_u64().unwrap() > epoch
    });
    for other in c.nodes.iter().map(|n| n.id).collect::<Vec<_>>() {
        if other != node {
            c.kill(other);
        }
    }
    let devices: Vec<u64> = c.nodes.iter().map(|n| n.device).collect();
    wait_until("only the one node's device up", WAIT, || {
        devices.iter().all(|d| (*d == device) == c.device_up(*d))
    });
    common::tool_ok("fio", &to_str(&fio_args(c, true)), WAIT * 3);
    log.verify(nbd, c.object_size);
}

#[test]
fn with_two_of_three_nodes_down_writes_wait_and_complete_when_one_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path());
    common::tool_ok("fio", &to_str(&fio_args(&c, false)), WAIT * 3);
    let writer = Writer::start(nbd(&c), writer_objects(&c, |_| true), c.object_size);
    wait_until("the writer to write", WAIT, || writer.peek(Log::acks) > 0);
    let ids: Vec<u64> = c.nodes.iter().map(|n| n.id).collect();
    // Both victims are nodes that do not lead, so the survivor marks their devices down.
    let leader = c.leader();
    let victims: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| Some(*id) != leader)
        .take(2)
        .collect();
    let (first, second) = (victims[0], victims[1]);

    // The first goes: the PGs go on with two copies.
    let t1 = kill_and_wait_down(&mut c, first);
    wait_until("the writer acknowledged with one node down", WAIT, || {
        writer.peek(|l| l.acks_sent_after(t1)) > 0
    });
    // The second goes: one copy is below min_size, nothing sent from then on is acknowledged.
    c.kill(second);
    let t2 = Instant::now();
    let device = c.node(second).device;
    wait_until("the second victim's device down", WAIT, || {
        !c.device_up(device)
    });
    let survivor = ids
        .iter()
        .copied()
        .find(|id| !victims.contains(id))
        .unwrap();
    wait_until(
        "the survivor's PGs not active (peered below min_size)",
        WAIT,
        || {
            let s = c.up.cli_json(&["status"]);
            let pgs = s["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["id"].as_u64() == Some(survivor))
                .and_then(|n| n["status"]["pgs"].as_array().cloned())
                .unwrap_or_default();
            pgs.len() == c.pg_count as usize && pgs.iter().all(|p| p["state"] != "active")
        },
    );
    let (acked_after, pending) = writer.peek(|l| (l.acks_sent_after(t2), l.in_flight));
    assert_eq!(
        acked_after, 0,
        "writes acknowledged with one copy of min_size 2"
    );
    let (object, generation, sent) =
        pending.expect("the writer has a write waiting with two nodes down");
    // A read waits too (served from no PG below min_size), on a connection of its own.
    let mut reader = nbd(&c);
    let read = std::thread::spawn(move || {
        let got = reader.read(0, 4096);
        reader.disconnect();
        (got, Instant::now())
    });
    // A read served here would be answered in a millisecond; the status call takes longer.
    let s = c.up.cli_json(&["status"]);
    assert!(s["nodes"].is_array(), "{s}");
    assert!(!read.is_finished(), "a read was answered below min_size");

    // The first returns (it missed writes): the waiting write completes, nothing is lost.
    let back = Instant::now();
    c.restart(first);
    wait_until("the waiting write to complete", WAIT, || {
        writer.peek(|l| {
            l.writes
                .iter()
                .any(|w| w.object == object && w.generation == generation)
        })
    });
    let (mut nbd, log) = writer.finish();
    let done = *log
        .writes
        .iter()
        .find(|w| w.object == object && w.generation == generation)
        .unwrap();
    assert_eq!(done.error, 0, "the waiting write failed");
    assert!(done.got > back, "it completed before a node returned");
    eprintln!(
        "STALL two down: the waiting write took {:.3?}, {:.3?} after the node was started \
         again",
        done.got - sent,
        done.got - back
    );
    assert_eq!(log.errors(), Vec::new(), "failed writes");
    log.verify(&mut nbd, c.object_size);
    let (got, read_at) = read.join().unwrap();
    assert!(
        matches!(got, Ok(Ok(ref data)) if data.len() == 4096),
        "the waiting read: {got:?}"
    );
    assert!(read_at > back, "a read was served below min_size");

    c.restart(second);
    c.wait_clean(WAIT);
    common::tool_ok("fio", &to_str(&fio_args(&c, true)), WAIT * 3);
    log.verify(&mut nbd, c.object_size);
    nbd.disconnect();
    c.stop();
}

#[test]
fn etcd_killed_and_started_again_during_fio_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path());
    let objects = writer_objects(&c, |_| true);
    let mut restarted = None;
    let run = io_across(&mut c, objects, |c| {
        let at = Instant::now();
        c.restart_etcd();
        restarted = Some(at);
        at
    });
    report_stall("etcd restarted", &run, restarted.unwrap());
    let Run { log, mut nbd, .. } = run;
    log.verify(&mut nbd, c.object_size);
    c.wait_clean(WAIT);
    assert!(
        c.nodes
            .iter()
            .all(|n| n.pid.is_some_and(common::upcluster::alive)),
        "a node exited:\n{}",
        c.logs()
    );
    common::tool_ok("fio", &to_str(&fio_args(&c, true)), WAIT * 3);
    nbd.disconnect();
    c.stop();
}

/// The NBD gateway in node1's process (`basalt up --nodes 3 --local-gateway`, which starts
/// node1 with `basalt node --nbd`): fio and the writer go through it, the writer to PGs whose
/// primary is node1 (reached in process) and to PGs of another node (over TCP), which is
/// killed (SIGKILL) during the I/O: nothing is lost, and once it returns and is caught up,
/// everything written reads back through the gateway.
#[test]
fn a_gateway_in_a_node_process_loses_nothing_when_another_node_dies() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = common::upio::start(dir.path(), 3, &["--local-gateway"]);
    let gateway = c.nodes[0].id;
    let gateway_pid = c.node(gateway).pid.expect("node1 runs");
    let port = c.up.nbd.rsplit(':').next().unwrap().to_string();
    let listeners = common::tool_ok("ss", &["-ltnpH", &format!("sport = :{port}")], WAIT);
    assert!(
        listeners.contains(&format!("pid={gateway_pid},")),
        "node1 (pid {gateway_pid}) serves NBD on {}: {listeners}",
        c.up.nbd
    );
    let others: Vec<u64> = c.nodes[1..].iter().map(|n| n.id).collect();
    let victim = not_leader(&c, &others);
    let (gw_dev, victim_dev) = (c.node(gateway).device, c.node(victim).device);
    let acting = c.acting();
    let objects = writer_objects(&c, |pg| {
        acting[pg][0] == gw_dev || acting[pg][0] == victim_dev
    });
    let mut killed = None;
    let run = io_across(&mut c, objects, |c| {
        let at = kill_and_wait_down(c, victim);
        killed = Some(at);
        at
    });
    report_stall("a node killed, gateway in node1", &run, killed.unwrap());
    let Run { log, mut nbd, .. } = run;
    log.verify(&mut nbd, c.object_size);
    c.restart(victim);
    c.wait_clean(WAIT);
    common::tool_ok("fio", &to_str(&fio_args(&c, true)), WAIT * 3);
    log.verify(&mut nbd, c.object_size);
    // Node1's copies answered the gateway's reads of PGs other nodes lead (`--nbd-reads
    // local`, the default): every read above was checked all the same.
    let served = &c.node_status(gateway)["replica_reads"];
    assert!(
        served.as_u64().unwrap() > 0,
        "node1 served no read of its copies: {served}"
    );
    nbd.disconnect();
    c.stop();
}

// ---------------------------------------------------------------------------------------------
// Hosts in network namespaces (`common/netns.rs`; needs root): etcd, a gateway and three
// storage nodes, each on a host of its own. The node that is primary of most PGs loses its
// link (partition) while the writer writes to its PGs, then the link comes back.

mod net {
    use super::*;
    use common::netcluster::NetCluster;

    const PGS: u32 = 32;
    const OBJECT: u64 = 128 << 10;

    /// fio's writes (and checks) through the gateway at `addr`.
    fn fio_args(addr: std::net::SocketAddr, verify_only: bool) -> Vec<String> {
        common::netcluster::fio_args(addr, "4k/40:64k/30:128k/30", 23, verify_only)
    }

    /// The survivors' primaries all report their PGs active (as `status` shows them).
    fn survivors_active(c: &NetCluster) -> bool {
        let out = c.cli_output(&["status", "--json"]);
        if !out.status.success() {
            return false;
        }
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        let pgs: Vec<&Value> = s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n["status"]["pgs"].as_array())
            .flatten()
            .filter(|p| p["state"] == "active")
            .collect();
        pgs.len() == PGS as usize
    }

    /// Partitions the node that is primary of most PGs while the writer writes to its PGs
    /// through a gateway with `io_timeout`, heals it, and checks every acknowledged write.
    /// `strict`: no write may fail; else a write may fail (EIO) after waiting `io_timeout`
    /// for the partitioned node, if it was sent before the node's device went down.
    fn partition_primary(io_timeout: Duration, strict: bool) {
        let (c, nodes) = NetCluster::start_three(Duration::from_secs(3), PGS, "32MiB");
        let pool = c.cli(&["pool", "info", "default"]);
        let volume = c.cli(&["volume", "info", "v"]);
        let (pool_id, volume_id) = (
            basalt_types::PoolId(pool["id"].as_u64().unwrap() as u32),
            basalt_types::VolumeId(volume["id"].as_u64().unwrap()),
        );
        let gw = c.start_gateway("gw", io_timeout);
        c.fio("gw", &fio_args(gw.addr, false));

        // The victim: the node whose device is primary of most PGs.
        let primaries = c.pg_primaries("default");
        let devices: Vec<u64> = nodes.iter().map(|n| c.device_of(n).id).collect();
        let count = |d: u64| primaries.iter().filter(|p| **p == d).count();
        let at = (0..3).max_by_key(|i| count(devices[*i])).unwrap();
        let victim = &nodes[at];
        let objects: Vec<u64> = (128..256)
            .filter(|&o| {
                let oid = basalt_types::ObjectId::new(pool_id, volume_id, o);
                primaries[basalt_placement::pg_of(&oid, PGS) as usize] == devices[at]
            })
            .take(WRITER_OBJECTS)
            .collect();
        assert_eq!(objects.len(), WRITER_OBJECTS);
        eprintln!(
            "primaries by device: {:?}; partitioning {} (device {})",
            devices.iter().map(|d| (*d, count(*d))).collect::<Vec<_>>(),
            victim.host,
            devices[at]
        );
        let writer = Writer::start(c.nbd("gw", &gw, "v"), objects, OBJECT);
        wait_until("the writer to write", WAIT, || writer.peek(Log::acks) > 0);

        let cut = Instant::now();
        c.net.partition(&victim.host);
        c.wait_device(victim, "the victim's device down", false, WAIT);
        let down = Instant::now();
        wait_until("the survivors serve every PG", WAIT, || {
            survivors_active(&c)
        });
        let active = Instant::now();
        wait_until("the writer acknowledged on the others", WAIT * 2, || {
            writer.peek(|l| l.acks_sent_after(cut)) > 0
        });
        let resumed = Instant::now();
        let healed = Instant::now();
        c.net.heal(&victim.host);
        c.wait_device(victim, "the victim's device up", true, WAIT);
        wait_until("every PG clean after the heal", WAIT, || c.all_clean(PGS));
        wait_until("the writer acknowledged after the heal", WAIT, || {
            writer.peek(|l| l.acks_sent_after(healed)) > 0
        });
        let (mut nbd, log) = writer.finish();
        let slowest = log.slowest().unwrap();
        eprintln!(
            "STALL partitioned primary (I/O timeout {io_timeout:?}): device down at {}, every \
             PG active on the survivors at {}, the writer acknowledged again by {}; its slowest \
             write {:.3?}, sent at {}, error {} (the partition at 0); {} writes acknowledged, \
             {} failed",
            since(down, cut),
            since(active, cut),
            since(resumed, cut),
            slowest.latency(),
            since(slowest.sent, cut),
            slowest.error,
            log.acks(),
            log.errors().len()
        );
        if strict {
            assert_eq!(log.errors(), Vec::new(), "failed writes");
        }
        for w in log.errors() {
            assert!(
                w.error == 5 && w.latency() >= io_timeout && w.sent < down,
                "only a write stuck on the partitioned node may fail, after the I/O timeout: \
                 {w:?}"
            );
        }
        log.verify(&mut nbd, OBJECT);
        nbd.disconnect();
        assert!(c.net.running(&victim.proc), "the victim exited");
        c.fio("gw", &fio_args(gw.addr, true));
    }

    /// The gateway's request in flight to the partitioned primary gets no reset; it moves to
    /// the new primary as soon as a map names one (`client/src/retry.rs::call_node`), so no
    /// write fails and none is lost.
    #[test]
    fn a_partitioned_primary_loses_no_acknowledged_write_and_catches_up_when_healed() {
        partition_primary(IO_TIMEOUT, true);
    }
}

/// The leader is killed (SIGKILL) in a cluster whose node lease (20 s) is much longer than the
/// leadership's (2 s, the default): a successor is elected once the leadership expires and
/// marks the dead leader's device down on the two survivors' failure reports, while the dead
/// node is still registered (its lease has not expired), so its PGs fail over about as fast as
/// after the kill of any other node. (With the leadership on the node's lease nothing could
/// mark it down before that lease expired: the node would be seen deregistered, `down`.)
#[test]
fn a_killed_leader_is_marked_down_by_its_peers_before_its_lease_expires() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = UpCluster::start(dir.path(), 3, "64MiB", &["--lease-ttl", "20s"]);
    c.wait_clean(WAIT);
    let leader = c.leader().expect("a leader");
    let device = c.node(leader).device;
    c.kill(leader);
    let killed = Instant::now();
    wait_until("the dead leader's device down", WAIT, || {
        !c.device_up(device)
    });
    let status = c.up.cli_json(&["status"]);
    let node = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"].as_u64() == Some(leader))
        .unwrap()
        .clone();
    assert_eq!(
        node["state"],
        "unreachable",
        "marked down while still registered (by reports, not by its lease), {:?} after the \
         kill: {node}",
        killed.elapsed()
    );
    let successor = c.leader().expect("a new leader");
    assert_ne!(successor, leader);
    wait_until("every PG active on the survivors", WAIT, || {
        let pgs = &c.up.cli_json(&["status"])["pgs"];
        pgs["active"] == pgs["total"] && pgs["degraded"] == pgs["total"]
    });
    c.stop();
}
