//! Placement: which devices hold which object. Pure functions over plain data; no I/O, no async.
//!
//! The flow, from an object to the devices that store it:
//!
//! 1. An object `(pool, volume, index)` hashes into one of the pool's placement groups:
//!    [`pg_of`] (xxh3 with a fixed seed, pinned by a test vector so it never changes).
//! 2. The [`ClusterMap`] lists, for every PG of every pool, an ordered set of devices; the first
//!    is the primary that serves reads and orders writes: [`ClusterMap::locate`],
//!    [`ClusterMap::primary`].
//! 3. Each device belongs to a node, and the map knows each node's data-path address:
//!    [`ClusterMap::node_addr`].
//!
//! The leader builds a new map from the cluster's current pools, devices and nodes with
//! [`compute`]: every PG gets `replicas` distinct devices in distinct failure domains where
//! possible, device PG counts follow their weights (within one PG of the weighted target when
//! no failure-domain rule is in the way), primaries are balanced too, and a change of devices
//! moves only the PGs it has to. The epoch increases only when the map actually changes.
//! docs/design/placement.md explains the algorithm and its guarantees.
//!
//! Start here: [`compute`] (building a map), [`ClusterMap::locate`] (using one).

mod assign;
mod compute;
mod hash;
mod map;
mod primary;
mod targets;

pub use compute::{PlacementInput, PoolSpec, compute};
pub use hash::{PG_HASH_SEED, pg_of};
pub use map::{ClusterMap, DeviceInfo, FailureDomain, MapFormat, NodeInfo, PoolMap};
