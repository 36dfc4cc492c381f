//! Reads from a member's own copy (`replica_read.rs`): each rule refuses when it should, and
//! the read is served once all of them hold. Node 1 holds dev.1, the second member of pg.1.0
//! (the primary's dev.2 is on node 2), with read leases of 2 s; time is paused.

use crate::pg::info::MemberInfo;
use crate::pg::messages::PeerMsg;
use crate::readlease::ReadLeases;
use crate::service::NodeShared;
use crate::testing::{Flaky, shared_with_leases, sim_store};
use basalt_meta::Catalog;
use basalt_placement::{ClusterMap, DeviceInfo, NodeInfo, PgMap, PoolMap};
use basalt_proto::{ErrorCode, RepKind, RepOp, Response, WireError};
use basalt_types::{
    DeviceId, Epoch, FailureDomain, NodeId, ObjectId, PgId, PoolId, Term, Version, VolumeId,
};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(2);
const ME: DeviceId = DeviceId(1);
const PRIMARY: DeviceId = DeviceId(2);
const PG: PgId = PgId {
    pool: PoolId(1),
    pg: 0,
};
const TERM: Term = Term::new(Epoch(5), 0);

/// A map at `epoch` of one pool with one PG, acting (and up) `acting` since `since`.
fn map(epoch: u64, acting: &[DeviceId], since: u64) -> ClusterMap {
    let mut m = ClusterMap {
        epoch: Epoch(epoch),
        ..ClusterMap::default()
    };
    for d in [ME, PRIMARY, DeviceId(3)] {
        m.devices
            .insert(d, DeviceInfo::new(NodeId(d.0), "ssd", 1, 128 << 10));
        let addr = format!("n{}", d.0);
        m.nodes.insert(NodeId(d.0), NodeInfo { addr });
    }
    m.pools.insert(
        PG.pool,
        PoolMap {
            pg_count: 1,
            replicas: acting.len() as u8,
            min_size: 1,
            object_size: 128 << 10,
            failure_domain: FailureDomain::Host,
            device_class: None,
            pgs: vec![PgMap {
                up: acting.to_vec(),
                acting: acting.to_vec(),
                since: Epoch(since),
            }],
        },
    );
    m
}

fn oid(index: u64) -> ObjectId {
    ObjectId::new(PG.pool, VolumeId(1), index)
}

/// The `n`-th write of [`TERM`], of object `index`, sent when `committed` was the watermark.
fn rep(index: u64, n: u64, committed: u64) -> RepOp {
    RepOp {
        epoch: Epoch(5),
        device: ME,
        pg: PG,
        term: TERM,
        oid: oid(index),
        version: TERM.version(n).unwrap(),
        kind: RepKind::Write { offset: 0 },
        data: Bytes::from(vec![n as u8; 4096]),
        committed: match committed {
            0 => TERM.before(),
            c => TERM.version(c).unwrap(),
        },
        prior: Version::NONE,
    }
}

/// Node `id` with one simulated device, dev.`id`, and read leases of [`LEASE`].
async fn leased_node(dir: &std::path::Path, id: u32) -> Arc<NodeShared> {
    let catalog = Catalog::new(Flaky::open(&dir.join("meta.redb")).await);
    shared_with_leases(
        NodeId(id),
        Duration::from_secs(3600),
        vec![sim_store(id)],
        catalog,
        LEASE,
    )
}

/// Node 1, activated in [`TERM`] as a member (`readable` as its primary says), with map 5.
async fn member(dir: &std::path::Path, readable: bool) -> Arc<NodeShared> {
    let node = leased_node(dir, 1).await;
    node.maps.offer(map(5, &[PRIMARY, ME], 5));
    query(&node, TERM).await;
    activate(&node, TERM, readable).await;
    node
}

/// The primary of `term` (on node 2) queries node 1's member: it promises `term`.
async fn query(node: &NodeShared, term: Term) {
    let msg = PeerMsg::Query {
        device: ME,
        pg: PG,
        term,
        epoch: Epoch(5),
        from: Some(NodeId(2)),
    };
    node.pgs.peer(msg, Bytes::new()).await.unwrap();
}

async fn activate(node: &NodeShared, term: Term, readable: bool) {
    let msg = PeerMsg::Activate {
        device: ME,
        pg: PG,
        term,
        info: MemberInfo {
            les: term.interval,
            activated: term.interval,
            last_complete: Version::new(term.interval.0, 0),
            ..MemberInfo::default()
        },
        readable,
    };
    node.pgs.peer(msg, Bytes::new()).await.unwrap();
}

/// Node 2 (the primary's) grants node 1 a read lease now, at node 1's map epoch.
fn lease_from_primary(node: &NodeShared) {
    lease_from(node, NodeId(2));
}

async fn read(node: &NodeShared, index: u64) -> Result<Bytes, WireError> {
    let epoch = node.maps.epoch();
    match crate::read::read_replica(node, epoch, oid(index), 0, 4096).await? {
        Response::Read { data } => Ok(data),
        other => panic!("answered {other:?}"),
    }
}

/// The refusal of a read, with what it says.
async fn refused(node: &NodeShared, index: u64) -> String {
    match read(node, index).await {
        Err(e) => {
            assert_eq!(e.code, ErrorCode::Busy, "{e:?}");
            e.message
        }
        Ok(data) => panic!("read of object {index} served {:?}", &data[..8]),
    }
}

#[tokio::test(start_paused = true)]
async fn a_member_serves_committed_writes_of_its_term_while_it_holds_the_leases() {
    let dir = tempfile::tempdir().unwrap();
    let node = member(dir.path(), true).await;
    // Write 1 of object 0, then write 2 of object 1, which says write 1 is on every member.
    node.pgs.rep(rep(0, 1, 0)).await.unwrap();
    // No lease of the primary's node yet.
    assert!(refused(&node, 7).await.contains("no read lease"));
    lease_from_primary(&node);
    // Never written: zeros, decided before the term.
    assert_eq!(read(&node, 7).await.unwrap(), Bytes::from(vec![0u8; 4096]));
    // Applied here, not known to be on every member: the primary serves it.
    assert!(refused(&node, 0).await.contains("not known durable"));
    node.pgs.rep(rep(1, 2, 1)).await.unwrap();
    assert_eq!(read(&node, 0).await.unwrap(), Bytes::from(vec![1u8; 4096]));
    // Sent with another map epoch than the node's: refused at once, no wait for a map.
    let other = crate::read::read_replica(&node, Epoch(6), oid(0), 0, 4096).await;
    assert!(other.unwrap_err().message.contains("at map epoch 5"));
    assert!(refused(&node, 1).await.contains("not known durable"));
    // The lease runs out (7/8 of its length after the ping): refused again.
    tokio::time::advance(LEASE / 8 * 7).await;
    assert!(refused(&node, 0).await.contains("no read lease"));
    let status = crate::admin::AdminHandler::status(&node.admin, &node);
    assert_eq!((status.replica_reads, status.replica_reads_refused), (2, 5));
}

#[tokio::test(start_paused = true)]
async fn the_watermark_a_primary_sends_once_writes_pause_makes_the_last_write_readable() {
    let dir = tempfile::tempdir().unwrap();
    let node = member(dir.path(), true).await;
    lease_from_primary(&node);
    node.pgs.rep(rep(0, 1, 0)).await.unwrap();
    assert!(refused(&node, 0).await.contains("not known durable"));
    let commit = |term: Term, upto: Version| PeerMsg::Commit {
        device: ME,
        pg: PG,
        term,
        upto,
    };
    // Of another term: ignored.
    let other = Term::new(Epoch(4), 0);
    let upto = TERM.version(1).unwrap();
    node.pgs
        .peer(commit(other, upto), Bytes::new())
        .await
        .unwrap();
    assert!(refused(&node, 0).await.contains("not known durable"));
    node.pgs
        .peer(commit(TERM, upto), Bytes::new())
        .await
        .unwrap();
    assert_eq!(read(&node, 0).await.unwrap(), Bytes::from(vec![1u8; 4096]));
}

#[tokio::test(start_paused = true)]
async fn a_member_its_primary_did_not_call_readable_serves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = member(dir.path(), false).await;
    lease_from_primary(&node);
    assert!(refused(&node, 7).await.contains("does not serve reads"));
    // Once nothing is missing, the primary says so again (`publish_complete`), with its
    // watermark.
    node.pgs.rep(rep(0, 1, 0)).await.unwrap();
    let complete = MemberInfo {
        les: TERM.interval,
        activated: TERM.interval,
        last_complete: TERM.version(1).unwrap(),
        ..MemberInfo::default()
    };
    let msg = PeerMsg::Activate {
        device: ME,
        pg: PG,
        term: TERM,
        info: complete,
        readable: true,
    };
    node.pgs.peer(msg, Bytes::new()).await.unwrap();
    assert_eq!(read(&node, 0).await.unwrap(), Bytes::from(vec![1u8; 4096]));
}

#[tokio::test(start_paused = true)]
async fn a_newer_term_a_failed_write_or_a_newer_interval_stop_a_members_reads() {
    let dir = tempfile::tempdir().unwrap();
    let node = member(dir.path(), true).await;
    lease_from_primary(&node);
    assert!(read(&node, 7).await.is_ok());

    // A sub-operation that fails here (past the object's end): the term ends at the primary,
    // and this copy may lack what the others hold.
    let mut bad = rep(2, 1, 0);
    bad.kind = RepKind::Write { offset: 127 << 10 };
    bad.data = Bytes::from(vec![9u8; 8192]);
    assert!(node.pgs.rep(bad).await.is_err());
    assert!(refused(&node, 7).await.contains("does not serve reads"));
    // A late activation of the same term (sent before the failure) does not undo it.
    activate(&node, TERM, true).await;
    assert!(refused(&node, 7).await.contains("does not serve reads"));

    // The next round: readable; then a round after it queries the member: it stops at once.
    let newer = Term::new(TERM.interval, 1);
    query(&node, newer).await;
    activate(&node, newer, true).await;
    assert!(read(&node, 7).await.is_ok());
    query(&node, Term::new(TERM.interval, 2)).await;
    assert!(refused(&node, 7).await.contains("does not serve reads"));

    // Readable in a newer round; then a map whose interval for the PG is newer (the PG's
    // serving set changed) although no newer peering reached this member.
    let newest = Term::new(TERM.interval, 3);
    query(&node, newest).await;
    activate(&node, newest, true).await;
    assert!(read(&node, 7).await.is_ok());
    node.maps.offer(map(6, &[PRIMARY, ME, DeviceId(3)], 6));
    lease_from_primary(&node);
    let why = refused(&node, 7).await;
    assert!(why.contains("no longer has"), "{why}");
}

/// The primary calls its members readable only once its term is active with nothing missing
/// on any member (the authority may have adopted a version only some hold) and without
/// backfill targets (its up set within its acting set).
#[tokio::test(start_paused = true)]
async fn the_primary_calls_members_readable_only_when_active_complete_and_without_targets() {
    use crate::pg::{Missing, Status};
    let dir = tempfile::tempdir().unwrap();
    let node = leased_node(dir.path(), 2).await;
    let pg = node.pgs.get(PRIMARY, PG).unwrap();
    pg.serve_alone_for_test(Epoch(5));
    let readable = |change: &dyn Fn(&mut crate::pg::Primary)| {
        let mut st = pg.st.lock();
        let p = st.primary.as_mut().unwrap();
        p.up = vec![PRIMARY, ME];
        p.acting = vec![PRIMARY, ME];
        p.status = Status::Active;
        p.missing.clear();
        change(p);
        p.members_readable()
    };
    assert!(readable(&|_| {}));
    // Still peering, or peered below min_size.
    assert!(!readable(&|p| p.status = Status::Peering));
    assert!(!readable(&|p| p.status = Status::Peered("1 of 2".into())));
    // An object the authority adopted that a member lacks: recovery first.
    assert!(!readable(&|p| {
        let missing = Missing {
            version: TERM.version(1).unwrap(),
            deleted: false,
            sources: vec![ME],
            need: vec![PRIMARY],
        };
        p.missing.insert(oid(0), missing);
    }));
    // The up set moved a copy to dev.3, still to be backfilled.
    assert!(!readable(&|p| p.up = vec![PRIMARY, DeviceId(3)]));
    // Fewer up than acting (a copy leaving, kept until it is clean elsewhere): no target.
    assert!(readable(&|p| p.up = vec![PRIMARY]));
}

/// A link that is never used.
struct Unused;

impl basalt_proto::Service for Unused {
    fn call(&self, _req: basalt_proto::Request) -> basalt_proto::ResponseFuture {
        panic!("no request goes to a backfill target in this test")
    }
}

impl basalt_link::Link for Unused {
    fn is_open(&self) -> bool {
        true
    }
}

/// Node `granter` grants node 1 a read lease now, at node 1's map epoch.
fn lease_from(node: &NodeShared, granter: NodeId) {
    let leases = &node.pgs.ctx.leases;
    let ping = leases.ping(NodeId(1), node.maps.epoch(), false);
    let pong = ReadLeases::new(LEASE, Duration::ZERO).answer(ping.clone(), || Epoch(0));
    leases.answered(granter, Instant::now(), &ping, &pong);
}

/// The primary's own reads (rule 9) need the lease of a backfill target's node too once the
/// target completed: it then witnesses the interval for later peerings, so its promise alone
/// may let a newer term go active. Not before: an incomplete target witnesses nothing.
/// Real time: the primary's read waits for the store (on a thread of its own) beside a timer
/// of its own (`Pg::wait_change`), and paused time would jump past the lease meanwhile.
#[tokio::test]
async fn a_primary_answers_reads_only_with_the_lease_of_a_completed_backfill_target() {
    let dir = tempfile::tempdir().unwrap();
    let node = leased_node(dir.path(), 1).await;
    let target = DeviceId(3);
    let mut m = map(9, &[ME], 9);
    m.pools.get_mut(&PG.pool).unwrap().pgs[0].up = vec![ME, target];
    node.maps.offer(m);
    let pg = node.pgs.get(ME, PG).unwrap();
    pg.serve_alone_for_test(Epoch(9));
    let add_target = |done: bool| {
        let mut st = pg.st.lock();
        let p = st.primary.as_mut().unwrap();
        p.targets = vec![super::super::Target {
            member: super::super::Member {
                dev: target,
                link: Arc::new(Unused),
            },
            cursor: None,
            done,
            objects: 0,
            walked: 0,
            dirty: Default::default(),
            tail: false,
        }];
    };
    let ctx = node.pgs.ctx.clone();
    add_target(false);
    assert!(pg.read(&ctx, oid(0), 0, 4096).await.is_ok());
    add_target(true);
    let e = pg.read(&ctx, oid(0), 0, 4096).await.unwrap_err();
    assert!(e.message.contains("no read lease"), "{e:?}");
    lease_from(&node, NodeId(3));
    let read = pg.read(&ctx, oid(0), 0, 4096).await;
    assert!(read.is_ok(), "{read:?}");
}
