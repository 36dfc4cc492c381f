//! The failure reports this node filed (`heartbeat.rs` decides whom it suspects; the leader
//! judges the reports: `reports.rs`). Each suspect gets a report under the lease that holds
//! this node's record; a peer that answers again, or left the map, gets its report withdrawn.
//!
//! A write to the metadata store that fails may still have been applied (its answer lost: a
//! timeout, a connection broken during an etcd election), so the outcome of a failed put or
//! delete is unknown: the peer is `unsure` and the next round puts or deletes its report again,
//! whichever it then needs. (Before, a put applied without its answer left a report nobody
//! withdrew, which kept a healthy node reported while this one lived; a delete applied without
//! its answer left the peer counted as reported, so a second cut got no report.)

use basalt_meta::{Catalog, LeaseId, MetaError};
use basalt_types::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The reports this node filed, as far as it knows.
#[derive(Debug, Default)]
pub(crate) struct Filed {
    /// Peers reported, with the lease the report is under.
    reported: BTreeMap<NodeId, LeaseId>,
    /// Peers whose last put or delete failed: whether a report stands is unknown.
    unsure: BTreeSet<NodeId>,
}

impl Filed {
    /// Makes the reports match `suspects` (with how long each has been silent): withdraws
    /// those of peers no longer suspected, files one for each suspect not reported under the
    /// current lease. Stops at the first failure (the next round goes on from there).
    pub async fn sync(
        &mut self,
        catalog: &Catalog,
        me: NodeId,
        suspects: &BTreeMap<NodeId, Duration>,
    ) -> Result<(), MetaError> {
        let cleared: BTreeSet<NodeId> = self
            .reported
            .keys()
            .chain(&self.unsure)
            .filter(|n| !suspects.contains_key(n))
            .copied()
            .collect();
        for peer in cleared {
            if let Err(e) = catalog.remove_failure_report(me, peer).await {
                self.unsure.insert(peer);
                return Err(e);
            }
            self.unsure.remove(&peer);
            if self.reported.remove(&peer).is_some() {
                tracing::info!(%peer, "failure report withdrawn");
            }
        }
        if suspects.is_empty() {
            return Ok(());
        }
        // Reports live under the lease that holds this node's record (a new one after the
        // node registered again: the old reports went with the old lease).
        let Some(lease) = catalog.node_lease(me).await? else {
            self.reported.clear();
            return Ok(());
        };
        for (peer, silent) in suspects {
            if self.reported.get(peer) == Some(&lease) && !self.unsure.contains(peer) {
                continue;
            }
            let put = catalog.put_failure_report(me, *peer, unix_ms_ago(*silent), lease);
            if let Err(e) = put.await {
                self.unsure.insert(*peer);
                return Err(e);
            }
            self.unsure.remove(peer);
            self.reported.insert(*peer, lease);
            tracing::warn!(%peer, ?silent, "the peer does not answer heartbeats: reported it");
        }
        Ok(())
    }
}

/// Unix milliseconds `ago` before now.
pub(crate) fn unix_ms_ago(ago: Duration) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(now.saturating_sub(ago).as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "filed_tests.rs"]
mod tests;
