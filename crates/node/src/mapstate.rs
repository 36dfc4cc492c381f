//! The node's view of the cluster map, and the checks every data-path request goes through:
//! the request's epoch is current, and this node holds the primary of the object's PG.

use basalt_engine::Store;
use basalt_placement::ClusterMap;
use basalt_proto::{ErrorCode, WireError};
use basalt_types::{DeviceId, Epoch, ObjectId, PgId};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a request carrying a newer epoch than the node's waits for the node to catch up.
const CATCH_UP: Duration = Duration::from_secs(2);

pub(crate) struct MapState {
    current: RwLock<Arc<ClusterMap>>,
    epoch_tx: watch::Sender<Epoch>,
    stores: BTreeMap<DeviceId, Store>,
    /// Newer maps are not installed while set (a test's map watch that lags); the newest one
    /// offered meanwhile waits here and is installed when they are let in again.
    held_back: std::sync::atomic::AtomicBool,
    #[cfg(feature = "sim")]
    waiting: parking_lot::Mutex<Option<ClusterMap>>,
}

impl MapState {
    pub(crate) fn new(stores: BTreeMap<DeviceId, Store>) -> MapState {
        let (epoch_tx, _) = watch::channel(Epoch(0));
        MapState {
            current: RwLock::new(Arc::new(ClusterMap::default())),
            epoch_tx,
            stores,
            held_back: Default::default(),
            #[cfg(feature = "sim")]
            waiting: Default::default(),
        }
    }

    /// Holds newer maps back (`true`: none is installed, as if this node's map watch lagged)
    /// or lets them in again, the newest one offered meanwhile first (the watch catches up);
    /// for tests.
    #[cfg(feature = "sim")]
    pub(crate) fn hold_back(&self, held: bool) {
        self.held_back
            .store(held, std::sync::atomic::Ordering::SeqCst);
        if !held && let Some(map) = self.waiting.lock().take() {
            self.offer(map);
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

    pub(crate) fn stores(&self) -> &BTreeMap<DeviceId, Store> {
        &self.stores
    }

    /// Installs a newer map; older or equal epochs are ignored.
    pub(crate) fn offer(&self, map: ClusterMap) -> bool {
        if self.held_back.load(std::sync::atomic::Ordering::SeqCst) {
            #[cfg(feature = "sim")]
            {
                let mut waiting = self.waiting.lock();
                if waiting.as_ref().is_none_or(|w| w.epoch < map.epoch) {
                    *waiting = Some(map);
                }
            }
            return false;
        }
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

    /// The local device holding the primary of `oid`'s PG: the first up member of its acting
    /// set. `NotPrimary` when that device is elsewhere; `Busy` (the client retries) when no
    /// acting member is up: the PG is unavailable and is never served from a device that may
    /// not hold its data.
    pub(crate) fn primary_of(
        &self,
        map: &ClusterMap,
        oid: &ObjectId,
    ) -> Result<(PgId, DeviceId), WireError> {
        let (pg, entry) = map.locate(oid).ok_or_else(|| {
            WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "pool {} does not exist in map epoch {}",
                    oid.pool, map.epoch.0
                ),
            )
        })?;
        let primary = map.pg_primary(entry).ok_or_else(|| {
            WireError::new(
                ErrorCode::Busy,
                format!(
                    "{pg} is unavailable in map epoch {}: none of its acting devices {:?} is up",
                    map.epoch.0, entry.acting
                ),
            )
        })?;
        if !self.stores.contains_key(&primary) {
            let mut e = WireError::new(
                ErrorCode::NotPrimary,
                format!("{pg} has primary {primary}, which is not on this node"),
            );
            e.epoch = map.epoch;
            return Err(e);
        }
        Ok((pg, primary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_engine::sim::SimDisk;
    use basalt_engine::{FormatOptions, OpenOptions};
    use basalt_placement::{DeviceInfo, FailureDomain, NodeInfo, PgMap, PoolMap};
    use basalt_types::{NodeId, PoolId, VolumeId};

    fn state() -> MapState {
        let disk = SimDisk::new(64 << 20);
        let opts = FormatOptions {
            device_id: DeviceId(1),
            ..FormatOptions::default()
        };
        basalt_engine::format_sim(&disk, &opts).unwrap();
        let store = Store::open_sim(&disk, &OpenOptions::default()).unwrap();
        MapState::new(BTreeMap::from([(DeviceId(1), store)]))
    }

    /// A map at `epoch` whose single pool has one PG acting on `acting` (up = acting), with
    /// the devices in `down` down.
    fn map(epoch: u64, acting: Vec<DeviceId>, down: &[u32]) -> ClusterMap {
        let mut m = ClusterMap {
            epoch: Epoch(epoch),
            ..ClusterMap::default()
        };
        for d in [1, 2] {
            let mut info = DeviceInfo::new(NodeId(d), "ssd", 1, 128 << 10);
            info.up = !down.contains(&d);
            m.devices.insert(DeviceId(d), info);
            m.nodes.insert(
                NodeId(d),
                NodeInfo {
                    addr: format!("127.0.0.1:{d}"),
                },
            );
        }
        m.pools.insert(
            PoolId(1),
            PoolMap {
                pg_count: 1,
                replicas: acting.len() as u8,
                min_size: 1,
                object_size: 128 << 10,
                failure_domain: FailureDomain::Host,
                device_class: None,
                pgs: vec![PgMap {
                    up: acting.clone(),
                    acting,
                    since: Epoch(epoch),
                }],
            },
        );
        m
    }

    const OID: ObjectId = ObjectId {
        pool: PoolId(1),
        volume: VolumeId(1),
        index: 0,
    };

    #[tokio::test]
    async fn stale_epochs_are_refused_with_the_current_one() {
        let s = state();
        assert!(s.offer(map(3, vec![DeviceId(1)], &[])));
        assert!(
            !s.offer(map(2, vec![DeviceId(2)], &[])),
            "an older map replaced a newer one"
        );
        assert!(s.admit(Epoch(3)).await.is_ok());
        let e = s.admit(Epoch(2)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::StaleEpoch);
        assert_eq!(e.epoch, Epoch(3));
    }

    #[tokio::test]
    async fn a_newer_epoch_waits_for_the_node_to_catch_up() {
        let s = Arc::new(state());
        s.offer(map(1, vec![DeviceId(1)], &[]));
        let waiter = {
            let s = s.clone();
            tokio::spawn(async move { s.admit(Epoch(2)).await.map(|m| m.epoch) })
        };
        tokio::task::yield_now().await;
        s.offer(map(2, vec![DeviceId(1)], &[]));
        assert_eq!(waiter.await.unwrap().unwrap(), Epoch(2));
    }

    #[test]
    fn only_the_primary_serves() {
        let s = state();
        let m = map(1, vec![DeviceId(2), DeviceId(1)], &[]);
        let e = s.primary_of(&m, &OID).err().unwrap();
        assert_eq!(e.code, ErrorCode::NotPrimary);
        let m = map(1, vec![DeviceId(1), DeviceId(2)], &[]);
        let (pg, dev) = s.primary_of(&m, &OID).unwrap();
        assert_eq!((pg.pg, dev), (0, DeviceId(1)));
    }

    #[test]
    fn the_first_up_acting_member_serves_and_a_pg_with_none_is_unavailable() {
        let s = state();
        // Device 2 (elsewhere) is down: device 1, next in the acting set, is the primary.
        let m = map(1, vec![DeviceId(2), DeviceId(1)], &[2]);
        assert!(s.primary_of(&m, &OID).is_ok());
        // Device 1's own PG while device 1 is marked down: unavailable, not served.
        let m = map(1, vec![DeviceId(1)], &[1]);
        let e = s.primary_of(&m, &OID).err().unwrap();
        assert_eq!(e.code, ErrorCode::Busy);
        assert!(e.message.contains("unavailable"), "{}", e.message);
        // `up` moved to device 1 but the data is still on (down) device 2: not served here.
        let mut m = map(1, vec![DeviceId(2)], &[2]);
        m.pools.get_mut(&PoolId(1)).unwrap().pgs[0].up = vec![DeviceId(1)];
        let e = s.primary_of(&m, &OID).err().unwrap();
        assert_eq!(e.code, ErrorCode::Busy);
    }
}
