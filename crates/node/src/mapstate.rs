//! The node's view of the cluster map, and the checks every data-path request goes through:
//! the request's epoch is current, and this node holds the primary of the object's PG.

use basalt_engine::Store;
use basalt_placement::ClusterMap;
use basalt_proto::{ErrorCode, WireError};
use basalt_types::{DeviceId, Epoch, ObjectId};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a request carrying a newer epoch than the node's waits for the node to catch up.
const CATCH_UP: Duration = Duration::from_secs(2);

pub(crate) struct MapState {
    current: RwLock<Arc<ClusterMap>>,
    epoch_tx: watch::Sender<Epoch>,
    stores: HashMap<DeviceId, Store>,
}

impl MapState {
    pub(crate) fn new(stores: HashMap<DeviceId, Store>) -> MapState {
        let (epoch_tx, _) = watch::channel(Epoch(0));
        MapState {
            current: RwLock::new(Arc::new(ClusterMap::default())),
            epoch_tx,
            stores,
        }
    }

    pub(crate) fn map(&self) -> Arc<ClusterMap> {
        self.current.read().clone()
    }

    /// Notified with every newly installed epoch.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Epoch> {
        self.epoch_tx.subscribe()
    }

    pub(crate) fn epoch(&self) -> Epoch {
        self.current.read().epoch
    }

    pub(crate) fn stores(&self) -> &HashMap<DeviceId, Store> {
        &self.stores
    }

    /// Installs a newer map; older or equal epochs are ignored.
    pub(crate) fn offer(&self, map: ClusterMap) -> bool {
        let mut cur = self.current.write();
        if map.epoch <= cur.epoch {
            return false;
        }
        let epoch = map.epoch;
        *cur = Arc::new(map);
        drop(cur);
        self.epoch_tx.send_replace(epoch);
        tracing::info!(%epoch, "installed cluster map");
        true
    }

    /// Checks a request's epoch against the node's: older is refused (fencing), newer waits
    /// briefly for the node's own map to catch up.
    pub(crate) async fn admit(&self, sent: Epoch) -> Result<Arc<ClusterMap>, WireError> {
        let map = self.map();
        if sent == map.epoch {
            return Ok(map);
        }
        if sent < map.epoch {
            return Err(WireError::stale_epoch(map.epoch, sent));
        }
        let mut rx = self.epoch_tx.subscribe();
        let caught_up = tokio::time::timeout(CATCH_UP, rx.wait_for(|e| *e >= sent)).await;
        let map = self.map();
        match caught_up {
            Ok(Ok(_)) if map.epoch == sent => Ok(map),
            Ok(Ok(_)) => Err(WireError::stale_epoch(map.epoch, sent)),
            _ => Err(WireError::new(
                ErrorCode::Busy,
                format!(
                    "node is at map epoch {} and has not seen epoch {} yet",
                    map.epoch.0, sent.0
                ),
            )),
        }
    }

    /// Like [`MapState::primary_store`], for a write. A PG whose acting set has more than one
    /// device needs replication, which this version does not do: such writes are refused rather
    /// than acknowledged with fewer copies than the pool promises.
    pub(crate) fn primary_store_for_write(
        &self,
        map: &ClusterMap,
        oid: &ObjectId,
    ) -> Result<&Store, WireError> {
        if let Some((pg, devices)) = map.locate(oid)
            && devices.len() > 1
        {
            return Err(WireError::new(
                ErrorCode::Unsupported,
                format!(
                    "{pg} has {} copies; replicated writes are not supported by this version",
                    devices.len()
                ),
            ));
        }
        self.primary_store(map, oid)
    }

    /// The local store holding the primary copy of `oid`, or `NotPrimary`.
    pub(crate) fn primary_store(
        &self,
        map: &ClusterMap,
        oid: &ObjectId,
    ) -> Result<&Store, WireError> {
        let (pg, devices) = map.locate(oid).ok_or_else(|| {
            WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "pool {} does not exist in map epoch {}",
                    oid.pool, map.epoch.0
                ),
            )
        })?;
        let primary = devices.first().ok_or_else(|| {
            WireError::new(ErrorCode::Busy, format!("{pg} has no device in the map"))
        })?;
        self.stores.get(primary).ok_or_else(|| {
            let mut e = WireError::new(
                ErrorCode::NotPrimary,
                format!("{pg} has primary {primary}, which is not on this node"),
            );
            e.epoch = map.epoch;
            e
        })
    }
}
