//! The client's copy of the cluster map: replaced whenever the metadata store publishes a newer
//! epoch, and refreshed on demand when a node says the client's epoch is stale.

use basalt_placement::ClusterMap;
use basalt_types::Epoch;
use parking_lot::RwLock;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub(crate) struct MapCache {
    current: RwLock<Arc<ClusterMap>>,
    epoch_tx: watch::Sender<Epoch>,
}

impl MapCache {
    pub(crate) fn new(initial: Option<ClusterMap>) -> MapCache {
        let map = initial.unwrap_or_default();
        let (epoch_tx, _) = watch::channel(map.epoch);
        MapCache {
            current: RwLock::new(Arc::new(map)),
            epoch_tx,
        }
    }

    pub(crate) fn get(&self) -> Arc<ClusterMap> {
        self.current.read().clone()
    }

    /// Installs `map` if it is newer than the current one. Returns whether it was installed.
    pub(crate) fn offer(&self, map: ClusterMap) -> bool {
        let mut cur = self.current.write();
        if map.epoch <= cur.epoch {
            return false;
        }
        let epoch = map.epoch;
        *cur = Arc::new(map);
        drop(cur);
        self.epoch_tx.send_replace(epoch);
        true
    }

    /// Waits until the map's epoch is at least `epoch`, or `timeout` passes.
    pub(crate) async fn wait_for(&self, epoch: Epoch, timeout: Duration) -> bool {
        let mut rx = self.epoch_tx.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|e| *e >= epoch))
            .await
            .is_ok()
    }

    /// Waits until the map's epoch is at least `epoch`, however long that takes. No timer: every
    /// request in flight waits like this for a map that routes it elsewhere.
    pub(crate) async fn wait_until(&self, epoch: Epoch) {
        let mut rx = self.epoch_tx.subscribe();
        if rx.wait_for(|e| *e >= epoch).await.is_err() {
            // The sender lives as long as the cache: not reached while anyone borrows it.
            std::future::pending::<()>().await;
        }
    }
}
