//! The nodes a flush must reach: every node that acknowledged a write of a volume that was not
//! durable yet (no FUA) since the volume's last flush, wherever later maps moved the volume's
//! placement groups. Shared by every handle of the volume in one [`crate::Cluster`], so a flush
//! on one NBD connection covers writes acknowledged on another (CAN_MULTI_CONN).

use basalt_types::{NodeId, VolumeId};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Default)]
pub(crate) struct Unflushed(Mutex<HashMap<VolumeId, BTreeSet<NodeId>>>);

impl Unflushed {
    /// `node` acknowledged a write of `volume` that is not durable yet. Called before the
    /// write is acknowledged to the caller, so a flush issued after that ack sees it.
    pub(crate) fn record(&self, volume: VolumeId, node: NodeId) {
        self.0.lock().entry(volume).or_default().insert(node);
    }

    /// Takes the nodes a flush of `volume` must reach (besides the current primaries); writes
    /// acknowledged from now on go into the next flush's set.
    pub(crate) fn take(&self, volume: VolumeId) -> BTreeSet<NodeId> {
        self.0.lock().remove(&volume).unwrap_or_default()
    }

    /// Puts back nodes whose flush failed: the next flush tries them again.
    pub(crate) fn restore(&self, volume: VolumeId, nodes: impl IntoIterator<Item = NodeId>) {
        self.0.lock().entry(volume).or_default().extend(nodes);
    }
}
