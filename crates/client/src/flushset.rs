//! The nodes a flush must reach: every node that acknowledged a write of a volume that was not
//! durable yet (sent without FUA, and answered with an incarnation other than 0: a replicated
//! PG makes every write durable) since a flush of the volume last succeeded there, wherever later maps
//! moved the volume's placement groups. Shared by every handle of the volume in one
//! [`crate::Cluster`], so a flush on one NBD connection covers writes acknowledged on another
//! (CAN_MULTI_CONN). A node leaves the set only once a flush that began after its last such
//! write succeeded there: a flush running beside another that is still flushing the node
//! flushes it too, instead of returning before the node's writes are durable.
//!
//! Each owed node also keeps the incarnation it acknowledged the writes in (the node's
//! `incarnation.rs`): a node that answers a flush in another one, or acknowledged some of the
//! writes in another one, started again after a crash in between and may have lost them. The
//! flush then fails, and every handle of the volume open at the time fails its next flush once
//! (the losses are counted per volume; a handle remembers the count it reported, as Linux's
//! `errseq_t` does for the files open on a device).

use basalt_types::{NodeId, VolumeId};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

/// What one node owes a flush of one volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owed {
    /// The number of the newest non-durable write it acknowledged (numbers are never reused:
    /// the mark a flush compares when it settles).
    pub last: u64,
    /// Its incarnation when it acknowledged the newest of them.
    pub incarnation: u64,
    /// The number of the newest of them it acknowledged in another incarnation than
    /// `incarnation` (it started again since): those may be lost.
    pub older: Option<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct Unflushed(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    owed: HashMap<VolumeId, BTreeMap<NodeId, Owed>>,
    /// The number of the last write recorded, of any volume and node.
    writes: u64,
    /// Per volume: how many times writes were found lost, and the latest finding.
    losses: HashMap<VolumeId, (u64, String)>,
}

impl Unflushed {
    /// `node`, in `incarnation`, acknowledged a write of `volume` that is not durable yet.
    /// Called before the write is acknowledged to the caller, so a flush issued after that ack
    /// sees it.
    pub(crate) fn record(&self, volume: VolumeId, node: NodeId, incarnation: u64) {
        let mut st = self.0.lock();
        st.writes = st.writes.checked_add(1).expect("fewer than 2^64 writes");
        let last = st.writes;
        let owed = st.owed.entry(volume).or_default();
        let entry = owed.entry(node).or_insert(Owed {
            last,
            incarnation,
            older: None,
        });
        if entry.incarnation != incarnation {
            entry.older = Some(entry.last);
            entry.incarnation = incarnation;
        }
        entry.last = last;
    }

    /// The nodes a flush of `volume` must reach (besides the current primaries), each with
    /// what it owes, for [`Unflushed::flushed`]. They stay owed until then.
    pub(crate) fn owed(&self, volume: VolumeId) -> BTreeMap<NodeId, Owed> {
        self.0.lock().owed.get(&volume).cloned().unwrap_or_default()
    }

    /// A flush that began when `node` owed `owed` succeeded there, the node answering in
    /// `incarnation`: it owes nothing more unless it acknowledged another non-durable write
    /// since. Fails (and counts a loss of the volume) when writes it still owes were
    /// acknowledged in another incarnation: they may be lost. What another flush settled
    /// meanwhile is not reported again, nor as lost when that flush found it durable.
    pub(crate) fn flushed(
        &self,
        volume: VolumeId,
        node: NodeId,
        owed: Owed,
        incarnation: u64,
    ) -> Result<(), String> {
        let mut st = self.0.lock();
        let Some(nodes) = st.owed.get_mut(&volume) else {
            return Ok(());
        };
        let Some(now) = nodes.get_mut(&node) else {
            return Ok(());
        };
        let lost = now.older.is_some() || now.incarnation != incarnation;
        if now.last == owed.last {
            nodes.remove(&node);
        } else if lost && now.incarnation == incarnation {
            // Writes since, the newest in the answer's incarnation: this finding covers those
            // acknowledged in another one before the flush began. One acknowledged in another
            // after it began (its ack raced the crash) is not covered: the next flush must
            // fail too, so the mark stays.
            now.older = now.older.filter(|&older| older > owed.last);
        }
        // (Writes since, the newest in another incarnation than the answer's: they may be lost
        // too and stay owed as they are, so the next flush fails as well.)
        if nodes.is_empty() {
            st.owed.remove(&volume);
        }
        if !lost {
            return Ok(());
        }
        let why = format!(
            "{node} started again since it acknowledged writes of this volume that were not \
             durable yet (its incarnation changed): they may be lost"
        );
        let loss = st.losses.entry(volume).or_insert((0, String::new()));
        loss.0 += 1;
        loss.1.clone_from(&why);
        Err(why)
    }

    /// `node` was removed from the cluster before a flush reached it: it cannot be asked any
    /// more, and what it owed may be lost (it may have crashed and lost the writes before it
    /// was drained): forgotten, and counted as a loss of the volume, once.
    pub(crate) fn removed(&self, volume: VolumeId, node: NodeId) {
        let mut st = self.0.lock();
        let Some(nodes) = st.owed.get_mut(&volume) else {
            return;
        };
        if nodes.remove(&node).is_none() {
            return;
        }
        if nodes.is_empty() {
            st.owed.remove(&volume);
        }
        let why = format!(
            "{node} was removed from the cluster before a flush reached it; writes of this \
             volume it acknowledged before they were durable may be lost"
        );
        let loss = st.losses.entry(volume).or_insert((0, String::new()));
        loss.0 += 1;
        loss.1 = why;
    }

    /// How many times writes of `volume` were found lost so far (a new handle starts there).
    pub(crate) fn losses(&self, volume: VolumeId) -> u64 {
        self.0.lock().losses.get(&volume).map_or(0, |l| l.0)
    }

    /// The latest loss of `volume` if any was found after the first `seen`, with the count.
    pub(crate) fn loss_since(&self, volume: VolumeId, seen: u64) -> Option<(u64, String)> {
        let st = self.0.lock();
        let (count, why) = st.losses.get(&volume)?;
        (*count > seen).then(|| (*count, why.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: VolumeId = VolumeId(1);
    const N: NodeId = NodeId(1);

    #[test]
    fn a_node_answering_in_another_incarnation_lost_what_it_owed() {
        let u = Unflushed::default();
        u.record(V, N, 7);
        let owed = u.owed(V)[&N];
        assert!(u.flushed(V, N, owed, 7).is_ok(), "same incarnation");
        assert!(u.owed(V).is_empty());
        u.record(V, N, 7);
        let owed = u.owed(V)[&N];
        let e = u.flushed(V, N, owed, 8).unwrap_err();
        assert!(e.contains("may be lost"), "{e}");
        assert!(u.owed(V).is_empty(), "reported: owed no more");
        assert_eq!(u.losses(V), 1);
        assert_eq!(u.loss_since(V, 0).map(|l| l.0), Some(1));
        assert_eq!(u.loss_since(V, 1), None);
    }

    #[test]
    fn writes_acknowledged_across_a_restart_are_lost_even_if_the_flush_sees_the_new_one() {
        let u = Unflushed::default();
        u.record(V, N, 7);
        u.record(V, N, 8);
        let owed = u.owed(V)[&N];
        assert!(owed.older.is_some());
        assert!(u.flushed(V, N, owed, 8).is_err());
        // A write recorded after a flush began stays owed, and is not reported twice.
        u.record(V, N, 9);
        u.record(V, N, 9);
        let owed = u.owed(V)[&N];
        u.record(V, N, 10);
        assert!(u.flushed(V, N, owed, 10).is_err());
        let left = u.owed(V)[&N];
        assert!(left.older.is_none() && left.incarnation == 10 && left.last > owed.last);
        assert!(u.flushed(V, N, left, 10).is_ok());
        assert_eq!(u.losses(V), 2);
        // One acknowledged in an incarnation older than a flush's answer is lost again.
        u.record(V, N, 10);
        let owed = u.owed(V)[&N];
        u.record(V, N, 11);
        assert!(u.flushed(V, N, owed, 11).is_err());
        u.record(V, N, 10);
        assert!(
            u.owed(V)[&N].older.is_some(),
            "acknowledged before the restart it saw"
        );
    }

    /// A write acknowledged in the old incarnation after a flush began (its ack raced the
    /// node's crash), the flush answered in the new one: the flush fails, and so must the next,
    /// which the write completed before (found by a review: it was owed as of the new
    /// incarnation, and the next flush succeeded).
    #[test]
    fn a_write_acknowledged_in_the_old_incarnation_after_a_flush_began_stays_lost() {
        let u = Unflushed::default();
        u.record(V, N, 7);
        let owed = u.owed(V)[&N];
        u.record(V, N, 7);
        assert!(u.flushed(V, N, owed, 8).is_err());
        let left = u.owed(V)[&N];
        assert!(
            u.flushed(V, N, left, 8).is_err(),
            "the later write is lost too"
        );
        assert!(u.owed(V).is_empty());
        // The same with a write in the new incarnation after it: the old one is still lost.
        u.record(V, N, 8);
        let owed = u.owed(V)[&N];
        u.record(V, N, 8);
        u.record(V, N, 9);
        assert!(u.flushed(V, N, owed, 9).is_err());
        let left = u.owed(V)[&N];
        assert!(
            u.flushed(V, N, left, 9).is_err(),
            "acknowledged in 8 after the flush began"
        );
        // Only writes of the new incarnation since: the next flush succeeds.
        u.record(V, N, 9);
        let owed = u.owed(V)[&N];
        u.record(V, N, 10);
        assert!(u.flushed(V, N, owed, 10).is_err());
        let left = u.owed(V)[&N];
        assert!(u.flushed(V, N, left, 10).is_ok(), "acknowledged in 10 only");
        assert_eq!(u.losses(V), 5);
    }

    /// Two flushes that began together: the first settles the node; what the second finds
    /// later is not reported, neither as a loss of writes the first found durable nor twice.
    #[test]
    fn what_a_concurrent_flush_settled_is_not_reported_again() {
        let u = Unflushed::default();
        u.record(V, N, 7);
        let owed = u.owed(V)[&N];
        assert!(u.flushed(V, N, owed, 7).is_ok());
        assert!(
            u.flushed(V, N, owed, 8).is_ok(),
            "durable before the restart"
        );
        u.record(V, N, 7);
        let owed = u.owed(V)[&N];
        assert!(u.flushed(V, N, owed, 8).is_err());
        assert!(u.flushed(V, N, owed, 8).is_ok(), "counted once");
        assert_eq!(u.losses(V), 1);
        // A write recorded after an older flush began is not settled by it, even when the
        // node owes as many writes as it did then.
        u.record(V, N, 8);
        let old = u.owed(V)[&N];
        assert!(u.flushed(V, N, old, 8).is_ok());
        u.record(V, N, 8);
        assert!(u.flushed(V, N, old, 8).is_ok());
        assert!(u.owed(V).contains_key(&N), "the later write is still owed");
    }
}
