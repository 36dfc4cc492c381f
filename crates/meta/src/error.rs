//! [`MetaError`]: everything that can go wrong in the metadata layer, with messages that say
//! what to do.

use crate::store::LeaseId;
use basalt_types::name::NameError;
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MetaError {
    // --- the store ---
    #[error(
        "metadata store {endpoint} is unavailable: {detail}; check that it is running and reachable"
    )]
    Unavailable { endpoint: String, detail: String },
    #[error("metadata store request failed: {0}")]
    Backend(String),
    #[error("embedded metadata file {path}: {detail}")]
    Embedded { path: String, detail: String },
    #[error("{0} has expired or was revoked; grant a new lease and register again")]
    LeaseNotFound(LeaseId),
    #[error("invalid transaction: {0}")]
    InvalidTxn(String),
    #[error(
        "record at '{key}' is unreadable: {detail}; it was written by another version or damaged"
    )]
    Corrupt { key: String, detail: String },
    #[error(
        "record at '{key}' has format version {found}, this build reads version {supported}; \
         upgrade basalt"
    )]
    UnsupportedVersion {
        key: String,
        found: u32,
        supported: u32,
    },
    #[error("too much contention on '{key}': gave up after {attempts} attempts; retry later")]
    Contention { key: String, attempts: u32 },

    // --- the catalog ---
    #[error(transparent)]
    InvalidName(#[from] NameError),
    #[error("invalid size {size} for volume '{name}': {reason}")]
    InvalidSize {
        name: String,
        size: u64,
        reason: String,
    },
    #[error("invalid pool '{name}': {reason}")]
    InvalidPool { name: String, reason: String },
    #[error("invalid setting: {0}")]
    InvalidSetting(String),
    #[error("volume '{0}' already exists; pick another name or delete it first")]
    VolumeExists(String),
    #[error("volume '{0}' is being deleted; run the delete again to finish it")]
    VolumeDeleting(String),
    #[error("volume '{0}' must be marked deleting before its record is removed")]
    VolumeNotDeleting(String),
    #[error(
        "volume '{name}' was resized to {found} bytes by someone else while this resize expected {expected}; look at it again and retry"
    )]
    VolumeChanged {
        name: String,
        expected: u64,
        found: u64,
    },
    #[error("no volume named '{0}'; list volumes to see the names")]
    NoSuchVolume(String),
    #[error("pool '{0}' already exists; pick another name")]
    PoolExists(String),
    #[error("no pool '{0}'; list pools to see the names, or create it first")]
    NoSuchPool(String),
    #[error("no device {0}; list devices to see the ids")]
    NoSuchDevice(String),
    /// A PG's history changed since it was read: another primary activated it meanwhile.
    #[error("the history of {0} changed meanwhile (another primary is peering it); peering again")]
    HistoryChanged(String),
    #[error(
        "the cluster map changed under us (expected revision {expected:?}, found {found:?}); \
         reload it and recompute"
    )]
    MapConflict {
        expected: Option<i64>,
        found: Option<i64>,
    },
    #[error("this process is no longer the leader (the leader key was lost or taken over)")]
    NotLeader,
    #[error(
        "the cluster map at '{key}' has format version 1, written by an older basalt; this \
         build keeps the map under /basalt/map/ in format 2 and cannot serve that cluster's \
         data: run the older basalt, or start a new cluster"
    )]
    LegacyMap { key: String },
    #[error("pool '{pool}' still holds volumes ({volumes}); delete them first")]
    PoolInUse { pool: String, volumes: String },
    #[error("pool '{0}' is being deleted; run `basalt pool delete {0}` again to finish or undo it")]
    PoolDeleting(String),
    #[error("device {device} belongs to {owner}, not to {node}; give each node its own devices")]
    DeviceOwned {
        device: String,
        owner: String,
        node: String,
    },
    #[error(
        "{device} was removed from the cluster (`{by}`, at unix time {at}): it may not register \
         again, its data is stale; take it off the node's --device list, or erase the drive \
         (at least its first and last MiB: a Basalt store is never reformatted) to use it as a \
         new device"
    )]
    DeviceRemoved { device: String, by: String, at: u64 },
    #[error(
        "{0} was declared lost (`basalt device lost`): it stays down and out for good; to use \
         the drive again, remove the device (`basalt device remove`) and erase it"
    )]
    DeviceLost(String),
    #[error(
        "{0} is up: its node is registered and reports it working; only a device that is down \
         may be declared lost (stop its node, or wait until it reports the device down)"
    )]
    DeviceInUse(String),
    #[error(
        "{node} was removed from the cluster (`{by}`, at unix time {at}): it may not register \
         again, its devices' data is stale; to use this host again start it as a new node: an \
         empty --data directory, and each device erased (at least its first and last MiB: a \
         Basalt store is never reformatted)"
    )]
    NodeRemoved { node: String, by: String, at: u64 },

    // --- the etcd child process ---
    #[error("could not start etcd: {0}")]
    EtcdStart(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl MetaError {
    pub(crate) fn corrupt(key: &str, detail: impl std::fmt::Display) -> MetaError {
        MetaError::Corrupt {
            key: key.to_string(),
            detail: detail.to_string(),
        }
    }

    /// Whether retrying the same call later may succeed (the store was unreachable).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            MetaError::Unavailable { .. } | MetaError::Contention { .. }
        )
    }
}
