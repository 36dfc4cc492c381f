//! The collector: removes from this node's stores the objects and tombstones of volumes that no
//! longer exist (a delete whose removal did not reach a store, objects a stale writer left
//! behind before an older version fenced it, volumes deleted while a device was elsewhere).
//!
//! Every `interval` a pass lists the volume records (a listing newer than anything written
//! before the pass), reads the volume id counter after it, then walks each store PG by PG. A
//! PG's index is ordered by (volume, index), so the walk asks for the first object after the
//! current volume and lands on the next volume: one small listing per volume per PG, never a
//! scan of the whole store in one request. A volume is removed only when the view says so
//! (`View::collect`): its record was removed, or it has no record, its id is at most the
//! counter, and every record could be read. Before removing one, the collector marks it gone
//! in the view (writes to it are refused from then on) and waits for writes admitted earlier.
//! Listings and removals are paced at `rate` per second; removals are flushed per volume and
//! PG (a crash before the flush leaves objects the next pass removes again).

use crate::service::NodeShared;
use crate::volumes::Collect;
use basalt_engine::{EngineError, Store, WriteOptions};
use basalt_meta::{Catalog, IdKind, MetaError};
use basalt_proto::WireError;
use basalt_types::{ObjectId, PgId};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

/// How many objects one listing returns while removing a volume's objects.
const PAGE: usize = 256;

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
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let result = tokio::select! {
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

/// One pass over every store. Returns how many objects and tombstones it removed.
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
    let last_id = catalog.last_id(IdKind::Volume).await?;
    let mut removed = 0;
    for store in shared.maps.stores().values() {
        for pg in store.pgs().await? {
            removed += walk(shared, store, pg.pg, last_id, pacer).await?;
        }
    }
    shared.collector.passes.fetch_add(1, Relaxed);
    Ok(removed)
}

/// Visits each volume with objects in `pg` once, removing the objects of dead ones.
async fn walk(
    shared: &NodeShared,
    store: &Store,
    pg: PgId,
    last_id: u64,
    pacer: &mut Pacer,
) -> Result<u64, CollectError> {
    let mut after = None;
    let mut removed = 0;
    loop {
        pacer.tick().await;
        let Some(first) = store.list(pg, after, 1).await?.into_iter().next() else {
            return Ok(removed);
        };
        let volume = first.oid.volume;
        match shared.volumes.claim_for_collection(volume, last_id) {
            Collect::Purge => {
                shared.volumes.drain().await;
                let n = purge(store, first.oid, first.pg, pacer).await?;
                shared.collector.objects.fetch_add(n, Relaxed);
                removed += n;
            }
            Collect::NeverAllocated => tracing::warn!(
                "{} holds objects of volume {volume}, above the last volume id handed out \
                 ({last_id}): was the metadata store restored from an older copy? Left in place",
                store.info().device_id
            ),
            Collect::Exists | Collect::Undecided => {}
        }
        // The next volume: past every index of this one.
        after = Some(ObjectId::new(pg.pool, volume, u64::MAX));
    }
}

/// Removes the objects and tombstones of `first`'s volume in its PG (`pg`, within its pool),
/// from `first` on, then flushes. Returns how many.
async fn purge(
    store: &Store,
    first: ObjectId,
    pg: u32,
    pacer: &mut Pacer,
) -> Result<u64, EngineError> {
    let opts = WriteOptions::buffered().in_pg(pg);
    let pg_id = PgId {
        pool: first.pool,
        pg,
    };
    pacer.tick().await;
    store.purge(first, opts).await?;
    let (mut removed, mut cursor) = (1, first);
    loop {
        pacer.tick().await;
        let page = store.list(pg_id, Some(cursor), PAGE).await?;
        let mine: Vec<ObjectId> = page
            .iter()
            .map(|o| o.oid)
            .take_while(|oid| oid.volume == first.volume)
            .collect();
        for &oid in &mine {
            pacer.tick().await;
            store.purge(oid, opts).await?;
            removed += 1;
            cursor = oid;
        }
        if mine.len() < PAGE {
            break;
        }
    }
    store.flush().await?;
    Ok(removed)
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
