//! THE key schema: every key Basalt stores in its metadata store is built here, and only here.
//! docs/design/metadata-keys.md documents each key and the format of its value.
//!
//! Numeric ids are zero-padded to a fixed width so that key order is numeric order (a prefix
//! listing returns pools, nodes and devices sorted by id).

use basalt_types::{ChunkId, DeviceId, Epoch, NodeId, PgId, PoolId};

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
/// Prefix of the published cluster map: [`MAP_HEADER`] and the chunks under [`MAP_CHUNKS`].
pub const MAP: &str = "/basalt/map/";
/// The cluster map's header (format, epoch, devices, nodes, pools, chunk list).
pub const MAP_HEADER: &str = "/basalt/map/header";
/// Prefix of the chunks of the cluster map's PG tables.
pub const MAP_CHUNKS: &str = "/basalt/map/chunks/";
/// Where map format 1 kept the whole map as one value; refused when found.
pub const LEGACY_MAP: &str = "/basalt/map";
/// Prefix of the PG-ready reports (a primary completed a PG on its `up` set).
pub const PG_READY: &str = "/basalt/pg-ready/";
/// Prefix of the PG histories (intervals since each PG was last clean).
pub const PG_HISTORY: &str = "/basalt/pg-history/";
/// The leader record (attached to the leader's lease).
pub const LEADER: &str = "/basalt/leader";
/// The cluster-wide settings an operator changes at runtime (`basalt config set`).
pub const SETTINGS: &str = "/basalt/settings";
/// Prefix of the marks of removed nodes and devices (`basalt node remove`, `basalt device
/// remove`): a removed id never registers again.
pub const REMOVED: &str = "/basalt/removed/";
/// Prefix of the failure reports (a node cannot reach another), each attached to the
/// reporter's lease.
pub const FAILURE_REPORTS: &str = "/basalt/failure-reports/";

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

/// `/basalt/removed/nodes/<id, 10 digits>`
pub fn removed_node(id: NodeId) -> String {
    format!("{REMOVED}nodes/{:010}", id.0)
}

/// `/basalt/removed/devices/<id, 10 digits>`
pub fn removed_device(id: DeviceId) -> String {
    format!("{REMOVED}devices/{:010}", id.0)
}

/// `/basalt/map/chunks/<pool, 10 digits>/<index, 10 digits>/<written epoch, 20 digits>`
pub fn map_chunk(id: ChunkId) -> String {
    format!(
        "{MAP_CHUNKS}{:010}/{:010}/{:020}",
        id.pool.0, id.index, id.written.0
    )
}

/// `/basalt/pg-ready/<pool, 10 digits>/<pg, 10 digits>`
pub fn pg_ready(pg: PgId) -> String {
    format!("{PG_READY}{:010}/{:010}", pg.pool.0, pg.pg)
}

/// `/basalt/pg-history/<pool, 10 digits>/<pg, 10 digits>`
pub fn pg_history(pg: PgId) -> String {
    format!("{PG_HISTORY}{:010}/{:010}", pg.pool.0, pg.pg)
}

/// `/basalt/failure-reports/<accused, 10 digits>/<reporter, 10 digits>`
pub fn failure_report(reporter: NodeId, accused: NodeId) -> String {
    format!("{FAILURE_REPORTS}{:010}/{:010}", accused.0, reporter.0)
}

/// `(reporter, accused)` in a key under [`FAILURE_REPORTS`].
pub fn parse_failure_report(key: &str) -> Option<(NodeId, NodeId)> {
    let (accused, reporter) = key.strip_prefix(FAILURE_REPORTS)?.split_once('/')?;
    Some((
        NodeId(reporter.parse().ok()?),
        NodeId(accused.parse().ok()?),
    ))
}

/// The chunk id in a key under [`MAP_CHUNKS`].
pub fn parse_map_chunk(key: &str) -> Option<ChunkId> {
    let mut parts = key.strip_prefix(MAP_CHUNKS)?.split('/');
    let pool = PoolId(parts.next()?.parse().ok()?);
    let index = parts.next()?.parse().ok()?;
    let written = Epoch(parts.next()?.parse().ok()?);
    parts.next().is_none().then_some(ChunkId {
        pool,
        index,
        written,
    })
}

/// The PG in a key under [`PG_READY`].
pub fn parse_pg_ready(key: &str) -> Option<PgId> {
    let (pool, pg) = key.strip_prefix(PG_READY)?.split_once('/')?;
    Some(PgId {
        pool: PoolId(pool.parse().ok()?),
        pg: pg.parse().ok()?,
    })
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
        assert_eq!(removed_node(NodeId(2)), "/basalt/removed/nodes/0000000002");
        assert_eq!(
            removed_device(DeviceId(7)),
            "/basalt/removed/devices/0000000007"
        );
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
        let chunk = ChunkId {
            pool: PoolId(2),
            index: 3,
            written: Epoch(40),
        };
        assert_eq!(
            map_chunk(chunk),
            "/basalt/map/chunks/0000000002/0000000003/00000000000000000040"
        );
        assert_eq!(parse_map_chunk(&map_chunk(chunk)), Some(chunk));
        assert_eq!(parse_map_chunk(MAP_HEADER), None);
        let pg = PgId {
            pool: PoolId(1),
            pg: 77,
        };
        assert_eq!(pg_ready(pg), "/basalt/pg-ready/0000000001/0000000077");
        assert_eq!(parse_pg_ready(&pg_ready(pg)), Some(pg));
        let report = failure_report(NodeId(2), NodeId(5));
        assert_eq!(report, "/basalt/failure-reports/0000000005/0000000002");
        assert_eq!(parse_failure_report(&report), Some((NodeId(2), NodeId(5))));
        assert_eq!(parse_failure_report(&pg_ready(pg)), None);
        // Chunks sort before the header, so a listing or a poller meets them first.
        assert!(map_chunk(chunk).as_str() < MAP_HEADER);
        // No prefix is a prefix of another family (the legacy map key is only ever read
        // with `get`).
        for (a, b) in [
            (POOLS, POOL_NAMES),
            (NODES, DEVICES),
            (MAP, LEADER),
            (MAP, PG_READY),
            (POOLS, PG_READY),
            (FAILURE_REPORTS, PG_READY),
            (FAILURE_REPORTS, LEADER),
        ] {
            assert!(!a.starts_with(b) && !b.starts_with(a));
        }
    }
}
