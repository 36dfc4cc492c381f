//! The primary's writes to one object while an earlier one is in flight: the later write goes
//! to the members carrying the earlier one's version (`RepOp::prior`), and a member where the
//! earlier one never arrived does not apply it, so the write is not acknowledged and no copy
//! reaches the primary's version without every write to the object.

use super::WriteKind;
use crate::pg::{Member, Pg};
use crate::service::NodeShared;
use crate::testing::{Flaky, activate_member, shared, sim_store};
use basalt_meta::Catalog;
use basalt_proto::{ErrorCode, RepOp, Request, ResponseFuture, Service, WireError};
use basalt_types::{DeviceId, Epoch, NodeId, ObjectId, PgId, PoolId, Term, Version, VolumeId};
use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

const PRIMARY: DeviceId = DeviceId(1);
const MEMBER: DeviceId = DeviceId(2);
const PG: PgId = PgId {
    pool: PoolId(1),
    pg: 0,
};

/// The link to the member's node (in this process). The first sub-operation sent on it is lost
/// on the way (a connection reset before it arrived: the primary gets an error once the test
/// releases it); the others arrive.
struct LosesFirst {
    member: Arc<NodeShared>,
    sent: Mutex<Vec<RepOp>>,
    release: Mutex<Option<oneshot::Receiver<()>>>,
}

impl Service for LosesFirst {
    fn call(&self, req: Request) -> ResponseFuture {
        let Request::Rep(op) = req else {
            panic!("only sub-operations go to the member in this test: {req:?}")
        };
        let first = {
            let mut sent = self.sent.lock();
            sent.push(op.clone());
            sent.len() == 1
        };
        if !first {
            return self.member.pgs.rep(op);
        }
        let released = self.release.lock().take().expect("one first");
        Box::pin(async move {
            let _ = released.await;
            Err(WireError::new(
                ErrorCode::ShuttingDown,
                "connection reset (test)",
            ))
        })
    }
}

impl basalt_link::Link for LosesFirst {
    fn is_open(&self) -> bool {
        true
    }
}

async fn node(dir: &std::path::Path, id: u32) -> Arc<NodeShared> {
    let catalog = Catalog::new(Flaky::open(&dir.join(format!("meta{id}.redb"))).await);
    shared(
        NodeId(id),
        Duration::from_secs(3600),
        vec![sim_store(id)],
        catalog,
    )
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
    let dir = tempfile::tempdir().unwrap();
    let (primary, member) = (node(dir.path(), 1).await, node(dir.path(), 2).await);
    let pg: Arc<Pg> = primary.pgs.get(PRIMARY, PG).unwrap();
    pg.serve_alone_for_test(Epoch(9));
    let term = Term::new(Epoch(9), 0);
    activate_member(&member, MEMBER, PG, term).await;
    let (release, released) = oneshot::channel();
    let link = Arc::new(LosesFirst {
        member: member.clone(),
        sent: Mutex::new(Vec::new()),
        release: Mutex::new(Some(released)),
    });
    pg.st.lock().primary.as_mut().unwrap().members = vec![Member {
        dev: MEMBER,
        link: link.clone(),
    }];
    let ctx = primary.pgs.ctx.clone();
    let oid = ObjectId::new(PG.pool, VolumeId(1), 0);
    let write = |offset: u32, byte: u8| {
        let (pg, ctx) = (pg.clone(), ctx.clone());
        let data = Bytes::from(vec![byte; 4096]);
        let kind = WriteKind::Data { offset, data };
        tokio::spawn(async move { pg.write(&ctx, Epoch(0), oid, kind, false).await })
    };
    let first = write(0, 1);
    until("the first write sent", || link.sent.lock().len() == 1).await;
    let second = write(4096, 2);
    until("the second write sent", || link.sent.lock().len() == 2).await;
    let err = second
        .await
        .unwrap()
        .expect_err("acknowledged, though the member lacks the write before it");
    let sent = link.sent.lock().clone();
    assert_eq!(sent[0].prior, Version::NONE, "nothing in flight before it");
    assert_eq!(
        sent[1].prior, sent[0].version,
        "sent behind the first write"
    );
    assert_eq!(err.code, ErrorCode::Busy, "the client retries it: {err:?}");
    // The second write's failure ended the term: nothing may wait for the lost answer now.
    let _ = release.send(());
    assert!(first.await.unwrap().is_err(), "lost on the way: failed");
    let store = member.pgs.store(MEMBER).unwrap();
    assert_eq!(
        store.object_info(oid).await.unwrap(),
        None,
        "the member applied the second write without the first"
    );
    let here = primary.pgs.store(PRIMARY).unwrap();
    let held = here.object_info(oid).await.unwrap().map(|o| o.version);
    assert_eq!(held, Some(sent[1].version), "both applied here");
}
