//! A device that hangs (its I/O never completes, no error comes back: a firmware stall, a dead
//! path) with real nodes in one process over simulated disks (`SimDisk::stall`): its node
//! reports it down once its oldest I/O is older than the stall limit, the map fails its PGs
//! over to the other members, writes go on, and every acknowledged write reads back; the
//! primary's writes waiting on its own hung store end with its term (the client retries them
//! on the new primary), requests waiting on the hung device are answered, and the node stops
//! though its device hangs. The device stays down when the stall ends, and when its node
//! restarts. A write through a node's in-process service whose caller gives up while a member
//! hangs for a moment still completes.

use basalt_client::{ClientError, Cluster as Client, Volume};
use basalt_engine::sim::SimDisk;
use basalt_meta::DeviceState;
use basalt_node::{DeviceConfig, Node, NodeConfig};
use basalt_proto::{ErrorCode, Request, Response};
use basalt_types::{DeviceId, ObjectId, Version};
use std::time::Duration;

mod common;

use common::{Cluster, OBJECT, PGS, WAIT, device_of, pattern, until};

const DISK: u64 = 64 << 20;

/// The stall limit of the tests' nodes.
const LIMIT: Duration = Duration::from_secs(1);

/// How long after its oldest I/O reaches the limit a hung device may take to be reported
/// down: the fault check runs every 0.5 s, then one write to the metadata store (measured:
/// 0.3 s; the rest is room for a loaded machine).
const REPORT_SLACK: Duration = Duration::from_secs(3);

/// Three nodes on simulated disks (stall limit [`LIMIT`]), a pool of three copies (`min_size`
/// 2), every PG clean.
struct Three {
    c: Cluster,
    disks: Vec<SimDisk>,
    nodes: Vec<Node>,
}

/// A failing test fails instead of hanging where a store's last handle waits for its I/O loop
/// to drain: the disks stop hanging first.
impl Drop for Three {
    fn drop(&mut self) {
        for d in &self.disks {
            d.stall(false);
        }
    }
}

async fn three() -> Three {
    let c = Cluster::new().await;
    let disks: Vec<SimDisk> = (0..3).map(|_| SimDisk::new(DISK)).collect();
    let mut nodes = Vec::new();
    for (i, disk) in disks.iter().enumerate() {
        nodes.push(start(&c, i, disk).await);
    }
    c.pool(3, 2).await;
    until("every PG clean", || active(&nodes, true) == PGS as usize).await;
    Three { c, disks, nodes }
}

/// Node `i` of [`Three`] on `disk`.
async fn start(c: &Cluster, i: usize, disk: &SimDisk) -> Node {
    start_with(c, i, disk, LIMIT).await
}

/// Node `i` on `disk` with the stall limit `limit` (zero: stalls are never reported).
async fn start_with(c: &Cluster, i: usize, disk: &SimDisk, limit: Duration) -> Node {
    let device = |data: &std::path::Path| DeviceConfig {
        sim: Some(disk.clone()),
        ..DeviceConfig::new(data.join("dev.img"))
    };
    let tune = |config: &mut NodeConfig| {
        config.scrub_bytes_per_sec = 0;
        config.device_stall_timeout = limit;
    };
    c.start_node(&format!("n{i}"), device, tune).await
}

/// PGs the nodes serve as active primaries (and clean, with `clean`).
fn active(nodes: &[Node], clean: bool) -> usize {
    nodes
        .iter()
        .flat_map(|n| n.status().pgs)
        .filter(|p| p.status.state == "active" && (!clean || p.clean))
        .count()
}

fn oid(vol: &Volume, i: u64) -> ObjectId {
    ObjectId::new(vol.pool(), vol.id(), i)
}

/// The objects among `0..objects` whose primary is (`true`) or is not `dev`.
fn objects_where(
    client: &Client,
    vol: &Volume,
    objects: u64,
    dev: DeviceId,
    primary: bool,
) -> Vec<u64> {
    let map = client.map();
    (0..objects)
        .filter(|i| (map.primary(&oid(vol, *i)) == Some(dev)) == primary)
        .collect()
}

/// Waits until `dev`'s record says down and the map marks it down; returns how long after
/// `since` the record was seen down.
async fn reported_down(c: &Cluster, dev: DeviceId, since: tokio::time::Instant) -> Duration {
    let deadline = since + WAIT;
    loop {
        let rec = c.catalog.get_device(dev).await.unwrap().unwrap();
        if rec.state == DeviceState::Down {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{dev} not reported down within {WAIT:?} of its stall"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = since.elapsed();
    c.map_where("the hung device down", |m| !m.is_up(dev)).await;
    took
}

/// Every object reads back as the newest generation written to it.
async fn check_all(vol: &Volume, gens: &[u64]) {
    for (i, g) in gens.iter().enumerate() {
        let i = i as u64;
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(
            got == pattern(i, *g),
            "object {i} does not read back as generation {g}"
        );
    }
}

/// Ends the stall, checks that the device stays down though its I/O completed, and after its
/// node restarts too (a drive that hung is not trusted again without an operator), and stops
/// the nodes.
async fn release_and_stop(mut t: Three, dev: DeviceId) {
    t.disks[0].stall(false);
    until("the hung device completed its I/O", || {
        t.nodes[0].status().devices[0].oldest_io_ms.is_none()
    })
    .await;
    let still_faulty = |rec: &basalt_meta::DeviceRecord| {
        rec.state == DeviceState::Down && rec.fault.as_deref().is_some_and(|f| f.contains("hangs"))
    };
    let rec = t.c.catalog.get_device(dev).await.unwrap().unwrap();
    assert!(
        still_faulty(&rec),
        "it stays down until an operator clears the fault, and the record says why: {rec:?}"
    );
    let n0 = t.nodes.remove(0);
    let id = n0.id();
    n0.shutdown().await;
    let n0 = start(&t.c, 0, &t.disks[0]).await;
    let addr = n0.local_addr().to_string();
    t.nodes.insert(0, n0);
    let map =
        t.c.map_where("the restarted node in the map", |m| {
            m.nodes.get(&id).is_some_and(|n| n.addr == addr)
        })
        .await;
    assert!(
        !map.is_up(dev),
        "the hung device is up again after a restart"
    );
    let rec = t.c.catalog.get_device(dev).await.unwrap().unwrap();
    assert!(still_faulty(&rec), "after a restart: {rec:?}");
    for n in std::mem::take(&mut t.nodes) {
        n.shutdown().await;
    }
}

/// A replica's disk hangs: the primaries' writes wait on its answer until its node reports it
/// down (within the limit) and the map gives its PGs to the two others; then writes complete
/// and every acknowledged write reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_disk_hangs_is_reported_down_and_its_pgs_fail_over() {
    let t = three().await;
    let client = t.c.client(Duration::from_secs(30)).await;
    let objects = 16;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    let mut gens = vec![1; objects as usize];
    for i in 0..objects {
        vol.write(i * OBJECT, pattern(i, 1), false).await.unwrap();
    }
    let dev = device_of(&t.nodes[0]);
    // Objects whose primary is another device: `dev` holds a copy of each as a replica.
    let replicated = objects_where(&client, &vol, objects, dev, false);
    assert!(!replicated.is_empty());

    t.disks[0].stall(true);
    let since = tokio::time::Instant::now();
    let writes = async {
        for &i in &replicated {
            vol.write(i * OBJECT, pattern(i, 2), false).await.unwrap();
        }
    };
    let (took, ()) = tokio::join!(
        async {
            until("the node shows the stalled I/O", || {
                t.nodes[0].status().devices[0].oldest_io_ms >= Some(500)
            })
            .await;
            reported_down(&t.c, dev, since).await
        },
        writes
    );
    eprintln!("the hung device was reported down {took:?} after the stall began");
    assert!(
        took <= LIMIT + REPORT_SLACK,
        "reported down {took:?} after the stall began (limit {LIMIT:?})"
    );
    for &i in &replicated {
        gens[i as usize] = 2;
    }
    until("every PG active on the other two", || {
        active(&t.nodes[1..], false) == PGS as usize
    })
    .await;
    check_all(&vol, &gens).await;
    // The requests other nodes sent to the hung device before the failover (sub-operations,
    // a peering query) are answered with an error rather than held forever: they would keep
    // the budget of the one connection each of those nodes reaches every device of node 0 on.
    until(
        "node 0 answered the requests waiting on its hung device",
        || t.nodes[0].requests_in_flight() == 0,
    )
    .await;
    // Writes to every object go on while the device still hangs.
    for i in 0..objects {
        vol.write(i * OBJECT, pattern(i, 3), false).await.unwrap();
        gens[i as usize] = 3;
    }
    check_all(&vol, &gens).await;
    release_and_stop(t, dev).await;
}

/// With the stall limit off, writes wait on a replica's hung disk for as long as it hangs: the
/// node of the hung disk (the sub-operations) and a primary (the client's writes) report them
/// as slow requests once they have waited [`basalt_node::SLOW_REQUEST`], with the age of the
/// oldest; once the disk answers, the writes complete and no request is slow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_on_a_hung_disk_are_reported_slow() {
    let c = Cluster::new().await;
    let disks: Vec<SimDisk> = (0..3).map(|_| SimDisk::new(DISK)).collect();
    let mut nodes = Vec::new();
    for (i, disk) in disks.iter().enumerate() {
        nodes.push(start_with(&c, i, disk, Duration::ZERO).await);
    }
    let t = Three { c, disks, nodes };
    t.c.pool(3, 2).await;
    until("every PG clean", || active(&t.nodes, true) == PGS as usize).await;
    let client = t.c.client(Duration::from_secs(120)).await;
    let objects = 16;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    for i in 0..objects {
        vol.write(i * OBJECT, pattern(i, 1), false).await.unwrap();
    }
    let dev = device_of(&t.nodes[0]);
    let replicated = objects_where(&client, &vol, objects, dev, false);
    assert!(!replicated.is_empty());
    let slow = |n: &Node| n.status().slow_requests;
    assert!(t.nodes.iter().all(|n| slow(n) == 0));

    t.disks[0].stall(true);
    let done = std::sync::atomic::AtomicBool::new(false);
    let writes = async {
        for &i in &replicated {
            vol.write(i * OBJECT, pattern(i, 2), false).await.unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    };
    let watch = async {
        until("slow requests on the hung node and on a primary", || {
            slow(&t.nodes[0]) > 0 && t.nodes[1..].iter().any(|n| slow(n) > 0)
        })
        .await;
        let oldest = t.nodes[0].status().oldest_request_ms.unwrap();
        assert!(
            (5000..WAIT.as_millis() as u64 + 5000).contains(&oldest),
            "the oldest has waited {oldest} ms"
        );
        assert!(
            !done.load(std::sync::atomic::Ordering::Relaxed),
            "the writes completed on a hung copy"
        );
        t.disks[0].stall(false);
    };
    tokio::join!(writes, watch);
    until("no slow request once the disk answers", || {
        t.nodes
            .iter()
            .all(|n| slow(n) == 0 && n.status().oldest_request_ms.is_none())
    })
    .await;
    let mut gens = vec![1; objects as usize];
    for &i in &replicated {
        gens[i as usize] = 2;
    }
    check_all(&vol, &gens).await;
    let mut t = t;
    for n in std::mem::take(&mut t.nodes) {
        n.shutdown().await;
    }
}

/// The primary's own disk hangs: a write and a read it took wait on its store, and end
/// (`Busy`) when the map that marks the device down ends its term, rather than hanging; the
/// client's writes move to the new primaries and every acknowledged write reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_whose_disk_hangs_is_reported_down_and_its_writes_end_with_its_term() {
    let t = three().await;
    let client = t.c.client(Duration::from_secs(30)).await;
    let objects = 16;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    let mut gens = vec![1; objects as usize];
    for i in 0..objects {
        vol.write(i * OBJECT, pattern(i, 1), false).await.unwrap();
    }
    let dev = device_of(&t.nodes[0]);
    let mine = objects_where(&client, &vol, objects, dev, true);
    assert!(!mine.is_empty(), "node 0 is the primary of some objects");

    t.disks[0].stall(true);
    let since = tokio::time::Instant::now();
    // One write sent to the primary as is (no retry, no rerouting): only the node can end it.
    let raw = Request::Write {
        epoch: client.map().epoch,
        oid: oid(&vol, mine[0]),
        offset: 0,
        version: Version::NONE,
        fua: false,
        data: pattern(mine[0], 9),
        session: basalt_proto::Session::NONE,
    };
    // And a read of an object no write waits on: it reads the hung device.
    let read = Request::Read {
        epoch: client.map().epoch,
        oid: oid(&vol, *mine.last().unwrap()),
        offset: 0,
        len: OBJECT as u32,
    };
    let (answer, read_answer, took, ()) = tokio::join!(
        tokio::time::timeout(WAIT, client.call_node(t.nodes[0].id(), raw)),
        tokio::time::timeout(WAIT, client.call_node(t.nodes[0].id(), read)),
        reported_down(&t.c, dev, since),
        async {
            for &i in &mine {
                vol.write(i * OBJECT, pattern(i, 2), false).await.unwrap();
            }
        }
    );
    eprintln!("the hung device was reported down {took:?} after the stall began");
    assert!(
        took <= LIMIT + REPORT_SLACK,
        "reported down {took:?} after the stall began (limit {LIMIT:?})"
    );
    match answer.expect("the write on the hung primary ends with its term") {
        Err(ClientError::Node(e)) if e.code == ErrorCode::Busy => {
            assert!(e.message.contains("did not answer"), "{e}");
        }
        other => panic!("the write on the hung primary answered {other:?}"),
    }
    match read_answer.expect("the read on the hung primary ends with its term") {
        Err(ClientError::Node(e)) if e.code == ErrorCode::Busy => {
            assert!(e.message.contains("did not answer"), "{e}");
        }
        other => panic!("the read on the hung primary answered {other:?}"),
    }
    for &i in &mine {
        gens[i as usize] = 2;
    }
    until("every PG active on the other two", || {
        active(&t.nodes[1..], false) == PGS as usize
    })
    .await;
    // The unacknowledged raw write may or may not have stayed (peering decides); write the
    // object again so that every object has one acknowledged newest generation.
    vol.write(mine[0] * OBJECT, pattern(mine[0], 3), false)
        .await
        .unwrap();
    gens[mine[0] as usize] = 3;
    check_all(&vol, &gens).await;
    // The node stops though its device still hangs: it does not wait for the hung store (its
    // requests in flight get the drain limit, 5 s; the metadata store the stop limit, 5 s).
    // (On a task: if it does not stop, the test ends the stall before anything drops the
    // node, and fails instead of hanging.)
    let mut t = t;
    let mut stop = tokio::spawn(t.nodes.remove(0).shutdown());
    tokio::time::timeout(Duration::from_secs(20), &mut stop)
        .await
        .expect("a node whose device hangs stops")
        .unwrap();
    t.disks[0].stall(false);
    for n in std::mem::take(&mut t.nodes) {
        n.shutdown().await;
    }
}

/// A write sent through a node's in-process service (`Node::service`, as a gateway inside the
/// node calls it: `basalt node --nbd`) whose caller gives up (drops its future) while a
/// member's disk hangs for a moment: the write is not cancelled halfway. Once the disk
/// answers it completes, and the object reads back its data at once. (When the dropped future
/// took the write with it, the PG's in-flight entry and the store's hold of the object stayed:
/// reads of the object on the primary waited until the PG's term ended.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_write_whose_caller_gives_up_still_completes() {
    let mut t = three().await;
    let client = t.c.client(Duration::from_secs(30)).await;
    let objects = 8;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    let dev = device_of(&t.nodes[0]);
    let i = objects_where(&client, &vol, objects, dev, true)[0];
    vol.write(i * OBJECT, pattern(i, 1), false).await.unwrap();
    let svc = t.nodes[0].service();
    let epoch = client.map().epoch;
    // Shorter than the stall limit: the member is never reported down, the term goes on.
    t.disks[1].stall(true);
    let write = Request::Write {
        epoch,
        oid: oid(&vol, i),
        offset: 0,
        version: Version::NONE,
        fua: false,
        data: pattern(i, 2),
        session: basalt_proto::Session::NONE,
    };
    let gave_up = tokio::time::timeout(Duration::from_millis(200), svc.call(write)).await;
    assert!(
        gave_up.is_err(),
        "the write waits for the hung member: {gave_up:?}"
    );
    t.disks[1].stall(false);
    let read = Request::Read {
        epoch,
        oid: oid(&vol, i),
        offset: 0,
        len: OBJECT as u32,
    };
    // Before, the read waited until the PG's term ended: never, with no member reported down.
    // Ten seconds tell the two apart on a loaded machine.
    let answer = tokio::time::timeout(Duration::from_secs(10), svc.call(read))
        .await
        .expect("the object reads once the member answered");
    match answer {
        Ok(Response::Read { data }) => assert!(data == pattern(i, 2), "the write completed"),
        other => panic!("the read answered {other:?}"),
    }
    for n in std::mem::take(&mut t.nodes) {
        n.shutdown().await;
    }
}
