//! Identifiers, epochs, versions and sizes shared by every Basalt crate.
//!
//! This crate does no I/O and has no async code; every other crate may depend on it.
//!
//! - [`ObjectId`]: the unit of placement and of atomicity, `(pool, volume, index)`.
//! - [`Epoch`]: the cluster-map epoch carried by every data-path operation (fencing).
//! - [`Version`]: the per-object version assigned by the primary.
//! - [`size`]: parsing and printing of sizes such as `8GiB`.
//! - [`name`]: validation of volume and pool names.
//! - [`MapParts`]: the cluster map as stored (header and chunks), the contract between
//!   placement (which encodes it) and the metadata store (which stores it).

pub mod domain;
pub mod ids;
pub mod mapparts;
pub mod name;
pub mod size;

pub use domain::FailureDomain;
pub use ids::{
    DeviceId, Epoch, NodeId, ObjectId, PgId, PoolId, Term, Version, VolumeId, unique_u64,
};
pub use mapparts::{ChunkId, MapCodec, MapParts};

/// The checksum and I/O granule: every 4 KiB block on a device carries its own CRC-32C.
pub const BLOCK_SIZE: u64 = 4096;

/// Default object size of a pool: the unit of placement, of atomic writes and of device slots.
pub const DEFAULT_OBJECT_SIZE: u32 = 128 * 1024;
