//! The primary's writes to one object while an earlier one is in flight: the later write goes
//! to the members carrying the earlier one's version (`RepOp::prior`), and a member where the
//! earlier one never arrived does not apply it, so the write is not acknowledged and no copy
//! reaches the primary's version without every write to the object.

use super::WriteKind;
use crate::pg::messages::Held;
use crate::pg::{Member, Missing, Pg, Status};
use crate::service::NodeShared;
use crate::testing::{Flaky, activate_member, shared, sim_store, sim_store_on};
use basalt_engine::Store;
use basalt_engine::sim::{Latency, SimDisk, Spread};
use basalt_meta::Catalog;
use basalt_proto::{ErrorCode, RepOp, Request, ResponseFuture, Service, Session, WireError};
use basalt_types::{DeviceId, Epoch, NodeId, ObjectId, PgId, PoolId, Term, Version, VolumeId};
use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

const PRIMARY: DeviceId = DeviceId(1);
const MEMBER: DeviceId = DeviceId(2);
const PG: PgId = PgId {
    pool: PoolId(1),
    pg: 0,
};

/// The link to the member's node (in this process). Sub-operations are delivered at once and
/// their answers held until the test releases them; with `lose`, the first is lost on the way
/// instead (a connection reset before it arrived: the primary gets an error).
struct Holds {
    member: Arc<NodeShared>,
    lose: bool,
    sent: Mutex<Vec<RepOp>>,
    released: tokio::sync::watch::Receiver<bool>,
}

impl Service for Holds {
    fn call(&self, req: Request) -> ResponseFuture {
        let Request::Rep(op) = req else {
            panic!("only sub-operations go to the member in this test: {req:?}")
        };
        let first = {
            let mut sent = self.sent.lock();
            sent.push(op.clone());
            sent.len() == 1
        };
        let delivered = (!(first && self.lose)).then(|| self.member.pgs.rep(op));
        let mut released = self.released.clone();
        Box::pin(async move {
            let _ = released.wait_for(|r| *r).await;
            match delivered {
                Some(answer) => answer.await,
                None => Err(WireError::new(
                    ErrorCode::ShuttingDown,
                    "connection reset (test)",
                )),
            }
        })
    }
}

impl basalt_link::Link for Holds {
    fn is_open(&self) -> bool {
        true
    }
}

async fn node(dir: &std::path::Path, id: u32) -> Arc<NodeShared> {
    node_with(dir, id, sim_store(id)).await
}

async fn node_with(dir: &std::path::Path, id: u32, store: Store) -> Arc<NodeShared> {
    let catalog = Catalog::new(Flaky::open(&dir.join(format!("meta{id}.redb"))).await);
    shared(NodeId(id), Duration::from_secs(3600), vec![store], catalog)
}

/// A backfill target on `dev` behind `link`, its cursor at `cursor`, `dirty` to copy again.
fn target(
    dev: DeviceId,
    link: Arc<dyn basalt_link::Link>,
    cursor: Option<ObjectId>,
    dirty: Option<ObjectId>,
) -> crate::pg::Target {
    crate::pg::Target {
        member: Member { dev, link },
        cursor,
        done: false,
        objects: 0,
        walked: 0,
        dirty: dirty.into_iter().collect(),
        tail: false,
    }
}

async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("never: {what}");
}

/// Without the check the member applies the second write onto a copy that lacks the first,
/// reaching the primary's version with different bytes, and the write is acknowledged; a
/// later peering, comparing versions, finds nothing to recover, and a read after a failover
/// to the member returns older data than one from the primary did.
#[tokio::test]
async fn a_write_sent_behind_one_lost_on_the_way_to_a_member_is_neither_applied_there_nor_acknowledged()
 {
    let t = Test::new(true).await;
    let first = t.write(0, data(1));
    until("the first write sent", || t.link.sent.lock().len() == 1).await;
    let second = t.write(4096, data(2));
    until("the second write sent", || t.link.sent.lock().len() == 2).await;
    t.release();
    let err = second
        .await
        .unwrap()
        .expect_err("acknowledged, though the member lacks the write before it");
    let sent = t.link.sent.lock().clone();
    assert_eq!(sent[0].prior, Version::NONE, "nothing in flight before it");
    assert_eq!(
        sent[1].prior, sent[0].version,
        "sent behind the first write"
    );
    assert_eq!(err.code, ErrorCode::Busy, "the client retries it: {err:?}");
    assert!(first.await.unwrap().is_err(), "lost on the way: failed");
    assert_eq!(
        t.version(&t.member, MEMBER).await,
        None,
        "the member applied the second write without the first"
    );
    let here = t.version(&t.primary, PRIMARY).await;
    assert_eq!(here, Some(sent[1].version), "both applied here");
}

/// A write-zeroes of an object no copy holds changes nothing, and the store records no version
/// for it; each copy remembers it reached that version (`engine/src/engine/unrecorded.rs`), so
/// a write sent behind it applies. Else it would be refused on every copy, the PG peering again
/// for each such pair (a discard of never written space, then a write).
#[tokio::test]
async fn a_write_sent_behind_a_zeroing_of_an_absent_object_applies_everywhere() {
    let t = Test::new(false).await;
    let zeroes = WriteKind::Zeroes {
        offset: 0,
        len: 8192,
    };
    let first = t.submit(zeroes);
    until("the zeroing sent", || t.link.sent.lock().len() == 1).await;
    let second = t.write(0, data(2));
    until("the write sent", || t.link.sent.lock().len() == 2).await;
    let sent = t.link.sent.lock().clone();
    assert_eq!(sent[1].prior, sent[0].version);
    t.release();
    let written = second.await.unwrap().expect("the write behind the zeroing");
    first.await.unwrap().expect("the zeroing");
    for (node, dev) in [(&t.primary, PRIMARY), (&t.member, MEMBER)] {
        assert_eq!(t.version(node, dev).await, Some(written), "{dev}");
    }
}

/// A write lost on the way, a zeroing behind it (refused on the member: its copy is not at the
/// lost write's version), and a write behind the zeroing: refused there too, though the object
/// is absent on the member (a found-in-review variant: excusing any removal onto an absent
/// object let the third write through, at the primary's version without the first's bytes).
#[tokio::test]
async fn a_write_behind_a_zeroing_behind_a_lost_write_is_not_applied_on_the_member() {
    let t = Test::new(true).await;
    let first = t.write(0, Bytes::from(vec![1u8; 8192]));
    until("the first write sent", || t.link.sent.lock().len() == 1).await;
    let zeroing = t.submit(WriteKind::Zeroes {
        offset: 0,
        len: 4096,
    });
    until("the zeroing sent", || t.link.sent.lock().len() == 2).await;
    let third = t.write(0, data(3));
    until("the third write sent", || t.link.sent.lock().len() == 3).await;
    t.release();
    assert!(zeroing.await.unwrap().is_err(), "the zeroing acknowledged");
    assert!(
        third.await.unwrap().is_err(),
        "the third write acknowledged"
    );
    assert!(first.await.unwrap().is_err());
    assert_eq!(
        t.version(&t.member, MEMBER).await,
        None,
        "the member applied a write without the first"
    );
}

/// A backfill target whose cursor moved past an object written since its last copy (created
/// after its page was listed) gets no write of it until it is copied again: the target lacks
/// the earlier writes, and one applied there would bring its copy to the primary's version
/// without them (a later backfill, comparing versions, would skip it, and an acknowledged write
/// would be missing from the completed target).
#[tokio::test]
async fn a_backfill_target_gets_no_write_of_an_object_it_must_copy_again() {
    let t = Test::new(false).await;
    let cursor = Some(ObjectId::new(PG.pool, VolumeId(1), 9));
    let target = |dirty: bool| target(MEMBER, t.link.clone(), cursor, dirty.then_some(t.oid));
    let serve = |dirty| {
        t.with_primary(|p| {
            p.members.clear();
            p.targets = vec![target(dirty)];
        })
    };
    serve(true);
    let written = tokio::time::timeout(Duration::from_secs(5), t.write(0, data(1))).await;
    assert!(
        matches!(written, Ok(Ok(Ok(_)))),
        "the write waited for the target: {written:?}"
    );
    assert!(t.link.sent.lock().is_empty(), "sent to the target");
    assert!(
        t.with_primary(|p| p.targets[0].dirty.contains(&t.oid)),
        "no longer to be copied again"
    );
    // Copied again (no longer dirty): its writes reach the target.
    serve(false);
    let second = t.write(0, data(2));
    until("the write sent to the target", || {
        t.link.sent.lock().len() == 1
    })
    .await;
    t.release();
    assert!(second.await.unwrap().is_ok());
}

/// Once the walk has listed and copied everything (`Target::tail`), a write of an object past
/// the cursor (created since: on neither copy) reaches the target and leaves nothing to copy
/// again; before, the target still waits for the walk: the write makes the object dirty.
#[tokio::test]
async fn a_target_walked_to_the_end_gets_the_writes_of_objects_created_past_its_cursor() {
    for tail in [false, true] {
        let t = Test::new(false).await;
        t.with_primary(|p| {
            p.members.clear();
            let walked = crate::pg::Target {
                tail,
                ..target(MEMBER, t.link.clone(), None, None)
            };
            p.targets = vec![walked];
        });
        t.release();
        t.write(0, data(1)).await.unwrap().unwrap();
        let sent = t.link.sent.lock().len();
        let dirty = t.with_primary(|p| p.targets[0].dirty.contains(&t.oid));
        match tail {
            false => assert_eq!((sent, dirty), (0, true), "before the walk reached it"),
            true => assert_eq!((sent, dirty), (1, false), "walked to the end"),
        }
    }
}

/// The term ends while the primary's own copy of a write still waits in its store (here for
/// the old block a partial write must merge with, on a disk that hangs): the hold is released
/// once the store has applied the write, not before. The store counts a held write when it
/// applies it and dropped the commit that came first: the object's reads waited for good.
#[tokio::test]
async fn a_held_write_the_term_ended_under_is_released_once_its_store_applies_it() {
    let disk = SimDisk::new(64 << 20);
    let t = Test::with_primary_store(false, sim_store_on(&disk, PRIMARY.0)).await;
    t.release();
    let store = t.primary.pgs.store(PRIMARY).unwrap().clone();
    let whole = Bytes::from(vec![1u8; store.info().object_size as usize]);
    let first = t.write(0, whole).await.unwrap().unwrap();
    // The old block is read twice at 1 s each: by the primary's check of its copy, then by
    // the store merging the write with it. Once the write is versioned (submitted), the disk
    // hangs: the store's read does not complete while the term ends.
    disk.set_latency(Latency {
        read: Spread::fixed(Duration::from_secs(1)),
        ..Latency::ZERO
    });
    let partial = t.write(100, Bytes::from_static(b"partial"));
    until("the write submitted", || {
        t.with_primary(|p| p.tails.contains_key(&t.oid))
    })
    .await;
    disk.stall(true);
    let unstall = Unstall(disk.clone());
    t.pg.serve_alone_for_test(Epoch(10));
    let ended = tokio::time::timeout(Duration::from_secs(10), partial).await;
    let ended = ended.expect("the write outlived its term").unwrap();
    assert!(
        matches!(&ended, Err(e) if e.code == ErrorCode::Busy),
        "{ended:?}"
    );
    drop(unstall);
    disk.set_latency(Latency::ZERO);
    for _ in 0..10_000 {
        if t.version(&t.primary, PRIMARY).await != Some(first) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_ne!(
        t.version(&t.primary, PRIMARY).await,
        Some(first),
        "never applied"
    );
    let read = tokio::time::timeout(Duration::from_secs(10), store.read(t.oid, 100, 7)).await;
    let read = read.expect("the object stays held: its reads wait for good");
    assert_eq!(read.unwrap(), &b"partial"[..]);
}

/// A volume's objects are deleted from a PG (a volume deleted, or shrunk) only where the
/// primary's store holds all of them: the deletion lists that store. Still peering, or with
/// an object of the volume still to recover onto it, the primary answers `Busy` (the caller
/// retries) instead of deleting nothing and reporting success: the object would survive, and
/// show its old data once the volume grew again.
#[tokio::test]
async fn a_volume_is_deleted_from_a_pg_only_where_its_primary_holds_every_object() {
    let t = Test::new(false).await;
    t.release();
    let (pg, ctx) = (t.pg.clone(), t.primary.pgs.ctx.clone());
    let delete = || pg.delete_volume(&ctx, Epoch(9), t.oid.volume, 0, &|| Ok(()));
    t.with_primary(|p| p.status = Status::Peering);
    let refused = delete().await;
    assert!(
        matches!(&refused, Err(e) if e.code == ErrorCode::Busy && e.message.contains("not active")),
        "{refused:?}"
    );
    t.with_primary(|p| {
        p.status = Status::Active;
        let missing = Missing {
            version: Term::new(Epoch(9), 0).version(1).unwrap(),
            deleted: false,
            sources: vec![MEMBER],
            need: vec![PRIMARY],
        };
        p.missing.insert(t.oid, missing);
    });
    let refused = delete().await;
    assert!(
        matches!(&refused, Err(e) if e.code == ErrorCode::Busy && e.message.contains("recovered")),
        "{refused:?}"
    );
    t.with_primary(|p| p.missing.clear());
    assert_eq!(delete().await.unwrap(), 0);
}

/// Ends a disk's stall when dropped: a failing test fails instead of hanging where its
/// stores wait for their I/O.
struct Unstall(SimDisk);

impl Drop for Unstall {
    fn drop(&mut self) {
        self.0.stall(false);
    }
}

/// A link to a device whose store is out of space: every sub-operation fails with `NoSpace`.
struct Full;

impl Service for Full {
    fn call(&self, _req: Request) -> ResponseFuture {
        Box::pin(async { Err(WireError::new(ErrorCode::NoSpace, "device full (test)")) })
    }
}

impl basalt_link::Link for Full {
    fn is_open(&self) -> bool {
        true
    }
}

/// A backfill target out of space fails the write with `Busy` (the client retries; the next
/// term's backfill stops at the target's limit before covering the object), not `NoSpace`:
/// the serving copies had room, and a client told `ENOSPC` would give up a write that fits
/// (found by a review). (A serving member out of space still refuses it with `NoSpace`:
/// `tests/full.rs`.)
#[tokio::test]
async fn a_backfill_target_out_of_space_does_not_refuse_the_client_for_lack_of_space() {
    let t = Test::new(false).await;
    t.with_primary(|p| {
        p.members.clear();
        let cursor = Some(ObjectId::new(PG.pool, VolumeId(1), 9));
        p.targets = vec![target(MEMBER, Arc::new(Full), cursor, None)];
    });
    let err = t.write(0, data(1)).await.unwrap().unwrap_err();
    assert_eq!(err.code, ErrorCode::Busy, "{err:?}");
    assert!(err.message.contains("backfill target"), "{err:?}");
}

/// A backfill copy of an object waits for the writes of it already in flight: the local store
/// may answer for the object as it was before one of them (not applied yet: a partial block's
/// read, a full journal), a write the target did not get. Without the wait the copy found the
/// target's version equal, counted the object current there and moved the cursor past it; the
/// next write reached the target, which lacked the one before (same version, other bytes).
#[tokio::test]
async fn a_backfill_copy_waits_for_the_writes_of_its_object_in_flight() {
    let t = Test::new(false).await;
    t.release();
    t.write(0, data(1)).await.unwrap().unwrap();
    t.release.send_replace(false);
    let in_flight = t.write(0, data(2));
    until("the write in flight", || {
        t.with_primary(|p| p.tails.contains_key(&t.oid))
    })
    .await;
    // The target holds what the primary's store answers for the object now.
    let copy = t.backfill_copy().await;
    until("the object held for its copy", || {
        copy.is_finished() || t.with_primary(|p| p.busy.contains(&t.oid))
    })
    .await;
    // Two round trips through the primary's store and the tasks' turns: a copy that did not
    // wait would have compared versions and moved the cursor by now.
    for _ in 0..2 {
        t.version(&t.primary, PRIMARY).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
    let target =
        |t: &Test| t.with_primary(|p| (p.targets[0].dirty.contains(&t.oid), p.targets[0].cursor));
    assert!(!copy.is_finished(), "the copy did not wait for the write");
    assert_eq!(target(&t), (true, None), "counted current on the target");
    t.release();
    in_flight.await.unwrap().unwrap();
    // Compared once the write landed (the target is taken to hold what the store answered
    // before: the same version here, so nothing moves), then counted current.
    let copied = copy.await.unwrap();
    assert!(copied.is_ok(), "{copied:?}");
    assert_eq!(target(&t), (false, Some(t.oid)));
}

/// A backfill copy of an object held by another (a read repair, a recovery) waits for it: the
/// other's end releases the object, and writes of it would go on while the copy still read it.
#[tokio::test]
async fn a_backfill_copy_waits_for_an_object_held_by_another() {
    let t = Test::new(false).await;
    t.release();
    t.write(0, data(1)).await.unwrap().unwrap();
    t.with_primary(|p| p.busy.insert(t.oid));
    let copy = t.backfill_copy().await;
    until("the copy waiting for the object", || {
        copy.is_finished() || t.with_primary(|p| p.waiters.contains_key(&t.oid))
    })
    .await;
    assert!(
        !copy.is_finished(),
        "the copy did not wait for the object's holder"
    );
    t.with_primary(|p| {
        assert!(p.targets[0].dirty.contains(&t.oid));
        p.busy.remove(&t.oid);
        p.release(&t.oid);
    });
    copy.await.unwrap().unwrap();
    t.with_primary(|p| {
        assert!(!p.busy.contains(&t.oid), "left held");
        assert!(!p.targets[0].dirty.contains(&t.oid));
    });
}

/// A write whose request carried a map older than the PG's interval (admitted by the node
/// before the map moved the PG away and back, then left waiting) is refused, not versioned in
/// the new interval: its client may have had it acknowledged elsewhere since and written the
/// block again.
#[tokio::test]
async fn a_write_sent_with_a_map_older_than_the_interval_is_not_versioned() {
    let t = Test::new(false).await;
    t.release();
    let (pg, ctx, oid) = (t.pg.clone(), t.primary.pgs.ctx.clone(), t.oid);
    let old = pg
        .write(
            &ctx,
            Epoch(8),
            Session::NONE,
            oid,
            WriteKind::Data {
                offset: 0,
                data: data(1),
            },
            false,
        )
        .await;
    assert!(
        matches!(&old, Err(e) if e.code == ErrorCode::StaleEpoch),
        "{old:?}"
    );
    assert_eq!(t.version(&t.primary, PRIMARY).await, None, "applied");
    assert!(t.link.sent.lock().is_empty(), "sent to the member");
    t.write(0, data(2)).await.unwrap().unwrap();
}

/// A write of a client whose later attempt (a newer session generation) already reached the
/// node is refused, not versioned: the client gave up on it (`sessions.rs`). The newer
/// generation's writes, other clients' and the node's own are versioned.
#[tokio::test]
async fn a_write_of_a_session_its_client_left_is_not_versioned() {
    let t = Test::new(false).await;
    t.release();
    let (pg, ctx, oid) = (t.pg.clone(), t.primary.pgs.ctx.clone(), t.oid);
    let session = |generation| Session {
        client: 7,
        generation,
    };
    ctx.sessions.arrived(session(2));
    let write = |s: Session, byte: u8| {
        let kind = WriteKind::Data {
            offset: 0,
            data: data(byte),
        };
        pg.write(&ctx, Epoch(9), s, oid, kind, false)
    };
    let old = write(session(1), 1).await;
    assert!(
        matches!(&old, Err(e) if e.code == ErrorCode::Busy && e.message.contains("later attempt")),
        "{old:?}"
    );
    assert_eq!(t.version(&t.primary, PRIMARY).await, None, "applied");
    assert!(t.link.sent.lock().is_empty(), "sent to the member");
    let other = Session {
        client: 8,
        generation: 1,
    };
    for (s, byte) in [(session(2), 2), (other, 3), (Session::NONE, 4)] {
        let (_, durable) = write(s, byte).await.unwrap();
        assert!(durable, "a replicated write is durable when acknowledged");
    }
}

fn data(byte: u8) -> Bytes {
    Bytes::from(vec![byte; 4096])
}

/// A primary (node 1) serving the PG in term 9.0 with one member (node 2) behind a
/// [`Holds`] link.
struct Test {
    _dir: tempfile::TempDir,
    primary: Arc<NodeShared>,
    member: Arc<NodeShared>,
    pg: Arc<Pg>,
    link: Arc<Holds>,
    release: tokio::sync::watch::Sender<bool>,
    oid: ObjectId,
}

impl Test {
    async fn new(lose: bool) -> Test {
        Test::with_primary_store(lose, sim_store(PRIMARY.0)).await
    }

    async fn with_primary_store(lose: bool, store: Store) -> Test {
        let dir = tempfile::tempdir().unwrap();
        let primary = node_with(dir.path(), PRIMARY.0, store).await;
        let member = node(dir.path(), 2).await;
        let pg: Arc<Pg> = primary.pgs.get(PRIMARY, PG).unwrap();
        pg.serve_alone_for_test(Epoch(9));
        activate_member(&member, MEMBER, PG, Term::new(Epoch(9), 0)).await;
        let (release, released) = tokio::sync::watch::channel(false);
        let link = Arc::new(Holds {
            member: member.clone(),
            lose,
            sent: Mutex::new(Vec::new()),
            released,
        });
        pg.st.lock().primary.as_mut().unwrap().members = vec![Member {
            dev: MEMBER,
            link: link.clone(),
        }];
        Test {
            _dir: dir,
            primary,
            member,
            pg,
            link,
            release,
            oid: ObjectId::new(PG.pool, VolumeId(1), 0),
        }
    }

    fn submit(&self, kind: WriteKind) -> JoinHandle<Result<Version, WireError>> {
        let (pg, ctx, oid) = (self.pg.clone(), self.primary.pgs.ctx.clone(), self.oid);
        let none = Session::NONE;
        let write = async move { pg.write(&ctx, Epoch(9), none, oid, kind, false).await };
        tokio::spawn(async move { write.await.map(|(version, _)| version) })
    }

    fn write(&self, offset: u32, data: Bytes) -> JoinHandle<Result<Version, WireError>> {
        self.submit(WriteKind::Data { offset, data })
    }

    /// Lets the answers go (the lost one as an error).
    fn release(&self) {
        self.release.send_replace(true);
    }

    /// Makes device 3 a backfill target of the PG with the object dirty (its cursor before
    /// it) and starts the copy of the object there, the target taken to hold what the
    /// primary's store answers for the object now (this test's map has no route to it).
    async fn backfill_copy(&self) -> JoinHandle<Result<(), String>> {
        const TARGET: DeviceId = DeviceId(3);
        let theirs = self
            .version(&self.primary, PRIMARY)
            .await
            .map(|version| Held {
                oid: self.oid,
                version,
                deleted: false,
            });
        let (generation, term) = {
            let mut st = self.pg.st.lock();
            let generation = st.generation;
            let p = st.primary.as_mut().unwrap();
            p.targets = vec![target(TARGET, self.link.clone(), None, Some(self.oid))];
            (generation, p.term)
        };
        let (pg, ctx, oid) = (self.pg.clone(), self.primary.pgs.ctx.clone(), self.oid);
        tokio::spawn(async move {
            let map = basalt_placement::ClusterMap::default();
            pg.backfill_object(&ctx, &map, generation, term, TARGET, oid, theirs)
                .await
        })
    }

    /// Runs `f` on the primary's state of the PG (under its lock).
    fn with_primary<R>(&self, f: impl FnOnce(&mut crate::pg::Primary) -> R) -> R {
        f(self.pg.st.lock().primary.as_mut().unwrap())
    }

    async fn version(&self, node: &NodeShared, dev: DeviceId) -> Option<Version> {
        let store = node.pgs.store(dev).unwrap();
        store
            .object_info(self.oid)
            .await
            .unwrap()
            .map(|o| o.version)
    }
}
