//! Read repair, scrub and device faults with real nodes in one process over simulated disks
//! (the embedded metadata store, TCP between nodes, the client library): bits flipped in one
//! copy of an object never reach a reader, the copy is repaired, scrub finds and repairs copies
//! no read touched, an object bad on every member fails its read, and a store that fails its
//! writes (poisoned) is reported down so its PGs are served by the others.

use basalt_client::{ClientError, Cluster as Client, Volume};
use basalt_engine::sim::SimDisk;
use basalt_engine::{ObjectContent, ObjectImage, WriteOptions};
use basalt_meta::{DeviceState, OutReason};
use basalt_node::{AdminRequest, DeviceConfig, LostReport, Node, NodeConfig, ScrubReport};
use basalt_placement::ClusterMap;
use basalt_proto::{ErrorCode, Request, Response};
use basalt_types::{DeviceId, ObjectId, PgId, Version};
use bytes::Bytes;
use std::time::Duration;

mod common;

use common::{Cluster, OBJECT, PGS, blocks_holding, device_of, pattern, until};

const DISK: u64 = 64 << 20;

impl Cluster {
    /// Starts node `name` on simulated disk `disk` (background scrub off); `tune` adjusts its
    /// configuration.
    async fn node(&self, name: &str, disk: &SimDisk, tune: impl FnOnce(&mut NodeConfig)) -> Node {
        let device = |data: &std::path::Path| DeviceConfig {
            sim: Some(disk.clone()),
            ..DeviceConfig::new(data.join("dev.img"))
        };
        let tune = |config: &mut NodeConfig| {
            config.scrub_bytes_per_sec = 0;
            tune(config);
        };
        self.start_node(name, device, tune).await
    }

    async fn map(&self) -> ClusterMap {
        self.catalog
            .get_map::<ClusterMap>()
            .await
            .unwrap()
            .expect("a map")
            .0
    }
}

/// Three nodes on simulated disks, a pool of three copies (`min_size` 2), every PG clean.
struct Three {
    c: Cluster,
    disks: Vec<SimDisk>,
    nodes: Vec<Node>,
}

async fn three(tune: impl Fn(&mut NodeConfig)) -> Three {
    let c = Cluster::new().await;
    let disks: Vec<SimDisk> = (0..3).map(|_| SimDisk::new(DISK)).collect();
    let mut nodes = Vec::new();
    for (i, disk) in disks.iter().enumerate() {
        nodes.push(c.node(&format!("n{i}"), disk, &tune).await);
    }
    c.pool(3, 2).await;
    until("every PG clean", || all_active(&nodes, true)).await;
    Three { c, disks, nodes }
}

fn all_active(nodes: &[Node], clean: bool) -> bool {
    let pgs: Vec<_> = nodes
        .iter()
        .flat_map(|n| n.status().pgs)
        .filter(|p| p.status.state == "active" && (!clean || p.clean))
        .collect();
    pgs.len() == PGS as usize
}

fn repaired(nodes: &[Node]) -> u64 {
    nodes.iter().map(|n| n.status().repaired_objects).sum()
}

fn checksum_errors(node: &Node) -> u64 {
    node.status().devices[0].checksum_errors
}

async fn write_all(vol: &Volume, objects: u64, g: u64) {
    for i in 0..objects {
        vol.write(i * OBJECT, pattern(i, g), false).await.unwrap();
    }
}

fn oid(vol: &Volume, i: u64) -> ObjectId {
    ObjectId::new(vol.pool(), vol.id(), i)
}

/// Flips one bit in every 4 KiB block of `disk` that holds a block of object `i` of generation
/// `g` (all its blocks are alike), as media corruption would. Returns how many it flipped.
fn corrupt(disk: &SimDisk, i: u64, g: u64) -> usize {
    let hits = blocks_holding(disk, &pattern(i, g)[..4096]);
    assert!(
        !hits.is_empty(),
        "object {i} generation {g} not found on the disk"
    );
    for &off in &hits {
        disk.flip_bit(off + 1000 + (i % 7), (off / 4096 % 8) as u8);
    }
    hits.len()
}

/// Flips one bit in only the `n`-th 4 KiB block of object `i` (generation `g`) on `disk`.
fn corrupt_block(disk: &SimDisk, i: u64, g: u64, n: usize) {
    let hits = blocks_holding(disk, &pattern(i, g)[..4096]);
    assert!(hits.len() > n, "object {i}: {} blocks found", hits.len());
    disk.flip_bit(hits[n] + 77, 3);
}

/// Asks every node to scrub the pool; sums their reports.
async fn scrub(client: &Client, nodes: &[Node]) -> ScrubReport {
    let mut total = ScrubReport::default();
    for n in nodes {
        let body = serde_json::to_vec(&AdminRequest::Scrub { pool: None }).unwrap();
        let answer = client
            .call_node(n.id(), Request::Admin { body: body.into() })
            .await
            .unwrap();
        let Response::Admin { body } = answer else {
            panic!("unexpected answer {answer:?}");
        };
        let report: ScrubReport = serde_json::from_slice(&body).unwrap();
        total.add(&report);
    }
    total
}

/// How one copy goes bad in [`one_bad_copy_is_repaired`].
struct Damage {
    /// Damages object `i` of generation `g` on a disk.
    apply: fn(&SimDisk, u64, u64),
    /// The node's count of the errors this damage causes.
    errors: fn(&Node) -> u64,
    /// Its count of the other kind of error, which must stay 0.
    other: fn(&Node) -> u64,
}

/// Node 0's copy of every object goes bad, of objects it is the primary of and of objects it
/// is a replica of: every read returns the acknowledged data; each primary copy fails once and
/// is repaired by the read (read again, no new error); scrub finds the replica copies no read
/// touched and repairs them; a second scrub finds nothing.
async fn one_bad_copy_is_repaired(damage: Damage) {
    let t = three(|_| {}).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 24;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let dev = device_of(&t.nodes[0]);
    let map = t.c.map().await;
    let (on_primary, on_replica): (Vec<u64>, Vec<u64>) =
        (0..objects).partition(|&i| map.primary(&oid(&vol, i)) == Some(dev));
    assert!(
        !on_primary.is_empty() && !on_replica.is_empty(),
        "node 0 is the primary of some objects and a replica of others"
    );
    for i in 0..objects {
        (damage.apply)(&t.disks[0], i, 1);
    }
    let before = (damage.errors)(&t.nodes[0]);
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 1), "object {i} read back wrong");
    }
    let errors = (damage.errors)(&t.nodes[0]) - before;
    assert_eq!(
        errors,
        on_primary.len() as u64,
        "each bad primary copy failed once, then was repaired"
    );
    assert_eq!(repaired(&t.nodes), on_primary.len() as u64);
    for &i in &on_primary {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 1), "object {i} read back wrong");
    }
    assert_eq!(
        (damage.errors)(&t.nodes[0]) - before,
        errors,
        "no new error"
    );
    assert_eq!((damage.other)(&t.nodes[0]), 0, "the other kind of error");

    // Scrub finds the replica's bad copies that no read touched, and repairs them.
    let report = scrub(&client, &t.nodes).await;
    assert_eq!(report.pgs_scrubbed(), PGS as u64, "{report:?}");
    assert_eq!(report.objects(), objects, "{report:?}");
    assert_eq!(report.inconsistent(), on_replica.len() as u64, "{report:?}");
    assert_eq!(report.repaired(), on_replica.len() as u64, "{report:?}");
    assert_eq!(report.unrepairable(), 0, "{report:?}");
    let again = scrub(&client, &t.nodes).await;
    assert_eq!(again.inconsistent(), 0, "{again:?}");
    assert_eq!(again.objects(), objects, "{again:?}");
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// Bits flipped in one copy ([`one_bad_copy_is_repaired`]): checksum errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bits_in_one_copy_are_never_read_and_are_repaired() {
    one_bad_copy_is_repaired(Damage {
        apply: |disk, i, g| {
            corrupt(disk, i, g);
        },
        errors: checksum_errors,
        other: read_errors,
    })
    .await;
}

/// Makes one sector of one 4 KiB block of object `i` (generation `g`) on `disk` unreadable
/// (its reads fail with `EIO`, a latent sector error): the sector `i % 8` of the block
/// `i % 32` of those found (all blocks of an object are alike, found in disk order).
fn unreadable(disk: &SimDisk, i: u64, g: u64) {
    let hits = blocks_holding(disk, &pattern(i, g)[..4096]);
    assert!(
        !hits.is_empty(),
        "object {i} generation {g} not found on the disk"
    );
    let sector = hits[(i % 32) as usize % hits.len()] + 512 * (i % 8);
    disk.fail_reads(sector..sector + 512);
}

fn read_errors(node: &Node) -> u64 {
    node.status().devices[0].read_errors
}

/// Sectors that fail to read (`EIO`, a disk's latent sector errors) in one copy
/// ([`one_bad_copy_is_repaired`]): read errors, not checksum errors; each copy is served from
/// another and rewritten (before, the client got `EIO`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_sectors_in_one_copy_are_read_from_another_and_rewritten() {
    one_bad_copy_is_repaired(Damage {
        apply: unreadable,
        errors: read_errors,
        other: checksum_errors,
    })
    .await;
}

/// The primary's copy of an object has a sector that still fails after it is rewritten (a drive
/// that can no longer remap it): every read returns the acknowledged data, served from the good
/// copy the read repair fetched (before, the read after the repair failed with `EIO`), also two
/// reads of the object at once (one waits for the other's repair, then repairs again); a write
/// of part of a block, which needs the block readable there, fails at once (`EIO`) and changes
/// nothing (it does not make the PG peer again and again). The device is never reported down
/// here (`checksum_error_limit` 0), so the PG stays on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sector_still_unreadable_after_its_rewrite_is_served_from_the_good_copy() {
    let t = three(|c| c.checksum_error_limit = 0).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 8;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let dev = device_of(&t.nodes[0]);
    let map = t.c.map().await;
    let i = (0..objects)
        .find(|&i| map.primary(&oid(&vol, i)) == Some(dev))
        .expect("node 0 is the primary of an object");
    let hits = blocks_holding(&t.disks[0], &pattern(i, 1)[..4096]);
    assert!(!hits.is_empty(), "object {i} not found on node 0's disk");
    // From the copy's first block to the end of the disk: wherever the store rewrites it.
    t.disks[0].fail_reads_always(hits[0]..DISK);
    for round in 0..3 {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(
            got == pattern(i, 1),
            "object {i} read back wrong in round {round}"
        );
    }
    assert!(read_errors(&t.nodes[0]) >= 1, "the dead sector was read");
    assert!(repaired(&t.nodes) >= 1, "the copy was rewritten");
    let half = OBJECT / 2;
    let whole = pattern(i, 1);
    for round in 0..8 {
        let (a, b) = tokio::join!(
            vol.read(i * OBJECT, half as u32),
            vol.read(i * OBJECT + half, half as u32)
        );
        assert!(a.unwrap() == whole.slice(..half as usize), "round {round}");
        assert!(b.unwrap() == whole.slice(half as usize..), "round {round}");
    }
    // A checksum error, not the client's retries exhausted after the PG peered again and again.
    match vol
        .write(i * OBJECT + 10, Bytes::from(vec![7u8; 100]), false)
        .await
    {
        Err(ClientError::Checksum(_)) => {}
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(vol.read(i * OBJECT, OBJECT as u32).await.unwrap() == whole);
    for j in 0..objects {
        let got = vol.read(j * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(j, 1), "object {j} read back wrong");
    }
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// An object whose every copy is bad fails its read (never bad data); the others read fine;
/// scrub counts it unrepairable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_bad_on_every_member_fails_its_read() {
    let t = three(|_| {}).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 8;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    for disk in &t.disks {
        corrupt(disk, 3, 1);
    }
    // Bad on two of three: still served, and both repaired.
    corrupt(&t.disks[0], 5, 1);
    corrupt(&t.disks[1], 5, 1);
    match vol.read(3 * OBJECT, OBJECT as u32).await {
        Err(ClientError::Checksum(why)) => {
            assert!(why.contains("no member holds a good copy"), "{why}")
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    for i in (0..objects).filter(|i| *i != 3) {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 1), "object {i} read back wrong");
    }
    // Object 3 cannot be repaired; a bad copy of object 5 that the read did not need (the
    // primary found a good copy first) is repaired now.
    let report = scrub(&client, &t.nodes).await;
    assert_eq!(report.unrepairable(), 1, "{report:?}");
    assert!(report.inconsistent() >= 1, "{report:?}");
    assert_eq!(report.repaired(), report.inconsistent() - 1, "{report:?}");
    // Rewriting the object makes it whole again.
    vol.write(3 * OBJECT, pattern(3, 2), false).await.unwrap();
    assert!(vol.read(3 * OBJECT, OBJECT as u32).await.unwrap() == pattern(3, 2));
    let again = scrub(&client, &t.nodes).await;
    assert_eq!(again.inconsistent(), 0, "{again:?}");
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// Every copy of an object fails its checksum, each in another block (block 0 on node 0's,
/// 1 on node 1's, 2 on node 2's): merged block by block, the copies still give the object.
/// The read returns the acknowledged data, every copy is replaced by the merged image, and a
/// scrub then finds nothing. (Without the merge the read failed: no copy verifies whole.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_bad_in_different_blocks_are_merged() {
    let t = three(|_| {}).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 8;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    for (n, disk) in t.disks.iter().enumerate() {
        corrupt_block(disk, 5, 1, n);
    }
    let got = vol.read(5 * OBJECT, OBJECT as u32).await.unwrap();
    assert!(got == pattern(5, 1), "object 5 read back wrong");
    assert_eq!(
        repaired(&t.nodes),
        3,
        "every copy replaced by the merged one"
    );
    let report = scrub(&client, &t.nodes).await;
    assert_eq!(report.inconsistent(), 0, "{report:?}");
    assert_eq!(report.objects(), objects, "{report:?}");
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 1), "object {i} read back wrong");
    }
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// A node away while every object changed comes back; for each object one of the two copies
/// recovery can copy from fails its checksum (node 0's of even objects, node 1's of odd ones):
/// recovery falls back to the good one, so every PG gets clean (without the fallback it
/// retried the bad source forever), the bad sources are replaced on the way, and then every
/// copy verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_copies_from_another_source_when_one_fails_its_checksum() {
    let mut t = three(|_| {}).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 24;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let away = t.nodes.pop().unwrap();
    let dev = device_of(&away);
    away.shutdown().await;
    t.c.map_where("node 2 down", |m| !m.is_up(dev)).await;
    write_all(&vol, objects, 2).await;
    for i in 0..objects {
        corrupt(&t.disks[(i % 2) as usize], i, 2);
    }
    let errors_before: u64 = t.nodes.iter().map(checksum_errors).sum();
    t.nodes.push(t.c.node("n2", &t.disks[2], |_| {}).await);
    until("every PG clean after recovery", || {
        all_active(&t.nodes, true)
    })
    .await;
    let errors: u64 = t.nodes.iter().map(checksum_errors).sum::<u64>() - errors_before;
    assert!(
        errors > 0,
        "recovery met no bad source: the test tests nothing"
    );
    assert_eq!(
        repaired(&t.nodes),
        errors,
        "every bad source met was replaced"
    );
    // Every copy on every node verifies once scrub replaced the bad ones recovery did not
    // read; node 2's were all copied from good sources.
    let report = scrub(&client, &t.nodes).await;
    assert_eq!(report.objects(), objects, "{report:?}");
    assert_eq!(report.unrepairable(), 0, "{report:?}");
    assert_eq!(report.inconsistent(), objects - errors, "{report:?}");
    let again = scrub(&client, &t.nodes).await;
    assert_eq!(again.inconsistent(), 0, "{again:?}");
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 2), "object {i} read back wrong");
    }
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// A node away while one object changed comes back, and both copies recovery could copy that
/// object from fail their checksums: there is no good copy anywhere. Recovery fails, and the PG
/// tries again after waits that double (1 s, 2 s, 4 s ... at most 30 s), not at once: the bad
/// copies are read a few times, not in a loop, which would also count enough checksum errors
/// to report both good devices down (`--checksum-error-limit`) and take every other PG on them
/// down with them. Every other PG gets clean; the object is unfound: its reads and writes fail
/// at once (never bad data, never a wait until the client's timeout). Declared lost, it reads
/// as zeros and its PG gets clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_with_no_good_copy_does_not_make_recovery_spin() {
    let mut t = three(|_| {}).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 8;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let away = t.nodes.pop().unwrap();
    let dev = device_of(&away);
    away.shutdown().await;
    t.c.map_where("node 2 down", |m| !m.is_up(dev)).await;
    vol.write(3 * OBJECT, pattern(3, 2), false).await.unwrap();
    corrupt(&t.disks[0], 3, 2);
    corrupt(&t.disks[1], 3, 2);
    let errors = |nodes: &[Node]| nodes[..2].iter().map(checksum_errors).sum::<u64>();
    let before = errors(&t.nodes);
    t.nodes.push(t.c.node("n2", &t.disks[2], |_| {}).await);
    until("recovery met the bad copies", || errors(&t.nodes) > before).await;
    until("every other PG clean", || {
        let pgs: Vec<_> = t.nodes.iter().flat_map(|n| n.status().pgs).collect();
        pgs.iter().filter(|p| p.clean).count() == PGS as usize - 1
    })
    .await;
    // Watch the failing PG for a while: a few more attempts at most (each reads both bad
    // copies twice: whole, then block by block to merge them; 4 errors per attempt).
    let first = errors(&t.nodes);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let more = errors(&t.nodes) - first;
    assert!(
        more <= 16,
        "{more} checksum errors in 6 s: recovery retries the bad copies in a loop"
    );
    let map = t.c.map().await;
    for n in &t.nodes {
        assert!(map.is_up(device_of(n)), "{} reported down", device_of(n));
    }
    // The object is unfound: its read and a write fail at once with the reason, instead of
    // waiting for a recovery that only retries until the client's timeout (10 s here).
    let read = vol.read(3 * OBJECT, OBJECT as u32).await;
    assert!(
        matches!(&read, Err(ClientError::Checksum(m)) if m.contains("unfound")),
        "{read:?}"
    );
    let write = vol.write(3 * OBJECT, pattern(3, 3), false).await;
    assert!(
        matches!(&write, Err(ClientError::Checksum(m)) if m.contains("unfound")),
        "{write:?}"
    );
    for i in (0..objects).filter(|i| *i != 3) {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 1), "object {i} read back wrong");
    }
    // The operator gives it up (`basalt pg mark-unfound-lost`): the primary deletes it on
    // every member; it reads as zeros, takes writes again, and its PG gets clean.
    let map = t.c.map().await;
    let lost = oid(&vol, 3);
    let (pg, _) = map.locate(&lost).unwrap();
    let node = map.device_node(map.primary(&lost).unwrap()).unwrap();
    let mut asked = 0;
    let report: LostReport = loop {
        asked += 1;
        assert!(asked < 100, "the primary never had the object unfound");
        let req = AdminRequest::MarkUnfoundLost { pg };
        let body = serde_json::to_vec(&req).unwrap();
        let answer = client
            .call_node(node, Request::Admin { body: body.into() })
            .await;
        let Ok(Response::Admin { body }) = answer else {
            panic!("unexpected answer {answer:?}");
        };
        let r: LostReport = serde_json::from_slice(&body).unwrap();
        // Between two recovery attempts the PG peers and nothing is unfound for a moment.
        if !r.declared.is_empty() || !r.failed.is_empty() {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(report.failed, Vec::<String>::new(), "{report:?}");
    assert_eq!(report.declared.len(), 1, "{report:?}");
    assert_eq!(report.declared[0].0, lost, "{report:?}");
    let zeros = vol.read(3 * OBJECT, OBJECT as u32).await.unwrap();
    assert!(
        zeros.iter().all(|b| *b == 0),
        "a lost object reads as zeros"
    );
    until("every PG clean", || all_active(&t.nodes, true)).await;
    let unfound: u64 = t
        .nodes
        .iter()
        .flat_map(|n| n.status().pgs)
        .map(|p| p.unfound_objects)
        .sum();
    assert_eq!(unfound, 0);
    vol.write(3 * OBJECT, pattern(3, 4), false).await.unwrap();
    assert!(vol.read(3 * OBJECT, OBJECT as u32).await.unwrap() == pattern(3, 4));
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// A fourth node joins while node 0's copy of every object is bad: backfill, which copies
/// from the primary's own store, takes a good member's copy where the primary's fails its
/// checksum (and replaces the primary's); the new node's copies all verify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_copies_a_good_members_copy_when_the_primarys_is_bad() {
    let mut t = three(|_| {}).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 24;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    for i in 0..objects {
        corrupt(&t.disks[0], i, 1);
    }
    let errors_before = checksum_errors(&t.nodes[0]);
    let disk = SimDisk::new(DISK);
    t.nodes.push(t.c.node("n3", &disk, |_| {}).await);
    t.disks.push(disk);
    let new = device_of(&t.nodes[3]);
    t.c.map_where("node 3 serving its PGs", |m| {
        let pgs = || m.pools.values().flat_map(|p| &p.pgs);
        pgs().all(|pg| pg.up == pg.acting) && pgs().any(|pg| pg.acting.contains(&new))
    })
    .await;
    until("every PG clean", || all_active(&t.nodes, true)).await;
    let errors = checksum_errors(&t.nodes[0]) - errors_before;
    assert!(
        errors > 0,
        "backfill met no bad copy: the test tests nothing"
    );
    assert_eq!(
        repaired(&t.nodes),
        errors,
        "every bad copy met was replaced"
    );
    let report = scrub(&client, &t.nodes).await;
    assert_eq!(report.objects(), objects, "{report:?}");
    assert_eq!(report.unrepairable(), 0, "{report:?}");
    let again = scrub(&client, &t.nodes).await;
    assert_eq!(again.inconsistent(), 0, "{again:?}");
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 1), "object {i} read back wrong");
    }
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// A fourth node joins while every copy of every object is bad: each backfill to it stops at
/// an object with no good copy, which its PG's status lists as unfound (before, only a log line
/// said so and `mark-unfound-lost` had nothing to give up: those PGs never moved). The operator
/// gives them up, and the backfills go on: every PG gets clean, each object given up reads as
/// zeros, every other object still fails its read (never other data). An object a client
/// rewrites meanwhile is taken off the list and reads back what was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_lists_objects_with_no_good_copy_as_unfound_for_the_operator() {
    // Every block bad everywhere: no device may be reported down for its checksum errors
    // (`repeated_checksum_errors_mark_a_device_down` tests that), or no PG would serve at all.
    let tune = |c: &mut NodeConfig| c.checksum_error_limit = 0;
    let mut t = three(tune).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 8;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    for i in 0..objects {
        for disk in &t.disks {
            corrupt(disk, i, 1);
        }
    }
    let disk = SimDisk::new(DISK);
    t.nodes.push(t.c.node("n3", &disk, tune).await);
    t.disks.push(disk);
    let new = device_of(&t.nodes[3]);
    t.c.map_where("PGs placed on node 3", |m| {
        m.pools
            .values()
            .flat_map(|p| &p.pgs)
            .any(|pg| pg.up.contains(&new))
    })
    .await;
    // A client rewrites the first object listed: the write is taken (it makes the object
    // whole), takes it off the list, and giving up the PG's objects later spares it.
    let mut rewritten = None;
    until("an object listed unfound", || {
        rewritten = t
            .nodes
            .iter()
            .flat_map(|n| n.status().pgs)
            .find_map(|p| p.unfound.first().copied());
        rewritten.is_some()
    })
    .await;
    let rewritten = rewritten.unwrap().index;
    vol.write(rewritten * OBJECT, pattern(rewritten, 2), false)
        .await
        .unwrap();
    let declared = give_up_until_clean(&t.c, &client, &t.nodes).await;
    assert!(!declared.contains(&oid(&vol, rewritten)), "{declared:?}");
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await;
        if i == rewritten {
            assert!(
                got.unwrap() == pattern(i, 2),
                "object {i}: rewritten, read back wrong"
            );
        } else if declared.contains(&oid(&vol, i)) {
            let zeros = got.unwrap();
            assert!(
                zeros.iter().all(|b| *b == 0),
                "object {i}: given up, not zeros"
            );
        } else {
            assert!(
                matches!(&got, Err(ClientError::Checksum(_))),
                "object {i}: {got:?}"
            );
        }
    }
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// Gives up (as the operator does with `basalt pg mark-unfound-lost`) the objects every PG's
/// primary lists unfound, until every PG of `nodes` is clean; returns what was declared lost
/// (at least one object: else the test tests nothing).
async fn give_up_until_clean(c: &Cluster, client: &Client, nodes: &[Node]) -> Vec<ObjectId> {
    let mut declared: Vec<ObjectId> = Vec::new();
    let deadline = tokio::time::Instant::now() + 2 * common::WAIT;
    loop {
        let pgs: Vec<_> = nodes.iter().flat_map(|n| n.status().pgs).collect();
        let unfound: Vec<_> = pgs.iter().filter(|p| p.unfound_objects > 0).collect();
        if unfound.is_empty() && all_active(nodes, true) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "PGs not clean: {:?}",
            pgs.iter().filter(|p| !p.clean).collect::<Vec<_>>()
        );
        for p in unfound {
            if let Ok(r) = mark_unfound_lost(c, client, p.pg, p.device).await {
                declared.extend(r.declared.iter().map(|(o, _)| *o));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !declared.is_empty(),
        "no backfill met an object with no good copy: the test tests nothing"
    );
    declared
}

/// Asks the node of `device` (a PG's primary) to give up the PG's unfound objects.
async fn mark_unfound_lost(
    c: &Cluster,
    client: &Client,
    pg: PgId,
    device: DeviceId,
) -> Result<LostReport, ClientError> {
    let node = c.map().await.device_node(device).unwrap();
    let body = serde_json::to_vec(&AdminRequest::MarkUnfoundLost { pg }).unwrap();
    match client
        .call_node(node, Request::Admin { body: body.into() })
        .await?
    {
        Response::Admin { body } => Ok(serde_json::from_slice(&body).unwrap()),
        other => panic!("unexpected answer {other:?}"),
    }
}

/// The way out of the worst case of a PG below `min_size`: two copies (`min_size` 2), one
/// device gone for good (stopped, marked out), every copy on the other bad. The PG is peered on
/// the one device left, its backfill to a new node stops at the first object with no good copy
/// and lists it; giving it up is refused (a peered PG writes nothing, tombstones
/// included), saying how: the operator lowers `min_size` to the copies left, the PG serves,
/// gives up what it lists, its backfill completes, and with `min_size` back at 2 every PG is
/// clean on the two devices; what was given up reads as zeros.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peered_pg_stopped_at_an_object_with_no_good_copy_is_freed_by_lowering_min_size() {
    let tune = |c: &mut NodeConfig| c.checksum_error_limit = 0;
    let c = Cluster::new().await;
    let disks: Vec<SimDisk> = (0..3).map(|_| SimDisk::new(DISK)).collect();
    let mut nodes = vec![
        c.node("a", &disks[0], tune).await,
        c.node("b", &disks[1], tune).await,
    ];
    c.pool(2, 2).await;
    until("every PG clean", || all_active(&nodes, true)).await;
    let client = c.client(Duration::from_secs(10)).await;
    let objects = 8;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let b = nodes.pop().unwrap();
    let gone = device_of(&b);
    b.shutdown().await;
    c.catalog
        .set_device_out(gone, Some(OutReason::Operator))
        .await
        .unwrap();
    for i in 0..objects {
        corrupt(&disks[0], i, 1);
    }
    nodes.push(c.node("n", &disks[2], tune).await);
    let mut stuck = None;
    until("a peered PG listing an unfound object", || {
        stuck = nodes[0]
            .status()
            .pgs
            .into_iter()
            .find(|p| p.status.state == "peered" && p.unfound_objects > 0);
        stuck.is_some()
    })
    .await;
    let stuck = stuck.unwrap();
    // Asked while the PG peers again (its backfill failed: `failed_round` retries after a
    // second), the node has no peered primary to refuse with: it answers that it is not the
    // primary, or gives up nothing. Asked again until the PG is peered again and lists it.
    let deadline = tokio::time::Instant::now() + common::WAIT;
    loop {
        match mark_unfound_lost(&c, &client, stuck.pg, stuck.device).await {
            Err(ClientError::InvalidArgument(why)) if why.contains("--min-size 1") => break,
            Err(ClientError::Node(e)) if e.code == ErrorCode::NotFound => {}
            Ok(r) if r.declared.is_empty() && r.failed.is_empty() => {}
            other => panic!("giving up on a peered PG: {other:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the peered PG was never refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.catalog.set_pool_min_size("default", 1).await.unwrap();
    let declared = give_up_until_clean(&c, &client, &nodes).await;
    c.catalog.set_pool_min_size("default", 2).await.unwrap();
    until("every PG clean on two devices", || all_active(&nodes, true)).await;
    let map = c.map().await;
    for pg in map.pools.values().flat_map(|p| &p.pgs) {
        assert_eq!(pg.acting.len(), 2, "{pg:?}");
        assert!(!pg.acting.contains(&gone), "{pg:?}");
    }
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await;
        if declared.contains(&oid(&vol, i)) {
            let zeros = got.unwrap();
            assert!(zeros.iter().all(|b| *b == 0), "object {i}: not zeros");
        } else {
            assert!(
                matches!(&got, Err(ClientError::Checksum(_))),
                "object {i}: {got:?}"
            );
        }
    }
    for node in nodes {
        node.shutdown().await;
    }
}

/// Copies only a member holds, found by scrub walking every member's listing: a member's copy
/// that missed its object's delete (the primary holds the newer tombstone) gets the tombstone;
/// an object a member holds that the primary never had is reported unrepairable and left
/// alone (it could be the only copy of acknowledged data). Before, scrub walked only the
/// primary's live objects and found neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_finds_copies_only_a_member_holds() {
    let t = three(|_| {}).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 8;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    vol.trim(2 * OBJECT, OBJECT).await.unwrap();
    let map = t.c.map().await;
    let deleted = oid(&vol, 2);
    let primary = map.primary(&deleted).unwrap();
    let k = (0..3).find(|k| device_of(&t.nodes[*k]) != primary).unwrap();
    let dev = device_of(&t.nodes[k]);
    let store = t.nodes[k].store_for_test(dev).unwrap();
    let info = store.object_info(deleted).await.unwrap().unwrap();
    assert!(
        info.deleted,
        "a whole-object trim leaves a tombstone: {info:?}"
    );
    // The member's copy goes back to live data older than the tombstone.
    let image = |version: Version, i: u64| ObjectImage {
        version,
        content: ObjectContent::Data {
            data: pattern(i, 1),
            allocated: vec![u64::MAX; OBJECT as usize / 4096 / 64],
        },
    };
    let older = Version::new(info.version.epoch, info.version.seq - 1);
    let in_pg = |o: &ObjectId| WriteOptions::durable().in_pg(map.locate(o).unwrap().0.pg);
    store
        .install(deleted, image(older, 2), in_pg(&deleted))
        .await
        .unwrap();
    // An object past the volume's end that only this member holds (not its primary).
    let stray = (objects..objects + 64)
        .map(|i| oid(&vol, i))
        .find(|o| {
            let (_, pg) = map.locate(o).unwrap();
            pg.acting.contains(&dev) && map.primary(o) != Some(dev)
        })
        .unwrap();
    store
        .install(stray, image(info.version, 99), in_pg(&stray))
        .await
        .unwrap();

    let report = scrub(&client, &t.nodes).await;
    assert_eq!(report.inconsistent(), 2, "{report:?}");
    assert_eq!(report.repaired(), 1, "{report:?}");
    assert_eq!(report.unrepairable(), 1, "{report:?}");
    let now = store.object_info(deleted).await.unwrap().unwrap();
    assert!(now.deleted && now.version == info.version, "{now:?}");
    assert!(
        store.object_info(stray).await.unwrap().is_some(),
        "the member's only copy is left alone"
    );
    assert!(
        vol.read(2 * OBJECT, OBJECT as u32)
            .await
            .unwrap()
            .iter()
            .all(|b| *b == 0)
    );
    let again = scrub(&client, &t.nodes).await;
    assert_eq!(again.inconsistent(), 1, "{again:?}");
    assert_eq!(again.unrepairable(), 1, "{again:?}");
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// A write of part of a block whose copy is bad (on the primary for some objects, on a replica
/// for others) succeeds and reads back merged with the acknowledged data around it. On the
/// primary the block is verified (and read-repaired) first; on a replica the write fails there,
/// and peering, finding the only copy of the acknowledged version bad, rolls forward to the
/// members' newer copy. Before, the first failed with `EIO` and the second left the PG
/// incomplete for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_block_write_into_a_bad_copy_succeeds() {
    let t = three(|_| {}).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 12;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let map = t.c.map().await;
    let dev = device_of(&t.nodes[0]);
    let primaries = (0..objects)
        .filter(|i| map.primary(&oid(&vol, *i)) == Some(dev))
        .count();
    assert!(
        primaries > 0 && primaries < objects as usize,
        "node 0 is the primary of some objects and a replica of others"
    );
    for i in 0..objects {
        corrupt(&t.disks[0], i, 1);
    }
    let patch = Bytes::from(vec![0xabu8; 512]);
    for i in 0..objects {
        let at = i * OBJECT + 4096 + 100;
        vol.write(at, patch.clone(), false).await.unwrap();
    }
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        let mut want = pattern(i, 1).to_vec();
        want[4096 + 100..4096 + 612].fill(0xab);
        assert!(got[..] == want[..], "object {i} read back wrong");
    }
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// The background scrub, turned on at run time, finds and repairs a replica's bad copy that no
/// read touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_scrub_repairs_a_copy_no_read_touched() {
    let t = three(|c| c.tuning.scrub_start_delay = Duration::ZERO).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 16;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let dev = device_of(&t.nodes[0]);
    let map = t.c.map().await;
    let bad: Vec<u64> = (0..objects)
        .filter(|i| map.primary(&oid(&vol, *i)) != Some(dev))
        .take(2)
        .collect();
    for &i in &bad {
        corrupt(&t.disks[0], i, 1);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        repaired(&t.nodes),
        0,
        "the background scrub is off (rate 0)"
    );
    for n in &t.nodes {
        let body = serde_json::to_vec(&AdminRequest::SetScrubRate {
            bytes_per_sec: 64 << 20,
        })
        .unwrap();
        client
            .call_node(n.id(), Request::Admin { body: body.into() })
            .await
            .unwrap();
    }
    until("the background scrub repaired both copies", || {
        repaired(&t.nodes) == bad.len() as u64
    })
    .await;
    let report = scrub(&client, &t.nodes).await;
    assert_eq!(report.inconsistent(), 0, "{report:?}");
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// A store whose writes fail is poisoned: its node reports the device down, the leader's map
/// marks it down, its PGs are served by the other two, and the device stays down (the node
/// reports it again if anything marks it up while the store stays poisoned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_store_is_reported_down_and_its_pgs_fail_over() {
    let t = three(|_| {}).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 16;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let dev = device_of(&t.nodes[0]);
    t.disks[0].fail_writes(true);
    // Writes go on (retried by the client until the map moves the PGs away from the device).
    write_all(&vol, objects, 2).await;
    t.c.map_where("the poisoned device down", |m| !m.is_up(dev))
        .await;
    let rec = t.c.catalog.get_device(dev).await.unwrap().unwrap();
    assert_eq!(rec.state, DeviceState::Down);
    until("every PG active on the other two", || {
        all_active(&t.nodes[1..], false)
    })
    .await;
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 2), "object {i} read back wrong");
    }
    // Something marks it up again (a registration, say): the node reports it down again.
    t.c.catalog
        .set_device_state(dev, DeviceState::Up)
        .await
        .unwrap();
    t.c.map_where("the poisoned device down again", |m| !m.is_up(dev))
        .await;
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// A device whose reads fail their checksums more often than the limit within the window is
/// reported down, though its store still works; it stays down when its node restarts, until
/// an operator clears the fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_checksum_errors_mark_a_device_down() {
    let t = three(|c| {
        c.checksum_error_limit = 2;
        c.checksum_error_window = Duration::from_secs(600);
    })
    .await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 24;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let dev = device_of(&t.nodes[0]);
    let map = t.c.map().await;
    let mine: Vec<u64> = (0..objects)
        .filter(|i| map.primary(&oid(&vol, *i)) == Some(dev))
        .take(3)
        .collect();
    assert_eq!(mine.len(), 3, "node 0 is the primary of 3 objects");
    // Two errors are within the limit: still up.
    for &i in &mine[..2] {
        corrupt(&t.disks[0], i, 1);
        assert!(vol.read(i * OBJECT, OBJECT as u32).await.unwrap() == pattern(i, 1));
    }
    assert!(t.c.map().await.is_up(dev));
    corrupt(&t.disks[0], mine[2], 1);
    assert!(vol.read(mine[2] * OBJECT, OBJECT as u32).await.unwrap() == pattern(mine[2], 1));
    t.c.map_where("the device down", |m| !m.is_up(dev)).await;
    until("every PG active on the other two", || {
        all_active(&t.nodes[1..], false)
    })
    .await;
    for i in 0..objects {
        assert!(vol.read(i * OBJECT, OBJECT as u32).await.unwrap() == pattern(i, 1));
    }
    // A restart does not make the drive trustworthy: the device stays down, with its reason.
    let mut nodes = t.nodes;
    nodes.remove(0).shutdown().await;
    let tune = |c: &mut NodeConfig| {
        c.checksum_error_limit = 2;
        c.checksum_error_window = Duration::from_secs(600);
    };
    let n0 = t.c.node("n0", &t.disks[0], tune).await;
    let rec = t.c.catalog.get_device(dev).await.unwrap().unwrap();
    assert_eq!(rec.state, DeviceState::Down, "registered down again");
    let why = rec.fault.expect("the fault is kept");
    assert!(why.contains("failed their checksums"), "{why}");
    let map =
        t.c.map_where("the restarted node alive", |m| {
            m.nodes.contains_key(&n0.id())
        })
        .await;
    assert!(!map.is_up(dev), "its faulty device stays down");
    // The operator clears the fault (the drive replaced or checked): it serves again.
    let cleared = t.c.catalog.clear_device_fault(dev).await.unwrap();
    assert!(cleared.fault.is_none() && cleared.state == DeviceState::Up);
    t.c.map_where("the device up again", |m| m.is_up(dev)).await;
    nodes.insert(0, n0);
    until("every PG clean on all three", || all_active(&nodes, true)).await;
    for i in 0..objects {
        assert!(vol.read(i * OBJECT, OBJECT as u32).await.unwrap() == pattern(i, 1));
    }
    for n in nodes {
        n.shutdown().await;
    }
}

/// A member holds a newer copy of an object that was never acknowledged (divergent), and every
/// copy, of the acknowledged version and of the newer one, fails its checksum (a double media
/// fault). Peering can roll back to nothing and forward to nothing: the divergent copy goes,
/// the object is unfound (its read fails with the reason), and the rest of its PG goes active
/// and serves. Before, the PG stayed incomplete ("no newer copy verifies") until a good copy
/// came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_divergent_object_with_no_good_copy_leaves_its_pg_serving() {
    let mut t = three(|_| {}).await;
    let client = t.c.client(Duration::from_secs(10)).await;
    let objects = 24;
    let vol = t.c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let map = t.c.map().await;
    let bad = oid(&vol, 3);
    let (pg, entry) = map.locate(&bad).unwrap();
    let primary = map.primary(&bad).unwrap();
    let k = |dev: DeviceId| (0..3).find(|k| device_of(&t.nodes[*k]) == dev).unwrap();
    let r = k(*entry.acting.iter().find(|d| **d != primary).unwrap());
    // The replica gets a newer version that nobody acknowledged, then every copy goes bad.
    let dev_r = device_of(&t.nodes[r]);
    let store = t.nodes[r].store_for_test(dev_r).unwrap();
    let info = store.object_info(bad).await.unwrap().unwrap();
    let newer = ObjectImage {
        version: Version::new(info.version.epoch, info.version.seq + 1),
        content: ObjectContent::Data {
            data: pattern(3, 2),
            // Every block of the object holds data.
            allocated: vec![(1u64 << (OBJECT / 4096)) - 1],
        },
    };
    store
        .install(bad, newer, WriteOptions::durable().in_pg(pg.pg))
        .await
        .unwrap();
    corrupt(&t.disks[r], 3, 2);
    for (i, disk) in t.disks.iter().enumerate().filter(|(i, _)| *i != r) {
        assert!(corrupt(disk, 3, 1) > 0, "disk {i}");
    }
    // The primary stops: its PGs peer on the other two.
    let p = k(primary);
    let stopped = t.nodes.remove(p);
    stopped.shutdown().await;
    t.c.map_where("the primary down", |m| !m.is_up(primary))
        .await;
    until("every PG active on the other two", || {
        all_active(&t.nodes, false)
    })
    .await;
    let read = vol.read(3 * OBJECT, OBJECT as u32).await;
    assert!(
        matches!(&read, Err(ClientError::Checksum(m)) if m.contains("unfound")),
        "{:?}",
        read.map(|b| (b.len(), b.iter().filter(|x| **x != 0).count()))
    );
    let in_pg: Vec<u64> = (0..objects)
        .filter(|i| *i != 3 && map.locate(&oid(&vol, *i)).unwrap().0 == pg)
        .collect();
    assert!(!in_pg.is_empty(), "no other object in {pg}");
    for i in in_pg {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 1), "object {i} read back wrong");
    }
    // Polled: the PG peers again a second after its recovery failed, and lists the object
    // again only once that recovery fails too.
    until(&format!("{pg} lists the object unfound"), || {
        let unfound: u64 = t
            .nodes
            .iter()
            .flat_map(|n| n.status().pgs)
            .filter(|s| s.pg == pg)
            .map(|s| s.unfound_objects)
            .sum();
        unfound == 1
    })
    .await;
    // The divergent copy went; its member lacks the object, and is suspect for the PG (what
    // it lacks proves nothing) until the object is recovered or given up.
    let r = t.nodes.iter().position(|n| device_of(n) == dev_r).unwrap();
    assert!(
        store.object_info(bad).await.unwrap().is_none(),
        "the divergent copy is still there: peering did not drop it"
    );
    assert!(t.nodes[r].status().devices[0].suspect_pgs >= 1);
    for n in t.nodes {
        n.shutdown().await;
    }
}

/// Every device of an interval dies for good (two copies: one node stopped, writes went on on
/// the other, which then died too). The first node returns: its PGs wait, incomplete, since
/// the dead device may hold writes no other has. The operator declares that device lost
/// (`basalt device lost`): the PGs serve again from the node left, with the data it holds
/// (the writes only the lost device held are given up), and take new writes. Before, the only
/// way out was `basalt pg mark-lost`, which serves the PG empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pg_waiting_for_a_device_lost_for_good_serves_once_the_operator_declares_it_lost() {
    let c = Cluster::new().await;
    let disks: Vec<SimDisk> = (0..2).map(|_| SimDisk::new(DISK)).collect();
    let mut nodes = vec![
        c.node("a", &disks[0], |_| {}).await,
        c.node("b", &disks[1], |_| {}).await,
    ];
    c.pool(2, 1).await;
    until("every PG clean", || all_active(&nodes, true)).await;
    let b = nodes.pop().unwrap();
    let a = nodes.pop().unwrap();
    let client = c.client(Duration::from_secs(10)).await;
    let objects = 8;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let (dev_a, dev_b) = (device_of(&a), device_of(&b));
    a.shutdown().await;
    let down = c
        .map_where("a's device down", |m| !m.is_up(dev_a))
        .await
        .epoch;
    write_all(&vol, objects, 2).await;
    // Every PG peered on b alone (its history records that interval), the ones no write
    // touched too: else a, back, would serve those as if b's interval never was.
    until("every PG active on b since a went down", || {
        let pgs = b.status().pgs;
        pgs.len() == PGS as usize
            && pgs
                .iter()
                .all(|p| p.status.state == "active" && p.interval >= down)
    })
    .await;
    b.shutdown().await;
    // With no node left nobody leads: a, back, marks b's device down.
    let a = c.node("a", &disks[0], |_| {}).await;
    c.map_where("b's device down", |m| !m.is_up(dev_b) && m.is_up(dev_a))
        .await;
    until("every PG incomplete, waiting for b's device", || {
        let pgs = a.status().pgs;
        pgs.len() == PGS as usize
            && pgs.iter().all(|p| {
                p.status.state == "incomplete"
                    && p.status.why.as_ref().is_some_and(|w| {
                        w.contains(&format!("{dev_b}")) && w.contains("basalt device lost")
                    })
            })
    })
    .await;
    c.catalog.mark_device_lost(dev_b).await.unwrap();
    until("every PG active on a", || {
        all_active(std::slice::from_ref(&a), false)
    })
    .await;
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 1), "object {i}: not what a held");
    }
    write_all(&vol, objects, 3).await;
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 3), "object {i}: the new write");
    }
    let rec = c.catalog.get_device(dev_b).await.unwrap().unwrap();
    assert!(rec.lost && !rec.is_in() && rec.state == DeviceState::Down);
    a.shutdown().await;
}

/// Three copies, `min_size` 1: c is down while a and b take writes; a goes down, c comes back
/// and is recovered from b; then b goes down too. c alone holds every acknowledged write (it
/// was made complete after a and b's interval): the PGs serve from it, with no operator
/// action. Before, they waited for a or b, the members of that interval
/// (`peering.rs::complete_after`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_recovered_in_a_later_interval_serves_when_the_earlier_members_are_down() {
    let c = Cluster::new().await;
    let disks: Vec<SimDisk> = (0..3).map(|_| SimDisk::new(DISK)).collect();
    let mut nodes = vec![
        c.node("a", &disks[0], |_| {}).await,
        c.node("b", &disks[1], |_| {}).await,
        c.node("c", &disks[2], |_| {}).await,
    ];
    c.pool(3, 1).await;
    until("every PG clean", || all_active(&nodes, true)).await;
    let client = c.client(Duration::from_secs(10)).await;
    let objects = 8;
    let vol = c.volume(&client, "v", objects * OBJECT).await;
    write_all(&vol, objects, 1).await;
    let third = nodes.pop().unwrap();
    let b = nodes.pop().unwrap();
    let a = nodes.pop().unwrap();
    let (dev_a, dev_b, dev_c) = (device_of(&a), device_of(&b), device_of(&third));
    third.shutdown().await;
    c.map_where("c's device down", |m| !m.is_up(dev_c)).await;
    write_all(&vol, objects, 2).await;
    a.shutdown().await;
    c.map_where("a's device down", |m| !m.is_up(dev_a)).await;
    let third = c.node("c", &disks[2], |_| {}).await;
    let up = c.map_where("c's device up", |m| m.is_up(dev_c)).await.epoch;
    let both = [b, third];
    // Rows of an interval from before c came up (b alone, not yet peered again) would say
    // nothing is missing before c was recovered (a flaky race before). One snapshot for both
    // conditions: a PG peering again between two reads shows nothing missing yet. Nothing
    // missing is not enough: until the primary told c so, c does not know it is complete,
    // and the PG waits for b once b is down (a flaky race in CI).
    until(
        "every PG active on b and c since c came up, its members told they are complete",
        || {
            let pgs: Vec<_> = both.iter().flat_map(|n| n.status().pgs).collect();
            pgs.iter().filter(|p| p.status.state == "active").count() == PGS as usize
                && pgs.iter().all(|p| {
                    p.interval >= up
                        && p.missing_objects == 0
                        && p.degraded_objects == 0
                        && p.members_complete
                })
        },
    )
    .await;
    let [b, third] = both;
    b.shutdown().await;
    c.map_where("b's device down", |m| !m.is_up(dev_b) && m.is_up(dev_c))
        .await;
    until("every PG active on c", || {
        all_active(std::slice::from_ref(&third), false)
    })
    .await;
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(
            got == pattern(i, 2),
            "object {i}: not the last acknowledged write"
        );
    }
    write_all(&vol, objects, 3).await;
    for i in 0..objects {
        let got = vol.read(i * OBJECT, OBJECT as u32).await.unwrap();
        assert!(got == pattern(i, 3), "object {i}: the new write");
    }
    third.shutdown().await;
}
