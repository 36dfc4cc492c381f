//! The promise check on changes peering and recovery make to a copy: a `Put` of an older term
//! than the member promised is refused, and so is the primary's own install (a superseded
//! generation of the same device must not roll back what a newer term decided); a replicated
//! write applies only in the term the member was activated in and promised. Also which term a
//! primary may call whole (`recovery.rs::Pg::whole`), which map it judges on (`Primary::serves`),
//! that a stopped node starts no primary, and that a stray's removal of an older term purges
//! nothing.

use crate::pg::messages::{ImageKind, ImageMeta, PeerAnswer, PeerMsg};
use crate::service::NodeShared;
use crate::testing::{Flaky, activate_msg, query_msg, shared, shared_after, sim_store};
use basalt_meta::Catalog;
use basalt_proto::{ErrorCode, RepKind, RepOp};
use basalt_types::{DeviceId, Epoch, NodeId, ObjectId, PgId, PoolId, Term, Version, VolumeId};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

fn tombstone(term: Term) -> ImageMeta {
    ImageMeta {
        version: term.version(1).unwrap(),
        kind: ImageKind::Tombstone,
        allocated: Vec::new(),
    }
}

/// Node 1 with one simulated device, dev.1, and the PG pg.1.0 its tests use.
async fn one_device_node(dir: &std::path::Path) -> (Arc<NodeShared>, DeviceId, PgId) {
    let catalog = Catalog::new(Flaky::open(&dir.join("meta.redb")).await);
    let node = shared(
        NodeId(1),
        Duration::from_secs(3600),
        vec![sim_store(1)],
        catalog,
    );
    let pg = PgId {
        pool: PoolId(1),
        pg: 0,
    };
    (node, DeviceId(1), pg)
}

/// A map (epoch 0) of `devices`, each up, in, on the node of its own number.
fn map_of(devices: &[DeviceId]) -> basalt_placement::ClusterMap {
    let mut map = basalt_placement::ClusterMap::default();
    for d in devices {
        let info = basalt_placement::DeviceInfo::new(NodeId(d.0), "ssd", 1, 128 << 10);
        map.devices.insert(*d, info);
    }
    map
}

#[tokio::test]
async fn changes_of_an_older_term_than_promised_are_refused_on_every_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    let oid = ObjectId::new(PoolId(1), VolumeId(1), 0);
    let (old, new) = (Term::new(Epoch(5), 0), Term::new(Epoch(7), 0));
    let query = PeerMsg::Query {
        device: dev,
        pg,
        term: new,
        epoch: Epoch(0),
        from: None,
    };
    let (answer, _) = node.pgs.peer(query, Bytes::new()).await.unwrap();
    assert!(matches!(answer, PeerAnswer::Holding(_)), "{answer:?}");
    let put = |term| PeerMsg::Put {
        device: dev,
        pg,
        term,
        oid,
        image: tombstone(term),
    };
    // A member's copy: a Put of the older term is refused, the newer one applies.
    let err = node.pgs.peer(put(old), Bytes::new()).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::StaleEpoch, "{err:?}");
    let store = node.pgs.store(dev).unwrap().clone();
    assert_eq!(store.object_info(oid).await.unwrap(), None);
    node.pgs.peer(put(new), Bytes::new()).await.unwrap();
    let held = store.object_info(oid).await.unwrap().unwrap();
    assert_eq!(held.version, new.version(1).unwrap());
    // The primary's own copy: the same check.
    let p = node.pgs.get(dev, pg).unwrap();
    let map = basalt_placement::ClusterMap::default();
    let ctx = node.pgs.ctx.clone();
    let err = p
        .put(&ctx, &map, dev, old, oid, tombstone(old), Bytes::new())
        .await
        .unwrap_err();
    assert!(err.contains("follows term"), "{err}");
    let err = p.submit_purge(old, oid).unwrap_err();
    assert_eq!(err.code, ErrorCode::StaleEpoch, "{err:?}");
    let held = store.object_info(oid).await.unwrap().unwrap();
    assert_eq!(held.version, new.version(1).unwrap(), "nothing rolled back");
    // Not what the same term wrote either (`a_late_put_of_a_term_never_rolls_back_its_writes`);
    // a later term's purge of it applies.
    let err = p.submit_purge(new, oid).unwrap().await.unwrap_err();
    assert!(
        matches!(err, basalt_engine::EngineError::StaleVersion { .. }),
        "{err:?}"
    );
    p.submit_purge(Term::new(Epoch(9), 0), oid)
        .unwrap()
        .await
        .unwrap();
    assert_eq!(store.object_info(oid).await.unwrap(), None);
}

/// A `Put` (or `Purge`) of a term that reaches a member after a write of the same term to its
/// object is refused: the primary gave up on it (its answer timed out, a read repair or scrub
/// that then released the object) and wrote the object, and the late put would roll the
/// member's copy back below a write the primary acknowledged, which a read at the member
/// (`replica_read.rs`) would then answer. Found by a review. A put at the version the member
/// holds (a repair) applies, and so does a later term's over a version of an earlier one (a
/// rollback by peering).
#[tokio::test]
async fn a_late_put_of_a_term_never_rolls_back_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    let store = node.pgs.store(dev).unwrap().clone();
    let oid = ObjectId::new(PoolId(1), VolumeId(1), 0);
    let (term, next) = (Term::new(Epoch(5), 0), Term::new(Epoch(5), 1));
    crate::testing::activate_member(&node, dev, pg, term).await;
    let held = || async { store.object_info(oid).await.unwrap().map(|o| o.version) };
    let v = |t: Term, n| t.version(n).unwrap();
    let put = |t: Term, version| PeerMsg::Put {
        device: dev,
        pg,
        term: t,
        oid,
        image: ImageMeta {
            version,
            kind: ImageKind::Tombstone,
            allocated: Vec::new(),
        },
    };
    node.pgs
        .rep(write_op(dev, pg, oid, term, 1, 0, Version::NONE))
        .await
        .unwrap();
    // The repair's put, at the version the member holds: applies.
    node.pgs
        .peer(put(term, v(term, 1)), Bytes::new())
        .await
        .unwrap();
    assert_eq!(held().await, Some(v(term, 1)));
    // The object written again in the term, then the same put once more, late: refused, and
    // the write stays, bytes included.
    node.pgs
        .rep(write_op(dev, pg, oid, term, 2, 0, v(term, 1)))
        .await
        .unwrap();
    let err = node
        .pgs
        .peer(put(term, v(term, 1)), Bytes::new())
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::StaleVersion, "{err:?}");
    let purge = PeerMsg::Purge {
        device: dev,
        pg,
        term,
        oid,
    };
    let err = node.pgs.peer(purge, Bytes::new()).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::StaleVersion, "{err:?}");
    assert_eq!(held().await, Some(v(term, 2)));
    assert_eq!(store.read(oid, 0, 4096).await.unwrap(), vec![2u8; 4096]);
    // A later round's peering rolls write 2 back (never acknowledged, say): applies.
    crate::testing::activate_member(&node, dev, pg, next).await;
    node.pgs
        .peer(put(next, v(term, 1)), Bytes::new())
        .await
        .unwrap();
    assert_eq!(held().await, Some(v(term, 1)));
}

/// Two generations of one device's primary in the same interval never share a term, even
/// when the older one's query has not yet reached its own device (so the device promised
/// nothing newer): with a shared term, the older generation, superseded but still running,
/// could roll back on the members (who accept that term) writes the newer one acknowledged.
/// Found by the cluster simulation (seed 1134, once read leases delayed those queries).
#[tokio::test]
async fn each_generation_of_a_primary_peers_in_a_term_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    // A query of an older interval creates the PG here (a member, promised t5.0).
    let query = PeerMsg::Query {
        device: dev,
        pg,
        term: Term::new(Epoch(5), 0),
        epoch: Epoch(0),
        from: None,
    };
    node.pgs.peer(query, Bytes::new()).await.unwrap();
    let p = node.pgs.get(dev, pg).unwrap();
    let map = basalt_placement::ClusterMap::default();
    let entry = basalt_placement::PgMap {
        up: vec![dev],
        acting: vec![dev],
        since: Epoch(7),
    };
    let term = || p.st.lock().primary.as_ref().map(|p| p.term).unwrap();
    p.restart_primary(node.pgs.ctx.clone(), &map, &entry, 1);
    let first = term();
    p.restart_primary(node.pgs.ctx.clone(), &map, &entry, 1);
    let second = term();
    assert_eq!(first, Term::new(Epoch(7), 0));
    assert!(second > first, "{first} then {second}");
    p.stop_primary();
}

/// Rule 2 of the failure model on a member: a replicated write applies only in the term the
/// member was activated in and the newest it promised. Refused (`StaleEpoch`, nothing written)
/// before the activation, and once a newer primary's query was promised, before that term
/// activates it too; so a deposed primary can complete no write once a newer term peered.
#[tokio::test]
async fn a_replicated_write_applies_only_in_the_term_the_member_was_activated_in_and_promised() {
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    let store = node.pgs.store(dev).unwrap().clone();
    let oid = ObjectId::new(PoolId(1), VolumeId(1), 0);
    let (old, new) = (Term::new(Epoch(5), 0), Term::new(Epoch(7), 0));
    let rep = |term: Term, n: u64| write_op(dev, pg, oid, term, n, 0, Version::NONE);
    let query = |term| query_msg(dev, pg, term);
    let activate = |term| activate_msg(dev, pg, term);
    let held = || async { store.object_info(oid).await.unwrap().map(|o| o.version) };

    // Promised, not yet activated: refused.
    node.pgs.peer(query(old), Bytes::new()).await.unwrap();
    let err = node.pgs.rep(rep(old, 1)).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::StaleEpoch, "{err:?}");
    assert_eq!(held().await, None);
    // Activated: applied.
    node.pgs.peer(activate(old), Bytes::new()).await.unwrap();
    node.pgs.rep(rep(old, 1)).await.unwrap();
    assert_eq!(held().await, Some(old.version(1).unwrap()));
    // A newer primary's query promised: the older term's writes are refused, and the newer
    // term's too until it activates the member.
    node.pgs.peer(query(new), Bytes::new()).await.unwrap();
    for op in [rep(old, 2), rep(new, 1)] {
        let err = node.pgs.rep(op).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::StaleEpoch, "{err:?}");
    }
    assert_eq!(
        held().await,
        Some(old.version(1).unwrap()),
        "nothing applied"
    );
    node.pgs.peer(activate(new), Bytes::new()).await.unwrap();
    node.pgs.rep(rep(new, 1)).await.unwrap();
    assert_eq!(held().await, Some(new.version(1).unwrap()));
    let err = node.pgs.rep(rep(old, 3)).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::StaleEpoch, "{err:?}");
}

/// A sub-operation sent behind an earlier write to its object (`RepOp::prior`) applies only
/// onto that write's version: where the earlier one failed, so does this one, and the copy
/// keeps the version it had (peering then sees it behind and recovers it). Without the check it
/// would reach the later version without the earlier write's bytes, a copy peering cannot tell
/// from the others.
#[tokio::test]
async fn a_write_sent_behind_one_that_failed_on_the_member_is_not_applied_there() {
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    let store = node.pgs.store(dev).unwrap().clone();
    let oid = ObjectId::new(PoolId(1), VolumeId(1), 0);
    let term = Term::new(Epoch(5), 0);
    let rep = |n: u64, offset: u32, prior: u64| {
        let prior = match prior {
            0 => Version::NONE,
            p => term.version(p).unwrap(),
        };
        write_op(dev, pg, oid, term, n, offset, prior)
    };
    crate::testing::activate_member(&node, dev, pg, term).await;
    let held = || async { store.object_info(oid).await.unwrap().map(|o| o.version) };
    node.pgs.rep(rep(1, 0, 0)).await.unwrap();
    // Write 2 fails here (it ends past the object), write 3 was sent behind it: refused.
    let past_the_end = store.info().object_size;
    assert!(node.pgs.rep(rep(2, past_the_end, 1)).await.is_err());
    let err = node.pgs.rep(rep(3, 8192, 2)).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::StaleVersion, "{err:?}");
    assert!(err.message.contains("not at"), "{err:?}");
    assert_eq!(
        held().await,
        Some(term.version(1).unwrap()),
        "kept as it was"
    );
    let data = store.read(oid, 8192, 4096).await.unwrap();
    assert!(data.iter().all(|b| *b == 0), "write 3 not applied");
    // Behind a write that applied here: applied.
    node.pgs.rep(rep(4, 8192, 1)).await.unwrap();
    assert_eq!(held().await, Some(term.version(4).unwrap()));
}

/// Recovery takes the objects clients wait for first, then the rest in order, never one being
/// moved: a client waits for its own object, not for the queue before it (a returning node's
/// PGs stalled I/O for seconds while recovery went through its objects in order).
#[tokio::test]
async fn recovery_takes_the_objects_clients_wait_for_first() {
    use crate::pg::Missing;
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    let p = node.pgs.get(dev, pg).unwrap();
    p.serve_alone_for_test(Epoch(1));
    let oid = |i| ObjectId::new(PoolId(1), VolumeId(1), i);
    let mut st = p.st.lock();
    let primary = st.primary.as_mut().unwrap();
    for i in 0..6 {
        let missing = Missing {
            version: Term::new(Epoch(1), 0).version(1).unwrap(),
            deleted: false,
            sources: vec![DeviceId(2)],
            need: vec![dev],
        };
        primary.missing.insert(oid(i), missing);
    }
    primary.busy.insert(oid(0));
    for i in [5, 3, 9] {
        // 9 is not missing (waits for something else).
        let (tx, _rx) = tokio::sync::oneshot::channel();
        primary.waiters.entry(oid(i)).or_default().push(tx);
    }
    let next = |n| -> Vec<u64> {
        let picks = primary.next_to_recover(n);
        picks.iter().map(|(o, _)| o.index).collect()
    };
    assert_eq!(next(1), vec![3]);
    assert_eq!(next(3), vec![3, 5, 1]);
    assert_eq!(next(10), vec![3, 5, 1, 2, 4], "0 is being moved");
}

/// A term counts as whole (so the history may be compacted to it and the PG called clean) only
/// while the map still shows the term's interval with its members as every acting device: a
/// newer map that brought back a device down through the term is a new interval, and the
/// returning device lacks what the term wrote. Judged by that map alone, the term looked
/// whole: the history was compacted to it, the returning device stopped counting as a source
/// and its PG stayed inactive ("holds the PG from before its history began"; seen in
/// `tests/restart.rs`, a clean stop and a start 40 ms later).
#[tokio::test]
async fn a_term_is_whole_only_in_its_own_interval_with_every_acting_device() {
    use basalt_placement::PgMap;
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    let p = node.pgs.get(dev, pg).unwrap();
    p.serve_alone_for_test(Epoch(9));
    let other = DeviceId(2);
    let mut map = map_of(&[dev, other]);
    let entry = |acting: Vec<DeviceId>, since| PgMap {
        up: acting.clone(),
        acting,
        since: Epoch(since),
    };
    let term = Term::new(Epoch(9), 0);
    assert_eq!(p.whole(&map, &entry(vec![dev], 9)), Some(term));
    // The other device came back: a new interval with a device the term never had.
    assert_eq!(p.whole(&map, &entry(vec![dev, other], 10)), None);
    assert_eq!(p.whole(&map, &entry(vec![dev, other], 9)), None);
    // The same devices in a newer interval (the PG has yet to peer it): not whole.
    assert_eq!(p.whole(&map, &entry(vec![dev], 10)), None);
    // Its own interval but a newer map of it: still whole.
    map.epoch = Epoch(12);
    assert_eq!(p.whole(&map, &entry(vec![dev], 9)), Some(term));
    // An acting device down: not whole.
    map.devices.get_mut(&other).unwrap().up = false;
    assert_eq!(p.whole(&map, &entry(vec![dev, other], 9)), None);
    assert_eq!(p.whole(&map, &entry(vec![other, dev], 10)), None);
    p.stop_primary();
    assert_eq!(
        p.whole(&map, &entry(vec![dev], 9)),
        None,
        "no longer the primary"
    );
}

/// A primary serves the map entry it started from: its interval, up set, which of the up set
/// is up, and acting set; any other entry restarts it (`Pgs::primary_sees`).
#[tokio::test]
async fn a_primary_serves_only_the_map_entry_it_started_from() {
    use basalt_placement::{ClusterMap, PgMap};
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    let p = node.pgs.get(dev, pg).unwrap();
    p.serve_alone_for_test(Epoch(9));
    let other = DeviceId(2);
    let mut map = map_of(&[dev, other]);
    let entry = |up: Vec<DeviceId>, acting: Vec<DeviceId>, since| PgMap {
        up,
        acting,
        since: Epoch(since),
    };
    let serves = |map: &ClusterMap, e: &PgMap| {
        let st = p.st.lock();
        st.primary.as_ref().is_some_and(|pr| pr.serves(map, e))
    };
    assert!(serves(&map, &entry(vec![dev], vec![dev], 9)));
    map.epoch = Epoch(14);
    assert!(
        serves(&map, &entry(vec![dev], vec![dev], 9)),
        "a newer map, same entry"
    );
    assert!(
        !serves(&map, &entry(vec![dev], vec![dev], 10)),
        "a newer interval"
    );
    assert!(
        !serves(&map, &entry(vec![dev, other], vec![dev], 9)),
        "another up set"
    );
    assert!(
        !serves(&map, &entry(vec![dev], vec![dev, other], 9)),
        "another acting set"
    );
    map.devices.get_mut(&dev).unwrap().up = false;
    assert!(
        !serves(&map, &entry(vec![dev], vec![dev], 9)),
        "its up set went down"
    );
}

/// A stopped node starts no primary again: a write that failed on its closed store after the
/// shutdown's drain ends its term (`repeer`), and that must not peer anew on behalf of the
/// stopped node (in a process that goes on: tests, the simulation).
#[tokio::test]
async fn a_stopped_node_starts_no_primary() {
    use basalt_placement::PgMap;
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    let p = node.pgs.get(dev, pg).unwrap();
    let map = map_of(&[dev]);
    let entry = PgMap {
        up: vec![dev],
        acting: vec![dev],
        since: Epoch(3),
    };
    let ctx = node.pgs.ctx.clone();
    p.restart_primary(ctx.clone(), &map, &entry, 1);
    assert!(p.st.lock().primary.is_some(), "a running node starts it");
    ctx.stopped
        .store(true, std::sync::atomic::Ordering::Release);
    p.restart_primary(ctx, &map, &entry, 1);
    assert!(p.st.lock().primary.is_none(), "a stopped node does not");
}

/// A stray's copy is forgotten (`Remove`) only for a term this device was not promised past: a
/// newer primary (which may be about to backfill this very device) may have promised it
/// meanwhile. The door refuses such a `Remove`, and so does every batch of the removal itself
/// (called here directly, as when the promise lands while it runs): nothing is purged.
#[tokio::test]
async fn a_remove_of_an_older_term_than_promised_purges_nothing() {
    use basalt_engine::WriteOptions;
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    let store = node.pgs.store(dev).unwrap().clone();
    let (old, new) = (Term::new(Epoch(5), 0), Term::new(Epoch(7), 0));
    let query = |term| PeerMsg::Query {
        device: dev,
        pg,
        term,
        epoch: Epoch(0),
        from: None,
    };
    node.pgs.peer(query(old), Bytes::new()).await.unwrap();
    for i in 0..3 {
        let oid = ObjectId::new(PoolId(1), VolumeId(1), i);
        let data = Bytes::from(vec![7u8; 4096]);
        let opts = WriteOptions::durable().in_pg(pg.pg);
        store.write(oid, 0, data, opts).await.unwrap();
    }
    node.pgs.peer(query(new), Bytes::new()).await.unwrap();
    let remove = PeerMsg::Remove {
        device: dev,
        pg,
        term: old,
    };
    let err = node.pgs.peer(remove, Bytes::new()).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::StaleEpoch, "{err:?}");
    let err = node.pgs.remove(dev, pg, old).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::StaleEpoch, "{err:?}");
    assert_eq!(store.list(pg, None, 10).await.unwrap().len(), 3);
    node.pgs.remove(dev, pg, new).await.unwrap();
    assert!(store.list(pg, None, 10).await.unwrap().is_empty());
}

/// The ready report a term wrote is written again while the map still waits for it (the leader
/// deletes every report it considered, and one of an ended term may have replaced it), and not
/// once the acting set is the up set or the interval moved on.
#[tokio::test]
async fn a_ready_report_is_written_again_while_the_map_waits_for_it() {
    use basalt_meta::PgReadyRecord;
    use basalt_placement::{FailureDomain, PgMap, PoolMap};
    let dir = tempfile::tempdir().unwrap();
    let (node, dev, pg) = one_device_node(dir.path()).await;
    let p = node.pgs.get(dev, pg).unwrap();
    p.serve_alone_for_test(Epoch(9));
    let other = DeviceId(2);
    let up = vec![dev, other];
    let record = PgReadyRecord::new(pg, Epoch(9), up.clone()).in_interval(Epoch(9));
    let generation = {
        let mut st = p.st.lock();
        st.primary.as_mut().unwrap().reported = Some(record);
        st.generation
    };
    let ctx = node.pgs.ctx.clone();
    let offer = |epoch: u64, acting: Vec<DeviceId>, since: u64| {
        let mut map = map_of(&[dev, other]);
        map.epoch = Epoch(epoch);
        let entry = PgMap {
            up: up.clone(),
            acting,
            since: Epoch(since),
        };
        let pool = PoolMap {
            pg_count: 1,
            replicas: 2,
            min_size: 1,
            object_size: 128 << 10,
            failure_domain: FailureDomain::Host,
            device_class: None,
            pgs: vec![entry],
        };
        map.pools.insert(pg.pool, pool);
        assert!(ctx.maps.offer(map));
    };
    let reports = || async { ctx.catalog.list_pg_ready().await.unwrap() };
    offer(10, vec![dev], 9);
    p.report_again(&ctx, generation).await.unwrap();
    let found = reports().await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].0.up.clone(), found[0].0.interval),
        (up.clone(), Some(Epoch(9)))
    );
    let leader = ctx.catalog.campaign("test", Duration::from_secs(10)).await;
    let leader = leader.unwrap().expect("no other leader");
    let removed = ctx.catalog.remove_pg_ready(pg, found[0].1, &leader).await;
    assert!(removed.unwrap());
    // Applied (acting = up): nothing more; a newer interval: not this term's to report.
    offer(11, up.clone(), 11);
    p.report_again(&ctx, generation).await.unwrap();
    offer(12, vec![dev], 12);
    p.report_again(&ctx, generation).await.unwrap();
    assert!(reports().await.is_empty());
}

/// Sub-operation `n` of `term`: a 4 KiB write of byte `n` at `offset` of `oid`, sent behind
/// `prior`.
fn write_op(
    dev: DeviceId,
    pg: PgId,
    oid: ObjectId,
    term: Term,
    n: u64,
    offset: u32,
    prior: Version,
) -> RepOp {
    RepOp {
        epoch: Epoch(0),
        device: dev,
        pg,
        term,
        oid,
        version: term.version(n).unwrap(),
        kind: RepKind::Write { offset },
        data: Bytes::from(vec![n as u8; 4096]),
        committed: Version::NONE,
        prior,
    }
}

/// A restarted member forgets the newer term it promised (promises live in memory): it takes
/// an activation only once queried again, so a deposed primary of the interval it was last
/// activated in (its map lagging, telling members how far they are complete) cannot make it
/// accept that older term again behind the new primary's back (found by a review, 2026-11-29:
/// the deposed primary then acknowledged a write the new primary never saw).
#[tokio::test]
async fn a_restarted_member_takes_no_activation_before_a_query() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::new(Flaky::open(&dir.path().join("meta.redb")).await);
    let store = sim_store(1);
    let start = || {
        shared(
            NodeId(1),
            Duration::from_secs(3600),
            vec![store.clone()],
            catalog.clone(),
        )
    };
    let (dev, pg) = (
        DeviceId(1),
        PgId {
            pool: PoolId(1),
            pg: 0,
        },
    );
    let (old, new) = (Term::new(Epoch(5), 1), Term::new(Epoch(7), 0));
    let node = start();
    for msg in [
        query_msg(dev, pg, old),
        activate_msg(dev, pg, old),
        query_msg(dev, pg, new),
    ] {
        node.pgs.peer(msg, Bytes::new()).await.unwrap();
    }
    let refused = node
        .pgs
        .peer(activate_msg(dev, pg, old), Bytes::new())
        .await;
    assert!(refused.is_err(), "the newer term was promised");
    drop(node);
    // Started again: the promise of the newer term is gone.
    let node = start();
    for term in [old, new] {
        let e = node
            .pgs
            .peer(activate_msg(dev, pg, term), Bytes::new())
            .await
            .expect_err("activated without a query since the start");
        assert_eq!(e.code, ErrorCode::StaleEpoch, "{e:?}");
        assert!(e.message.contains("query it first"), "{e:?}");
    }
    // The new primary queries it again, then activates it; the old term stays refused.
    for msg in [query_msg(dev, pg, new), activate_msg(dev, pg, new)] {
        node.pgs.peer(msg, Bytes::new()).await.unwrap();
    }
    let refused = node
        .pgs
        .peer(activate_msg(dev, pg, old), Bytes::new())
        .await;
    assert!(refused.is_err(), "the newer term was promised again");
}

/// A node started again with heartbeats (read leases) off after a crash promises nothing
/// while a lease its previous process granted may still run: a deposed primary holding one
/// could answer reads the new term's writes made stale.
#[tokio::test(start_paused = true)]
async fn a_member_restarted_with_leases_off_promises_once_its_earlier_grants_ran_out() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::new(Flaky::open(&dir.path().join("meta.redb")).await);
    let earlier = Duration::from_secs(2);
    let node = shared_after(
        NodeId(1),
        Duration::from_secs(3600),
        vec![sim_store(1)],
        catalog,
        Duration::ZERO,
        earlier,
    );
    let (dev, pg) = (
        DeviceId(1),
        PgId {
            pool: PoolId(1),
            pg: 0,
        },
    );
    let query = || query_msg(dev, pg, Term::new(Epoch(7), 0));
    let refused = node.pgs.peer(query(), Bytes::new()).await;
    assert!(
        matches!(&refused, Err(e) if e.code == ErrorCode::Busy && e.message.contains("previous process")),
        "{refused:?}"
    );
    tokio::time::sleep(earlier).await;
    node.pgs.peer(query(), Bytes::new()).await.unwrap();
}
