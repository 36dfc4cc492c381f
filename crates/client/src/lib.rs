//! The Basalt client library: the data path every frontend (NBD, later S3 and FUSE) uses.
//!
//! Flow of a volume write:
//! 1. [`Cluster::open_volume`] looks the volume up by name in the metadata store and returns a
//!    [`Volume`] (id, pool, size, object size).
//! 2. [`Volume::write`] cuts the byte range into per-object pieces ([`split`]): object `i` of a
//!    volume holds bytes `[i * object_size, (i + 1) * object_size)`.
//! 3. For each piece, [`retry::call_primary`] finds the object's placement group and primary device
//!    in the cached cluster map, sends the request with the map's epoch over a [`link`] to the node
//!    that owns the device, and retries after refreshing the map when the node answers
//!    `StaleEpoch`/`NotPrimary` or the connection drops.
//! 4. Pieces go out concurrently; the write completes when all of them have.
//!
//! Reads mirror this in [`read`]. Links are TCP connections with pipelining (`basalt-link`) or,
//! for a node in the same process, a direct call into it ([`Cluster::add_local_node`]).
//!
//! Start here: [`Volume`], [`Cluster`].

pub mod admin;
pub mod cluster;
pub mod error;
mod flushset;
/// Links to nodes (see `basalt-link`).
pub use basalt_link as link;
mod mapcache;
pub mod meta;
mod openvolumes;
mod read;
mod remote_meta;
mod remove;
pub mod retry;
pub mod split;
#[cfg(test)]
mod testing;
pub mod volume;
mod write;

pub use cluster::{Cluster, ClusterConfig};
pub use error::ClientError;
pub use remote_meta::RemoteMetaStore;
pub use volume::{Durability, Volume, VolumeOptions};
