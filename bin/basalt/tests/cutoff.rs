//! A node cut off from the other nodes but not from etcd (nor from the gateway), with real
//! processes on hosts in network namespaces (`common/netns.rs`; needs root, iproute2 and
//! nftables): etcd, a gateway and three storage nodes, each on a host of its own, pool
//! `default` with 3 copies and `min_size` 2. nftables drops the traffic between the primary of
//! most PGs and the two other nodes only: the victim keeps its lease, so only the failure
//! reports of its peers (`node/src/heartbeat.rs`, `reports.rs`) can mark it down. Under fio
//! (`verify=crc32c`) and the checking writer (`common/writer.rs`), I/O resumes on the two
//! others within [`STALL_LIMIT`], nothing acknowledged is lost, and after the heal the victim
//! comes back up (the same lease all along), is caught up and serves everything.
//!
//! The longest stall is printed (`STALL ...`, shown with `--nocapture`).

mod common;

use common::fio::max_write_latency;
use common::netcluster::{Gateway, NetCluster, NodeProc};
use common::wait_until;
use common::writer::Log;
use common::writer::Writer;
use serde_json::Value;
use std::time::{Duration, Instant};

const PGS: u32 = 32;
const OBJECT: u64 = 128 << 10;
const WRITER_OBJECTS: usize = 16;
/// `--lease-ttl` of the nodes.
const TTL: Duration = Duration::from_secs(3);
/// `--io-timeout` of the gateway: far longer than any stall the test accepts.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(60);
/// The longest a write may wait across the cut: the heartbeat grace (2 s) and a ping interval,
/// the leader's map, the clients' and the survivors' reaction (peering). Without the failure
/// reports nothing marks the victim down and its PGs stall until the heal.
const STALL_LIMIT: Duration = Duration::from_secs(8);

/// fio over the first 16 MiB of the volume: random writes of mixed sizes, every block with a
/// crc32c checksum fio checks after writing (or only checks, `verify_only`); `rate` limits the
/// writes (so that they go on across the cut).
fn fio_args(addr: std::net::SocketAddr, verify_only: bool, rate: Option<&str>) -> Vec<String> {
    let mut args = common::netcluster::fio_args(addr, "4k/40:64k/30:128k/30", 23, verify_only);
    args.push("--output-format=json".into());
    if let Some(rate) = rate {
        args.push(format!("--rate=,{rate}"));
    }
    args
}

fn status(c: &NetCluster) -> Option<Value> {
    let out = c.cli_output(&["status", "--json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

fn clean(c: &NetCluster) -> bool {
    c.all_clean(PGS)
}

/// The nodes that report `node` in `basalt status --json`.
fn reported_by(c: &NetCluster, node: &NodeProc) -> Vec<u64> {
    let Some(s) = status(c) else {
        return Vec::new();
    };
    s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == node.id)
        .map(|n| {
            n["reported_by"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_u64().unwrap())
                .collect()
        })
        .unwrap_or_default()
}

/// `t` relative to `origin`, signed.
fn since(t: Instant, origin: Instant) -> String {
    match t.checked_duration_since(origin) {
        Some(d) => format!("+{d:.3?}"),
        None => format!("-{:.3?}", origin - t),
    }
}

/// fio's JSON report from its output (anything before the first `{` is not part of it).
fn fio_report(out: &str) -> Value {
    let start = out.find('{').expect("a JSON report from fio");
    serde_json::from_str(&out[start..]).expect("fio's JSON report")
}

/// The cluster: three nodes, pool `default` (3 copies, `min_size` 2, [`PGS`] PGs), volume `v`
/// of 32 MiB, a gateway on host `gw`.
struct Setup {
    c: NetCluster,
    nodes: [NodeProc; 3],
    gw: Gateway,
    pool: basalt_types::PoolId,
    volume: basalt_types::VolumeId,
}

fn setup() -> Setup {
    let (c, nodes) = NetCluster::start_three(TTL, PGS, "32MiB");
    let pool = c.cli(&["pool", "info", "default"]);
    let volume = c.cli(&["volume", "info", "v"]);
    let (pool_id, volume_id) = (
        basalt_types::PoolId(pool["id"].as_u64().unwrap() as u32),
        basalt_types::VolumeId(volume["id"].as_u64().unwrap()),
    );
    let gw = c.start_gateway("gw", IO_TIMEOUT);
    Setup {
        c,
        nodes,
        gw,
        pool: pool_id,
        volume: volume_id,
    }
}

/// [`WRITER_OBJECTS`] objects of the second half of the volume whose PG's primary is `device`.
fn objects_of(s: &Setup, primaries: &[u64], device: u64) -> Vec<u64> {
    let objects: Vec<u64> = (128..256)
        .filter(|&o| {
            let oid = basalt_types::ObjectId::new(s.pool, s.volume, o);
            primaries[basalt_placement::pg_of(&oid, PGS) as usize] == device
        })
        .take(WRITER_OBJECTS)
        .collect();
    assert_eq!(objects.len(), WRITER_OBJECTS);
    objects
}

#[test]
fn a_primary_cut_off_from_the_other_nodes_but_not_from_etcd_is_marked_down_by_its_peers() {
    let s = setup();
    let (c, nodes, gw) = (&s.c, &s.nodes, &s.gw);
    c.fio("gw", &fio_args(gw.addr, false, None));

    // The victim: the node whose device is primary of most PGs; the writer writes to its PGs.
    let primaries = c.pg_primaries("default");
    let devices: Vec<u64> = nodes.iter().map(|n| c.device_of(n).id).collect();
    let count = |d: u64| primaries.iter().filter(|p| **p == d).count();
    let at = (0..3).max_by_key(|i| count(devices[*i])).unwrap();
    let victim = &nodes[at];
    let others: Vec<&NodeProc> = nodes.iter().filter(|n| n.id != victim.id).collect();
    let objects = objects_of(&s, &primaries, devices[at]);
    let lease = c.node_lease(victim.id).expect("the victim is registered");
    eprintln!(
        "primaries by device: {:?}; cutting {} (device {}) off from the other nodes",
        devices.iter().map(|d| (*d, count(*d))).collect::<Vec<_>>(),
        victim.host,
        devices[at]
    );
    let writer = Writer::start(c.nbd("gw", gw, "v"), objects, OBJECT);
    wait_until("the writer to write", WAIT, || writer.peek(Log::acks) > 0);

    let (cut, down, resumed, fio) = std::thread::scope(|s| {
        let fio = s.spawn(|| c.fio("gw", &fio_args(gw.addr, false, Some("1m"))));
        let before = writer.peek(Log::acks);
        wait_until("the writer to write on", WAIT, || {
            writer.peek(Log::acks) >= before + 10
        });
        let cut = Instant::now();
        for other in &others {
            c.net.cut(&victim.host, &other.host);
        }
        c.wait_device(victim, "the victim's device down", false, STALL_LIMIT);
        let down = Instant::now();
        wait_until("the writer acknowledged on the others", STALL_LIMIT, || {
            writer.peek(|l| l.acks_sent_after(cut)) > 0
        });
        let resumed = Instant::now();
        let mut reporters = reported_by(c, victim);
        reporters.sort();
        let mut expect: Vec<u64> = others.iter().map(|n| n.id).collect();
        expect.sort();
        assert_eq!(reporters, expect, "both others report the victim");
        assert_eq!(
            c.node_lease(victim.id),
            Some(lease),
            "the victim kept its lease: it was marked down by its peers' reports"
        );
        (cut, down, resumed, fio_report(&fio.join().unwrap()))
    });

    let healed = Instant::now();
    c.net.heal_all();
    c.wait_device(victim, "the victim's device up", true, WAIT);
    let up = Instant::now();
    wait_until("every PG clean after the heal", WAIT, || clean(c));
    wait_until("the writer acknowledged after the heal", WAIT, || {
        writer.peek(|l| l.acks_sent_after(healed)) > 0
    });
    let (mut nbd, log) = writer.finish();
    let slowest = log.slowest().unwrap();
    eprintln!(
        "STALL primary cut off from the other nodes (not from etcd): device down at {}, the \
         writer acknowledged again by {}; its slowest write {:.3?}, sent at {} (the cut at 0); \
         fio's slowest write {:.3?}; {} writes acknowledged, {} failed; up again {:.3?} after \
         the heal",
        since(down, cut),
        since(resumed, cut),
        slowest.latency(),
        since(slowest.sent, cut),
        max_write_latency(&fio),
        log.acks(),
        log.errors().len(),
        up - healed,
    );
    assert_eq!(log.errors(), Vec::new(), "failed writes");
    assert!(
        slowest.latency() < STALL_LIMIT,
        "the writer waited {:?}",
        slowest.latency()
    );
    assert!(
        max_write_latency(&fio) < STALL_LIMIT,
        "fio waited {:?}",
        max_write_latency(&fio)
    );
    log.verify(&mut nbd, OBJECT);
    nbd.disconnect();
    assert!(c.net.running(&victim.proc), "the victim exited");
    assert_eq!(
        c.node_lease(victim.id),
        Some(lease),
        "the victim never lost its lease"
    );
    // Everything reads back, with the victim serving its PGs again.
    let primaries = c.pg_primaries("default");
    assert!(primaries.contains(&devices[at]), "{primaries:?}");
    c.fio("gw", &fio_args(gw.addr, true, None));
}

/// One broken link: n1 and n2 cannot reach each other, both reach n3 and etcd. Each reports
/// the other, neither has two reporters; once both reports stood for the broken-link delay
/// (3 s) the leader marks the higher id of the two down, and the PGs whose primary is the
/// other resume (they needed both). After the heal it is up again and caught up.
#[test]
fn one_broken_link_between_two_nodes_takes_one_of_them_down_and_io_resumes() {
    let s = setup();
    let (c, nodes, gw) = (&s.c, &s.nodes, &s.gw);
    let mut pair = [&nodes[0], &nodes[1]];
    pair.sort_by_key(|n| n.id);
    let [keeper, victim] = pair;
    let keeper_device = c.device_of(keeper).id;
    let objects = objects_of(&s, &c.pg_primaries("default"), keeper_device);
    let lease = c.node_lease(victim.id).expect("registered");
    let writer = Writer::start(c.nbd("gw", gw, "v"), objects, OBJECT);
    wait_until("the writer to write", WAIT, || writer.peek(Log::acks) > 0);

    let cut = Instant::now();
    c.net.cut(&keeper.host, &victim.host);
    // Heartbeat grace, the broken-link delay, then the map and peering.
    let limit = STALL_LIMIT + Duration::from_secs(3);
    c.wait_device(victim, "the higher id of the two down", false, limit);
    let down = Instant::now();
    assert!(c.device_of(keeper).up, "only one of the two goes down");
    wait_until("the writer acknowledged again", limit, || {
        writer.peek(|l| l.acks_sent_after(cut)) > 0
    });
    let resumed = Instant::now();
    assert_eq!(reported_by(c, victim), vec![keeper.id]);
    assert_eq!(c.node_lease(victim.id), Some(lease), "it kept its lease");

    let healed = Instant::now();
    c.net.heal_all();
    c.wait_device(victim, "the victim's device up", true, WAIT);
    wait_until("every PG clean after the heal", WAIT, || clean(c));
    wait_until("the writer acknowledged after the heal", WAIT, || {
        writer.peek(|l| l.acks_sent_after(healed)) > 0
    });
    let (mut nbd, log) = writer.finish();
    let slowest = log.slowest().unwrap();
    eprintln!(
        "STALL one broken link: the higher id down at {}, the writer acknowledged again by {}; \
         its slowest write {:.3?}, sent at {} (the cut at 0); {} writes acknowledged",
        since(down, cut),
        since(resumed, cut),
        slowest.latency(),
        since(slowest.sent, cut),
        log.acks(),
    );
    assert_eq!(log.errors(), Vec::new(), "failed writes");
    assert!(
        slowest.latency() < limit,
        "a write waited {:?}",
        slowest.latency()
    );
    log.verify(&mut nbd, OBJECT);
    nbd.disconnect();
}

/// 4 KiB of generation `g` of object `o`.
fn generation(o: u64, g: u8) -> Vec<u8> {
    (0..4096u32)
        .map(|k| (o as u8).wrapping_mul(31) ^ g ^ (k as u8))
        .collect()
}

/// A gateway inside a node (`basalt node --nbd`, reads served from the node's own copies)
/// whose node is cut off from the other nodes but not from etcd: once the other gateway's
/// write of a block is acknowledged (by the PG's primary and the third node, in a newer term),
/// the cut-off gateway never reads the block's older data: its node refuses reads of its own
/// copy (its map says its device is down; its read leases of the other nodes ran out), and
/// the primary is out of its reach, so the read fails (`EIO`) or, after the heal, returns the
/// new data.
#[test]
fn a_gateway_in_a_node_cut_off_from_the_others_never_reads_older_data() {
    let c = NetCluster::start(&["etcd", "gw", "n1", "n2", "n3"], TTL);
    let local_addr: std::net::SocketAddr = format!("{}:10809", c.net.addr("n1")).parse().unwrap();
    let local_nbd = local_addr.to_string();
    let n1 = c.start_node_with("n1", &["--nbd", &local_nbd, "--nbd-io-timeout", "3s"]);
    let others = [c.start_node("n2"), c.start_node("n3")];
    wait_until("three devices up", WAIT, || {
        let devs = c.devices();
        devs.len() == 3 && devs.iter().all(|d| d.up)
    });
    c.create_pool("default", 3, PGS);
    let volume = c.cli(&["volume", "create", "v", "--size", "32MiB"]);
    wait_until("every PG clean", WAIT, || clean(&c));
    let pool =
        basalt_types::PoolId(c.cli(&["pool", "info", "default"])["id"].as_u64().unwrap() as u32);
    let volume = basalt_types::VolumeId(volume["id"].as_u64().unwrap());
    let gw = c.start_gateway("gw", IO_TIMEOUT);
    let mut writer = c.nbd("gw", &gw, "v");
    // Objects whose PG n1 holds as a member, not as its primary.
    let mine = c.device_of(&n1).id;
    let primaries = c.pg_primaries("default");
    let objects: Vec<u64> = (0..256)
        .filter(|&o| {
            let oid = basalt_types::ObjectId::new(pool, volume, o);
            primaries[basalt_placement::pg_of(&oid, PGS) as usize] != mine
        })
        .take(8)
        .collect();
    for &o in &objects {
        assert_eq!(writer.write(o * OBJECT, &generation(o, 1), 0).unwrap(), 0);
    }
    let connect = || {
        let s = c
            .net
            .connect("n1", local_addr)
            .expect("connect to n1's gateway");
        common::nbd::NbdClient::over(s, "v").expect("NBD handshake")
    };
    let mut local = connect();
    let served = |c: &NetCluster| {
        let s = status(c).expect("status");
        let node = s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == n1.id)
            .cloned();
        node.and_then(|n| n["status"]["replica_reads"].as_u64())
            .unwrap_or(0)
    };
    // Once the writes paused, their primaries tell n1 they are on every copy: from then on n1
    // serves them from its own.
    wait_until("n1 serving reads of its own copies", WAIT, || {
        for &o in &objects {
            let got = local.read(o * OBJECT, 4096).unwrap();
            assert!(
                got == Ok(generation(o, 1)),
                "object {o} through n1's gateway"
            );
        }
        served(&c) >= objects.len() as u64
    });

    for other in &others {
        c.net.cut(&n1.host, &other.host);
    }
    c.wait_device(&n1, "n1's device down", false, STALL_LIMIT);
    for &o in &objects {
        assert_eq!(writer.write(o * OBJECT, &generation(o, 2), 0).unwrap(), 0);
    }
    let mut failed = 0;
    for &o in &objects {
        match local.read(o * OBJECT, 4096).unwrap() {
            Ok(data) => assert!(
                data == generation(o, 2),
                "object {o}: n1's gateway read data older than an acknowledged write"
            ),
            Err(_) => failed += 1,
        }
    }
    eprintln!(
        "cut off: {failed} of {} reads through n1's gateway failed",
        objects.len()
    );

    c.net.heal_all();
    c.wait_device(&n1, "n1's device up", true, WAIT);
    wait_until("every PG clean after the heal", WAIT, || clean(&c));
    let mut local = connect();
    for &o in &objects {
        let got = local.read(o * OBJECT, 4096).unwrap();
        assert!(got == Ok(generation(o, 2)), "object {o} after the heal");
    }
    local.disconnect();
    writer.disconnect();
}
