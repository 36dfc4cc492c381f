//! Giving up unfound objects (`basalt pg mark-unfound-lost`): an object every copy of whose
//! authoritative version fails its checksum is unfound, and its reads and writes fail while
//! recovery keeps looking for a good copy. An operator who knows none will come back (the
//! devices that could hold one are gone for good) declares it lost: the PG's primary deletes
//! it on every serving member as a replicated write at a new version, so it reads as zeros from
//! then on, takes writes again, and the PG can become clean. A copy of an older version that
//! comes back later is older than the tombstone and is replaced by it, as any stale copy.
//!
//! Only objects unfound on the primary now are declared lost; each is kept from clients and
//! recovery (busy) until its tombstone is on every member, so a write to it cannot slip in
//! between and be deleted after it was acknowledged.

use super::primary::{Pass, WriteKind};
use super::{Ctx, Pg, Pgs, Status};
use basalt_proto::{ErrorCode, Session, WireError};
use basalt_types::{DeviceId, ObjectId, PgId, Version};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What `mark-unfound-lost` did on one PG's primary.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostReport {
    pub pg: PgId,
    pub device: DeviceId,
    /// Objects deleted, and the tombstone's version.
    pub declared: Vec<(ObjectId, Version)>,
    /// Objects whose tombstone was not acknowledged (the PG peers again; run it again).
    pub failed: Vec<String>,
}

impl Pgs {
    /// Declares lost every unfound object of `pg` a device of this node is the active primary
    /// of. Refused (`InvalidArgument`, with what to do) when the primary here is peered below
    /// `min_size` and lists unfound objects: such a PG writes nothing, tombstones included (its interval is not in the
    /// history, so nothing written in it could be told from a write never acknowledged), and a
    /// backfill stopped at an unfound object would keep it peered for ever; `NotFound` when no
    /// device of this node is its primary.
    pub(crate) async fn mark_unfound_lost(&self, pg: PgId) -> Result<LostReport, WireError> {
        let here: Vec<_> = self.all().into_iter().filter(|p| p.id == pg).collect();
        if let Some(primary) = here.iter().find(|p| p.is_active_primary()) {
            return Ok(primary.mark_unfound_lost(&self.ctx).await);
        }
        if let Some((primary, why)) = here.iter().find_map(|p| Some((p, p.peered()?))) {
            let (unfound, serving) = primary.unfound_and_serving();
            if unfound == 0 {
                return Ok(LostReport {
                    pg,
                    device: primary.dev,
                    ..LostReport::default()
                });
            }
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "{pg} is peered, not active ({why}): it serves no I/O and gives up nothing \
                     ({unfound} object(s) unfound). To give them up, let it serve with the \
                     copies it has: `basalt pool set POOL --min-size {serving}`, run this \
                     again, then set min_size back"
                ),
            ));
        }
        Err(WireError::new(
            ErrorCode::NotFound,
            format!("no device of this node is the active primary of {pg}"),
        ))
    }
}

impl Pg {
    async fn mark_unfound_lost(self: &Arc<Self>, ctx: &Arc<Ctx>) -> LostReport {
        let (generation, unfound) = {
            let st = self.st.lock();
            let oids = st
                .primary
                .as_ref()
                .map(|p| p.unfound.keys().copied().collect::<Vec<_>>())
                .unwrap_or_default();
            (st.generation, oids)
        };
        let mut report = LostReport {
            pg: self.id,
            device: self.dev,
            ..LostReport::default()
        };
        for oid in unfound {
            let Some(why) = self.claim_lost(generation, oid) else {
                report.failed.push(format!("{oid}: no longer unfound here"));
                continue;
            };
            let epoch = ctx.maps.map().epoch;
            let pass = Pass::Lost { generation };
            let r = self
                .write_as(
                    ctx,
                    (epoch, Session::NONE),
                    oid,
                    WriteKind::Delete,
                    true,
                    pass,
                )
                .await;
            self.settle_lost(generation, oid, r.is_ok().then_some(()).ok_or(why));
            match r {
                Ok((version, _)) => {
                    tracing::warn!(pg = %self.id, %oid, %version, "unfound object declared lost by the operator: deleted on every member");
                    report.declared.push((oid, version));
                }
                Err(e) => report.failed.push(format!("{oid}: {e}")),
            }
        }
        report
    }

    /// Why this device's primary of the PG is peered below `min_size`; `None` unless it is.
    fn peered(&self) -> Option<String> {
        let st = self.st.lock();
        let p = st.primary.as_ref().filter(|p| p.term == st.promised)?;
        match &p.status {
            Status::Peered(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// The primary's unfound objects, and its serving members (itself included).
    fn unfound_and_serving(&self) -> (usize, usize) {
        let st = self.st.lock();
        st.primary
            .as_ref()
            .map_or((0, 0), |p| (p.unfound.len(), p.members.len() + 1))
    }

    /// Takes `oid` from the unfound objects of `generation` and keeps clients and recovery
    /// from it (busy); returns why it was unfound. `None` if it is not unfound (or busy) in
    /// that generation now.
    fn claim_lost(&self, generation: u64, oid: ObjectId) -> Option<String> {
        let mut st = self.st.lock();
        if st.generation != generation {
            return None;
        }
        let p = st.primary.as_mut()?;
        if p.busy.contains(&oid) {
            return None;
        }
        let why = p.unfound.remove(&oid)?;
        p.busy.insert(oid);
        Some(why)
    }

    /// The tombstone of `oid` is on every member (`Ok`), or it failed (`Err`: why the object
    /// was unfound, which it is again): requests for it go on.
    fn settle_lost(&self, generation: u64, oid: ObjectId, done: Result<(), String>) {
        let mut st = self.st.lock();
        if st.generation != generation {
            return;
        }
        let Some(p) = st.primary.as_mut() else {
            return;
        };
        p.busy.remove(&oid);
        match done {
            // No member needs the lost version any more: the tombstone replaced it.
            Ok(()) => {
                p.missing.remove(&oid);
            }
            Err(why) => {
                p.unfound.insert(oid, why);
            }
        }
        p.release(&oid);
        drop(st);
        self.changed.notify_waiters();
    }
}
