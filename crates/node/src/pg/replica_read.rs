//! Reads a member serves from its own copy (`ReadReplica`), without its primary: what a
//! gateway in the same process asks its node for, skipping a network hop (the primary's reads
//! are in `primary.rs`).
//!
//! A member answers such a read of object `o` in term `t` only when all of these hold
//! (docs/design/replication.md, "Reads from a member's own copy"; failure-model.md rule 10):
//!
//! 1. **Complete in `t`, and so is every other member.** Its primary said so once `t` was
//!    active with nothing missing on any member and no backfill target (`readable` in the
//!    `PeerMsg::Activate` of `recovery.rs::publish_complete`; `Primary::members_readable`): every
//!    version the authority adopted, acknowledged or not, is then on every member, so no later
//!    peering can drop it. `t` is still the term it accepts and the newest it promised (a
//!    newer peering asked it: it stops at once), and no sub-operation of `t` failed here. Being
//!    a serving member of `t`, it then gets every write of `t` before that write is
//!    acknowledged.
//! 2. **Committed.** The version read is at or below the newest commit watermark the primary
//!    sent (`RepOp::committed`; everything before `t` was decided by its peering and is on
//!    every member by rule 1): a write
//!    applied here that is not yet on every member (peering may still roll it back) is never
//!    returned. A younger object is refused: the client reads it from the primary, which
//!    holds such writes until they are durable everywhere.
//! 3. **No newer term can have acknowledged a write.** After the read, this node holds a read
//!    lease (`readlease.rs`) of every other node with a serving member of `t`, and then its
//!    map still has `t`'s interval with this device serving. A newer term goes active only
//!    with the promise of a device that witnesses `t`'s interval: a serving member of it
//!    (since `t` has no backfill target, no other device can witness it), or of a later
//!    interval, which itself needed one. That device promised only once every lease its node
//!    granted at an older epoch than the new primary's map had run out; a lease this node
//!    holds of it after that was granted at that epoch or later, so this node's map is new
//!    enough to say the interval ended. On this node's own devices the map is shared.
//!
//! Any failure is a refusal (`Busy`): the client reads from the primary. A copy that fails
//! its checksum here is refused too (counted; the scrub or the primary's read repair fixes
//! it).

use super::messages::PeerMsg;
use super::peering::ask;
use super::{Ctx, Pg, Pgs, Status};
use basalt_placement::ClusterMap;
use basalt_proto::{ErrorCode, WireError};
use basalt_types::{DeviceId, ObjectId, Term, Version};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

fn refused(msg: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Busy, msg)
}

impl Pgs {
    /// The local device that holds `oid`'s copy as a serving member in `map` (the first one),
    /// to read it there.
    pub(crate) fn replica_of(
        &self,
        map: &ClusterMap,
        oid: &ObjectId,
    ) -> Result<Arc<Pg>, WireError> {
        let (pg, entry) = map
            .locate(oid)
            .ok_or_else(|| refused(format!("{} is not in map epoch {}", oid.pool, map.epoch.0)))?;
        map.serving(entry)
            .find(|d| self.store(*d).is_some())
            .and_then(|d| self.get(d, pg))
            .ok_or_else(|| refused(format!("no serving copy of {pg} on this node")))
    }
}

impl Pg {
    /// Reads `len` bytes of `oid` at `offset` from this member's own copy, or refuses.
    pub async fn read_replica(
        &self,
        ctx: &Arc<Ctx>,
        oid: ObjectId,
        offset: u32,
        len: u32,
    ) -> Result<Bytes, WireError> {
        if !ctx.leases.enabled() {
            return Err(refused("read leases are off: reads go to the primary"));
        }
        let (term, pending) = {
            let st = self.st.lock();
            let term = self.readable_term(&st)?;
            // Submitted under the PG's lock, as sub-operations are: ordered with them.
            (term, self.store.submit_read_versioned(oid, offset, len))
        };
        let (data, version) = pending.await.map_err(|e| {
            refused(format!(
                "{} on {}: {e}; read it from the primary",
                self.id, self.dev
            ))
        })?;
        self.replica_answerable(ctx, term, oid, version)?;
        Ok(data)
    }

    /// The term in which this member may answer reads of its own copy now (rule 1 above).
    fn readable_term(&self, st: &super::PgState) -> Result<Term, WireError> {
        match st.readable {
            Some(t) if t == st.accepting && t == st.promised => Ok(t),
            _ => Err(refused(format!(
                "{} on {} does not serve reads of its copy now (accepting {}, promised {})",
                self.id, self.dev, st.accepting, st.promised
            ))),
        }
    }

    /// Rules 1 to 3 above, once the read of `version` completed.
    fn replica_answerable(
        &self,
        ctx: &Ctx,
        term: Term,
        oid: ObjectId,
        version: Version,
    ) -> Result<(), WireError> {
        {
            let st = self.st.lock();
            if self.readable_term(&st)? != term {
                return Err(refused(format!("{} changed terms during a read", self.id)));
            }
            let committed = st.committed.max(term.before());
            if version > committed {
                return Err(refused(format!(
                    "{oid} at {version} on {} is not known durable on every member yet \
                     (committed up to {committed})",
                    self.dev
                )));
            }
        }
        let map = ctx.maps.map();
        let me = map.device_node(self.dev);
        for m in serving_in(&map, self.id, term) {
            let node = map.device_node(m);
            if node != me && !node.is_some_and(|n| ctx.leases.holds_granted(n)) {
                return Err(refused(format!(
                    "{}: no read lease of the node of member {m}",
                    self.id
                )));
            }
        }
        // Read after the leases were checked: a lease granted at an epoch means this node
        // had that map when it asked.
        let map = ctx.maps.map();
        if !serving_in(&map, self.id, term).contains(&self.dev) {
            return Err(refused(format!(
                "{}: map {} no longer has {} serving interval {}",
                self.id, map.epoch, self.dev, term.interval
            )));
        }
        Ok(())
    }
}

/// How long a PG's writes must pause before its primary tells the members how far they are
/// committed (while writes go on, each `Rep` says so).
const COMMIT_QUIET: Duration = Duration::from_millis(100);

impl Pg {
    /// While `generation` lasts: once the PG's writes pause for [`COMMIT_QUIET`], tells every
    /// serving member the commit watermark (`PeerMsg::Commit`), so that the objects written
    /// last become readable from the members' copies too (otherwise only the next write's
    /// `Rep`, or the primary's report of how far members are complete, would say so).
    pub(super) async fn publish_commits(self: Arc<Self>, ctx: Arc<Ctx>, generation: u64) {
        let mut sent = Version::NONE;
        loop {
            let idle = self.writes_idle.notified();
            let changed = self.changed.notified();
            tokio::select! {
                biased;
                _ = idle => {}
                _ = changed => {}
                _ = tokio::time::sleep(COMMIT_QUIET * 10) => {}
            }
            if !self.current(generation) {
                return;
            }
            let seq = self.st.lock().primary.as_ref().map(|p| p.seq);
            tokio::time::sleep(COMMIT_QUIET).await;
            let (term, upto, members) = {
                let st = self.st.lock();
                let Some(p) = st.primary.as_ref().filter(|_| st.generation == generation) else {
                    return;
                };
                // Writes went on meanwhile: their `Rep`s carried it, and the last one to
                // complete wakes this again.
                if Some(p.seq) != seq || !p.inflight.is_empty() || p.status != Status::Active {
                    continue;
                }
                let Some(upto) = p.committed_upto().filter(|u| *u > sent) else {
                    continue;
                };
                let members: Vec<DeviceId> = p.members.iter().map(|m| m.dev).collect();
                (p.term, upto, members)
            };
            let map = ctx.maps.map();
            let sends = members.iter().map(|&device| {
                let msg = PeerMsg::Commit {
                    device,
                    pg: self.id,
                    term,
                    upto,
                };
                let map = &map;
                let ctx = &ctx;
                async move { ask(ctx, map, device, &msg).await }
            });
            // A member that did not get it reads from its primary until the next one.
            let _ = futures::future::join_all(sends).await;
            sent = upto;
        }
    }
}

/// The serving members of `pg` in `map` while the map is still in `term`'s interval (none
/// otherwise).
fn serving_in(map: &ClusterMap, pg: basalt_types::PgId, term: Term) -> Vec<DeviceId> {
    map.pg(pg)
        .filter(|e| e.since == term.interval)
        .map(|e| map.serving(e).collect())
        .unwrap_or_default()
}

#[cfg(test)]
#[path = "replica_read_tests.rs"]
mod tests;
