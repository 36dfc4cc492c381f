//! Scrub: the primary of a PG compares the copies of every object it holds on every serving
//! member (version, allocation and a CRC-32C of the data; reading the whole object also
//! verifies every block's own checksum) and repairs copies that are bad or differ from a good
//! one: its own copy when it verifies, else a member's copy at the authoritative version (the
//! primary's: peering made every serving member current). `basalt scrub` runs it on demand
//! (`Pgs::scrub_now`); every node also scrubs in the background at a low byte rate, one PG at a
//! time (`background`).
//!
//! Copies are compared first without holding the object; only when they differ is the object
//! held ([`Pg::exclusive`]: writes of it wait) and compared again, so a write in flight is
//! never mistaken for an inconsistency. Tombstones are not compared (members trim them at
//! different times). The walk merges every serving member's listing with the primary's, so an
//! object a member holds live and the primary does not is found too (`scrub_orphan`): it gets
//! the primary's newer tombstone, or else is reported unrepairable and left alone.

use super::messages::{Held, ImageKind, ImageMeta, ObjectDigest, PeerAnswer, PeerMsg};
use super::peering::ask;
use super::repair::{Exclusive, bump};
use super::{Ctx, Pg, Pgs, Status};
use crate::peers::PeerError;
use basalt_placement::ClusterMap;
use basalt_proto::ErrorCode;
use basalt_types::{DeviceId, ObjectId, PgId, PoolId, Version};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::watch;

/// Objects listed per page while walking a PG.
const PAGE: usize = 64;

/// What scrubbing one PG found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgScrub {
    pub pg: PgId,
    pub device: DeviceId,
    /// Objects whose copies were compared.
    pub objects: u64,
    /// Objects with a copy that failed its checksum or differed from the good one.
    pub inconsistent: u64,
    /// Inconsistent objects whose every bad copy was replaced by a good one.
    pub repaired: u64,
    /// Inconsistent objects with no good copy, or whose repair failed.
    pub unrepairable: u64,
    /// Bytes of object data compared (each copy read once).
    pub bytes: u64,
    /// Why the scrub of the PG stopped early (it changed terms, a member did not answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A node's answer to `basalt scrub`: one entry per PG it is the active primary of.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubReport {
    pub pgs: Vec<PgScrub>,
}

impl ScrubReport {
    /// Adds another node's report.
    pub fn add(&mut self, other: &ScrubReport) {
        self.pgs.extend(other.pgs.iter().cloned());
    }
    /// PGs scrubbed to the end.
    pub fn pgs_scrubbed(&self) -> u64 {
        self.pgs.iter().filter(|p| p.error.is_none()).count() as u64
    }
    fn sum(&self, f: impl Fn(&PgScrub) -> u64) -> u64 {
        self.pgs.iter().map(f).fold(0, u64::saturating_add)
    }
    pub fn objects(&self) -> u64 {
        self.sum(|p| p.objects)
    }
    pub fn inconsistent(&self) -> u64 {
        self.sum(|p| p.inconsistent)
    }
    pub fn repaired(&self) -> u64 {
        self.sum(|p| p.repaired)
    }
    pub fn unrepairable(&self) -> u64 {
        self.sum(|p| p.unrepairable)
    }
}

/// One copy as scrub saw it.
#[derive(Clone, Debug)]
enum Seen {
    Good(ObjectDigest),
    /// It failed its checksum.
    Bad,
}

/// Every copy of one object: the primary's (with its data when it verified) and the members'.
struct View {
    /// The primary's version of the object (its index, even when the data is bad).
    version: Version,
    local: Seen,
    local_image: Option<(ImageMeta, Bytes)>,
    members: BTreeMap<DeviceId, Seen>,
}

impl View {
    fn consistent(&self) -> bool {
        let Seen::Good(mine) = &self.local else {
            return false;
        };
        self.members
            .values()
            .all(|c| matches!(c, Seen::Good(d) if d == mine))
    }

    fn bytes(&self) -> u64 {
        let n = self.local_image.as_ref().map_or(0, |(_, d)| d.len() as u64);
        n.saturating_mul(1 + self.members.len() as u64)
    }
}

/// How one object came out.
enum Outcome {
    Consistent(u64),
    Repaired(u64),
    Unrepairable(u64),
    /// Held by recovery or a repair right now: not compared.
    Skipped,
}

impl PgScrub {
    /// Counts one object's outcome, then waits as the byte rate asks.
    async fn count(&mut self, outcome: Outcome, rate: &impl Fn() -> u64) {
        let bytes = match outcome {
            Outcome::Skipped => return,
            Outcome::Consistent(b) => b,
            Outcome::Repaired(b) => {
                self.inconsistent += 1;
                self.repaired += 1;
                b
            }
            Outcome::Unrepairable(b) => {
                self.inconsistent += 1;
                self.unrepairable += 1;
                b
            }
        };
        self.objects += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        let rate = rate();
        if rate > 0 && bytes > 0 {
            tokio::time::sleep(Duration::from_secs_f64(bytes as f64 / rate as f64)).await;
        }
    }
}

impl Pg {
    /// Scrubs the PG if this device is its active primary; `rate` (bytes per second, 0:
    /// unlimited) is read again after every object. `None` when it is not the active primary.
    pub(crate) async fn scrub(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        rate: impl Fn() -> u64,
    ) -> Option<PgScrub> {
        let _one = self.scrubbing.lock().await;
        let generation = {
            let st = self.st.lock();
            let p = st.primary.as_ref()?;
            if p.status != Status::Active || p.term != st.promised {
                return None;
            }
            st.generation
        };
        let mut out = PgScrub {
            pg: self.id,
            device: self.dev,
            ..PgScrub::default()
        };
        if let Err(e) = self.walk(ctx, generation, &rate, &mut out).await {
            out.error = Some(e);
        }
        if out.inconsistent > 0 || out.error.is_some() {
            tracing::warn!(pg = %self.id, device = %self.dev, objects = out.objects, inconsistent = out.inconsistent, repaired = out.repaired, unrepairable = out.unrepairable, error = ?out.error, "scrubbed");
        } else {
            tracing::debug!(pg = %self.id, objects = out.objects, "scrubbed: consistent");
        }
        Some(out)
    }

    /// Walks the primary's listing and every serving member's together, page by page, so an
    /// object only a member holds is found too.
    async fn walk(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        generation: u64,
        rate: &impl Fn() -> u64,
        out: &mut PgScrub,
    ) -> Result<(), String> {
        let mut after = None;
        loop {
            let members = self.members_in(generation)?;
            let mine = self
                .store
                .list(self.id, after, PAGE)
                .await
                .map_err(|e| e.to_string())?;
            let mut bound = (mine.len() == PAGE)
                .then(|| mine.last().map(|o| o.oid))
                .flatten();
            let map = ctx.maps.map();
            let mut theirs: BTreeMap<ObjectId, Vec<(DeviceId, Held)>> = BTreeMap::new();
            for dev in members {
                let msg = PeerMsg::List {
                    device: dev,
                    pg: self.id,
                    after,
                    limit: PAGE,
                };
                let PeerAnswer::List { entries } = ask(ctx, &map, dev, &msg).await? else {
                    return Err(format!("{dev} answered a listing oddly"));
                };
                if entries.len() == PAGE
                    && let Some(last) = entries.last()
                {
                    bound = Some(bound.map_or(last.oid, |b| b.min(last.oid)));
                }
                for h in entries.into_iter().filter(|h| !h.deleted) {
                    theirs.entry(h.oid).or_default().push((dev, h));
                }
            }
            let within = |oid: ObjectId| bound.is_none_or(|b| oid <= b);
            let mut live = BTreeSet::new();
            for o in mine.iter().filter(|o| !o.deleted && within(o.oid)) {
                live.insert(o.oid);
                let outcome = self.scrub_one(ctx, generation, o.oid).await?;
                out.count(outcome, rate).await;
            }
            for (oid, copies) in theirs {
                if within(oid) && !live.contains(&oid) {
                    let outcome = self.scrub_orphan(ctx, generation, oid, copies).await?;
                    out.count(outcome, rate).await;
                }
            }
            match bound {
                Some(b) => after = Some(b),
                None => return Ok(()),
            }
        }
    }

    /// The serving members other than this device, while `generation` is the one serving.
    fn members_in(&self, generation: u64) -> Result<Vec<DeviceId>, String> {
        let st = self.st.lock();
        match st.primary.as_ref() {
            Some(p) if st.generation == generation => Ok(p.members.iter().map(|m| m.dev).collect()),
            _ => Err(format!("{} changed terms during the scrub", self.id)),
        }
    }

    /// An object members hold live that this device (the primary) holds deleted or not at all.
    /// Compared again with the object held (a write admitted before may have created it here
    /// meanwhile). A member's copy older than this device's tombstone missed the delete: it
    /// gets the tombstone. Any other case (no tombstone here, or one older than the member's
    /// copy) cannot be decided safely (the copy may be the only one of acknowledged data, or a
    /// deleted object's): it is reported unrepairable and left alone.
    async fn scrub_orphan(
        &self,
        ctx: &Arc<Ctx>,
        generation: u64,
        oid: ObjectId,
        copies: Vec<(DeviceId, Held)>,
    ) -> Result<Outcome, String> {
        let Some(held) = self
            .exclusive(oid, generation)
            .await
            .map_err(|e| e.message)?
        else {
            return Ok(Outcome::Skipped);
        };
        let here = self
            .store
            .object_info(oid)
            .await
            .map_err(|e| format!("{oid} here: {e}"))?;
        let tombstone = match here {
            Some(i) if !i.deleted => return Ok(Outcome::Skipped),
            Some(i) => Some(i.version),
            None => None,
        };
        let map = ctx.maps.map();
        let mut ok = true;
        for (dev, copy) in copies {
            let fixed = match tombstone {
                Some(version) if copy.version < version => {
                    let meta = ImageMeta {
                        version,
                        kind: ImageKind::Tombstone,
                        allocated: Vec::new(),
                    };
                    self.replace(ctx, &map, &held, dev, &meta, &Bytes::new())
                        .await
                        .inspect_err(|e| tracing::warn!(pg = %self.id, %oid, device = %dev, "scrub: deleting a copy that missed its delete: {e}"))
                        .is_ok()
                }
                _ => {
                    tracing::error!(pg = %self.id, %oid, device = %dev, version = %copy.version, here = ?tombstone, "scrub: a member holds an object the primary does not; left alone");
                    false
                }
            };
            ok &= fixed;
        }
        if !ok {
            self.repairs.unrepairable(1);
            return Ok(Outcome::Unrepairable(0));
        }
        tracing::warn!(pg = %self.id, %oid, "scrub: copies that missed their object's delete now hold its tombstone");
        Ok(Outcome::Repaired(0))
    }

    /// Compares the copies of one object; if they differ, compares again with the object held
    /// and repairs the bad copies.
    async fn scrub_one(
        &self,
        ctx: &Arc<Ctx>,
        generation: u64,
        oid: ObjectId,
    ) -> Result<Outcome, String> {
        let members: Vec<DeviceId> = {
            let st = self.st.lock();
            match st.primary.as_ref() {
                Some(p) if st.generation == generation => {
                    if p.missing.contains_key(&oid) {
                        return Ok(Outcome::Skipped);
                    }
                    p.members.iter().map(|m| m.dev).collect()
                }
                _ => return Err(format!("{} changed terms during the scrub", self.id)),
            }
        };
        let map = ctx.maps.map();
        let first = self.view(ctx, &map, &members, oid).await?;
        if first.consistent() {
            return Ok(Outcome::Consistent(first.bytes()));
        }
        let Some(held) = self
            .exclusive(oid, generation)
            .await
            .map_err(|e| e.message)?
        else {
            return Ok(Outcome::Skipped);
        };
        // Every write of the object changes the primary's version (and is on every member
        // before the primary's copy shows it); the held object takes none: when the version is
        // still the one compared, so are the copies (no second read of them, nor a second
        // checksum error counted against their devices).
        let now = self.version_of(oid).await?;
        let bytes = first.bytes();
        let view = if now == first.version && held.members.len() == first.members.len() {
            first
        } else {
            let devs: Vec<DeviceId> = held.members.iter().map(|m| m.dev).collect();
            self.view(ctx, &map, &devs, oid).await?
        };
        if view.consistent() {
            return Ok(Outcome::Consistent(bytes));
        }
        Ok(match self.fix(ctx, &map, &held, view).await {
            true => Outcome::Repaired(bytes),
            false => Outcome::Unrepairable(bytes),
        })
    }

    /// Reads every copy of `oid`: this device's (with its data) and each member's digest.
    async fn view(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        members: &[DeviceId],
        oid: ObjectId,
    ) -> Result<View, String> {
        let (version, local, local_image) = match self.store.read_object(oid).await {
            Ok(image) => {
                let (meta, data) = ImageMeta::of(image);
                let digest = ObjectDigest::of(&meta, &data);
                (meta.version, Seen::Good(digest), Some((meta, data)))
            }
            Err(e) if e.is_bad_copy() => (self.version_of(oid).await?, Seen::Bad, None),
            Err(e) => return Err(format!("reading {oid} here: {e}")),
        };
        let mut copies = BTreeMap::new();
        for &dev in members {
            let msg = PeerMsg::Digest {
                device: dev,
                pg: self.id,
                oid,
            };
            let copy = match ctx.peers.ask(map, dev, &msg, Bytes::new()).await {
                Ok((PeerAnswer::Digest(d), _)) => Seen::Good(d),
                Ok((other, _)) => return Err(format!("{dev} answered a digest with {other:?}")),
                Err(PeerError::Refused(e)) if e.code == ErrorCode::Checksum => Seen::Bad,
                Err(e) => return Err(format!("comparing {oid} with {dev}: {e}")),
            };
            copies.insert(dev, copy);
        }
        Ok(View {
            version,
            local,
            local_image,
            members: copies,
        })
    }

    /// This device's version of `oid` (none: `Version::NONE`).
    async fn version_of(&self, oid: ObjectId) -> Result<Version, String> {
        let info = self
            .store
            .object_info(oid)
            .await
            .map_err(|e| format!("{oid} here: {e}"))?;
        Ok(info.map_or(Version::NONE, |i| i.version))
    }

    /// Replaces every bad copy with a good one; returns whether every copy is good now.
    async fn fix(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        held: &Exclusive<'_>,
        view: View,
    ) -> bool {
        let oid = held.oid;
        let (meta, data, digest) = match (view.local_image, &view.local) {
            (Some((meta, data)), Seen::Good(d)) => (meta, data, d.clone()),
            _ => match self.member_copy(ctx, map, oid, &view.members).await {
                Some(((meta, data), d)) => (meta, data, d),
                None => {
                    self.repairs.unrepairable(1);
                    tracing::error!(pg = %self.id, %oid, "scrub: no copy of the object verifies; it cannot be repaired");
                    return false;
                }
            },
        };
        let mut bad: Vec<DeviceId> = view
            .members
            .iter()
            .filter(|(_, c)| !matches!(c, Seen::Good(d) if *d == digest))
            .map(|(dev, _)| *dev)
            .collect();
        if !matches!(&view.local, Seen::Good(d) if *d == digest) {
            bad.insert(0, self.dev);
        }
        let mut whole = true;
        for dev in bad {
            match self.replace(ctx, map, held, dev, &meta, &data).await {
                Ok(()) => {
                    tracing::warn!(pg = %self.id, %oid, device = %dev, version = %meta.version, "scrub: repaired a bad copy")
                }
                Err(e) => {
                    tracing::warn!(pg = %self.id, %oid, device = %dev, "scrub: repairing a copy failed: {e}");
                    whole = false;
                }
            }
        }
        if !whole {
            self.repairs.unrepairable(1);
        }
        whole
    }

    /// A member's good copy at this device's version of `oid` (the authoritative one), the
    /// digest most members agree on first.
    async fn member_copy(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        oid: ObjectId,
        members: &BTreeMap<DeviceId, Seen>,
    ) -> Option<((ImageMeta, Bytes), ObjectDigest)> {
        let version = self.version_of(oid).await.ok()?;
        let mut votes: Vec<(usize, &ObjectDigest, DeviceId)> = Vec::new();
        for (dev, c) in members {
            let Seen::Good(d) = c else { continue };
            if d.version != version || d.kind != super::messages::ImageKind::Data {
                continue;
            }
            let n = members
                .values()
                .filter(|o| matches!(o, Seen::Good(x) if x == d))
                .count();
            votes.push((n, d, *dev));
        }
        votes.sort_by_key(|v| std::cmp::Reverse(v.0));
        for (_, digest, dev) in votes {
            let search = self.search(ctx, map, &[dev], &[], oid, version).await;
            if let Some((_, meta, data)) = search.found
                && ObjectDigest::of(&meta, &data) == *digest
            {
                return Some(((meta, data), digest.clone()));
            }
        }
        None
    }
}

impl Pgs {
    /// Scrubs every PG (of `pool`, if given) a device of this node is the active primary of,
    /// one after the other, at full speed (`basalt scrub`).
    pub(crate) async fn scrub_now(&self, pool: Option<PoolId>) -> ScrubReport {
        let mut pgs: Vec<Arc<Pg>> = self
            .all()
            .into_iter()
            .filter(|pg| pool.is_none_or(|p| pg.id.pool == p))
            .collect();
        pgs.sort_by_key(|pg| (pg.id, pg.dev));
        let mut report = ScrubReport::default();
        for pg in pgs {
            if let Some(done) = pg.scrub(&self.ctx, || 0).await {
                self.count_scrub(&done);
                report.pgs.push(done);
            }
        }
        report
    }

    fn count_scrub(&self, done: &PgScrub) {
        bump(&self.scrub.objects, done.objects);
        bump(&self.scrub.bytes, done.bytes);
        bump(&self.scrub.pgs, 1);
    }
}

/// The background scrub: one PG at a time, at the node's scrub rate (bytes per second of
/// object data compared; 0 turns it off), resuming after the last PG it scrubbed.
pub(crate) async fn background(pgs: Arc<Pgs>, mut stop: watch::Receiver<bool>) {
    let pause = |d: Duration, stop: &mut watch::Receiver<bool>| {
        let mut stop = stop.clone();
        async move {
            tokio::select! {
                biased;
                _ = tokio::time::sleep(d) => false,
                _ = stop.wait_for(|s| *s) => true,
            }
        }
    };
    if pause(pgs.ctx.tuning.scrub_start_delay, &mut stop).await {
        return;
    }
    let mut last: Option<(PgId, DeviceId)> = None;
    loop {
        if pgs.scrub.rate.load(Ordering::Relaxed) == 0 {
            if pause(Duration::from_secs(1), &mut stop).await {
                return;
            }
            continue;
        }
        let mut mine: Vec<Arc<Pg>> = pgs
            .all()
            .into_iter()
            .filter(|pg| pg.is_active_primary())
            .collect();
        mine.sort_by_key(|pg| (pg.id, pg.dev));
        let next = mine
            .iter()
            .find(|pg| last.is_none_or(|l| (pg.id, pg.dev) > l))
            .cloned();
        let Some(pg) = next else {
            // A pass is over (or there is nothing to scrub): start again later.
            last = None;
            if pause(pgs.ctx.tuning.scrub_pass_pause, &mut stop).await {
                return;
            }
            continue;
        };
        last = Some((pg.id, pg.dev));
        let scrub = pg.scrub(&pgs.ctx, || pgs.scrub.rate.load(Ordering::Relaxed));
        tokio::select! {
            biased;
            done = scrub => if let Some(done) = done { pgs.count_scrub(&done) },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
