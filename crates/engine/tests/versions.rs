//! What replication needs from the store (format v2): epoch versions that stay unique across
//! failovers, tombstones, per-PG ordered listings and logs, whole-object images (read with
//! version, install at any version), held writes (commit gating) and PG records. Each test runs
//! on the simulated disk and on io_uring.

mod common;

use basalt_engine::{
    EngineError, ObjectContent, ObjectImage, PG_BLOB, PgId, PoolId, Store, Version, WriteOptions,
};
use bytes::Bytes;
use common::{Backend, Dev, OBJ, oid, pattern};
use std::time::Duration;

fn dev(b: Backend) -> Dev {
    Dev::new(b, 64 << 20, 4 << 20)
}

fn pg(n: u32) -> PgId {
    PgId {
        pool: PoolId(1),
        pg: n,
    }
}

fn at(epoch: u64, seq: u64, pg: u32) -> WriteOptions {
    WriteOptions::durable()
        .with_version(Version::new(epoch, seq))
        .in_pg(pg)
}

async fn put(store: &Store, o: basalt_engine::ObjectId, data: &[u8], opts: WriteOptions) {
    store
        .write(o, 0, Bytes::copy_from_slice(data), opts)
        .await
        .unwrap();
}

async fn epoch_versions_and_tombstones(b: Backend) {
    let dev = dev(b);
    let store = dev.open().await;
    let o = oid(1, 1);
    put(&store, o, b"a", at(3, 7, 2)).await;
    // A later interval is newer whatever its sequence number; an older one is refused.
    put(&store, o, b"b", at(4, 1, 2)).await;
    assert!(matches!(
        store
            .write(o, 0, Bytes::from_static(b"x"), at(3, 99, 2))
            .await,
        Err(EngineError::StaleVersion { .. })
    ));
    // Delete keeps the version: a tombstone at 4.2.
    assert_eq!(
        store.delete(o, at(4, 2, 2)).await.unwrap(),
        Version::new(4, 2)
    );
    let info = store.object_info(o).await.unwrap().unwrap();
    assert!(info.deleted && info.version == Version::new(4, 2) && info.pg == 2);
    // Re-creating must be newer than the delete, so a stale replica's copy never looks newer.
    assert!(matches!(
        store
            .write(o, 0, Bytes::from_static(b"x"), at(4, 1, 2))
            .await,
        Err(EngineError::StaleVersion { .. })
    ));
    put(&store, o, b"c", at(4, 3, 2)).await;
    assert_eq!(store.read(o, 0, 2).await.unwrap(), &b"c\0"[..]);
    // An object keeps its PG.
    assert!(matches!(
        store
            .write(o, 0, Bytes::from_static(b"x"), at(4, 4, 3))
            .await,
        Err(EngineError::InvalidArgument(_))
    ));
    // A trim that empties the object leaves a tombstone at its version too; it survives a
    // reopen.
    store.trim(o, 0, OBJ, at(5, 1, 2)).await.unwrap();
    drop(store);
    let store = dev.open().await;
    let info = store.object_info(o).await.unwrap().unwrap();
    assert!(info.deleted && info.version == Version::new(5, 1));
    assert_eq!(store.stats().tombstones, 1);
    let (data, v) = store.read_versioned(o, 0, 4).await.unwrap();
    assert_eq!((&data[..], v), (&[0u8; 4][..], Version::new(5, 1)));
}

async fn ordered_listing_per_pg(b: Backend) {
    let dev = dev(b);
    let store = dev.open().await;
    // Objects of two PGs, written out of order.
    for (i, p) in [(9u64, 0u32), (3, 1), (7, 0), (1, 0), (5, 1), (2, 0)] {
        put(&store, oid(1, i), b"x", at(1, i, p)).await;
    }
    store.delete(oid(1, 7), at(1, 20, 0)).await.unwrap();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store.list(pg(0), after, 2).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.oid);
        seen.extend(page.iter().map(|o| (o.oid.index, o.deleted)));
    }
    assert_eq!(seen, [(1, false), (2, false), (7, true), (9, false)]);
    let other: Vec<u64> = store
        .list(pg(1), None, 100)
        .await
        .unwrap()
        .iter()
        .map(|o| o.oid.index)
        .collect();
    assert_eq!(other, [3, 5]);
    let pgs = store.pgs().await.unwrap();
    let p0 = pgs.iter().find(|p| p.pg == pg(0)).unwrap();
    assert_eq!((p0.objects, p0.tombstones), (3, 1));
    assert_eq!(p0.last_version, Version::new(1, 20));
}

async fn log_since_and_trim(b: Backend) {
    let dev = dev(b);
    let store = dev.open().await;
    for i in 1..=5u64 {
        put(&store, oid(2, i), b"x", at(2, i, 0)).await;
    }
    store.delete(oid(2, 2), at(2, 6, 0)).await.unwrap();
    put(&store, oid(2, 4), b"y", at(3, 1, 0)).await;
    // What changed after 2.3: objects 5, 2 (deleted) and 4 (rewritten), oldest first; the log
    // keeps only the newest change of each object.
    let since = store
        .list_since(pg(0), Version::new(2, 3), 100)
        .await
        .unwrap();
    let got: Vec<(u64, Version, bool)> = since
        .iter()
        .map(|e| (e.oid.index, e.version, e.deleted))
        .collect();
    assert_eq!(
        got,
        [
            (5, Version::new(2, 5), false),
            (2, Version::new(2, 6), true),
            (4, Version::new(3, 1), false)
        ]
    );
    // Paging with the last version as cursor.
    let first = store.list_since(pg(0), Version::NONE, 2).await.unwrap();
    let next = store
        .list_since(pg(0), first[1].version, 100)
        .await
        .unwrap();
    assert_eq!(first.len() + next.len(), 5);
    // Trimming forgets tombstones up to 2.6 and raises the tail: asking for changes before it
    // is refused (the caller must compare full listings), after it still works.
    assert_eq!(store.trim_log(pg(0), Version::new(2, 6)).await.unwrap(), 1);
    assert!(store.object_info(oid(2, 2)).await.unwrap().is_none());
    assert!(matches!(
        store.list_since(pg(0), Version::new(2, 3), 100).await,
        Err(EngineError::LogTrimmed { .. })
    ));
    store.flush().await.unwrap();
    drop(store);
    let store = dev.open().await;
    assert!(matches!(
        store.list_since(pg(0), Version::new(2, 5), 100).await,
        Err(EngineError::LogTrimmed { .. })
    ));
    let after = store
        .list_since(pg(0), Version::new(2, 6), 100)
        .await
        .unwrap();
    assert_eq!(after.len(), 1);
    let p0 = store.pgs().await.unwrap().remove(0);
    assert_eq!(
        (p0.log_tail, p0.tombstones, p0.objects),
        (Version::new(2, 6), 0, 4)
    );
}

async fn images_round_trip_and_roll_back(b: Backend) {
    let (da, db) = (dev(b), dev(b));
    let (a, bstore) = (da.open().await, db.open().await);
    let o = oid(3, 1);
    // A sparse object: blocks 0 and 5 hold data.
    a.write(o, 0, Bytes::from(pattern(1, 4096)), at(6, 1, 4))
        .await
        .unwrap();
    a.write(o, 5 * 4096, Bytes::from(pattern(2, 100)), at(6, 2, 4))
        .await
        .unwrap();
    let img = a.read_object(o).await.unwrap();
    assert_eq!(img.version, Version::new(6, 2));
    let ObjectContent::Data { data, allocated } = &img.content else {
        panic!("expected data, got {img:?}");
    };
    assert_eq!(data.len(), OBJ as usize);
    assert_eq!(allocated[0], 0b10_0001);
    // Installed elsewhere: same bytes, version and allocation.
    bstore
        .install(o, img.clone(), WriteOptions::durable().in_pg(4))
        .await
        .unwrap();
    assert_eq!(bstore.read_object(o).await.unwrap(), img);
    assert_eq!(
        bstore
            .object_info(o)
            .await
            .unwrap()
            .unwrap()
            .allocated_bytes,
        2 * 4096
    );
    // A newer (divergent) write on b, then roll back to the image: install ignores versions.
    bstore
        .write(o, 0, Bytes::from_static(b"zzz"), at(7, 1, 4))
        .await
        .unwrap();
    bstore
        .install(o, img.clone(), WriteOptions::durable().in_pg(4))
        .await
        .unwrap();
    drop(bstore);
    let bstore = db.open().await;
    assert_eq!(bstore.read_object(o).await.unwrap(), img);
    // Tombstones and absence install too.
    let gone = ObjectImage {
        version: Version::new(8, 1),
        content: ObjectContent::Tombstone,
    };
    bstore
        .install(o, gone.clone(), WriteOptions::durable().in_pg(4))
        .await
        .unwrap();
    assert_eq!(bstore.read_object(o).await.unwrap(), gone);
    let absent = ObjectImage {
        version: Version::NONE,
        content: ObjectContent::Absent,
    };
    bstore
        .install(o, absent.clone(), WriteOptions::durable().in_pg(4))
        .await
        .unwrap();
    assert_eq!(bstore.read_object(o).await.unwrap(), absent);
    assert!(bstore.object_info(o).await.unwrap().is_none());
}

async fn held_writes_are_invisible_until_committed(b: Backend) {
    let dev = dev(b);
    let store = dev.open().await;
    let (o, other) = (oid(4, 1), oid(4, 2));
    put(&store, o, b"old", at(1, 1, 0)).await;
    put(&store, other, b"free", at(1, 2, 0)).await;
    let v = store
        .write(o, 0, Bytes::from_static(b"new"), at(1, 3, 0).held())
        .await
        .unwrap();
    // A read of the object waits for the commit; other objects are not held up.
    let reader = {
        let s = store.clone();
        tokio::spawn(async move { s.read(o, 0, 3).await.unwrap() })
    };
    assert_eq!(store.read(other, 0, 4).await.unwrap(), &b"free"[..]);
    wait_held(&store, 1).await;
    assert!(!reader.is_finished(), "a read saw an uncommitted write");
    store.commit(o, v).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the read went on after the commit")
        .unwrap();
    assert_eq!(&got[..], b"new");
    // An install replaces held writes: their reads go on with the installed image.
    store
        .write(o, 0, Bytes::from_static(b"bad"), at(1, 4, 0).held())
        .await
        .unwrap();
    let reader = {
        let s = store.clone();
        tokio::spawn(async move { s.read(o, 0, 3).await.unwrap() })
    };
    wait_held(&store, 1).await;
    let img = ObjectImage {
        version: Version::new(1, 3),
        content: ObjectContent::Data {
            data: {
                let mut d = vec![0u8; OBJ as usize];
                d[..3].copy_from_slice(b"new");
                Bytes::from(d)
            },
            allocated: vec![1],
        },
    };
    store
        .install(o, img, WriteOptions::durable().in_pg(0))
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the install released the held read")
        .unwrap();
    assert_eq!(&got[..], b"new");
}

/// Waits until `n` reads are held by uncommitted writes.
async fn wait_held(store: &Store, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.stats().held_reads != n {
        assert!(std::time::Instant::now() < deadline, "no read was held");
        tokio::task::yield_now().await;
    }
}

async fn pg_records_persist(b: Backend) {
    let dev = dev(b);
    let store = dev.open().await;
    let mut blob = [0u8; PG_BLOB];
    blob[0] = 42;
    blob[PG_BLOB - 1] = 7;
    store.set_pg(pg(9), Some(blob), true).await.unwrap();
    put(&store, oid(5, 1), b"x", at(1, 1, 9)).await;
    drop(store);
    let store = dev.open().await;
    let p = store
        .pgs()
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.pg == pg(9))
        .unwrap();
    assert!(p.has_record);
    assert_eq!((p.blob, p.objects), (blob, 1));
    store.set_pg(pg(9), None, true).await.unwrap();
    store
        .purge(oid(5, 1), WriteOptions::durable().in_pg(9))
        .await
        .unwrap();
    drop(store);
    let store = dev.open().await;
    assert!(store.pgs().await.unwrap().iter().all(|p| p.pg != pg(9)));
}

/// A write that follows a version (`WriteOptions::prior`) applies only onto it, checked after
/// every earlier operation on the object: one sent behind a write that failed is refused too.
async fn writes_follow_the_version_they_were_sent_behind(b: Backend) {
    let dev = dev(b);
    let store = dev.open().await;
    let o = oid(6, 1);
    // Onto an object that does not exist yet.
    let first = at(2, 1, 4).after(Version::NONE);
    put(&store, o, b"a", first).await;
    // Both queued before either applies: the first is stale (it fails here), so the one sent
    // behind it is refused, and the object keeps what it had.
    let failing = store.submit_write(o, 0, Bytes::from_static(b"x"), at(1, 9, 4));
    let behind = store.submit_write(
        o,
        4096,
        Bytes::from_static(b"y"),
        at(2, 3, 4).after(Version::new(1, 9)),
    );
    assert!(matches!(
        failing.await,
        Err(EngineError::StaleVersion { .. })
    ));
    match behind.await {
        Err(EngineError::PriorVersion { current, expected }) => {
            assert_eq!(
                (current, expected),
                (Version::new(2, 1), Version::new(1, 9))
            );
        }
        other => panic!("expected PriorVersion, got {other:?}"),
    }
    assert_eq!(store.read(o, 4096, 1).await.unwrap(), &b"\0"[..]);
    // Behind a held write that applies: both apply, in order.
    let held = store.submit_write(o, 0, Bytes::from_static(b"b"), at(2, 4, 4).held());
    let next = store.submit_delete(o, at(2, 5, 4).after(Version::new(2, 4)));
    assert_eq!(held.await.unwrap(), Version::new(2, 4));
    store.commit(o, Version::new(2, 4)).unwrap();
    assert_eq!(next.await.unwrap(), Version::new(2, 5));
    let info = store.object_info(o).await.unwrap().unwrap();
    assert!(info.deleted && info.version == Version::new(2, 5));
    // Onto a tombstone: its version is the one to follow; "does not exist" is not.
    assert!(matches!(
        store
            .write(
                o,
                0,
                Bytes::from_static(b"z"),
                at(2, 6, 4).after(Version::NONE)
            )
            .await,
        Err(EngineError::PriorVersion { .. })
    ));
    put(&store, o, b"z", at(2, 7, 4).after(Version::new(2, 5))).await;
    assert_eq!(store.read(o, 0, 1).await.unwrap(), &b"z"[..]);
    // Behind a write-zeroes of an object that does not exist: the store records no version
    // for it (nothing changes), yet the next write follows it: the object is at it here.
    let absent = oid(6, 2);
    let zeroes = store.submit_write_zeroes(absent, 0, 8192, at(3, 1, 4));
    let follows = store.submit_write(
        absent,
        0,
        Bytes::from_static(b"r"),
        at(3, 3, 4).after(Version::new(3, 1)),
    );
    assert_eq!(zeroes.await.unwrap(), Version::NONE, "nothing recorded");
    assert_eq!(follows.await.unwrap(), Version::new(3, 3));
    // A zeroing that never arrived here is not excused by the object being absent: one
    // behind a version this store never saw is refused.
    let never = oid(6, 3);
    assert!(matches!(
        store
            .write(
                never,
                0,
                Bytes::from_static(b"s"),
                at(3, 5, 4).after(Version::new(3, 4))
            )
            .await,
        Err(EngineError::PriorVersion { .. })
    ));
    assert_eq!(store.read(absent, 0, 1).await.unwrap(), &b"r"[..]);
}

/// Writes and deletes objects `(volume, 1..)` of `pg` (versions 5.x), 256 at a time, until
/// the store no longer knows `gone` (its tombstone was evicted); returns how many it deleted.
async fn evict(store: &Store, volume: u64, pg: u32, gone: basalt_engine::ObjectId) -> u64 {
    let mut i = 0;
    while i == 0 || store.object_info(gone).await.unwrap().is_some() {
        assert!(i < 16384, "no tombstone evicted after {i} deletes");
        let mut ops = Vec::new();
        for _ in 0..256 {
            i += 1;
            let f = oid(volume, i);
            ops.push(store.submit_write(f, 0, Bytes::from_static(b"f"), at(5, 2 * i, pg)));
            ops.push(store.submit_delete(f, at(5, 2 * i + 1, pg)));
        }
        for op in ops {
            op.await.unwrap();
        }
    }
    i
}

/// A write behind a delete whose tombstone the full tombstone table then forgot follows the
/// delete's version all the same (`engine/unrecorded.rs`), and still not an older one.
async fn a_write_follows_a_delete_whose_tombstone_was_evicted(b: Backend) {
    let dev = dev(b);
    let store = dev.open().await;
    let o = oid(8, 0);
    put(&store, o, b"v", at(4, 1, 2)).await;
    store.delete(o, at(4, 2, 2)).await.unwrap();
    // Fill the tombstone table (at least 1024 records) with younger tombstones of the same
    // PG, until a delete takes the oldest one's record, `o`'s.
    let i = evict(&store, 8, 2, o).await;
    assert!(i >= 1024, "evicted after {i} deletes");
    assert!(matches!(
        store
            .write(
                o,
                0,
                Bytes::from_static(b"x"),
                at(6, 1, 2).after(Version::new(4, 1))
            )
            .await,
        Err(EngineError::PriorVersion { .. })
    ));
    put(&store, o, b"w", at(6, 2, 2).after(Version::new(4, 2))).await;
    assert_eq!(store.read(o, 0, 1).await.unwrap(), &b"w"[..]);
}

/// A full tombstone table never forgets the tombstone of a held (uncommitted) delete: reads of
/// the object wait for its commit, which would find nothing to release them, and a read after
/// the eviction would see the delete before it was committed. A younger tombstone goes first.
async fn a_held_deletes_tombstone_is_not_the_one_evicted(b: Backend) {
    let dev = dev(b);
    let store = dev.open().await;
    let o = oid(9, 0);
    put(&store, o, b"v", at(4, 1, 3)).await;
    let deleted = store.submit_delete(o, at(4, 2, 3).held()).await.unwrap();
    let read = tokio::spawn(store.submit_read(o, 0, 1));
    // Younger tombstones of the same PG until the table forgets one of them (the first).
    evict(&store, 9, 3, oid(9, 1)).await;
    let kept = store.object_info(o).await.unwrap();
    assert_eq!(
        kept.map(|info| info.version),
        Some(deleted),
        "the held delete's tombstone was forgotten"
    );
    assert!(
        !read.is_finished(),
        "a read saw the delete before its commit"
    );
    store.commit(o, deleted).unwrap();
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), read).await;
    let read = read.expect("the read still waits after the commit");
    assert_eq!(read.unwrap().unwrap(), &[0u8][..]);
}

/// An install or purge that keeps versions above a floor (`WriteOptions::keep_since`) never
/// rolls back, or removes, a version above it: the late repair of a replica (node) must not
/// undo a write made since. Over a version at or below the floor, or onto the same version, it
/// applies.
async fn installs_keep_versions_written_since(b: Backend) {
    let dev = dev(b);
    let store = dev.open().await;
    let o = oid(7, 1);
    let since = Version::new(5, 0);
    let tomb = |v: Version| ObjectImage {
        version: v,
        content: ObjectContent::Tombstone,
    };
    let keep = || WriteOptions::durable().in_pg(2).keeping_since(since);
    put(&store, o, b"a", at(5, 1, 2)).await;
    put(&store, o, b"b", at(5, 2, 2)).await;
    // Back to 5.1: refused, the data stays; a purge too.
    let err = store
        .install(o, tomb(Version::new(5, 1)), keep())
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::StaleVersion { .. }), "{err:?}");
    let err = store.purge(o, keep()).await.unwrap_err();
    assert!(matches!(err, EngineError::StaleVersion { .. }), "{err:?}");
    assert_eq!(store.read(o, 0, 1).await.unwrap(), &b"b"[..]);
    // Onto the version it holds, or past it: applies.
    store
        .install(o, tomb(Version::new(5, 2)), keep())
        .await
        .unwrap();
    assert_eq!(
        store.object_info(o).await.unwrap().unwrap().version,
        Version::new(5, 2)
    );
    // A floor above what it holds (a later term's rollback): applies, down too.
    let later = WriteOptions::durable()
        .in_pg(2)
        .keeping_since(Version::new(6, 0));
    store
        .install(o, tomb(Version::new(4, 9)), later)
        .await
        .unwrap();
    assert_eq!(
        store.object_info(o).await.unwrap().unwrap().version,
        Version::new(4, 9)
    );
    store.purge(o, later).await.unwrap();
    assert!(store.object_info(o).await.unwrap().is_none());
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod sim { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Sim).await } )* }
        mod uring { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Uring).await } )* }
    };
}

suite!(
    epoch_versions_and_tombstones,
    ordered_listing_per_pg,
    log_since_and_trim,
    images_round_trip_and_roll_back,
    held_writes_are_invisible_until_committed,
    pg_records_persist,
    writes_follow_the_version_they_were_sent_behind,
    a_write_follows_a_delete_whose_tombstone_was_evicted,
    a_held_deletes_tombstone_is_not_the_one_evicted,
    installs_keep_versions_written_since,
);
