//! Nodes (live `basalt node` processes, each registered under a lease) and their devices.
//!
//! A node record exists exactly while the node keeps its lease alive: when the process dies,
//! the lease expires and the record vanishes, and watchers of [`keys::NODES`] see a Delete.
//! Device records are permanent; their state says whether placement may use them.

use crate::catalog::{Catalog, now_secs};
use crate::error::MetaError;
use crate::keys;
use crate::leader::Leadership;
use crate::lease::KeepAlive;
use crate::store::{Compare, LeaseId, Revision, Txn, TxnOp};
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
    /// Set at first registration; an operator may change it; a restart keeps it.
    pub weight: u32,
    /// The object size the store was formatted with (0 in records of older versions:
    /// no pool uses the device until its node registers it again).
    #[serde(default)]
    pub object_size: u32,
    /// What the device's node says: `up` (its store works) or `down`.
    pub state: DeviceState,
    /// Why the device is out (gets no new data), if it is: an operator drained it, or it was
    /// down longer than the down-out interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<OutReason>,
    /// Why its node found the device faulty (a poisoned store, repeated checksum errors, a
    /// hang), if it did: the device stays down, across restarts of its node too, until an
    /// operator clears it (`basalt device clear-fault`, [`Catalog::clear_device_fault`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// An operator declared the device lost for good (`basalt device lost`,
    /// [`Catalog::mark_device_lost`]): peering no longer waits for it, giving up the writes
    /// only it held. It stays down and out for good (its fault says why); to use the drive
    /// again, remove the device and erase it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
}

/// How the fault of a device its node started without begins (`basalt_node`'s
/// `devices.rs::report_missing`); only such a device may be removed (`basalt device remove`).
pub const LEFT_BEHIND: &str = "not among the devices of its node when the node started";

/// The fault of a device an operator declared lost ([`Catalog::mark_device_lost`]).
pub const DECLARED_LOST: &str = "declared lost by an operator (`basalt device lost`)";

impl DeviceRecord {
    /// Whether its node started without it (its drive removed or replaced), by its fault.
    pub fn left_behind(&self) -> bool {
        self.fault
            .as_deref()
            .is_some_and(|f| f.starts_with(LEFT_BEHIND))
    }

    /// Whether placement may give the device new PGs (it is not out).
    pub fn is_in(&self) -> bool {
        self.out.is_none() && self.state != DeviceState::Out
    }

    /// Whether its node reports the device working (it is up if the node is alive, too).
    pub fn reported_up(&self) -> bool {
        self.state != DeviceState::Down
    }
}

/// What a device's node reports about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DeviceState {
    /// Serving.
    Up,
    /// Not serving (e.g. its store failed); still counted as holding its data.
    Down,
    /// Only in records of older versions ("drained"): read as up and out by an operator, and
    /// rewritten that way when the node registers the device again.
    Out,
}

/// Why a device is out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum OutReason {
    /// `basalt device out`: stays out until `basalt device in`.
    Operator,
    /// The leader: down longer than the down-out interval; goes back in when it is up again.
    Auto,
}

/// What a node knows about one of its devices when it registers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRegistration {
    pub id: DeviceId,
    pub node: NodeId,
    pub path: String,
    /// Used only when the device is registered for the first time.
    pub class: String,
    pub capacity: u64,
    pub object_size: u32,
}

/// How often a registration reads the node's record again when it changed before the write.
const REGISTER_ATTEMPTS: usize = 8;

/// The default placement weight of a device of `capacity` bytes: its size in GiB, at least 1.
pub fn default_weight(capacity: u64) -> u32 {
    u32::try_from(capacity >> 30).unwrap_or(u32::MAX).max(1)
}

impl Catalog {
    /// Registers a live node under `lease`: the record vanishes when the lease ends.
    ///
    /// The write is guarded by the record's state read just before it (its revision, or its
    /// absence): an attempt its caller gave up on (a timeout) that the store applies late
    /// finds the record changed by the attempt that followed, and fails, instead of moving the
    /// record to its own lease, which nobody renews (the record would vanish with that lease
    /// while the node still holds its own, and the leader would take a live node for gone).
    /// A record that changed between the read and the write (the previous process's lease
    /// expiring, a late attempt landing) is read again, a few times, while the caller waits:
    /// a late attempt never retries, its caller is gone.
    pub async fn register_node_with_lease(
        &self,
        record: &NodeRecord,
        lease: LeaseId,
    ) -> Result<Revision, MetaError> {
        let value = crate::catalog::encode(record);
        let key = keys::node(record.id);
        for _ in 0..REGISTER_ATTEMPTS {
            let unchanged = match self.store().get(&key).await? {
                Some(kv) => Compare::mod_revision_is(&key, kv.mod_revision),
                None => Compare::missing(&key),
            };
            let txn = Txn::new()
                .when([Compare::missing(keys::removed_node(record.id)), unchanged])
                .and_then([TxnOp::put_with_lease(&key, value.clone(), lease)]);
            let result = self.store().txn(txn).await?;
            if result.succeeded {
                return Ok(result.revision);
            }
            if let Some(mark) = self.removed_node(record.id).await? {
                return Err(crate::remove::refused_node(record.id, &mark));
            }
        }
        Err(MetaError::Backend(format!(
            "registering {}: its record changed each time it was about to be written",
            record.id
        )))
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

    /// The lease that holds node `id`'s record now (`None`: it is not registered).
    pub async fn node_lease(&self, id: NodeId) -> Result<Option<LeaseId>, MetaError> {
        Ok(self
            .store()
            .get(&keys::node(id))
            .await?
            .and_then(|kv| kv.lease))
    }

    /// Every live node, by id.
    pub async fn list_nodes(&self) -> Result<Vec<NodeRecord>, MetaError> {
        self.read_all(keys::NODES).await
    }

    /// Creates or replaces a device record (tools and tests; nodes use
    /// [`Catalog::register_device`]).
    pub async fn put_device(&self, record: &DeviceRecord) -> Result<Revision, MetaError> {
        let value = crate::catalog::encode(record);
        self.store()
            .put(&keys::device(record.id), value, None)
            .await
    }

    /// Registers a device of a starting node by compare-and-swap: a new device gets its
    /// default weight, state up and in; a known one gets its path, capacity and object size
    /// updated and state up, and keeps its weight, class and out mark (an operator's decisions
    /// survive restarts). A device found faulty stays down (a restart does not make a failing
    /// drive trustworthy). A device recorded for another node is refused, and so is a device
    /// or a node that was removed (`remove.rs`: checked in the same transaction).
    pub async fn register_device(
        &self,
        reg: &DeviceRegistration,
    ) -> Result<DeviceRecord, MetaError> {
        let guards = [
            Compare::missing(keys::removed_device(reg.id)),
            Compare::missing(keys::removed_node(reg.node)),
        ];
        for _ in 0..crate::catalog::MAX_ATTEMPTS {
            if let Some(mark) = self.removed_device(reg.id).await? {
                return Err(crate::remove::refused_device(reg.id, &mark));
            }
            if let Some(mark) = self.removed_node(reg.node).await? {
                return Err(crate::remove::refused_node(reg.node, &mark));
            }
            // A failed guard may be a removal: checked again above.
            let mut f = |cur| Ok((registered(cur, reg)?, true));
            if let Some((record, _)) = self
                .update_once(&keys::device(reg.id), &guards, &mut f)
                .await?
            {
                return Ok(record);
            }
        }
        Err(MetaError::Contention {
            key: keys::device(reg.id),
            attempts: crate::catalog::MAX_ATTEMPTS,
        })
    }

    pub async fn get_device(&self, id: DeviceId) -> Result<Option<DeviceRecord>, MetaError> {
        Ok(self.read(&keys::device(id)).await?.map(|(rec, _)| rec))
    }

    /// Every device, by id.
    pub async fn list_devices(&self) -> Result<Vec<DeviceRecord>, MetaError> {
        self.read_all(keys::DEVICES).await
    }

    /// Changes what a device's node reports about it (compare-and-swap: other fields changed
    /// meanwhile are kept).
    pub async fn set_device_state(
        &self,
        id: DeviceId,
        state: DeviceState,
    ) -> Result<DeviceRecord, MetaError> {
        self.change_device(id, |d| {
            d.state = state;
            true
        })
        .await
    }

    /// A node found the device faulty: it is down, for `why`, until an operator clears it.
    pub async fn report_device_fault(
        &self,
        id: DeviceId,
        why: &str,
    ) -> Result<DeviceRecord, MetaError> {
        self.change_device(id, |d| {
            let changed = d.state != DeviceState::Down || d.fault.as_deref() != Some(why);
            d.state = DeviceState::Down;
            d.fault = Some(why.to_string());
            changed
        })
        .await
    }

    /// The operator's `basalt device clear-fault`: the device (replaced, or checked) is trusted
    /// again: no fault, and up (its node reports it down again at once if it still finds it
    /// faulty). A device without a fault is left as it is; one declared lost is refused.
    pub async fn clear_device_fault(&self, id: DeviceId) -> Result<DeviceRecord, MetaError> {
        self.try_change_device(id, |d| {
            refuse_lost(d)?;
            let changed = d.fault.is_some();
            if changed {
                d.fault = None;
                d.state = DeviceState::Up;
            }
            Ok(changed)
        })
        .await
    }

    /// The operator's `basalt device lost`: the device is gone for good. It is marked lost,
    /// down, out by the operator and faulty (so a registration keeps it down); peering stops
    /// waiting for it (`basalt_node`'s `pg/peering.rs::check_history`). Refused
    /// ([`MetaError::DeviceInUse`]) while its node is registered and the record does not say
    /// the device is down: in the same transaction as the mark, so a node that registers
    /// meanwhile fails it (and its registration, after the mark, keeps the device down). A
    /// fault its node reported stays (a device its node started without may then be removed:
    /// [`DeviceRecord::left_behind`]).
    pub async fn mark_device_lost(&self, id: DeviceId) -> Result<DeviceRecord, MetaError> {
        for _ in 0..crate::catalog::MAX_ATTEMPTS {
            let node = self
                .get_device(id)
                .await?
                .ok_or_else(|| MetaError::NoSuchDevice(id.to_string()))?
                .node;
            let node_up = self.get_node(node).await?.is_some();
            let guards = if node_up {
                Vec::new()
            } else {
                vec![Compare::missing(keys::node(node))]
            };
            let mut f = |cur: Option<DeviceRecord>| {
                let mut d = cur.ok_or_else(|| MetaError::NoSuchDevice(id.to_string()))?;
                if node_up && d.state != DeviceState::Down {
                    return Err(MetaError::DeviceInUse(id.to_string()));
                }
                let changed = !d.lost;
                d.lost = true;
                d.state = DeviceState::Down;
                d.out = Some(OutReason::Operator);
                d.fault.get_or_insert_with(|| DECLARED_LOST.to_string());
                Ok((d, changed))
            };
            if let Some((record, _)) = self.update_once(&keys::device(id), &guards, &mut f).await? {
                return Ok(record);
            }
        }
        Err(MetaError::Contention {
            key: keys::device(id),
            attempts: crate::catalog::MAX_ATTEMPTS,
        })
    }

    /// Marks a device out (`Some(reason)`) or in (`None`): the operator's `device out|in`.
    /// A device declared lost stays out.
    pub async fn set_device_out(
        &self,
        id: DeviceId,
        out: Option<OutReason>,
    ) -> Result<DeviceRecord, MetaError> {
        self.try_change_device(id, |d| {
            if out.is_none() {
                refuse_lost(d)?;
            }
            if d.state == DeviceState::Out {
                d.state = DeviceState::Up;
            }
            d.out = out;
            Ok(true)
        })
        .await
    }

    /// Sets a device's placement weight (0 = holds nothing).
    pub async fn set_device_weight(
        &self,
        id: DeviceId,
        weight: u32,
    ) -> Result<DeviceRecord, MetaError> {
        self.change_device(id, |d| {
            d.weight = weight;
            true
        })
        .await
    }

    /// The leader's down-out rule: marks an in device out automatically. Returns whether it
    /// changed anything (a device an operator marked out is left alone); `NotLeader` once
    /// `leadership`'s term is over (a deposed leader judges from a map that may be stale).
    pub async fn auto_out_device(
        &self,
        id: DeviceId,
        leadership: &Leadership,
    ) -> Result<bool, MetaError> {
        self.change_device_as_leader(id, leadership, |d| {
            let changed = d.is_in();
            if changed {
                d.out = Some(OutReason::Auto);
            }
            changed
        })
        .await
    }

    /// The leader's down-out rule: a device out automatically is back up, so it goes back in.
    /// Returns whether it changed anything; `NotLeader` as [`Catalog::auto_out_device`].
    pub async fn auto_in_device(
        &self,
        id: DeviceId,
        leadership: &Leadership,
    ) -> Result<bool, MetaError> {
        self.change_device_as_leader(id, leadership, |d| {
            let changed = d.out == Some(OutReason::Auto);
            if changed {
                d.out = None;
            }
            changed
        })
        .await
    }

    /// Compare-and-swap on a device record that also needs `leadership`'s key; returns
    /// whether `f` changed it.
    async fn change_device_as_leader(
        &self,
        id: DeviceId,
        leadership: &Leadership,
        mut f: impl FnMut(&mut DeviceRecord) -> bool,
    ) -> Result<bool, MetaError> {
        let guards = [leadership.holds_key()];
        let mut changed = false;
        let mut change = |cur: Option<DeviceRecord>| {
            let mut d = cur.ok_or_else(|| MetaError::NoSuchDevice(id.to_string()))?;
            changed = f(&mut d);
            Ok((d, changed))
        };
        let key = keys::device(id);
        for _ in 0..crate::catalog::MAX_ATTEMPTS {
            if self
                .update_once(&key, &guards, &mut change)
                .await?
                .is_some()
            {
                return Ok(changed);
            }
            if !self.still_leads(leadership).await? {
                return Err(MetaError::NotLeader);
            }
        }
        Err(MetaError::Contention {
            key,
            attempts: crate::catalog::MAX_ATTEMPTS,
        })
    }

    /// Compare-and-swap on a device record; `f` returns false to leave it unchanged.
    async fn change_device(
        &self,
        id: DeviceId,
        mut f: impl FnMut(&mut DeviceRecord) -> bool,
    ) -> Result<DeviceRecord, MetaError> {
        self.try_change_device(id, |d| Ok(f(d))).await
    }

    /// [`Catalog::change_device`] with a refusal: an error from `f` leaves the record as it is.
    async fn try_change_device(
        &self,
        id: DeviceId,
        mut f: impl FnMut(&mut DeviceRecord) -> Result<bool, MetaError>,
    ) -> Result<DeviceRecord, MetaError> {
        let (record, _) = self
            .update_if(&keys::device(id), |cur: Option<DeviceRecord>| {
                let mut d = cur.ok_or_else(|| MetaError::NoSuchDevice(id.to_string()))?;
                let changed = f(&mut d)?;
                Ok((d, changed))
            })
            .await?;
        Ok(record)
    }
}

/// A device declared lost may be neither cleared nor marked in (checked inside the
/// compare-and-swap, so a declaration racing with either wins or fails it).
fn refuse_lost(d: &DeviceRecord) -> Result<(), MetaError> {
    if d.lost {
        return Err(MetaError::DeviceLost(d.id.to_string()));
    }
    Ok(())
}

/// The record of a device registering: new, or `cur` updated (see
/// [`Catalog::register_device`]).
fn registered(
    cur: Option<DeviceRecord>,
    reg: &DeviceRegistration,
) -> Result<DeviceRecord, MetaError> {
    let Some(mut d) = cur else {
        return Ok(DeviceRecord {
            id: reg.id,
            node: reg.node,
            path: reg.path.clone(),
            class: reg.class.clone(),
            capacity: reg.capacity,
            weight: default_weight(reg.capacity),
            object_size: reg.object_size,
            state: DeviceState::Up,
            out: None,
            fault: None,
            lost: false,
        });
    };
    if d.node != reg.node {
        return Err(MetaError::DeviceOwned {
            device: reg.id.to_string(),
            owner: d.node.to_string(),
            node: reg.node.to_string(),
        });
    }
    if d.state == DeviceState::Out {
        d.out.get_or_insert(OutReason::Operator);
    }
    d.path.clone_from(&reg.path);
    d.capacity = reg.capacity;
    d.object_size = reg.object_size;
    d.state = if d.fault.is_some() || d.lost {
        DeviceState::Down
    } else {
        DeviceState::Up
    };
    Ok(d)
}
