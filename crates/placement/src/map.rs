//! The cluster map: what every client and node needs to route an object to its devices.
//!
//! Serialised as JSON and published under `/basalt/map` by the leader (see
//! docs/design/metadata-keys.md); the JSON carries `"v": 1`, checked on load.

use crate::hash::pg_of;
pub use basalt_types::FailureDomain;
use basalt_types::{DeviceId, Epoch, NodeId, ObjectId, PgId, PoolId};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::{BTreeMap, BTreeSet};

/// One published placement: pools with their PG -> devices tables, and the devices and nodes
/// they name. Every data-path operation carries the `epoch` of the map its sender used.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Format version of the serialised map (`"v": 1`).
    pub v: MapFormat,
    /// Strictly increases with every change; `Epoch(0)` is the empty map before the first
    /// publication.
    pub epoch: Epoch,
    pub pools: BTreeMap<PoolId, PoolMap>,
    pub devices: BTreeMap<DeviceId, DeviceInfo>,
    pub nodes: BTreeMap<NodeId, NodeInfo>,
}

/// The placement of one pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMap {
    pub pg_count: u32,
    pub replicas: u8,
    pub object_size: u32,
    pub failure_domain: FailureDomain,
    /// Only devices of this class hold the pool's data; `None` = any class.
    #[serde(default)]
    pub device_class: Option<String>,
    /// `pgs[i]` is the ordered device set of PG `i`: `pgs[i][0]` is the primary. Shorter than
    /// `replicas` (possibly empty) when too few devices are eligible; see `degraded`.
    pub pgs: Vec<Vec<DeviceId>>,
    /// The PGs that have fewer than `replicas` devices.
    #[serde(default)]
    pub degraded: BTreeSet<u32>,
}

/// A device as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub node: NodeId,
    /// Device class, e.g. `"ssd"` or `"hdd"`; matched against a pool's `device_class`.
    pub class: String,
    /// Relative share of PGs (by convention the capacity in GiB, at least 1). 0 = holds nothing.
    pub weight: u32,
    /// The device answers (its node is alive and the store is open).
    pub up: bool,
    /// The device is meant to hold data. An operator marks a device out to drain it.
    pub r#in: bool,
}

impl DeviceInfo {
    /// Whether placement may put data on this device: up, in and with a positive weight.
    pub fn eligible(&self) -> bool {
        self.up && self.r#in && self.weight > 0
    }
}

/// A node as clients see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Data-path address, `"ip:port"`.
    pub addr: String,
}

impl ClusterMap {
    /// The PG of `oid` and its ordered device set (first = primary), or `None` when the pool is
    /// not in the map.
    pub fn locate(&self, oid: &ObjectId) -> Option<(PgId, &[DeviceId])> {
        let pool = self.pools.get(&oid.pool)?;
        let pg = pg_of(oid, pool.pg_count);
        let devices = pool.pgs.get(pg as usize)?;
        Some((PgId { pool: oid.pool, pg }, devices.as_slice()))
    }

    /// The primary device of `oid`'s PG, if the pool exists and the PG has a device.
    pub fn primary(&self, oid: &ObjectId) -> Option<DeviceId> {
        self.locate(oid)
            .and_then(|(_, devices)| devices.first().copied())
    }

    /// The ordered device set of one PG.
    pub fn pg_devices(&self, pg: PgId) -> Option<&[DeviceId]> {
        let pool = self.pools.get(&pg.pool)?;
        pool.pgs.get(pg.pg as usize).map(Vec::as_slice)
    }

    /// The node that holds `device`.
    pub fn device_node(&self, device: DeviceId) -> Option<NodeId> {
        self.devices.get(&device).map(|d| d.node)
    }

    /// The data-path address of the node that holds `device`.
    pub fn node_addr(&self, device: DeviceId) -> Option<&str> {
        let node = self.device_node(device)?;
        self.nodes.get(&node).map(|n| n.addr.as_str())
    }

    /// Every PG in which `device` is a member, with its position in the set (0 = primary).
    pub fn pgs_of_device(&self, device: DeviceId) -> Vec<(PgId, usize)> {
        let mut out = Vec::new();
        for (pool_id, pool) in &self.pools {
            for (i, devices) in pool.pgs.iter().enumerate() {
                if let Some(pos) = devices.iter().position(|d| *d == device) {
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

/// The format version of a serialised [`ClusterMap`]: written as `1`, and a map with any other
/// version is refused on load (a newer leader's map needs a newer client).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapFormat;

impl MapFormat {
    pub const VERSION: u32 = 1;
}

impl Serialize for MapFormat {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(Self::VERSION)
    }
}

impl<'de> Deserialize<'de> for MapFormat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u32::deserialize(d)?;
        if v == Self::VERSION {
            Ok(MapFormat)
        } else {
            Err(serde::de::Error::custom(format!(
                "cluster map format version {v} is not supported by this build (it reads \
                 version {}); upgrade basalt",
                Self::VERSION
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_types::VolumeId;

    fn small_map() -> ClusterMap {
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
            map.devices.insert(
                DeviceId(d),
                DeviceInfo {
                    node: NodeId(1),
                    class: "ssd".into(),
                    weight: 1,
                    up: true,
                    r#in: true,
                },
            );
        }
        map.pools.insert(
            PoolId(1),
            PoolMap {
                pg_count: 2,
                replicas: 2,
                object_size: 131072,
                failure_domain: FailureDomain::Device,
                device_class: None,
                pgs: vec![
                    vec![DeviceId(1), DeviceId(2)],
                    vec![DeviceId(2), DeviceId(1)],
                ],
                degraded: BTreeSet::new(),
            },
        );
        map
    }

    #[test]
    fn locate_follows_pg_of() {
        let map = small_map();
        let oid = ObjectId::new(PoolId(1), VolumeId(7), 3);
        let (pg, devices) = map.locate(&oid).expect("pool 1 is in the map");
        assert_eq!(pg.pg, pg_of(&oid, 2));
        assert_eq!(
            devices,
            map.pools[&PoolId(1)].pgs[pg.pg as usize].as_slice()
        );
        assert_eq!(map.primary(&oid), Some(devices[0]));
        assert_eq!(map.node_addr(devices[0]), Some("127.0.0.1:7001"));
        assert_eq!(map.locate(&ObjectId::new(PoolId(2), VolumeId(7), 3)), None);
        assert_eq!(map.pgs_of_device(DeviceId(2)).len(), 2);
    }

    #[test]
    fn json_round_trips_and_carries_the_version() {
        let map = small_map();
        let json = serde_json::to_string(&map).expect("serialise");
        assert!(json.starts_with(r#"{"v":1,"epoch":3,"#), "{json}");
        assert!(json.contains(r#""in":true"#), "{json}");
        assert!(json.contains(r#""failure_domain":"device""#), "{json}");
        let back: ClusterMap = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, map);
        let future = json.replacen(r#""v":1"#, r#""v":2"#, 1);
        let err = serde_json::from_str::<ClusterMap>(&future).expect_err("v2 must be refused");
        assert!(err.to_string().contains("upgrade basalt"), "{err}");
    }
}
