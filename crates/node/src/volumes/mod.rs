//! Volume fencing: a gateway that missed a shrink or a delete (cut off from the metadata store,
//! or just behind) cannot write past a volume's end, into a deleted volume, or create objects
//! for a volume id that no longer exists.
//!
//! The node follows the volume records ([`follow`], `Catalog::watch_volumes`) into a
//! [`View`]: each volume's pool, size and state, and the ids it saw deleted. Before a store
//! call, `write.rs` asks:
//! - [`Volumes::admit_write`] (Write): the volume must be active, in the object's pool, and the
//!   written bytes must end within its size (the object index times the object size plus the
//!   end of the range within the object). Past the end → `InvalidArgument` (NBD `EINVAL`);
//!   deleting, deleted or unknown → `NotFound` (NBD `EIO`). Neither is retried by clients.
//! - [`Volumes::admit_discard`] (WriteZeroes, Trim): the volume must be active and in the
//!   object's pool; the range may reach past the end: zeroing only removes data, and a resize's
//!   discard zeroes the tail of the last object past the committed end.
//!
//! Both count the request in flight until the store has finished it ([`Admitted`]).
//!
//! **While the view lags, the rule is: a request is refused only by a view at least as new as
//! the moment it arrived.** The check against the view in memory is the fast path (a read lock
//! and a hash lookup). When it fails, the node lists the volume records again (one listing at
//! a time, shared by every request that arrived before it started: [`Volumes::catch_up`]) and
//! checks once more. A legitimate writer writes only what its handle allows, and its handle's
//! size and state come from the metadata store before the write was sent, so it is never
//! refused for a grow or a creation the node has not seen yet; a writer that missed a shrink or
//! a delete is refused once the node has seen it.
//!
//! The other direction (a view that has not yet seen a shrink or delete lets a stale write
//! through) is closed by `DeleteVolume`, which every delete sends after marking the volume
//! deleting and every resize sends when it discards (after committing a shrink, before
//! committing a grow), before zeroing the partial object: the node first brings its view up to
//! date and waits for the writes it admitted under an older view ([`Volumes::sync`]), then
//! removes the objects. Nothing a stale writer sent before can land after the removal, and
//! everything it sends after is refused.

#[cfg(test)]
mod delete_tests;
mod inflight;
#[cfg(test)]
mod tests;
mod view;

pub(crate) use inflight::Admitted;
use inflight::Inflight;
pub(crate) use view::{Collect, Status, View};

use crate::service::NodeShared;
use basalt_meta::{Catalog, MetaError, VolumeEvent};
use basalt_proto::{ErrorCode, WireError};
use basalt_types::{ObjectId, PoolId, VolumeId};
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;
use tokio::sync::watch;

/// How long a listing of the volume records may take before the request waiting for it gets
/// `Busy`.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// The node's view of the volumes, and the checks writes go through.
pub(crate) struct Volumes {
    view: RwLock<View>,
    inflight: Inflight,
    /// Where listings come from; `None` only in unit tests of other parts (every check that
    /// needs a listing then fails with `Busy`).
    catalog: Option<Catalog>,
    listings: Listings,
}

/// Listings of the volume records: numbered as they start; one at a time.
#[derive(Default)]
struct Listings {
    started: AtomicU64,
    turn: tokio::sync::Mutex<()>,
    /// The number of the last listing that finished, and its error if it failed.
    last: Mutex<(u64, Option<String>)>,
}

/// Why a write is refused.
enum Refusal {
    PastEnd { size: u64, end: Option<u64> },
    Missing(Status),
    WrongPool,
}

impl Volumes {
    pub(crate) fn new(catalog: Option<Catalog>) -> Volumes {
        Volumes {
            view: RwLock::new(View::default()),
            inflight: Inflight::default(),
            catalog,
            listings: Listings::default(),
        }
    }

    /// Admits a Write of `len` bytes at `offset` of `oid` (objects of `object_size` bytes).
    /// Hold the answer until the store has finished the write.
    pub(crate) async fn admit_write(
        &self,
        oid: &ObjectId,
        offset: u32,
        len: usize,
        object_size: u32,
    ) -> Result<Admitted<'_>, WireError> {
        let end = oid
            .index
            .checked_mul(u64::from(object_size))
            .and_then(|start| start.checked_add(u64::from(offset)))
            .and_then(|at| at.checked_add(len as u64));
        let check = |view: &View| check(view, oid, Reach::UpTo(end));
        let admitted = self.inflight.enter();
        if check(&self.view.read()).is_ok() {
            return Ok(admitted);
        }
        drop(admitted);
        self.catch_up().await?;
        let admitted = self.inflight.enter();
        let verdict = check(&self.view.read());
        verdict.map(|()| admitted).map_err(|r| self.refusal(oid, r))
    }

    /// Admits a WriteZeroes or Trim of `oid`: the volume must be active (any range). Counted
    /// in flight like a write (hold the answer until the store has finished): zeros landing
    /// after a `DeleteVolume` could erase what a grow's writes put there since.
    pub(crate) async fn admit_discard(&self, oid: &ObjectId) -> Result<Admitted<'_>, WireError> {
        let admitted = self.inflight.enter();
        if check(&self.view.read(), oid, Reach::Anywhere).is_ok() {
            return Ok(admitted);
        }
        drop(admitted);
        self.catch_up().await?;
        let admitted = self.inflight.enter();
        let verdict = check(&self.view.read(), oid, Reach::Anywhere);
        verdict.map(|()| admitted).map_err(|r| self.refusal(oid, r))
    }

    /// Brings the view up to date (a listing that started after this call) and waits for every
    /// write admitted under an older view to finish. `DeleteVolume` calls it before removing
    /// objects.
    pub(crate) async fn sync(&self) -> Result<(), WireError> {
        self.catch_up().await?;
        self.inflight.drain().await;
        Ok(())
    }

    /// What `DeleteVolume` (of the objects of `volume` in `pool` from index `from_index` on,
    /// objects of `object_size` bytes if the map knows the pool) does before it removes
    /// anything: [`Volumes::sync`], then counts itself in flight, as a write, and only then
    /// checks [`Volumes::admit_delete`]. The removal stays counted while the returned guard
    /// lives (the caller holds it until it removed its last object): a later one (a grow's
    /// discard after a shrink's whose client gave up) waits for it in its [`Volumes::sync`],
    /// so the grow commits only once the older removal is over.
    pub(crate) async fn before_delete(
        &self,
        pool: PoolId,
        volume: VolumeId,
        from_index: u64,
        object_size: Option<u32>,
    ) -> Result<Admitted<'_>, WireError> {
        self.sync().await?;
        let removing = self.inflight.enter();
        self.admit_delete(pool, volume, from_index, object_size)?;
        Ok(removing)
    }

    /// Checks a `DeleteVolume` of the objects of `volume` in `pool` from index `from_index` on
    /// (objects of `object_size` bytes; `None`: the map does not know the pool, nothing to
    /// check), after [`Volumes::sync`] and again before each page of objects it removes: it may
    /// not remove data inside an active volume's size. A delete is sent once the volume is
    /// marked deleting, and a
    /// resize's discard starts at the smaller of the old and new size, so only a discard
    /// prepared for a size the volume no longer has (a concurrent resize grew it since) can
    /// reach inside; it is refused rather than removing data written since.
    pub(crate) fn admit_delete(
        &self,
        pool: PoolId,
        volume: VolumeId,
        from_index: u64,
        object_size: Option<u32>,
    ) -> Result<(), WireError> {
        let Some(object_size) = object_size else {
            return Ok(());
        };
        let view = self.view.read();
        match view.status(volume) {
            Status::Active { pool: p, size } if p == pool => {
                let from = from_index.saturating_mul(u64::from(object_size));
                if from < size {
                    return Err(WireError::new(
                        ErrorCode::InvalidArgument,
                        format!(
                            "deleting the objects of volume {volume} from byte {from} would remove \
                             data inside its {size} bytes (metadata revision {}): it was \
                             resized since this discard was prepared",
                            view.listed()
                        ),
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Waits for every write admitted before this call to finish.
    pub(crate) async fn drain(&self) {
        self.inflight.drain().await;
    }

    /// Changes when a drain starts (tests wait on it).
    #[cfg(test)]
    pub(crate) fn drain_phase(&self) -> usize {
        self.inflight.phase()
    }

    /// Writes and removals counted in flight (tests).
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> u64 {
        self.inflight.count()
    }

    /// Lists the volume records now (or joins a listing that started after this call) and
    /// applies the listing. `Busy` when the metadata store does not answer.
    pub(crate) async fn catch_up(&self) -> Result<(), WireError> {
        let need = self.listings.started.load(SeqCst) + 1;
        let _turn = self.listings.turn.lock().await;
        {
            let (done, error) = &*self.listings.last.lock();
            if *done >= need {
                return error.as_ref().map_or(Ok(()), |e| Err(busy(e)));
            }
        }
        let number = self.listings.started.fetch_add(1, SeqCst) + 1;
        let result = self.list_now().await;
        let error = result.as_ref().err().map(ToString::to_string);
        *self.listings.last.lock() = (number, error);
        result.map_err(|e| busy(&e.to_string()))
    }

    /// Lists the volume records and applies the listing.
    pub(crate) async fn list_now(&self) -> Result<(), MetaError> {
        let Some(catalog) = &self.catalog else {
            return Err(MetaError::Backend(
                "this node has no metadata store to list volumes from".into(),
            ));
        };
        let listing = tokio::time::timeout(LIST_TIMEOUT, catalog.list_volumes_at())
            .await
            .map_err(|_| MetaError::Unavailable {
                endpoint: "the metadata store".into(),
                detail: format!("listing the volumes took more than {LIST_TIMEOUT:?}"),
            })??;
        self.view.write().apply_listing(&listing);
        Ok(())
    }

    /// Applies a change from the watch (a listing is applied by [`Volumes::catch_up`], which
    /// also knows which records it could not read).
    pub(crate) fn apply(&self, event: &VolumeEvent) {
        let mut view = self.view.write();
        match event {
            VolumeEvent::Changed { record, revision } => view.apply_changed(record, *revision),
            VolumeEvent::Removed { name, revision } => view.apply_removed(name, *revision),
            VolumeEvent::All { .. } => {}
        }
    }

    /// Whether the collector may remove the objects of `id` (see [`View::collect`]); when it
    /// may, the id is marked gone first, so no write to it is admitted from now on.
    pub(crate) fn claim_for_collection(
        &self,
        id: VolumeId,
        last_id: u64,
        listed_after_seen: bool,
    ) -> Collect {
        let mut view = self.view.write();
        let verdict = view.collect(id, last_id, listed_after_seen);
        if verdict == Collect::Purge {
            view.mark_gone(id);
        }
        verdict
    }

    fn refusal(&self, oid: &ObjectId, why: Refusal) -> WireError {
        let listed = self.view.read().listed();
        let volume = oid.volume;
        match why {
            Refusal::PastEnd { size, end } => WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "write to {oid} ends {} past the end of volume {volume} ({size} bytes at \
                     metadata revision {listed}): the volume was shrunk; this gateway has not \
                     seen it",
                    end.map_or("at an offset beyond 2^64".into(), |e| format!(
                        "at byte {e}"
                    ))
                ),
            ),
            Refusal::Missing(status) => WireError::new(
                ErrorCode::NotFound,
                format!(
                    "volume {volume} {} (metadata revision {listed}); reconnect to use a volume",
                    match status {
                        Status::Deleting => "is being deleted",
                        Status::Gone => "was deleted",
                        _ => "does not exist",
                    }
                ),
            ),
            Refusal::WrongPool => WireError::new(
                ErrorCode::NotFound,
                format!("volume {volume} is not in pool {}", oid.pool),
            ),
        }
    }
}

/// Where in the volume a request reaches.
#[derive(Clone, Copy)]
enum Reach {
    /// A Write: up to this byte of the volume (`None`: beyond 2^64).
    UpTo(Option<u64>),
    /// A WriteZeroes or Trim: any range.
    Anywhere,
}

/// The check against the view in memory.
fn check(view: &View, oid: &ObjectId, reach: Reach) -> Result<(), Refusal> {
    match view.status(oid.volume) {
        Status::Active { pool, .. } if pool != oid.pool => Err(Refusal::WrongPool),
        Status::Active { size, .. } => match reach {
            Reach::UpTo(end) if end.is_none_or(|e| e > size) => Err(Refusal::PastEnd { size, end }),
            _ => Ok(()),
        },
        other => Err(Refusal::Missing(other)),
    }
}

fn busy(detail: &str) -> WireError {
    WireError::new(
        ErrorCode::Busy,
        format!("cannot read the volume records to check this request: {detail}; retry"),
    )
}

/// Applies every change of the volume records to the node's view until `stop`. A new listing
/// from the watch (its start, or after it was lost) makes the node list the records itself.
pub(crate) async fn follow(catalog: Catalog, shared: Arc<NodeShared>, stop: watch::Receiver<bool>) {
    let mut stop = stop;
    loop {
        let rx = tokio::select! {
            biased;
            r = catalog.watch_volumes() => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match rx {
            Ok(mut rx) => loop {
                let event = tokio::select! {
                    biased;
                    e = rx.recv() => e,
                    _ = stop.wait_for(|s| *s) => return,
                };
                match event {
                    Some(VolumeEvent::All { .. }) => {
                        if let Err(e) = shared.volumes.catch_up().await {
                            // Changes may have been missed: watch (and list) again.
                            tracing::warn!("listing the volumes failed: {}", e.message);
                            break;
                        }
                    }
                    Some(event) => shared.volumes.apply(&event),
                    None => break,
                }
            },
            Err(e) => tracing::warn!("watching the volumes failed: {e}"),
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
