//! The nodes a flush must reach: every node that acknowledged a write of a volume that was not
//! durable yet (no FUA) since a flush of the volume last succeeded there, wherever later maps
//! moved the volume's placement groups. Shared by every handle of the volume in one
//! [`crate::Cluster`], so a flush on one NBD connection covers writes acknowledged on another
//! (CAN_MULTI_CONN). A node leaves the set only once a flush that began after its last such
//! write succeeded there: a flush running beside another that is still flushing the node
//! flushes it too, instead of returning before the node's writes are durable.

use basalt_types::{NodeId, VolumeId};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

/// Per volume, each owing node with the number of non-durable writes it acknowledged so far
/// (the mark a flush compares when it settles).
#[derive(Debug, Default)]
pub(crate) struct Unflushed(Mutex<HashMap<VolumeId, BTreeMap<NodeId, u64>>>);

impl Unflushed {
    /// `node` acknowledged a write of `volume` that is not durable yet. Called before the
    /// write is acknowledged to the caller, so a flush issued after that ack sees it.
    pub(crate) fn record(&self, volume: VolumeId, node: NodeId) {
        let mut owed = self.0.lock();
        let writes = owed.entry(volume).or_default().entry(node).or_insert(0);
        *writes = writes
            .checked_add(1)
            .expect("fewer than 2^64 writes between flushes");
    }

    /// The nodes a flush of `volume` must reach (besides the current primaries), each with
    /// its mark for [`Unflushed::flushed`]. They stay owed until then.
    pub(crate) fn owed(&self, volume: VolumeId) -> BTreeMap<NodeId, u64> {
        self.0.lock().get(&volume).cloned().unwrap_or_default()
    }

    /// A flush that began when `node` was at `mark` succeeded there: it owes nothing more
    /// unless it acknowledged another non-durable write since.
    pub(crate) fn flushed(&self, volume: VolumeId, node: NodeId, mark: u64) {
        let mut owed = self.0.lock();
        let Some(nodes) = owed.get_mut(&volume) else {
            return;
        };
        if nodes.get(&node) == Some(&mark) {
            nodes.remove(&node);
        }
        if nodes.is_empty() {
            owed.remove(&volume);
        }
    }
}
