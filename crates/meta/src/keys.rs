//! THE key schema: every key Basalt stores in its metadata store is built here, and only here.
//! docs/design/metadata-keys.md documents each key and the format of its value.
//!
//! Numeric ids are zero-padded to a fixed width so that key order is numeric order (a prefix
//! listing returns pools, nodes and devices sorted by id).

use basalt_types::{DeviceId, NodeId, PoolId};

/// The root of the schema. Every key starts with it.
pub const ROOT: &str = "/basalt/";

/// Prefix of the id counters.
pub const IDS: &str = "/basalt/ids/";
/// Prefix of the pool records, keyed by id.
pub const POOLS: &str = "/basalt/pools/";
/// Prefix of the pool-name index (name -> id).
pub const POOL_NAMES: &str = "/basalt/pool-names/";
/// Prefix of the volume records, keyed by name.
pub const VOLUMES: &str = "/basalt/volumes/";
/// Prefix of the live node records (each attached to the node's lease).
pub const NODES: &str = "/basalt/nodes/";
/// Prefix of the device records.
pub const DEVICES: &str = "/basalt/devices/";
/// The published cluster map.
pub const MAP: &str = "/basalt/map";
/// The leader record (attached to the leader's lease).
pub const LEADER: &str = "/basalt/leader";

/// What an id counter counts. Ids of each kind start at 1 and are never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IdKind {
    Pool,
    Volume,
    Node,
    Device,
}

impl IdKind {
    pub fn as_str(self) -> &'static str {
        match self {
            IdKind::Pool => "pool",
            IdKind::Volume => "volume",
            IdKind::Node => "node",
            IdKind::Device => "device",
        }
    }
}

/// `/basalt/ids/<kind>`: the last id handed out.
pub fn id_counter(kind: IdKind) -> String {
    format!("{IDS}{}", kind.as_str())
}

/// `/basalt/pools/<id, 10 digits>`
pub fn pool(id: PoolId) -> String {
    format!("{POOLS}{:010}", id.0)
}

/// `/basalt/pool-names/<name>`
pub fn pool_name(name: &str) -> String {
    format!("{POOL_NAMES}{name}")
}

/// `/basalt/volumes/<name>`
pub fn volume(name: &str) -> String {
    format!("{VOLUMES}{name}")
}

/// `/basalt/nodes/<id, 10 digits>`
pub fn node(id: NodeId) -> String {
    format!("{NODES}{:010}", id.0)
}

/// `/basalt/devices/<id, 10 digits>`
pub fn device(id: DeviceId) -> String {
    format!("{DEVICES}{:010}", id.0)
}

/// The node id in a key under [`NODES`] (e.g. from a watch event).
pub fn parse_node(key: &str) -> Option<NodeId> {
    key.strip_prefix(NODES)?.parse().ok().map(NodeId)
}

/// The device id in a key under [`DEVICES`].
pub fn parse_device(key: &str) -> Option<DeviceId> {
    key.strip_prefix(DEVICES)?.parse().ok().map(DeviceId)
}

/// The pool id in a key under [`POOLS`].
pub fn parse_pool(key: &str) -> Option<PoolId> {
    key.strip_prefix(POOLS)?.parse().ok().map(PoolId)
}

/// The volume name in a key under [`VOLUMES`].
pub fn parse_volume(key: &str) -> Option<&str> {
    key.strip_prefix(VOLUMES).filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_parse_back() {
        assert_eq!(pool(PoolId(3)), "/basalt/pools/0000000003");
        assert_eq!(node(NodeId(12)), "/basalt/nodes/0000000012");
        assert_eq!(device(DeviceId(7)), "/basalt/devices/0000000007");
        assert_eq!(volume("vm-1"), "/basalt/volumes/vm-1");
        assert_eq!(pool_name("fast"), "/basalt/pool-names/fast");
        assert_eq!(id_counter(IdKind::Volume), "/basalt/ids/volume");
        assert_eq!(parse_node(&node(NodeId(12))), Some(NodeId(12)));
        assert_eq!(
            parse_device(&device(DeviceId(u32::MAX))),
            Some(DeviceId(u32::MAX))
        );
        assert_eq!(parse_pool(&pool(PoolId(9))), Some(PoolId(9)));
        assert_eq!(parse_volume("/basalt/volumes/a.b"), Some("a.b"));
        assert_eq!(parse_node("/basalt/devices/0000000001"), None);
        // Zero padding keeps key order = id order.
        assert!(node(NodeId(9)) < node(NodeId(10)));
        // No prefix is a prefix of another family.
        for (a, b) in [(POOLS, POOL_NAMES), (NODES, DEVICES), (MAP, LEADER)] {
            assert!(!a.starts_with(b) && !b.starts_with(a));
        }
    }
}
