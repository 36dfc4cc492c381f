//! The collector: deletes from this node's PGs the objects of volumes that no
//! longer exist (a delete whose removal did not reach a store, objects a stale writer left
//! behind before an older version fenced it, volumes deleted while a device was elsewhere).
//!
//! Every `interval` a pass lists the volume records (a listing newer than anything written
//! before the pass), reads the volume id counter after it, then walks each store PG by PG. A
//! PG's index is ordered by (volume, index), so the walk asks for the first object after the
//! current volume and lands on the next volume: one small listing per volume per PG, never a
//! scan of the whole store in one request. A volume is removed only when the view says so
//! (`View::collect`): its record was removed, or it has no record in a listing made after its
//! object was seen (the walk lists again for such an id: the pass's own listing may predate a
//! volume created as it began and written through another primary), its id is at most the
//! counter, and every record could be read. Before removing one, the collector marks it gone
//! in the view (writes to it are refused from then on) and waits for writes admitted earlier.
//! Listings and removals are paced at `rate` per second.
//!
//! Only a PG's active primary collects it, and it removes objects as replicated deletes
//! (`pg/primary.rs::Pg::delete_volume`: a tombstone on every member at a version the primary
//! assigns), never by removing them from one member's store: the members of a PG stay
//! identical, and a member's view of the volume records (which replicated writes do not pass
//! through) never decides anything.

use crate::pg::Pg;
use crate::service::NodeShared;
use crate::volumes::Collect;
use basalt_engine::EngineError;
use basalt_meta::{Catalog, IdKind, MetaError};
use basalt_proto::WireError;
use basalt_types::ObjectId;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

/// The shortest time between passes (each starts with a listing of the volume records).
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// How the collector runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CollectConfig {
    /// Time between the end of a pass and the start of the next.
    pub(crate) interval: Duration,
    /// Store calls (listings and removals) per second, at most.
    pub(crate) rate: u32,
}

/// What the collector did since the node started.
#[derive(Debug, Default)]
pub(crate) struct CollectStats {
    /// Passes completed over every store.
    pub(crate) passes: AtomicU64,
    /// Objects and tombstones removed.
    pub(crate) objects: AtomicU64,
}

#[derive(Debug, Error)]
enum CollectError {
    #[error("volume records: {0}")]
    Listing(WireError),
    #[error("volume id counter: {0}")]
    Meta(#[from] MetaError),
    #[error("store: {0}")]
    Store(#[from] EngineError),
    #[error("replicated delete: {0}")]
    Delete(WireError),
}

/// Runs passes until `stop`.
pub(crate) async fn run(
    catalog: Catalog,
    shared: Arc<NodeShared>,
    config: CollectConfig,
    mut stop: watch::Receiver<bool>,
) {
    let mut pacer = Pacer::new(config.rate);
    let interval = config.interval.max(MIN_INTERVAL);
    loop {
        tokio::select! {
            biased;
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let result = tokio::select! {
            biased;
            r = pass(&catalog, &shared, &mut pacer) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match result {
            Ok(0) => {}
            Ok(n) => tracing::info!("collector removed {n} objects of deleted volumes"),
            Err(e) => tracing::warn!("collector pass failed: {e}; trying again later"),
        }
    }
}

/// One pass over every store. Returns how many objects it deleted.
async fn pass(
    catalog: &Catalog,
    shared: &NodeShared,
    pacer: &mut Pacer,
) -> Result<u64, CollectError> {
    shared
        .volumes
        .catch_up()
        .await
        .map_err(CollectError::Listing)?;
    let mut last_id = catalog.last_id(IdKind::Volume).await?;
    let mut removed = 0;
    // A PG that fails (an object of a dead volume still to recover here, a copy that does not
    // verify) does not keep the pass from the PGs after it; the pass then reports the first.
    let mut failed = None;
    for (dev, store) in shared.maps.stores() {
        for pg in store.pgs().await? {
            let Some(primary) = shared.pgs.existing(*dev, pg.pg) else {
                continue;
            };
            if !primary.is_active_primary() {
                continue;
            }
            match walk(catalog, shared, &primary, &mut last_id, pacer).await {
                Ok(n) => removed += n,
                Err(e) => {
                    tracing::debug!(pg = %primary.id, "collecting: {e}; on with the next PG");
                    failed.get_or_insert(e);
                }
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    shared.collector.passes.fetch_add(1, Relaxed);
    Ok(removed)
}

/// Visits each volume with objects in `pg` once, deleting the objects of dead ones. `last_id`
/// is the volume id counter as read after the newest listing.
async fn walk(
    catalog: &Catalog,
    shared: &NodeShared,
    pg: &Arc<Pg>,
    last_id: &mut u64,
    pacer: &mut Pacer,
) -> Result<u64, CollectError> {
    let mut after = None;
    let mut removed = 0;
    loop {
        pacer.tick().await;
        let page = pg.store.list(pg.id, after, 1).await?;
        let Some(first) = page.into_iter().next() else {
            return Ok(removed);
        };
        let volume = first.oid.volume;
        let mut verdict = shared.volumes.claim_for_collection(volume, *last_id, false);
        if verdict == Collect::Relist {
            // The pass's listing may predate the volume (`View::collect`): one made now,
            // after its object was seen, tells.
            shared
                .volumes
                .catch_up()
                .await
                .map_err(CollectError::Listing)?;
            *last_id = catalog.last_id(IdKind::Volume).await?;
            verdict = shared.volumes.claim_for_collection(volume, *last_id, true);
        }
        match verdict {
            Collect::Purge => {
                shared.volumes.drain().await;
                pacer.tick().await;
                let epoch = shared.maps.map().epoch;
                let n = pg
                    .delete_volume(&shared.pgs.ctx, epoch, volume, 0, &|| Ok(()))
                    .await
                    .map_err(CollectError::Delete)?;
                shared.collector.objects.fetch_add(n, Relaxed);
                removed += n;
            }
            Collect::NeverAllocated => tracing::warn!(
                "{} holds objects of volume {volume}, above the last volume id handed out \
                 ({last_id}): was the metadata store restored from an older copy? Left in place",
                pg.dev
            ),
            // (`Relist` only without a listing made after the object was seen.)
            Collect::Exists | Collect::Undecided | Collect::Relist => {}
        }
        // The next volume: past every index of this one.
        after = Some(ObjectId::new(pg.id.pool, volume, u64::MAX));
    }
}

/// Spaces store calls `1/rate` apart (a call that finds the pacer late goes at once).
#[derive(Debug)]
struct Pacer {
    gap: Duration,
    next: Instant,
}

impl Pacer {
    fn new(rate: u32) -> Pacer {
        Pacer {
            gap: Duration::from_secs(1) / rate.max(1),
            next: Instant::now(),
        }
    }

    async fn tick(&mut self) {
        let now = Instant::now();
        if self.next > now {
            tokio::time::sleep_until(self.next).await;
        }
        self.next = self.next.max(now) + self.gap;
    }
}

#[cfg(test)]
#[path = "collect_tests.rs"]
mod tests;
