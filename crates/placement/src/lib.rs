//! Placement: which devices hold which object. Pure functions over plain data; no I/O, no async.
//!
//! The flow, from an object to the device that serves it:
//!
//! 1. An object `(pool, volume, index)` hashes into one of the pool's placement groups:
//!    [`pg_of`] (xxh3 with a fixed seed, pinned by a test vector so it never changes).
//! 2. The [`ClusterMap`] holds, for every PG of every pool, a [`PgMap`]: `up` (where the PG
//!    should live), `acting` (who holds its data) and `since` (when its serving set last
//!    changed). The serving set is the acting members whose device is up; its first member is
//!    the primary that serves reads and orders writes: [`ClusterMap::locate`],
//!    [`ClusterMap::primary`]. No serving member = the PG is unavailable (never re-homed to a
//!    device without its data).
//! 3. Each device belongs to a node, and the map knows each live node's data-path address:
//!    [`ClusterMap::node_addr`].
//!
//! The leader builds a new map from the cluster's current pools, devices, nodes and PG-ready
//! reports with [`compute`]: `up` gives every PG `replicas` distinct devices that are `in`
//! (up or down: a down device keeps its PGs) in distinct failure domains where possible, device
//! PG counts follow their weights (within one PG of the weighted target when no failure-domain
//! rule is in the way), primaries are balanced too, and a change of devices moves only the PGs
//! it has to; `acting` follows `up` only when the PG's primary reported the PG complete there.
//! [`down_out`] says which down devices have been down long enough to be marked out. The epoch
//! increases only when the map actually changes. The map is stored as a header and chunks
//! ([`MapCodec`](basalt_types::MapCodec), codec.rs). docs/design/placement.md explains the
//! algorithm and its guarantees.
//!
//! Start here: [`compute`] (building a map), [`ClusterMap::locate`] (using one).

mod acting;
mod assign;
mod codec;
mod compute;
mod hash;
mod liveness;
mod map;
mod primary;
mod project;
mod targets;

pub use codec::{CHUNK_PGS, MAP_FORMAT, named_chunks};
pub use compute::{PlacementInput, PoolSpec, compute, is_candidate};
pub use hash::{PG_HASH_SEED, pg_of};
pub use liveness::{DownOut, down_out};
pub use map::{ClusterMap, DeviceInfo, FailureDomain, NodeInfo, PgMap, PoolMap};
pub use project::{Shortfall, arrivals_if_out, shortfalls_if_out};
