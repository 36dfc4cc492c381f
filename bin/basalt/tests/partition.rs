//! Multi-host tests: every host in its own network namespace on a bridge the test creates
//! (`common/netns.rs`), a real etcd on one of them, `basalt node` and `basalt nbd` processes on
//! others (`common/netcluster.rs`). Faults: a host's link down (partition) and nftables rules
//! dropping the traffic between two hosts (cut). Needs root, iproute2 and nftables.

mod common;

use basalt_placement::pg_of;
use basalt_proto::{ErrorCode, Request, Response};
use basalt_types::{ObjectId, PoolId, VolumeId};
use common::nbd::NbdClient;
use common::netcluster::{Gateway, LeaseClock, NetCluster, NodeProc};
use common::netns::Net;
use common::node::NodeConn;
use common::wait_until;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Whether a TCP connection from `from` to a listener on `to` succeeds within half a second.
fn reaches(net: &Net, from: &str, to: &str) -> bool {
    let ip = net.addr(to);
    let listener = net.in_ns(to, || {
        TcpListener::bind(SocketAddr::new(ip.into(), 0)).unwrap()
    });
    let addr = listener.local_addr().unwrap();
    net.in_ns(from, || {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
    })
}

#[test]
fn hosts_reach_each_other_only_on_the_bridge_and_faults_cut_what_they_say() {
    let net = Net::new(&["a", "b", "c"]);
    let bridge_addrs = std::process::Command::new("ip")
        .args(["-o", "addr", "show", "dev", &format!("{}br", net.prefix)])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&bridge_addrs.stdout).contains("inet"),
        "the bridge has an address in the root namespace"
    );
    for (x, y) in [("a", "b"), ("b", "c"), ("c", "a")] {
        assert!(reaches(&net, x, y) && reaches(&net, y, x), "{x} <-> {y}");
    }
    net.cut("a", "b");
    assert!(
        !reaches(&net, "a", "b") && !reaches(&net, "b", "a"),
        "cut a-b"
    );
    assert!(reaches(&net, "a", "c") && reaches(&net, "c", "b"), "others");
    net.heal_all();
    assert!(reaches(&net, "a", "b") && reaches(&net, "b", "a"), "healed");
    net.partition("c");
    assert!(
        !reaches(&net, "a", "c") && !reaches(&net, "c", "b"),
        "c down"
    );
    assert!(reaches(&net, "a", "b"), "a-b during c's partition");
    net.heal("c");
    assert!(reaches(&net, "a", "c") && reaches(&net, "c", "b"), "c back");
}

/// Sets up a net with processes (one with a child of its own), a cut and a partition.
fn busy_net() -> (Net, Vec<u32>) {
    let net = Net::new(&["x", "y"]);
    let mut sleeper = net.command("x", "sleep");
    sleeper.arg("600");
    net.spawn("x", "sleeper", sleeper);
    // A process that leaves a child behind in the namespace when it is killed.
    let mut parent = net.command("y", "sh");
    parent.args(["-c", "sleep 600 & echo started; wait"]);
    let p = net.spawn("y", "parent", parent);
    net.wait_for_line(&p, "started", Duration::from_secs(10));
    net.cut("x", "y");
    net.partition("y");
    let pids = net.pids();
    assert_eq!(pids.len(), 3, "sleep, sh and its sleep: {pids:?}");
    (net, pids)
}

#[test]
fn a_net_leaves_nothing_behind_also_when_the_test_panics() {
    let (net, pids) = busy_net();
    let prefix = net.prefix.clone();
    // 2 namespaces, the bridge and 2 veth ends, the nftables table, 3 processes.
    let made = Net::leftovers(&prefix, &pids);
    assert_eq!(made.len(), 9, "what the net made is visible: {made:?}");
    drop(net);
    assert_eq!(Net::leftovers(&prefix, &pids), Vec::<String>::new());

    let made = std::sync::Mutex::new(None);
    let result = std::panic::catch_unwind(|| {
        let (net, pids) = busy_net();
        *made.lock().unwrap() = Some((net.prefix.clone(), pids));
        panic!("a deliberate panic: the net must be cleaned up all the same");
    });
    assert!(result.is_err());
    let (prefix, pids) = made.into_inner().unwrap().unwrap();
    assert_eq!(Net::leftovers(&prefix, &pids), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// A cluster on four hosts: etcd, a gateway (and the test's NBD clients), two storage nodes.
// One copy per object; 16 PGs over both nodes; a 16 MiB volume written by fio.

const TTL: Duration = Duration::from_secs(3);
const IO_TIMEOUT: Duration = Duration::from_secs(3);
const OBJECT: usize = 128 << 10;
const OBJECTS: u64 = 128;
const PGS: u32 = 16;

struct Setup {
    c: NetCluster,
    nodes: Vec<NodeProc>,
    gw: Gateway,
    pool: PoolId,
    volume: VolumeId,
    /// The primary device of each PG.
    by_pg: Vec<u64>,
    /// Every object's bytes as fio wrote them.
    before: Arc<Vec<Vec<u8>>>,
}

impl Setup {
    fn start() -> Setup {
        let c = NetCluster::start(&["etcd", "gw", "n1", "n2"], TTL);
        let nodes = vec![c.start_node("n1"), c.start_node("n2")];
        wait_until("two devices up", Duration::from_secs(60), || {
            let devs = c.devices();
            devs.len() == 2 && devs.iter().all(|d| d.up)
        });
        c.create_pool("default", 1, PGS);
        let devs: Vec<u64> = nodes.iter().map(|n| c.device_of(n).id).collect();
        wait_until("every PG placed", Duration::from_secs(30), || {
            let p = c.pg_primaries("default");
            p.len() == PGS as usize && p.iter().all(|d| *d != 0)
        });
        let by_pg = c.pg_primaries("default");
        assert!(devs.iter().all(|d| by_pg.contains(d)), "{by_pg:?}");
        let vol = c.cli(&["volume", "create", "v", "--size", "16MiB"]);
        let volume = VolumeId(vol["id"].as_u64().unwrap());
        let pool = PoolId(c.cli(&["pool", "info", "default"])["id"].as_u64().unwrap() as u32);
        let gw = c.start_gateway("gw", IO_TIMEOUT);
        c.fio("gw", &fio_args(&gw, false));
        let mut nbd = c.nbd("gw", &gw, "v");
        let before: Vec<Vec<u8>> = (0..OBJECTS)
            .map(|i| nbd.read(i * OBJECT as u64, OBJECT as u32).unwrap().unwrap())
            .collect();
        nbd.disconnect();
        // fio wrote every byte: reading zeros later would not be what was written.
        assert!(before.iter().all(|o| o.iter().any(|b| *b != 0)));
        Setup {
            c,
            nodes,
            gw,
            pool,
            volume,
            by_pg,
            before: Arc::new(before),
        }
    }

    /// The objects whose PG `node`'s device serves.
    fn objects_on(&self, node: &NodeProc) -> Vec<u64> {
        let dev = self.c.device_of(node).id;
        (0..OBJECTS)
            .filter(|&i| {
                let oid = ObjectId::new(self.pool, self.volume, i);
                self.by_pg[pg_of(&oid, PGS) as usize] == dev
            })
            .collect()
    }

    /// (the node that leads now, the other one).
    fn leader_and_other(&self) -> (NodeProc, NodeProc) {
        let mut leader = None;
        wait_until("a leader", Duration::from_secs(30), || {
            leader = self.c.leader_addr();
            leader.is_some()
        });
        let (a, b) = (&self.nodes[0], &self.nodes[1]);
        if Some(a.addr) == leader {
            (a.clone(), b.clone())
        } else {
            assert_eq!(Some(b.addr), leader, "the leader is one of the nodes");
            (b.clone(), a.clone())
        }
    }

    /// Reads every object through the gateway and compares it with what fio wrote.
    fn check_all(&self, nbd: &mut NbdClient) {
        for i in 0..OBJECTS {
            let got = nbd.read(i * OBJECT as u64, OBJECT as u32).unwrap();
            assert!(
                got.as_ref() == Ok(&self.before[i as usize]),
                "object {i} does not read back as written: {}",
                describe(&got)
            );
        }
    }
}

/// fio over the whole volume through the gateway: writes with checksums, or verifies them.
fn fio_args(gw: &Gateway, verify_only: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "--name=fill",
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bssplit=4k/40:64k/30:128k/30",
        "--iodepth=8",
        "--size=16m",
        "--verify=crc32c",
        "--randseed=11",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("--uri=nbd://{}/v", gw.addr));
    if verify_only {
        args.push("--verify_only".into());
    }
    args
}

fn describe(got: &Result<Vec<u8>, u32>) -> String {
    match got {
        Ok(d) if d.iter().all(|b| *b == 0) => "zeros".into(),
        Ok(_) => "other bytes".into(),
        Err(e) => format!("error {e}"),
    }
}

/// What one request got, and when.
#[derive(Clone, Debug)]
struct Probe {
    sent: Instant,
    got: Instant,
    outcome: Outcome,
}

#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    /// Acknowledged (a read with the right bytes).
    Ack,
    /// NBD error (errno).
    Errno(u32),
    /// The node refused with Busy (its message).
    Busy(String),
    /// The node refused otherwise (stale epoch, not primary, ...).
    Refused(String),
    /// A read returned bytes other than those written: never allowed.
    Wrong(String),
}

impl Probe {
    fn acked(&self) -> bool {
        self.outcome == Outcome::Ack
    }
}

/// A thread sending requests in a loop and recording every answer, until [`Prober::finish`].
struct Prober {
    probes: Arc<Mutex<Vec<Probe>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Prober {
    /// Runs `step` (which sends one or more requests and records their answers) until stopped.
    fn start(mut step: impl FnMut(&mut Vec<Probe>) + Send + 'static) -> Prober {
        let probes = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (probes.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let mut batch = Vec::new();
                step(&mut batch);
                p.lock().unwrap().extend(batch);
                // Pacing (a few hundred requests a second are plenty), so that the nodes,
                // etcd and the gateway keep their share of a small machine's CPU.
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Prober {
            probes,
            stop,
            thread: Some(thread),
        }
    }

    fn count(&self, f: impl Fn(&Probe) -> bool) -> usize {
        count(&self.probes.lock().unwrap(), f)
    }

    /// Stops the thread (after its current request) and returns every answer.
    fn finish(mut self) -> Vec<Probe> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().expect("prober panicked");
        std::mem::take(&mut self.probes.lock().unwrap())
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads (and with `write`, first rewrites with the same bytes) `objects` through the gateway
/// in a loop, recording every answer.
fn nbd_prober(
    mut nbd: NbdClient,
    objects: Vec<u64>,
    before: Arc<Vec<Vec<u8>>>,
    write: bool,
) -> Prober {
    let mut next = 0;
    Prober::start(move |probes| {
        let i = objects[next % objects.len()];
        next += 1;
        let data = &before[i as usize];
        let offset = i * OBJECT as u64;
        if write {
            let sent = Instant::now();
            let e = nbd.write(offset, data, 0).unwrap();
            let outcome = if e == 0 {
                Outcome::Ack
            } else {
                Outcome::Errno(e)
            };
            probes.push(Probe {
                sent,
                got: Instant::now(),
                outcome,
            });
        }
        let sent = Instant::now();
        let got = nbd.read(offset, OBJECT as u32).unwrap();
        let outcome = match &got {
            Ok(d) if d == data => Outcome::Ack,
            Err(e) => Outcome::Errno(*e),
            Ok(_) => Outcome::Wrong(format!("object {i}: {}", describe(&got))),
        };
        probes.push(Probe {
            sent,
            got: Instant::now(),
            outcome,
        });
    })
}

/// Reads the first 4 KiB of `oid` straight from a node (no gateway, no retries) in a loop,
/// following the node's map epoch, recording every answer.
fn node_prober(conn: std::net::TcpStream, oid: ObjectId, expect: Vec<u8>) -> Prober {
    let mut c = NodeConn::over(conn);
    let mut epoch = c.hello();
    let mut id = 1u64;
    Prober::start(move |probes| {
        id += 1;
        let sent = Instant::now();
        c.send(
            id,
            &Request::Read {
                epoch,
                oid,
                offset: 0,
                len: expect.len() as u32,
            },
        );
        let answer = c.answer().expect("the node closed the connection");
        let outcome = match answer {
            Ok(Response::Read { data }) if data == expect => Outcome::Ack,
            Ok(other) => Outcome::Wrong(match other {
                Response::Read { data } => describe(&Ok(data.to_vec())),
                other => format!("{other:?}"),
            }),
            Err(e) if e.code == ErrorCode::Busy => Outcome::Busy(e.message),
            Err(e) => {
                if e.code == ErrorCode::StaleEpoch {
                    epoch = e.epoch;
                }
                Outcome::Refused(format!("{:?}: {}", e.code, e.message))
            }
        };
        probes.push(Probe {
            sent,
            got: Instant::now(),
            outcome,
        });
    })
}

fn count(probes: &[Probe], f: impl Fn(&Probe) -> bool) -> usize {
    probes.iter().filter(|p| f(p)).count()
}

#[test]
fn a_partitioned_node_is_marked_down_its_io_fails_others_continue_and_it_rejoins_by_itself() {
    let s = Setup::start();
    let c = &s.c;
    // Partition the leader: the other node has to take the leadership over to mark it down.
    let (victim, other) = s.leader_and_other();
    let on_victim = s.objects_on(&victim);
    let on_other = s.objects_on(&other);
    assert!(on_victim.len() >= 2 && on_other.len() >= 2);
    let lease_before = c.node_lease(victim.id).expect("registered");

    // A reader of the victim's data across the whole outage: it gets the bytes written or
    // EIO, never other bytes, and never waits much longer than the I/O timeout.
    let reader = nbd_prober(
        c.nbd("gw", &s.gw, "v"),
        on_victim.clone(),
        s.before.clone(),
        false,
    );
    wait_until("the reader reads", Duration::from_secs(10), || {
        reader.count(Probe::acked) > 0
    });
    let partitioned = Instant::now();
    c.net.partition(&victim.host);
    c.wait_device(
        &victim,
        "the victim's device down",
        false,
        Duration::from_secs(60),
    );
    assert!(
        c.leader_addr() == Some(other.addr),
        "the other node leads once the victim is down"
    );

    let mut nbd = c.nbd("gw", &s.gw, "v");
    for &i in &on_other {
        let offset = i * OBJECT as u64;
        let got = nbd.read(offset, OBJECT as u32).unwrap();
        assert!(
            got.as_ref() == Ok(&s.before[i as usize]),
            "object {i} of the live node during the partition: {}",
            describe(&got)
        );
        assert_eq!(nbd.write(offset, &s.before[i as usize], 0).unwrap(), 0);
    }
    for &i in &on_victim[..2] {
        let started = Instant::now();
        let got = nbd.read(i * OBJECT as u64, OBJECT as u32).unwrap();
        assert_eq!(
            got.as_ref().err(),
            Some(&5),
            "object {i} on the partitioned node: {}",
            describe(&got)
        );
        assert!(started.elapsed() >= IO_TIMEOUT / 2, "failed before waiting");
    }
    let e = nbd
        .write(
            on_victim[0] * OBJECT as u64,
            &s.before[on_victim[0] as usize],
            0,
        )
        .unwrap();
    assert_eq!(e, 5, "a write to the partitioned node's data");
    let problems = c.cli(&["pg", "list", "--problems"]);
    let unavailable = problems
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] == "unavailable")
        .count();
    let victim_dev = c.device_of(&victim).id;
    assert_eq!(
        unavailable,
        s.by_pg.iter().filter(|d| **d == victim_dev).count(),
        "exactly the victim's PGs are unavailable: {problems}"
    );

    let healed = Instant::now();
    c.net.heal(&victim.host);
    c.wait_device(
        &victim,
        "the victim's device up",
        true,
        Duration::from_secs(60),
    );
    wait_until("the victim's data served", Duration::from_secs(30), || {
        let i = on_victim[0];
        nbd.read(i * OBJECT as u64, OBJECT as u32).unwrap() == Ok(s.before[i as usize].clone())
    });
    let probes = reader.finish();
    assert!(c.net.running(&victim.proc), "the victim was restarted");
    assert_ne!(c.node_lease(victim.id), Some(lease_before), "same lease");
    assert!(c.net.log(&victim.proc).contains("registered again"));

    let wrong: Vec<&Probe> = probes
        .iter()
        .filter(|p| matches!(p.outcome, Outcome::Wrong(_)) || p.outcome == Outcome::Errno(22))
        .collect();
    assert!(wrong.is_empty(), "reads of the victim's data: {wrong:?}");
    let slowest = probes.iter().map(|p| p.got - p.sent).max().unwrap();
    assert!(
        slowest <= IO_TIMEOUT + Duration::from_secs(1),
        "a read of the partitioned node's data waited {slowest:?} (I/O timeout {IO_TIMEOUT:?})"
    );
    assert!(count(&probes, |p| p.acked() && p.got < partitioned) > 0);
    assert!(
        count(&probes, |p| p.outcome == Outcome::Errno(5)
            && p.got < healed)
            > 0
    );
    assert!(count(&probes, |p| p.acked() && p.sent > healed) > 0);

    c.fio("gw", &fio_args(&s.gw, true));
    s.check_all(&mut nbd);
    nbd.disconnect();
    let (prefix, pids) = (c.net.prefix.clone(), c.net.pids());
    assert!(pids.len() >= 4, "etcd, two nodes, a gateway: {pids:?}");
    drop(s);
    assert_eq!(Net::leftovers(&prefix, &pids), Vec::<String>::new());
}

/// How late the test may see an acknowledgement the node sent in time: the gateway and the
/// test's threads relay it (milliseconds, more on a loaded machine). A node acknowledging up to
/// its full lease, without the fifth of margin, overshoots by several hundred milliseconds.
const RELAY: Duration = Duration::from_millis(100);

fn since(t: Instant, origin: Instant) -> String {
    match t.checked_duration_since(origin) {
        Some(d) => format!("+{d:.3?}"),
        None => format!("-{:.3?}", origin - t),
    }
}

#[test]
fn a_node_cut_off_from_etcd_stops_acknowledging_before_its_lease_can_expire_and_rejoins() {
    let s = Setup::start();
    let c = &s.c;
    // Cut off a node that does not lead: the leader stays in touch with etcd and marks the
    // node's device down once etcd expired its lease.
    let (_leader, victim) = s.leader_and_other();
    let on_victim = s.objects_on(&victim);
    let lease = c.node_lease(victim.id).expect("registered");
    let clock = c.lease_clock(lease);
    // Through the gateway (writes of the bytes already there, and reads), and straight to the
    // node from the gateway's host, which still reaches it.
    let gateway = nbd_prober(
        c.nbd("gw", &s.gw, "v"),
        on_victim.clone(),
        s.before.clone(),
        true,
    );
    let first = on_victim[0];
    let direct = node_prober(
        c.net.connect("gw", victim.addr).unwrap(),
        ObjectId::new(s.pool, s.volume, first),
        s.before[first as usize][..4096].to_vec(),
    );
    wait_until("both probes acknowledged", Duration::from_secs(10), || {
        gateway.count(Probe::acked) > 0 && direct.count(Probe::acked) > 0
    });

    let cut = Instant::now();
    c.net.cut(&victim.host, &c.etcd_host);
    let samples = clock.finish(TTL * 4);
    let (earliest, latest) = LeaseClock::expiry(&samples)
        .unwrap_or_else(|| panic!("etcd did not expire the lease: {samples:?}"));
    // etcd got the node's last renewal at `latest - TTL` at the latest (the expiry is that
    // plus the TTL): from then on the node may acknowledge for TTL - TTL/5.
    let fence = latest - TTL / 5;
    c.wait_device(&victim, "its device down", false, Duration::from_secs(30));
    let down = Instant::now();
    wait_until("a refusal after the device went down", TTL, || {
        direct.count(|p| matches!(p.outcome, Outcome::Busy(_)) && p.sent > down) > 0
    });
    let healed = Instant::now();
    c.net.heal_all();
    wait_until("acknowledgements again", Duration::from_secs(60), || {
        direct.count(|p| p.acked() && p.sent > healed) > 0
            && gateway.count(|p| p.acked() && p.sent > healed) > 0
    });
    c.wait_device(&victim, "its device up", true, Duration::from_secs(30));
    let direct = direct.finish();
    let gateway = gateway.finish();

    let cut_off = |p: &&Probe| p.got > cut && p.got < healed;
    let last_ack = direct
        .iter()
        .chain(&gateway)
        .filter(cut_off)
        .filter(|p| p.acked())
        .map(|p| p.got)
        .max()
        .expect("no acknowledgement after the cut: was the node reachable?");
    let first_busy = direct
        .iter()
        .filter(|p| p.sent > cut)
        .find(|p| matches!(p.outcome, Outcome::Busy(_)))
        .expect("the node never answered Busy");
    eprintln!(
        "cut at 0: last ack {}, first Busy {}, etcd expired the lease in [{}, {}), device \
         down {}, healed {}",
        since(last_ack, cut),
        since(first_busy.got, cut),
        since(earliest, cut),
        since(latest, cut),
        since(down, cut),
        since(healed, cut)
    );
    for p in direct.iter().chain(&gateway).filter(cut_off) {
        assert!(
            !p.acked() || p.got < fence + RELAY,
            "acknowledged at {} after the cut; etcd had the last renewal by {}, so the node \
             had to stop by {} (TTL - TTL/5 later)",
            since(p.got, cut),
            since(latest - TTL, cut),
            since(fence, cut)
        );
        assert!(
            !p.acked() || p.got < earliest,
            "acknowledged after etcd may have expired the lease"
        );
        assert!(
            matches!(
                p.outcome,
                Outcome::Ack | Outcome::Busy(_) | Outcome::Errno(5)
            ),
            "{p:?}"
        );
    }
    assert!(
        first_busy.got < fence + RELAY,
        "the first Busy came at {}",
        since(first_busy.got, cut)
    );
    assert!(
        matches!(&first_busy.outcome, Outcome::Busy(m) if m.contains("lease")),
        "{first_busy:?}"
    );
    let wrong: Vec<&Probe> = direct
        .iter()
        .chain(&gateway)
        .filter(|p| matches!(p.outcome, Outcome::Wrong(_)))
        .collect();
    assert!(wrong.is_empty(), "{wrong:?}");

    // It rejoined by itself: same process, a new lease.
    assert!(c.net.running(&victim.proc), "the node was restarted");
    assert_ne!(c.node_lease(victim.id), Some(lease), "same lease");
    assert!(c.net.log(&victim.proc).contains("registered again"));
    c.fio("gw", &fio_args(&s.gw, true));
    let mut nbd = c.nbd("gw", &s.gw, "v");
    s.check_all(&mut nbd);
    nbd.disconnect();
}
