//! Removed devices and nodes: `basalt device remove` and `basalt node remove` forget a device,
//! or a node with all of its devices, for good. The records go and a mark stays
//! (`/basalt/removed/...`), in one transaction: a removed id never registers again
//! ([`Catalog::register_device`] and [`Catalog::register_node`] check the mark in the same
//! transaction that writes). Whatever a removed device still holds is stale: its placement
//! groups were rebuilt elsewhere and their histories no longer name it, and the former holders
//! a PG's primary tells to forget it (`strays`) are dropped once the device has left the map.
//! So a drive put back into its host, or a removed host that comes back, is refused with a
//! message that says what to do, instead of joining with old data.

use crate::catalog::{Catalog, encode, now_secs};
use crate::error::MetaError;
use crate::keys::{self, IdKind};
use crate::node::DeviceRecord;
use crate::store::{Compare, Revision, Txn, TxnOp};
use basalt_types::{DeviceId, NodeId};
use serde::{Deserialize, Serialize};

/// A node's devices as listed for [`Catalog::remove_node`], with the revision of the device id
/// counter read before the listing: a device created after it (a new drive of a host that is
/// starting) took an id since, which fails the removal instead of being left behind.
#[derive(Clone, Debug)]
pub struct NodeDevices {
    pub node: NodeId,
    pub devices: Vec<DeviceRecord>,
    ids_at: Revision,
}

/// The mark a removed node or device leaves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedRecord {
    /// Unix seconds when it was removed.
    pub at: u64,
    /// The node (of a device: the node it belonged to).
    pub node: NodeId,
    /// The command that removed it, e.g. `"basalt node remove"`.
    pub by: String,
}

impl RemovedRecord {
    fn now(node: NodeId, by: &str) -> RemovedRecord {
        RemovedRecord {
            at: now_secs(),
            node,
            by: by.to_string(),
        }
    }
}

impl Catalog {
    /// The mark of device `id`, if it was removed.
    pub async fn removed_device(&self, id: DeviceId) -> Result<Option<RemovedRecord>, MetaError> {
        Ok(self
            .read(&keys::removed_device(id))
            .await?
            .map(|(rec, _)| rec))
    }

    /// The mark of node `id`, if it was removed.
    pub async fn removed_node(&self, id: NodeId) -> Result<Option<RemovedRecord>, MetaError> {
        Ok(self
            .read(&keys::removed_node(id))
            .await?
            .map(|(rec, _)| rec))
    }

    /// Forgets a device for good (the operator's `basalt device remove`, once it may go: the
    /// caller checks) if its record is still `expected`: one that registered again or changed
    /// meanwhile is kept. Returns whether it went.
    pub async fn remove_device(&self, expected: &DeviceRecord) -> Result<bool, MetaError> {
        let Some(guard) = self.unchanged(expected).await? else {
            return Ok(false);
        };
        let mark = RemovedRecord::now(expected.node, "basalt device remove");
        let txn = Txn::new().when([guard]).and_then([
            TxnOp::delete(keys::device(expected.id)),
            TxnOp::put(keys::removed_device(expected.id), encode(&mark)),
        ]);
        Ok(self.store().txn(txn).await?.succeeded)
    }

    /// Node `node`'s devices, for [`Catalog::remove_node`].
    pub async fn node_devices(&self, node: NodeId) -> Result<NodeDevices, MetaError> {
        let counter = keys::id_counter(IdKind::Device);
        let ids_at = self
            .store()
            .get(&counter)
            .await?
            .map_or(0, |kv| kv.mod_revision);
        let devices = self
            .list_devices()
            .await?
            .into_iter()
            .filter(|d| d.node == node)
            .collect();
        Ok(NodeDevices {
            node,
            devices,
            ids_at,
        })
    }

    /// Forgets a node and its devices for good (the operator's `basalt node remove`, once they
    /// may go: the caller checks), if the node is not registered, every one of its devices is
    /// still as listed, and no device was created since the listing; returns whether they
    /// went. Nothing of the node registers after this.
    pub async fn remove_node(&self, listed: &NodeDevices) -> Result<bool, MetaError> {
        let (node, expected) = (listed.node, &listed.devices);
        let counter = keys::id_counter(IdKind::Device);
        let mut guards = vec![
            Compare::missing(keys::node(node)),
            Compare::missing(keys::removed_node(node)),
            match listed.ids_at {
                0 => Compare::missing(&counter),
                at => Compare::mod_revision_is(&counter, at),
            },
        ];
        let mark = RemovedRecord::now(node, "basalt node remove");
        let mut ops = vec![TxnOp::put(keys::removed_node(node), encode(&mark))];
        for d in expected {
            assert_eq!(d.node, node, "{} is not a device of {node}", d.id);
            let Some(guard) = self.unchanged(d).await? else {
                return Ok(false);
            };
            guards.push(guard);
            ops.push(TxnOp::delete(keys::device(d.id)));
            ops.push(TxnOp::put(keys::removed_device(d.id), encode(&mark)));
        }
        if ops.len() > Txn::MAX_OPS {
            return Err(MetaError::InvalidTxn(format!(
                "{node} has {} devices: more than one transaction removes",
                expected.len()
            )));
        }
        let txn = Txn::new().when(guards).and_then(ops);
        Ok(self.store().txn(txn).await?.succeeded)
    }

    /// A compare that holds while the device's record is `expected` (`None`: it is not).
    async fn unchanged(&self, expected: &DeviceRecord) -> Result<Option<Compare>, MetaError> {
        let key = keys::device(expected.id);
        Ok(match self.read::<DeviceRecord>(&key).await? {
            Some((current, kv)) if current == *expected => {
                Some(Compare::mod_revision_is(&key, kv.mod_revision))
            }
            _ => None,
        })
    }
}

/// The error of a removed node or device trying to register.
pub(crate) fn refused_device(id: DeviceId, mark: &RemovedRecord) -> MetaError {
    MetaError::DeviceRemoved {
        device: id.to_string(),
        by: mark.by.clone(),
        at: mark.at,
    }
}

pub(crate) fn refused_node(id: NodeId, mark: &RemovedRecord) -> MetaError {
    MetaError::NodeRemoved {
        node: id.to_string(),
        by: mark.by.clone(),
        at: mark.at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EmbeddedStore;
    use crate::node::{DeviceRegistration, DeviceState, NodeRecord, OutReason};
    use std::sync::Arc;
    use std::time::Duration;

    async fn catalog(dir: &std::path::Path) -> Catalog {
        Catalog::new(Arc::new(
            EmbeddedStore::open(dir.join("meta.redb")).await.unwrap(),
        ))
    }

    fn reg(id: u32, node: u32) -> DeviceRegistration {
        DeviceRegistration {
            id: DeviceId(id),
            node: NodeId(node),
            path: format!("/dev/d{id}"),
            class: "ssd".into(),
            capacity: 1 << 30,
            object_size: 1 << 20,
        }
    }

    #[tokio::test]
    async fn a_removed_device_never_registers_again() {
        let dir = tempfile::tempdir().unwrap();
        let c = catalog(dir.path()).await;
        let rec = c.register_device(&reg(5, 1)).await.unwrap();
        c.register_device(&reg(6, 1)).await.unwrap();
        // A record that changed since it was read stays.
        c.set_device_out(DeviceId(5), Some(OutReason::Operator))
            .await
            .unwrap();
        assert!(!c.remove_device(&rec).await.unwrap());
        let rec = c.get_device(DeviceId(5)).await.unwrap().unwrap();
        assert!(c.remove_device(&rec).await.unwrap());
        assert_eq!(c.get_device(DeviceId(5)).await.unwrap(), None);
        let mark = c.removed_device(DeviceId(5)).await.unwrap().unwrap();
        assert_eq!(
            (mark.node, mark.by.as_str()),
            (NodeId(1), "basalt device remove")
        );
        let e = c.register_device(&reg(5, 1)).await.unwrap_err();
        assert!(
            matches!(e, MetaError::DeviceRemoved { .. }) && e.to_string().contains("dev.5"),
            "{e}"
        );
        assert_eq!(c.get_device(DeviceId(5)).await.unwrap(), None);
        // The node's other device is not affected.
        assert_eq!(
            c.register_device(&reg(6, 1)).await.unwrap().state,
            DeviceState::Up
        );
    }

    #[tokio::test]
    async fn a_removed_node_and_its_devices_never_register_again() {
        let dir = tempfile::tempdir().unwrap();
        let c = catalog(dir.path()).await;
        c.register_device(&reg(1, 2)).await.unwrap();
        c.register_device(&reg(2, 2)).await.unwrap();
        let record = NodeRecord::new(NodeId(2), "b", "127.0.0.1:1");
        let keep = c
            .register_node(&record, Duration::from_secs(10))
            .await
            .unwrap();
        // A registered node stays.
        let listed = c.node_devices(NodeId(2)).await.unwrap();
        assert_eq!(listed.devices.len(), 2);
        assert!(!c.remove_node(&listed).await.unwrap());
        keep.revoke().await.unwrap();
        // A device created after the listing (a new drive of the node, starting) fails it.
        c.next_id(IdKind::Device).await.unwrap();
        assert!(!c.remove_node(&listed).await.unwrap());
        let listed = c.node_devices(NodeId(2)).await.unwrap();
        assert!(c.remove_node(&listed).await.unwrap());
        assert!(c.list_devices().await.unwrap().is_empty());
        assert!(c.removed_node(NodeId(2)).await.unwrap().is_some());
        let e = c
            .register_node(&record, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(
            matches!(e, MetaError::NodeRemoved { .. }) && e.to_string().contains("node.2"),
            "{e}"
        );
        assert_eq!(c.get_node(NodeId(2)).await.unwrap(), None);
        for d in [1, 2] {
            assert!(matches!(
                c.register_device(&reg(d, 2)).await,
                Err(MetaError::DeviceRemoved { .. })
            ));
        }
        // A new device of the removed node is refused too.
        assert!(matches!(
            c.register_device(&reg(3, 2)).await,
            Err(MetaError::NodeRemoved { .. })
        ));
        // Removing again: already gone.
        let listed = c.node_devices(NodeId(2)).await.unwrap();
        assert!(listed.devices.is_empty());
        assert!(!c.remove_node(&listed).await.unwrap());
    }
}
