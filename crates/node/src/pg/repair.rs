//! Repair: a copy of an object that fails its checksums is replaced by a good copy.
//!
//! - **Read repair**: a read on the primary whose local copy fails its CRC-32C fetches the whole
//!   object from another serving member holding the same version (`Get`: the member's store
//!   verifies every block it reads), installs it locally at that version (durably), and
//!   answers the read from that image (held all along, so no write came between): a copy that
//!   still fails after its rewrite, or a rewrite that failed, does not fail the read. The
//!   client gets correct data or, when no member holds a good copy, an error (never bad or
//!   older data).
//! - **Member repair**: a member whose `Get` answered a checksum error (read repair asked it
//!   first), or whose copy scrub found bad or divergent (`scrub.rs`), gets the good image
//!   (`Put`).
//! - **Source repair**: recovery and backfill copy an object from the first source whose copy
//!   verifies (recovery: every device peering found at the authoritative version; backfill: the
//!   primary, then the serving members), so one bad copy never stalls them, and replace the
//!   bad copies of serving members they met ([`Pg::good_image`]).
//!
//! A repair is a sub-operation of the primary's current term: it runs only while the primary
//! serves that term, with the object held exclusively (writes and reads of it wait, and writes
//! admitted before wait to be finished first: [`Pg::exclusive`]), and a member that promised a
//! newer term refuses its `Put`.

use super::messages::{ImageKind, ImageMeta, PeerAnswer, PeerMsg};
use super::{Ctx, Member, Pg, Status};
use crate::error::engine_to_wire;
use crate::peers::PeerError;
use basalt_placement::ClusterMap;
use basalt_proto::{ErrorCode, WireError};
use basalt_types::{DeviceId, ObjectId, Term, Version};
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a repair waits for the writes of its object admitted before it to finish.
const QUIESCE_LIMIT: Duration = Duration::from_secs(30);

fn busy(msg: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Busy, msg)
}

/// Adds `n` to a counter; it sticks at `u64::MAX` rather than wrapping.
pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_add(n))
    });
}

/// Repair counters of one PG on this node (since the node started), and of the node.
pub(crate) struct RepairStats {
    /// Copies replaced by a good one (the primary's own and members').
    pub repaired: AtomicU64,
    /// Objects found bad for which no good copy existed (or the repair failed).
    pub unrepairable: AtomicU64,
    node: Arc<RepairTotals>,
}

/// The node's repair counters: every PG's, also those the node no longer holds.
#[derive(Default)]
pub(crate) struct RepairTotals {
    pub repaired: AtomicU64,
    pub unrepairable: AtomicU64,
}

impl RepairStats {
    pub fn new(node: Arc<RepairTotals>) -> RepairStats {
        RepairStats {
            repaired: AtomicU64::new(0),
            unrepairable: AtomicU64::new(0),
            node,
        }
    }

    /// Counts `n` copies replaced by a good one.
    pub fn repaired(&self, n: u64) {
        bump(&self.repaired, n);
        bump(&self.node.repaired, n);
    }

    /// Counts `n` objects with no good copy.
    pub fn unrepairable(&self, n: u64) {
        bump(&self.unrepairable, n);
        bump(&self.node.unrepairable, n);
    }
}

/// Exclusive use of one object on the primary in one generation: writes and reads of it wait
/// until this is dropped.
pub(super) struct Exclusive<'a> {
    pg: &'a Pg,
    pub oid: ObjectId,
    pub generation: u64,
    pub term: Term,
    /// Serving members other than the primary when the hold began.
    pub members: Vec<Member>,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        let mut st = self.pg.st.lock();
        if st.generation == self.generation
            && let Some(p) = st.primary.as_mut()
        {
            p.busy.remove(&self.oid);
            p.release(&self.oid);
        }
        drop(st);
        self.pg.changed.notify_waiters();
    }
}

/// Where a good image of an object was found, and which members answered with a bad copy.
/// Why no good copy of an object was found.
#[derive(Debug)]
pub(super) struct NoGoodCopy {
    /// Every device asked answered with a copy that fails its checksum (none was merely
    /// unreachable, nor held another version).
    pub every_copy_bad: bool,
    /// Every device asked answered, none with a good copy and some with a bad one (the others
    /// hold another version or none): nowhere asked is there a good copy.
    pub none_anywhere: bool,
    pub why: String,
}

impl std::fmt::Display for NoGoodCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

pub(super) struct Search {
    pub found: Option<(DeviceId, ImageMeta, Bytes)>,
    /// Members whose copy failed its checksum.
    pub bad: Vec<DeviceId>,
    /// Why the other members could not give a good copy.
    pub why: Vec<String>,
    /// Devices that gave no answer about their copy (unreachable, an error): they may hold a
    /// good one.
    pub unanswered: usize,
}

impl Pg {
    /// Holds `oid` exclusively in `generation` (which must be the active term): later writes and
    /// reads of it wait, and writes admitted before are waited for. `None` when the object is
    /// held already (being repaired, recovered or backfilled): the caller retries through the
    /// gate, which waits for it.
    pub(super) async fn exclusive(
        &self,
        oid: ObjectId,
        generation: u64,
    ) -> Result<Option<Exclusive<'_>>, WireError> {
        let (before, term, members) = {
            let mut st = self.st.lock();
            let promised = st.promised;
            if st.generation != generation {
                return Err(busy(format!("{} changed terms", self.id)));
            }
            let Some(p) = st.primary.as_mut() else {
                return Err(busy(format!("{} is no longer served here", self.id)));
            };
            if p.status != Status::Active || p.term != promised {
                return Err(busy(format!("{} is not active in its term", self.id)));
            }
            if p.must_wait(&oid) {
                return Ok(None);
            }
            p.busy.insert(oid);
            (p.seq, p.term, p.members.clone())
        };
        let held = Exclusive {
            pg: self,
            oid,
            generation,
            term,
            members,
        };
        let deadline = Instant::now() + QUIESCE_LIMIT;
        loop {
            {
                let st = self.st.lock();
                if st.generation != generation {
                    return Err(busy(format!("{} changed terms", self.id)));
                }
                let p = st.primary.as_ref().expect("same generation");
                if p.inflight.first().is_none_or(|first| *first > before) {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err(busy(format!(
                    "{oid}: writes admitted before the repair did not finish"
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(Some(held))
    }

    /// Whether the hold's term is still the one this device serves (and promised).
    fn holds(&self, held: &Exclusive<'_>) -> Result<(), WireError> {
        let st = self.st.lock();
        if st.generation != held.generation || st.promised != held.term {
            return Err(busy(format!("{} changed terms during a repair", self.id)));
        }
        Ok(())
    }

    /// Read repair: the local copy of `oid` failed its checksum. Replaces it with a member's
    /// good copy at the same version (and repairs members found bad on the way), and returns
    /// that good copy's data (the whole object, read while held: what the read answers).
    /// `Ok(None)` when the read may be tried again (someone else is repairing it, or it is
    /// gone).
    pub(super) async fn repair_read(
        &self,
        ctx: &Arc<Ctx>,
        generation: u64,
        oid: ObjectId,
    ) -> Result<Option<Bytes>, WireError> {
        let Some(held) = self.exclusive(oid, generation).await? else {
            return Ok(None);
        };
        let info = self.store.object_info(oid).await.map_err(engine_to_wire)?;
        let Some(info) = info.filter(|i| !i.deleted) else {
            return Ok(None);
        };
        let map = ctx.maps.map();
        // The other members first; this device's own copy last, for a block-level merge.
        let devs: Vec<DeviceId> = held
            .members
            .iter()
            .map(|m| m.dev)
            .chain([self.dev])
            .collect();
        let search = self
            .search(ctx, &map, &devs, &[self.dev], oid, info.version)
            .await;
        let Some((source, meta, data)) = search.found else {
            self.repairs.unrepairable(1);
            let why = if held.members.is_empty() {
                "no other member serves the PG".to_string()
            } else {
                search.why.join("; ")
            };
            tracing::error!(pg = %self.id, %oid, device = %self.dev, "unrepairable: {why}");
            return Err(WireError::new(
                ErrorCode::Checksum,
                format!(
                    "{oid}: the copy on {} fails its checksum and no member holds a good copy at \
                     {}: {why}",
                    self.dev, info.version
                ),
            ));
        };
        match self.replace(ctx, &map, &held, self.dev, &meta, &data).await {
            Ok(()) => {
                tracing::warn!(pg = %self.id, %oid, device = %self.dev, %source, version = %info.version, "read repair: replaced a copy that failed its checksum")
            }
            // The term ended: the read is refused (`Pg::read` checks) and retried.
            Err(e) if self.holds(&held).is_err() => {
                tracing::warn!(pg = %self.id, %oid, device = %self.dev, "read repair: {e}");
            }
            Err(e) => {
                // The read is still answered from the good copy; the bad one stays for the
                // next read or scrub.
                self.repairs.unrepairable(1);
                tracing::error!(pg = %self.id, %oid, device = %self.dev, %source, "read repair: replacing the copy that failed its checksum failed: {e}");
            }
        }
        for dev in search.bad.into_iter().filter(|d| *d != self.dev) {
            if let Err(e) = self.replace(ctx, &map, &held, dev, &meta, &data).await {
                tracing::warn!(pg = %self.id, %oid, device = %dev, "repairing a member's bad copy: {e}");
            }
        }
        Ok(Some(data))
    }

    /// Asks `devs` in order for a good copy of `oid` at `version` (this device's own copy is
    /// read directly); stops at the first. Those in `known_bad` (a copy that just failed its
    /// checksum) are not read whole again, only counted bad. When none verifies as a whole but
    /// two or more failed their checksum, merges those block by block (`merge.rs`).
    pub(super) async fn search(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        devs: &[DeviceId],
        known_bad: &[DeviceId],
        oid: ObjectId,
        version: Version,
    ) -> Search {
        let mut out = Search {
            found: None,
            bad: Vec::new(),
            why: Vec::new(),
            unanswered: 0,
        };
        for &dev in devs {
            if known_bad.contains(&dev) {
                out.why.push(format!("{dev}: its copy failed its checksum"));
                out.bad.push(dev);
                continue;
            }
            if dev == self.dev {
                match self.store.read_object(oid).await {
                    Ok(image) => {
                        let (meta, data) = ImageMeta::of(image);
                        if meta.version == version && meta.kind == ImageKind::Data {
                            out.found = Some((dev, meta, data));
                            return out;
                        }
                        out.why.push(format!(
                            "{dev} holds {:?} at {} instead",
                            meta.kind, meta.version
                        ));
                    }
                    Err(e) if e.is_bad_copy() => {
                        out.why.push(format!("{dev}: {e}"));
                        out.bad.push(dev);
                    }
                    Err(e) => {
                        out.why.push(format!("{dev}: {e}"));
                        out.unanswered += 1;
                    }
                }
                continue;
            }
            let msg = PeerMsg::Get {
                device: dev,
                pg: self.id,
                oid,
            };
            match ctx.peers.ask(map, dev, &msg, Bytes::new()).await {
                Ok((PeerAnswer::Image(meta), data))
                    if meta.version == version && meta.kind == ImageKind::Data =>
                {
                    out.found = Some((dev, meta, data));
                    return out;
                }
                Ok((PeerAnswer::Image(meta), _)) => out.why.push(format!(
                    "{dev} holds {:?} at {} instead",
                    meta.kind, meta.version
                )),
                Ok((other, _)) => {
                    out.why.push(format!("{dev} answered {other:?}"));
                    out.unanswered += 1;
                }
                Err(PeerError::Refused(e)) if e.code == ErrorCode::Checksum => {
                    out.why.push(format!("{dev}: {}", e.message));
                    out.bad.push(dev);
                }
                Err(e) => {
                    out.why.push(format!("{dev}: {e}"));
                    out.unanswered += 1;
                }
            }
        }
        if out.bad.len() >= 2 {
            let bad = out.bad.clone();
            match self.merge_copies(ctx, map, &bad, oid, version).await {
                Ok((meta, data)) => {
                    tracing::warn!(pg = %self.id, %oid, %version, copies = ?bad, "no copy verified as a whole: merged the copies block by block");
                    out.found = Some((bad[0], meta, data));
                }
                Err(e) => out
                    .why
                    .push(format!("merging the copies block by block: {e}")),
            }
        }
        out
    }

    /// The history's strays that are up in `map`, but those in `devs` and this device.
    async fn up_strays(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        devs: &[DeviceId],
    ) -> Vec<DeviceId> {
        match ctx.catalog.get_pg_history(self.id).await {
            Ok((history, _)) => history
                .strays
                .into_iter()
                .filter(|d| *d != self.dev && !devs.contains(d) && map.is_up(*d))
                .collect(),
            Err(e) => {
                tracing::warn!(pg = %self.id, "reading the PG's history for its strays: {e}");
                Vec::new()
            }
        }
    }

    /// For recovery and backfill, which hold `oid` already: a good image of it at `version`
    /// from the first of `devs` whose copy verifies, so that one bad source does not fail the
    /// copy; when none does, from the PG's strays that are up (`strays.rs`: former holders
    /// not yet told to forget it, never asked otherwise). A copy at exactly `version` that
    /// verifies is that write's data whoever holds it (versions are unique), so a stray's
    /// saves an object whose every serving copy is bad (found by the cluster simulation, seed
    /// 966864: the one serving copy of an undersized PG bad, the other lost with its drive, a
    /// good one on a device marked out). Copies found bad on the way are replaced by it when
    /// their device serves the PG (this one included), as are those in `known_bad`; others (a
    /// former member) are left to the PG's cleanup.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn good_image(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        term: Term,
        devs: &[DeviceId],
        known_bad: &[DeviceId],
        oid: ObjectId,
        version: Version,
    ) -> Result<(ImageMeta, Bytes), NoGoodCopy> {
        let mut search = self.search(ctx, map, devs, known_bad, oid, version).await;
        let every_copy_bad = !devs.is_empty() && search.bad.len() == devs.len();
        let none_anywhere = !search.bad.is_empty() && search.unanswered == 0;
        if search.found.is_none() {
            let strays = self.up_strays(ctx, map, devs).await;
            if !strays.is_empty() {
                let more = self.search(ctx, map, &strays, &[], oid, version).await;
                if let Some((stray, ..)) = &more.found {
                    tracing::warn!(pg = %self.id, %oid, device = %stray, %version, "no serving copy verified: a good one found on a stray");
                }
                search.found = more.found;
                search.why.extend(more.why);
            }
        }
        search.bad.extend_from_slice(known_bad);
        search.bad.sort_unstable();
        search.bad.dedup();
        let Some((source, meta, data)) = search.found else {
            if !search.bad.is_empty() {
                self.repairs.unrepairable(1);
            }
            return Err(NoGoodCopy {
                every_copy_bad,
                none_anywhere,
                why: format!("no good copy at {version}: {}", search.why.join("; ")),
            });
        };
        let serving: Vec<DeviceId> = {
            let st = self.st.lock();
            let members = st.primary.iter().flat_map(|p| p.members.iter());
            members.map(|m| m.dev).chain([self.dev]).collect()
        };
        for dev in search.bad.into_iter().filter(|d| serving.contains(d)) {
            match self
                .put(ctx, map, dev, term, oid, meta.clone(), data.clone())
                .await
            {
                Ok(()) => {
                    self.repairs.repaired(1);
                    tracing::warn!(pg = %self.id, %oid, device = %dev, %source, %version, "replaced a source copy that failed its checksum");
                }
                Err(e) => {
                    tracing::warn!(pg = %self.id, %oid, device = %dev, "repairing a bad source copy: {e}")
                }
            }
        }
        Ok((meta, data))
    }

    /// Installs the good image on `dev` (this device or a member) in the hold's term, durably,
    /// and counts the repair.
    pub(super) async fn replace(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        held: &Exclusive<'_>,
        dev: DeviceId,
        meta: &ImageMeta,
        data: &Bytes,
    ) -> Result<(), String> {
        self.holds(held).map_err(|e| e.message)?;
        self.put(
            ctx,
            map,
            dev,
            held.term,
            held.oid,
            meta.clone(),
            data.clone(),
        )
        .await?;
        self.repairs.repaired(1);
        Ok(())
    }
}
