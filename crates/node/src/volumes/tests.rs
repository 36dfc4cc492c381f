//! The view's rules (pure), the in-flight drain, and the checks writes go through, against the
//! real embedded metadata store (made unreachable where a test needs it). The view is changed
//! only by the listings the checks make: no watch runs here, so every change the test makes in
//! the catalog is one the node has not seen yet.

use super::*;
use crate::testing::Flaky;
use basalt_meta::{PoolSpec, Revision, VolumeListing, VolumeRecord, VolumeState};
use basalt_types::{PoolId, VolumeId};
use std::sync::Arc;

const OS: u32 = 128 << 10;

fn rec(id: u64, name: &str, size: u64, state: VolumeState) -> VolumeRecord {
    VolumeRecord {
        id: VolumeId(id),
        name: name.into(),
        pool: PoolId(1),
        size,
        created_at: 0,
        state,
    }
}

fn listing(volumes: Vec<VolumeRecord>, unreadable: &[&str], revision: Revision) -> VolumeListing {
    VolumeListing {
        volumes,
        unreadable: unreadable.iter().map(|s| s.to_string()).collect(),
        revision,
    }
}

const ACTIVE: VolumeState = VolumeState::Active;
const DELETING: VolumeState = VolumeState::Deleting;

fn active(size: u64) -> Status {
    Status::Active {
        pool: PoolId(1),
        size,
    }
}

#[test]
fn the_view_keeps_the_newest_state_and_never_revives_a_volume() {
    let mut v = View::default();
    assert_eq!(v.status(VolumeId(1)), Status::Unknown);
    v.apply_listing(&listing(vec![rec(1, "a", 4096, ACTIVE)], &[], 10));
    assert_eq!(v.status(VolumeId(1)), active(4096));
    // A change older than the listing is ignored; a newer one applies.
    v.apply_changed(&rec(1, "a", 8192, ACTIVE), 9);
    assert_eq!(v.status(VolumeId(1)), active(4096));
    v.apply_changed(&rec(1, "a", 8192, ACTIVE), 11);
    assert_eq!(v.status(VolumeId(1)), active(8192));
    // An older listing (a slow one that started earlier) changes nothing.
    v.apply_listing(&listing(vec![rec(1, "a", 4096, ACTIVE)], &[], 10));
    assert_eq!(v.status(VolumeId(1)), active(8192));
    // Deleting is final, removal makes it gone, and nothing brings it back.
    v.apply_changed(&rec(1, "a", 8192, DELETING), 12);
    assert_eq!(v.status(VolumeId(1)), Status::Deleting);
    v.apply_changed(&rec(1, "a", 8192, ACTIVE), 13);
    assert_eq!(v.status(VolumeId(1)), Status::Deleting);
    v.apply_removed("a", 14);
    assert_eq!(v.status(VolumeId(1)), Status::Gone);
    v.apply_changed(&rec(1, "a", 8192, ACTIVE), 15);
    v.apply_listing(&listing(vec![rec(1, "a", 8192, ACTIVE)], &[], 16));
    assert_eq!(v.status(VolumeId(1)), Status::Gone);
    // Re-created under the same name: a new id, the old one stays gone.
    v.apply_changed(&rec(2, "a", 4096, ACTIVE), 17);
    assert_eq!(v.status(VolumeId(2)), active(4096));
    // A removal older than the re-creation does not touch the new volume.
    v.apply_removed("a", 16);
    assert_eq!(v.status(VolumeId(2)), active(4096));
}

#[test]
fn a_listing_removes_what_it_lacks_unless_it_could_not_read_it() {
    let mut v = View::default();
    v.apply_listing(&listing(
        vec![rec(1, "a", 4096, ACTIVE), rec(2, "b", 4096, ACTIVE)],
        &[],
        10,
    ));
    // b's record is rewritten in a form this version cannot read: b stays as it was.
    v.apply_listing(&listing(vec![rec(1, "a", 4096, ACTIVE)], &["b"], 20));
    assert_eq!(v.status(VolumeId(2)), active(4096));
    // a changed at 25 (seen by the watch before a listing at 22 finished): kept.
    v.apply_changed(&rec(1, "a", 8192, ACTIVE), 25);
    v.apply_listing(&listing(vec![], &["b"], 22));
    assert_eq!(v.status(VolumeId(1)), active(8192));
    // Gone from a listing newer than everything known: gone.
    v.apply_listing(&listing(vec![], &[], 30));
    assert_eq!(v.status(VolumeId(1)), Status::Gone);
    assert_eq!(v.status(VolumeId(2)), Status::Gone);
    // A change the watch delivers late, for a volume a newer listing did not have (created
    // and removed before it): gone, never active.
    v.apply_changed(&rec(3, "c", 4096, ACTIVE), 28);
    assert_eq!(v.status(VolumeId(3)), Status::Gone);
    // A change newer than the listing: a new volume.
    v.apply_changed(&rec(4, "d", 4096, ACTIVE), 31);
    assert_eq!(v.status(VolumeId(4)), active(4096));
}

#[test]
fn the_collector_takes_only_volumes_that_cannot_exist() {
    let mut v = View::default();
    assert_eq!(
        v.collect(VolumeId(1), 10, true),
        Collect::Undecided,
        "no listing"
    );
    v.apply_listing(&listing(
        vec![rec(1, "a", 4096, ACTIVE), rec(2, "b", 4096, DELETING)],
        &[],
        10,
    ));
    v.apply_changed(&rec(3, "c", 4096, ACTIVE), 11);
    v.apply_removed("c", 12);
    assert_eq!(v.collect(VolumeId(1), 10, true), Collect::Exists);
    assert_eq!(
        v.collect(VolumeId(2), 10, true),
        Collect::Exists,
        "deleting"
    );
    assert_eq!(v.collect(VolumeId(3), 10, true), Collect::Purge, "removed");
    assert_eq!(
        v.collect(VolumeId(5), 10, true),
        Collect::Purge,
        "no record, id handed out"
    );
    assert_eq!(v.collect(VolumeId(10), 10, true), Collect::Purge);
    assert_eq!(v.collect(VolumeId(11), 10, true), Collect::NeverAllocated);
    // Without a listing made after its objects were seen, no record proves nothing: the
    // volume may have been created as the listing was made.
    assert_eq!(v.collect(VolumeId(5), 10, false), Collect::Relist);
    assert_eq!(v.collect(VolumeId(11), 10, false), Collect::NeverAllocated);
    assert_eq!(v.collect(VolumeId(3), 10, false), Collect::Purge, "removed");
    assert_eq!(v.collect(VolumeId(1), 10, false), Collect::Exists);
    // A removed volume is collected whatever the counter says.
    assert_eq!(v.collect(VolumeId(3), 0, true), Collect::Purge);
    // With an unreadable record, no id without a record can be judged.
    v.apply_listing(&listing(vec![rec(1, "a", 4096, ACTIVE)], &["x"], 20));
    assert_eq!(v.collect(VolumeId(5), 10, true), Collect::Undecided);
    assert_eq!(
        v.collect(VolumeId(2), 10, true),
        Collect::Purge,
        "b was removed"
    );
    v.mark_gone(VolumeId(5));
    assert_eq!(v.status(VolumeId(5)), Status::Gone);
}

#[tokio::test]
async fn a_drain_waits_for_writes_counted_before_it_only() {
    let inflight = Arc::new(Inflight::default());
    let before = inflight.enter();
    let phase = inflight.phase();
    let drain = {
        let inflight = inflight.clone();
        tokio::spawn(async move { inflight.drain().await })
    };
    while inflight.phase() == phase {
        tokio::task::yield_now().await;
    }
    let after = inflight.enter();
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(
        !drain.is_finished(),
        "the drain ended with a write in flight"
    );
    drop(before);
    drain.await.unwrap();
    assert_eq!(inflight.count(), 1, "the later write is still counted");
    drop(after);
    assert_eq!(inflight.count(), 0);
    // Nothing in flight: a drain returns at once.
    inflight.drain().await;
}

/// A write that read the phase before one drain and counts itself in after it (it was
/// descheduled in between) reads the view after that drain's change, so it is one the next
/// drain must wait for.
#[tokio::test]
async fn a_write_that_read_the_phase_before_a_drain_is_waited_for_by_the_next() {
    let inflight = Arc::new(Inflight::default());
    let stale = inflight.phase();
    inflight.drain().await;
    let late = inflight.enter_late(stale);
    let phase = inflight.phase();
    let next = {
        let inflight = inflight.clone();
        tokio::spawn(async move { inflight.drain().await })
    };
    while inflight.phase() == phase {
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(!next.is_finished(), "the drain missed a late write");
    drop(late);
    next.await.unwrap();
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<Flaky>,
    catalog: Catalog,
    volumes: Volumes,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Flaky::open(&dir.path().join("meta.redb")).await;
    let catalog = Catalog::new(store.clone());
    catalog.create_pool(&PoolSpec::new("p")).await.unwrap();
    let volumes = Volumes::new(Some(catalog.clone()));
    volumes.list_now().await.unwrap();
    Fixture {
        _dir: dir,
        store,
        catalog,
        volumes,
    }
}

impl Fixture {
    async fn write(&self, oid: ObjectId, offset: u32, len: usize) -> Result<(), WireError> {
        self.volumes
            .admit_write(&oid, offset, len, OS)
            .await
            .map(drop)
    }

    async fn create(&self, name: &str, size: u64) -> VolumeId {
        self.catalog
            .create_volume(name, size, "p")
            .await
            .unwrap()
            .id
    }
}

fn oid(volume: VolumeId, index: u64) -> ObjectId {
    ObjectId::new(PoolId(1), volume, index)
}

fn code<T>(r: Result<T, WireError>) -> Option<ErrorCode> {
    r.err().map(|e| e.code)
}

#[tokio::test]
async fn a_write_must_end_within_the_volume() {
    let fx = fixture().await;
    // Four objects and one block.
    let v = fx.create("v", 4 * u64::from(OS) + 4096).await;
    assert!(fx.write(oid(v, 0), 0, OS as usize).await.is_ok());
    assert!(fx.write(oid(v, 4), 0, 4096).await.is_ok(), "up to the end");
    let past = Some(ErrorCode::InvalidArgument);
    assert_eq!(code(fx.write(oid(v, 4), 4096, 4096).await), past);
    assert_eq!(code(fx.write(oid(v, 4), 0, 8192).await), past);
    assert_eq!(code(fx.write(oid(v, 4), 4095, 2).await), past);
    assert_eq!(code(fx.write(oid(v, 5), 0, 1).await), past);
    assert_eq!(code(fx.write(oid(v, u64::MAX), 0, 1).await), past);
    let e = fx.write(oid(v, 7), 0, 4096).await.unwrap_err();
    assert!(e.message.contains("past the end"), "{}", e.message);
    // Zeroing and trimming may reach past the end (they only remove data).
    assert!(fx.volumes.admit_discard(&oid(v, 4)).await.is_ok());
    assert!(fx.volumes.admit_discard(&oid(v, 9)).await.is_ok());
    // The same volume id in another pool is not this volume.
    let elsewhere = ObjectId::new(PoolId(2), v, 0);
    let e = fx
        .volumes
        .admit_write(&elsewhere, 0, 1, OS)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert_eq!(
        code(fx.volumes.admit_discard(&elsewhere).await),
        Some(ErrorCode::NotFound)
    );
}

#[tokio::test]
async fn a_write_is_refused_only_by_a_view_newer_than_its_arrival() {
    let fx = fixture().await;
    let os = u64::from(OS);
    let v = fx.create("v", 2 * os).await;
    // Created after the node's last listing: written at once (the node lists again).
    assert!(fx.write(oid(v, 1), 0, 4096).await.is_ok());
    // Grown behind the node's back: writes past the old end go through.
    fx.catalog.resize_volume("v", 4 * os).await.unwrap();
    assert!(fx.write(oid(v, 3), 0, OS as usize).await.is_ok());
    // Shrunk behind its back: the stale view still admits a write past the new end (the
    // window DeleteVolume closes), and after a sync it refuses it.
    fx.catalog.resize_volume("v", os).await.unwrap();
    assert!(fx.write(oid(v, 2), 0, 4096).await.is_ok());
    fx.volumes.sync().await.unwrap();
    assert_eq!(
        code(fx.write(oid(v, 2), 0, 4096).await),
        Some(ErrorCode::InvalidArgument)
    );
    assert!(fx.write(oid(v, 0), 0, 4096).await.is_ok(), "before the end");
    // Marked deleting: refused once seen, zeroing too.
    fx.catalog.mark_volume_deleting("v").await.unwrap();
    fx.volumes.sync().await.unwrap();
    let e = fx.write(oid(v, 0), 0, 4096).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(e.message.contains("being deleted"), "{}", e.message);
    assert_eq!(
        code(fx.volumes.admit_discard(&oid(v, 0)).await),
        Some(ErrorCode::NotFound)
    );
    // Removed, and re-created under the same name: the old id stays refused.
    fx.catalog.remove_volume("v").await.unwrap();
    let again = fx.create("v", 2 * os).await;
    let e = fx.write(oid(v, 0), 0, 4096).await.unwrap_err();
    assert!(e.message.contains("was deleted"), "{}", e.message);
    assert!(fx.write(oid(again, 0), 0, 4096).await.is_ok());
    // An id never handed out.
    let e = fx.write(oid(VolumeId(99), 0), 0, 4096).await.unwrap_err();
    assert!(e.message.contains("does not exist"), "{}", e.message);
}

#[tokio::test]
async fn without_the_metadata_store_known_writes_go_on_and_the_rest_waits() {
    let fx = fixture().await;
    let v = fx.create("v", 1 << 20).await;
    fx.volumes.sync().await.unwrap();
    fx.store.set_down(true);
    assert!(fx.write(oid(v, 0), 0, 4096).await.is_ok());
    // A refusal needs a listing the store cannot give: Busy, which clients retry.
    for r in [
        fx.write(oid(v, 99), 0, 4096).await,
        fx.write(oid(VolumeId(50), 0), 0, 4096).await,
        fx.volumes.sync().await,
    ] {
        assert_eq!(code(r), Some(ErrorCode::Busy));
    }
    fx.store.set_down(false);
    assert_eq!(
        code(fx.write(oid(v, 99), 0, 4096).await),
        Some(ErrorCode::InvalidArgument)
    );
}

#[tokio::test]
async fn concurrent_refusals_share_their_listings() {
    let fx = Arc::new(fixture().await);
    let before = fx.store.lists();
    // The first refusal's listing waits while the other 49 arrive (each needs a listing that
    // starts after it arrived).
    fx.store.hold_lists(true);
    let writes: Vec<_> = (0..50)
        .map(|i| {
            let fx = fx.clone();
            tokio::spawn(async move { fx.write(oid(VolumeId(70), i), 0, 4096).await })
        })
        .collect();
    while fx.store.held_lists() == 0 {
        tokio::task::yield_now().await;
    }
    // One runtime thread: after these yields every spawned write has run up to its wait.
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    fx.store.hold_lists(false);
    for w in writes {
        assert_eq!(code(w.await.unwrap()), Some(ErrorCode::NotFound));
    }
    // The listing under way answers the first; one more serves all 49 that came during it
    // (one per request would be 50).
    let lists = fx.store.lists() - before;
    assert_eq!(lists, 2, "50 concurrent refusals made {lists} listings");
}

#[tokio::test]
async fn sync_waits_for_the_writes_admitted_before_it() {
    let fx = Arc::new(fixture().await);
    let v = fx.create("v", 1 << 20).await;
    // A write, and a write-zeroes or trim (which may zero a range a later grow's writes fill:
    // none admitted before a `DeleteVolume` may land after it, a review found them uncounted).
    for name in ["write", "discard"] {
        let held = match name {
            "write" => fx.volumes.admit_write(&oid(v, 0), 0, 4096, OS).await,
            _ => fx.volumes.admit_discard(&oid(v, 1)).await,
        }
        .unwrap();
        let phase = fx.volumes.inflight.phase();
        let sync = {
            let fx = fx.clone();
            tokio::spawn(async move { fx.volumes.sync().await })
        };
        while fx.volumes.inflight.phase() == phase {
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!sync.is_finished(), "sync ended with a {name} in flight");
        drop(held);
        sync.await.unwrap().unwrap();
    }
}
