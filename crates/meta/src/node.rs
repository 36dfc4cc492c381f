//! Nodes (live `basalt node` processes, each registered under a lease) and their devices.
//!
//! A node record exists exactly while the node keeps its lease alive: when the process dies,
//! the lease expires and the record vanishes, and watchers of [`keys::NODES`] see a Delete.
//! Device records are permanent; their state says whether placement may use them.

use crate::catalog::{Catalog, now_secs};
use crate::error::MetaError;
use crate::keys;
use crate::lease::KeepAlive;
use crate::store::{LeaseId, Revision};
use basalt_types::{DeviceId, NodeId};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A live node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: NodeId,
    /// Host name (or any human name) of the node.
    pub name: String,
    /// Data-path address, `"ip:port"`.
    pub addr: String,
    /// Unix seconds when the process started.
    pub started_at: u64,
    /// Software version of the node.
    pub version: String,
}

impl NodeRecord {
    /// A record for a node starting now, with this build's version.
    pub fn new(id: NodeId, name: impl Into<String>, addr: impl Into<String>) -> NodeRecord {
        NodeRecord {
            id,
            name: name.into(),
            addr: addr.into(),
            started_at: now_secs(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// A device (one store on one drive or file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub id: DeviceId,
    pub node: NodeId,
    /// The drive or file the store lives on.
    pub path: String,
    /// Device class, e.g. `"ssd"` or `"hdd"`.
    pub class: String,
    /// Usable bytes.
    pub capacity: u64,
    /// Relative share of data for placement; by convention the capacity in GiB, at least 1.
    pub weight: u32,
    pub state: DeviceState,
}

/// Whether placement may use a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DeviceState {
    /// Serving and holding data.
    Up,
    /// Not answering (its node is gone or its store failed); still counted as holding data.
    Down,
    /// Drained by an operator: holds no data.
    Out,
}

/// The default placement weight of a device of `capacity` bytes: its size in GiB, at least 1.
pub fn default_weight(capacity: u64) -> u32 {
    u32::try_from(capacity >> 30).unwrap_or(u32::MAX).max(1)
}

impl Catalog {
    /// Registers a live node under `lease`: the record vanishes when the lease ends.
    pub async fn register_node_with_lease(
        &self,
        record: &NodeRecord,
        lease: LeaseId,
    ) -> Result<Revision, MetaError> {
        let value = crate::catalog::encode(record);
        self.store()
            .put(&keys::node(record.id), value, Some(lease))
            .await
    }

    /// Registers a live node under a new lease of `ttl` and keeps the lease alive in the
    /// background until the returned handle is dropped or revoked (then the record vanishes,
    /// at the latest `ttl` later). The handle's [`KeepAlive::confirmed`] starts at the moment
    /// the grant was requested. Registering again (after the lease was lost) replaces the
    /// record and moves it to the new lease.
    pub async fn register_node(
        &self,
        record: &NodeRecord,
        ttl: Duration,
    ) -> Result<KeepAlive, MetaError> {
        let sent = tokio::time::Instant::now();
        let lease = self.store().grant_lease(ttl).await?;
        if let Err(e) = self.register_node_with_lease(record, lease).await {
            let _ = self.store().revoke_lease(lease).await;
            return Err(e);
        }
        Ok(KeepAlive::spawn_granted(
            self.store().clone(),
            lease,
            ttl,
            sent,
        ))
    }

    /// A live node.
    pub async fn get_node(&self, id: NodeId) -> Result<Option<NodeRecord>, MetaError> {
        Ok(self.read(&keys::node(id)).await?.map(|(rec, _)| rec))
    }

    /// Every live node, by id.
    pub async fn list_nodes(&self) -> Result<Vec<NodeRecord>, MetaError> {
        self.read_all(keys::NODES).await
    }

    /// Creates or replaces a device record.
    pub async fn put_device(&self, record: &DeviceRecord) -> Result<Revision, MetaError> {
        let value = crate::catalog::encode(record);
        self.store()
            .put(&keys::device(record.id), value, None)
            .await
    }

    pub async fn get_device(&self, id: DeviceId) -> Result<Option<DeviceRecord>, MetaError> {
        Ok(self.read(&keys::device(id)).await?.map(|(rec, _)| rec))
    }

    /// Every device, by id.
    pub async fn list_devices(&self) -> Result<Vec<DeviceRecord>, MetaError> {
        self.read_all(keys::DEVICES).await
    }

    /// Changes a device's state (compare-and-swap: other fields changed meanwhile are kept).
    pub async fn set_device_state(
        &self,
        id: DeviceId,
        state: DeviceState,
    ) -> Result<DeviceRecord, MetaError> {
        let (record, _) = self
            .update(&keys::device(id), |cur: Option<DeviceRecord>| {
                let mut d = cur.ok_or_else(|| MetaError::NoSuchDevice(id.to_string()))?;
                d.state = state;
                Ok(d)
            })
            .await?;
        Ok(record)
    }
}
