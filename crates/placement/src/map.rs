//! The cluster map: what every client and node needs to route an object to the device that
//! serves it.
//!
//! Stored as a header and chunks of PG tables (see `codec.rs` and
//! docs/design/metadata-keys.md).

use crate::hash::pg_of;
pub use basalt_types::FailureDomain;
use basalt_types::{DeviceId, Epoch, NodeId, ObjectId, PgId, PoolId};
use std::collections::BTreeMap;

/// One published placement: pools with their PG tables, and the devices and nodes they name.
/// Every data-path operation carries the `epoch` of the map its sender used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterMap {
    /// Strictly increases with every change; `Epoch(0)` is the empty map before the first
    /// publication.
    pub epoch: Epoch,
    pub pools: BTreeMap<PoolId, PoolMap>,
    /// Every known device, up or down, in or out (so that every id in a PG resolves).
    pub devices: BTreeMap<DeviceId, DeviceInfo>,
    /// The live nodes (registered under a lease) and their addresses.
    pub nodes: BTreeMap<NodeId, NodeInfo>,
}

/// The placement of one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolMap {
    pub pg_count: u32,
    pub replicas: u8,
    /// Serving copies a PG needs to go active (below it, its I/O waits).
    pub min_size: u8,
    pub object_size: u32,
    pub failure_domain: FailureDomain,
    /// Only devices of this class hold the pool's data; `None` = any class.
    pub device_class: Option<String>,
    /// `pgs[i]` is PG `i`.
    pub pgs: Vec<PgMap>,
}

/// Where one PG lives and who serves it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PgMap {
    /// Where the PG should live: placement over devices that are `in` (weight > 0, right class,
    /// right object size), whether they are up or down. A down device keeps its PGs here.
    pub up: Vec<DeviceId>,
    /// Who holds the PG's current data and serves it now (like Ceph's acting set / pg_temp).
    /// The serving set is the acting members whose device is up, in acting order; the first
    /// of them is the primary. Empty serving set = PG unavailable (I/O waits, then fails);
    /// it is never handed to devices without its data, unless every acting device is down
    /// and marked out by the operator (`acting.rs`: then the up set's primary finds the data
    /// by peering).
    pub acting: Vec<DeviceId>,
    /// The interval: the map epoch at which this PG's serving set (members and order) last
    /// changed. Replication fences sub-operations by it.
    pub since: Epoch,
}

/// A device as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub node: NodeId,
    /// Device class, e.g. `"ssd"` or `"hdd"`; matched against a pool's `device_class`.
    pub class: String,
    /// Relative share of PGs (by convention the capacity in GiB, at least 1). 0 = holds nothing.
    pub weight: u32,
    /// The object size the device was formatted with; only pools of that size use it (0 =
    /// unknown: no pool uses it).
    pub object_size: u32,
    /// The device answers: its node is registered (lease alive) and has not marked it down.
    pub up: bool,
    /// The device is meant to hold data. Out devices (by an operator, or automatically after
    /// being down longer than the down-out interval) get no new PGs in `up`.
    pub r#in: bool,
    /// Out because it was down longer than the down-out interval (not by an operator): it
    /// goes back in when it comes back up.
    pub auto_out: bool,
    /// Unix seconds since when the device is down (`None` while up). Carried from map to map,
    /// so a new leader continues the clock.
    pub down_since: Option<u64>,
}

impl DeviceInfo {
    /// A device that is up and in, with no history.
    pub fn new(node: NodeId, class: impl Into<String>, weight: u32, object_size: u32) -> Self {
        DeviceInfo {
            node,
            class: class.into(),
            weight,
            object_size,
            up: true,
            r#in: true,
            auto_out: false,
            down_since: None,
        }
    }
}

/// A node as clients see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// Data-path address, `"ip:port"`.
    pub addr: String,
}

impl PoolMap {
    /// The PGs whose serving set is smaller than `replicas` (but not empty).
    pub fn degraded(&self, map: &ClusterMap) -> usize {
        let want = usize::from(self.replicas);
        self.pgs
            .iter()
            .map(|pg| map.serving(pg).count())
            .filter(|&n| n > 0 && n < want)
            .count()
    }

    /// The PGs with no serving device: their I/O waits and then fails.
    pub fn unavailable(&self, map: &ClusterMap) -> usize {
        self.pgs
            .iter()
            .filter(|pg| map.serving(pg).next().is_none())
            .count()
    }

    /// The PGs whose data is not (yet) where placement wants it (`acting != up`).
    pub fn remapped(&self) -> usize {
        self.pgs.iter().filter(|pg| pg.acting != pg.up).count()
    }
}

impl ClusterMap {
    /// The PG of `oid`, or `None` when the pool is not in the map.
    pub fn locate(&self, oid: &ObjectId) -> Option<(PgId, &PgMap)> {
        let pool = self.pools.get(&oid.pool)?;
        let pg = pg_of(oid, pool.pg_count);
        let entry = pool.pgs.get(pg as usize)?;
        Some((PgId { pool: oid.pool, pg }, entry))
    }

    /// One PG.
    pub fn pg(&self, pg: PgId) -> Option<&PgMap> {
        self.pools.get(&pg.pool)?.pgs.get(pg.pg as usize)
    }

    /// Whether `device` is in the map and up.
    pub fn is_up(&self, device: DeviceId) -> bool {
        self.devices.get(&device).is_some_and(|d| d.up)
    }

    /// The serving set of a PG: its acting members that are up, in acting order.
    pub fn serving<'a>(&'a self, pg: &'a PgMap) -> impl Iterator<Item = DeviceId> + 'a {
        pg.acting.iter().copied().filter(|d| self.is_up(*d))
    }

    /// The primary of a PG: the first up member of its acting set; `None` = unavailable.
    pub fn pg_primary(&self, pg: &PgMap) -> Option<DeviceId> {
        self.serving(pg).next()
    }

    /// The primary device of `oid`'s PG, if the pool exists and the PG is available.
    pub fn primary(&self, oid: &ObjectId) -> Option<DeviceId> {
        self.locate(oid).and_then(|(_, pg)| self.pg_primary(pg))
    }

    /// The node that holds `device`.
    pub fn device_node(&self, device: DeviceId) -> Option<NodeId> {
        self.devices.get(&device).map(|d| d.node)
    }

    /// The data-path address of the node that holds `device`, if that node is alive.
    pub fn node_addr(&self, device: DeviceId) -> Option<&str> {
        let node = self.device_node(device)?;
        self.nodes.get(&node).map(|n| n.addr.as_str())
    }

    /// Every PG in which `device` is a member of `up`, with its position (0 = first).
    pub fn pgs_of_device(&self, device: DeviceId) -> Vec<(PgId, usize)> {
        let mut out = Vec::new();
        for (pool_id, pool) in &self.pools {
            for (i, entry) in pool.pgs.iter().enumerate() {
                if let Some(pos) = entry.up.iter().position(|d| *d == device) {
                    let pg = PgId {
                        pool: *pool_id,
                        pg: i as u32,
                    };
                    out.push((pg, pos));
                }
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use basalt_types::VolumeId;

    /// Two devices on one node; PG 0 = [1, 2], PG 1 = [2, 1]; device 2 is down in PG 1's
    /// primary position.
    pub(crate) fn small_map() -> ClusterMap {
        let mut map = ClusterMap {
            epoch: Epoch(3),
            ..ClusterMap::default()
        };
        map.nodes.insert(
            NodeId(1),
            NodeInfo {
                addr: "127.0.0.1:7001".into(),
            },
        );
        for d in [1, 2] {
            map.devices
                .insert(DeviceId(d), DeviceInfo::new(NodeId(1), "ssd", 1, 131072));
        }
        let pg = |a: u32, b: u32| PgMap {
            up: vec![DeviceId(a), DeviceId(b)],
            acting: vec![DeviceId(a), DeviceId(b)],
            since: Epoch(2),
        };
        map.pools.insert(
            PoolId(1),
            PoolMap {
                pg_count: 2,
                replicas: 2,
                min_size: 1,
                object_size: 131072,
                failure_domain: FailureDomain::Device,
                device_class: None,
                pgs: vec![pg(1, 2), pg(2, 1)],
            },
        );
        map
    }

    #[test]
    fn locate_follows_pg_of_and_the_primary_is_the_first_up_acting_member() {
        let mut map = small_map();
        let oid = ObjectId::new(PoolId(1), VolumeId(7), 3);
        let (pg, entry) = map.locate(&oid).expect("pool 1 is in the map");
        assert_eq!(pg.pg, pg_of(&oid, 2));
        assert_eq!(entry, &map.pools[&PoolId(1)].pgs[pg.pg as usize]);
        let first = entry.acting[0];
        let second = entry.acting[1];
        assert_eq!(map.primary(&oid), Some(first));
        assert_eq!(map.node_addr(first), Some("127.0.0.1:7001"));
        assert_eq!(map.locate(&ObjectId::new(PoolId(2), VolumeId(7), 3)), None);
        assert_eq!(map.pgs_of_device(DeviceId(2)).len(), 2);

        map.devices.get_mut(&first).expect("device").up = false;
        assert_eq!(map.primary(&oid), Some(second), "the next up member serves");
        let pool = &map.pools[&PoolId(1)];
        assert_eq!(pool.degraded(&map), 2);
        assert_eq!(pool.unavailable(&map), 0);
        map.devices.get_mut(&second).expect("device").up = false;
        assert_eq!(map.primary(&oid), None, "no up member: unavailable");
        assert_eq!(map.pools[&PoolId(1)].unavailable(&map), 2);
    }
}
