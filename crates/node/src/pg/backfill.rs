//! Backfill: up-set members that do not serve the PG yet (a device added or brought in, the
//! replacement of a device marked out) get the PG's data by a full comparison in object order,
//! with a cursor: the primary walks its objects and the target's together and copies, replaces
//! or purges until the target is identical. Writes to objects at or below the cursor are
//! forwarded to the target as to any member, so it stays current behind the cursor; the object
//! being copied waits. When every target is done the primary reports the PG ready on its up set
//! (`pg-ready` record) and the leader makes the up set the acting set; the old copies go only
//! once the PG is clean on the new one.

use super::info::{Backfill, MemberInfo};
use super::messages::{Held, ImageMeta, PeerAnswer, PeerMsg};
use super::peering::{ask, entry_of};
use super::{Ctx, Member, Pg};
use basalt_meta::{MetaError, PgReadyRecord};
use basalt_placement::ClusterMap;
use basalt_types::{DeviceId, ObjectId, Term, Version};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const PAGE: usize = 256;
/// How long a backfill copy waits for the writes of its object already in flight
/// ([`Pg::writes_landed`]) before it gives up (and the walk tries again later).
const LANDED_LIMIT: Duration = Duration::from_secs(30);

impl Pg {
    /// Backfills every target; reports the PG ready on its up set once all are done.
    pub(super) async fn backfill(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        generation: u64,
    ) -> Result<(), String> {
        let (term, targets, known) = {
            let st = self.st.lock();
            let Some(p) = st.primary.as_ref() else {
                return Ok(());
            };
            let t: Vec<(Member, Option<ObjectId>)> = p
                .targets
                .iter()
                .filter(|t| !t.done)
                .map(|t| (t.member.clone(), t.cursor))
                .collect();
            let known: Vec<DeviceId> = p.targets.iter().map(|t| t.member.dev).collect();
            (p.term, t, known)
        };
        let map = ctx.maps.map();
        let (entry, _) = entry_of(&map, self.id)?;
        // Up members that did not answer peering (a node still starting) are no targets yet:
        // peer again after a pause, or the PG would never become ready on its up set.
        let unreached: Vec<DeviceId> = entry
            .up
            .iter()
            .copied()
            .filter(|d| map.is_up(*d) && !entry.acting.contains(d))
            .filter(|d| !known.contains(d))
            .collect();
        // An up set whose members all serve already (the acting set in another order, or
        // fewer of its members) needs no copy, only the report: else it stays remapped.
        let complete = entry.acting != entry.up
            && !entry.up.is_empty()
            && entry
                .up
                .iter()
                .all(|d| entry.acting.contains(d) && map.is_up(*d));
        if targets.is_empty() && unreached.is_empty() && !complete {
            return Ok(());
        }
        self.count_misplaced(generation).await?;
        for (member, cursor) in targets {
            if let Err(why) = self
                .backfill_one(ctx, generation, term, &member, cursor)
                .await
            {
                if why.contains(super::replica::BACKFILL_FULL) && self.current(generation) {
                    *self.toofull.lock() = Some(why.clone());
                }
                return Err(why);
            }
            if !self.current(generation) {
                return Ok(());
            }
        }
        if !unreached.is_empty() {
            tokio::time::sleep(ctx.tuning.retry).await;
            return Err(format!("backfill targets {unreached:?} did not answer"));
        }
        // An up member that neither holds the PG (acting) nor was backfilled here, because it
        // is down, would enter the acting set without the PG's data: no report until it is up
        // (its coming up restarts this primary, which then backfills it).
        let away: Vec<DeviceId> = entry
            .up
            .iter()
            .copied()
            .filter(|d| !entry.acting.contains(d) && !known.contains(d) && !map.is_up(*d))
            .collect();
        if !away.is_empty() {
            tracing::info!(pg = %self.id, ?away, "backfill waits for down up-set members");
            return Ok(());
        }
        if let Some(why) = undersized_move(&map, &entry, self.id) {
            tracing::info!(pg = %self.id, "the acting set stays: {why}");
            let mut st = self.st.lock();
            if st.generation == generation
                && let Some(p) = st.primary.as_mut()
            {
                p.kept = Some(format!("the acting set stays: {why}"));
            }
            return Ok(());
        }
        // Only while the node's newest map still has this term's interval and up set: else
        // the round fails and the PG peers again on the newest map (a map skipped by
        // `drive_pgs` may have changed them and changed them back, so no restart is certain).
        let up = self.st.lock().primary.as_ref().map(|p| p.up.clone());
        let now = ctx.maps.map();
        let (current, _) = entry_of(&now, self.id)?;
        if !self.current(generation)
            || current.since != term.interval
            || up.as_ref() != Some(&current.up)
            || current.up != entry.up
        {
            return Err(format!(
                "map epoch {} moved on from term {term} (up {:?}): no ready report",
                now.epoch.0, current.up
            ));
        }
        let record =
            PgReadyRecord::new(self.id, now.epoch, entry.up.clone()).in_interval(term.interval);
        ctx.catalog
            .put_pg_ready(&record)
            .await
            .map_err(|e| e.to_string())?;
        let mut st = self.st.lock();
        if st.generation == generation
            && let Some(p) = st.primary.as_mut()
        {
            p.reported = Some(record);
        }
        drop(st);
        tracing::info!(pg = %self.id, up = ?entry.up, "backfill done: ready on the up set");
        Ok(())
    }

    /// Gives every target that has no count yet the PG's size on the primary: what it still
    /// lacks is that less what the backfill walked past (status shows it as misplaced).
    async fn count_misplaced(&self, generation: u64) -> Result<(), String> {
        let objects = self
            .store
            .pgs()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|p| p.pg == self.id)
            .map_or(0, |p| p.objects + p.tombstones);
        let mut st = self.st.lock();
        if st.generation == generation
            && let Some(p) = st.primary.as_mut()
        {
            for t in p.targets.iter_mut().filter(|t| t.objects == 0) {
                t.objects = objects;
            }
        }
        Ok(())
    }

    async fn backfill_one(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        generation: u64,
        term: Term,
        target: &Member,
        mut cursor: Option<ObjectId>,
    ) -> Result<(), String> {
        let dev = target.dev;
        let map = ctx.maps.map();
        self.mark_target(ctx, &map, term, dev, cursor).await?;
        tracing::info!(pg = %self.id, device = %dev, ?cursor, "backfilling");
        loop {
            if !self.current(generation) {
                return Ok(());
            }
            let mine = self
                .store
                .list(self.id, cursor, PAGE)
                .await
                .map_err(|e| e.to_string())?;
            let msg = PeerMsg::List {
                device: dev,
                pg: self.id,
                after: cursor,
                limit: PAGE,
            };
            let PeerAnswer::List { entries: theirs } = ask(ctx, &map, dev, &msg).await? else {
                return Err(format!("{dev} answered a listing oddly"));
            };
            let bound = page_bound(
                mine.last().map(|o| o.oid),
                mine.len(),
                theirs.last().map(|h| h.oid),
                theirs.len(),
            );
            let mut merged: BTreeMap<ObjectId, Option<Held>> = mine
                .iter()
                .filter(|o| bound.is_none_or(|b| o.oid <= b))
                .map(|o| (o.oid, None))
                .collect();
            for h in theirs.iter().filter(|h| bound.is_none_or(|b| h.oid <= b)) {
                merged.insert(h.oid, Some(*h));
            }
            for (oid, theirs) in merged {
                self.backfill_object(ctx, &map, generation, term, dev, oid, theirs)
                    .await?;
                cursor = Some(oid);
            }
            if bound.is_none() {
                break;
            }
            self.copy_dirty(ctx, &map, generation, term, dev, cursor)
                .await?;
            self.mark_target(ctx, &map, term, dev, cursor).await?;
        }
        // Every object was listed and copied: from here, writes of objects created past the
        // cursor reach the target (`Target::tail`).
        self.walked_all(generation, dev);
        // Objects written past the cursor that no listing showed (created after the last page
        // was listed): copied, and the target done (every later write reaches it) once none
        // is left.
        if !self
            .copy_dirty(ctx, &map, generation, term, dev, None)
            .await?
        {
            return Ok(());
        }
        // Complete now: it holds the primary's objects, and every write since reached it.
        let info = MemberInfo {
            les: term.interval,
            last_complete: Version::new(term.interval.0, 0),
            backfill: None,
            activated: term.interval,
            suspect: false,
        };
        let msg = PeerMsg::Activate {
            device: dev,
            pg: self.id,
            term,
            info,
            readable: false,
        };
        ask(ctx, &map, dev, &msg).await?;
        self.record_completion(ctx, term, dev).await;
        tracing::info!(pg = %self.id, device = %dev, "backfill of one target done");
        Ok(())
    }

    /// Lists `dev` in the history as complete in `term` (`peering.rs::completed_in`: it is then
    /// a witness of the interval), while the history names `term` as the interval's last to
    /// go active; else (a later term served, or `term` went no further than peered, below
    /// `min_size`: its interval is not recorded) leaves it out, which only keeps it from being
    /// a witness. By compare-and-swap, read again after a race.
    async fn record_completion(&self, ctx: &Arc<Ctx>, term: Term, dev: DeviceId) {
        for _ in 0..4 {
            let Ok((mut history, revision)) = ctx.catalog.get_pg_history(self.id).await else {
                return;
            };
            let Some(last) = history.intervals.last_mut() else {
                return;
            };
            if last.epoch != term.interval
                || last.round != term.round
                || last.backfilled.contains(&dev)
            {
                return;
            }
            last.backfilled.push(dev);
            match ctx
                .catalog
                .put_pg_history(self.id, &history, revision)
                .await
            {
                Err(MetaError::HistoryChanged(_)) => continue,
                Err(e) => {
                    tracing::warn!(pg = %self.id, device = %dev, "recording the backfill's completion: {e}");
                    return;
                }
                Ok(_) => return,
            }
        }
    }

    /// Marks target `dev` as walked to the end ([`super::Target::tail`]), under the PG's lock,
    /// where writes decide whether they reach it.
    fn walked_all(&self, generation: u64, dev: DeviceId) {
        let mut st = self.st.lock();
        if st.generation != generation {
            return;
        }
        let targets = st.primary.as_mut().map(|p| p.targets.iter_mut());
        if let Some(t) = targets.into_iter().flatten().find(|t| t.member.dev == dev) {
            t.tail = true;
        }
    }

    /// Copies again the objects written past the target's cursor that are now at or below
    /// `upto` (`None`: all of them, then marks the target done, in the same critical section
    /// as the check that none is left, so no write falls between). Returns false when the
    /// generation ended.
    #[allow(clippy::too_many_arguments)]
    async fn copy_dirty(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        generation: u64,
        term: Term,
        dev: DeviceId,
        upto: Option<ObjectId>,
    ) -> Result<bool, String> {
        loop {
            let oids: Vec<ObjectId> = {
                let mut st = self.st.lock();
                if st.generation != generation {
                    return Ok(false);
                }
                let Some(t) = st
                    .primary
                    .as_mut()
                    .and_then(|p| p.targets.iter_mut().find(|t| t.member.dev == dev))
                else {
                    return Ok(false);
                };
                let oids: Vec<ObjectId> = t
                    .dirty
                    .iter()
                    .filter(|o| upto.is_none_or(|u| **o <= u))
                    .copied()
                    .collect();
                if oids.is_empty() {
                    if upto.is_none() {
                        t.done = true;
                    }
                    return Ok(true);
                }
                oids
            };
            for oid in oids {
                self.backfill_object(ctx, map, generation, term, dev, oid, None)
                    .await?;
            }
        }
    }

    /// Makes `oid` on the target equal to the primary's (writes to it wait meanwhile), then
    /// moves the cursor past it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn backfill_object(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        generation: u64,
        term: Term,
        dev: DeviceId,
        oid: ObjectId,
        theirs: Option<Held>,
    ) -> Result<(), String> {
        // Throttled before the object is marked busy: writes to it wait only while it moves.
        let most = u64::from(self.store.info().object_size);
        let pass = ctx.recovery.throttle.admit(self.dev, most).await;
        loop {
            // Held by another (a read repair, a recovery): wait for it, else its end would
            // let writes of the object through while this copy still reads it.
            let held = {
                let mut st = self.st.lock();
                let current = st.generation == generation;
                match st.primary.as_mut().filter(|_| current) {
                    None => {
                        ctx.recovery.throttle.spent(pass, 0);
                        return Ok(());
                    }
                    Some(p) if p.busy.contains(&oid) => {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        p.waiters.entry(oid).or_default().push(tx);
                        rx
                    }
                    Some(p) => {
                        p.busy.insert(oid);
                        break;
                    }
                }
            };
            let _ = held.await;
        }
        let result = match self.writes_landed(oid, generation).await {
            Ok(()) => self.copy_object(ctx, map, term, dev, oid, theirs).await,
            Err(why) => Err(CopyFail::from(why)),
        };
        let moved = *result.as_ref().unwrap_or(&0);
        ctx.recovery.throttle.spent(pass, moved);
        let mut st = self.st.lock();
        if st.generation == generation
            && let Some(p) = st.primary.as_mut()
        {
            p.busy.remove(&oid);
            if let Err(e) = &result
                && e.unfound
            {
                self.unfound_in_backfill(p, oid, &e.why);
            }
            if result.is_ok()
                && let Some(t) = p.targets.iter_mut().find(|t| t.member.dev == dev)
            {
                // The copy read the object after every write of it so far (writes wait while
                // it is busy; the read waits for held ones): it is current on the target.
                t.dirty.remove(&oid);
                t.cursor = t.cursor.max(Some(oid));
                t.walked = t.walked.saturating_add(1);
            }
            p.release(&oid);
        }
        result.map(|_| ()).map_err(|e| e.why)
    }

    /// Waits until no write of `oid` admitted before it was marked busy is still in flight
    /// (`Primary::tails`; later ones wait for the copy). The local store may not have applied
    /// such a write yet (a partial block's read, a full journal, no free slot) and answers for
    /// the object as it was before it; the write was not sent to the target (the object was
    /// past its cursor, or dirty): a copy made now would lack it, yet count as current, and the
    /// next write of the object would reach the target (found by a helper's review).
    async fn writes_landed(&self, oid: ObjectId, generation: u64) -> Result<(), String> {
        let deadline = Instant::now() + LANDED_LIMIT;
        loop {
            {
                let st = self.st.lock();
                let Some(p) = st.primary.as_ref().filter(|_| st.generation == generation) else {
                    return Err(format!("{} changed terms", self.id));
                };
                if !p.tails.contains_key(&oid) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{oid}: a write admitted before its copy did not finish"
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn copy_object(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        term: Term,
        dev: DeviceId,
        oid: ObjectId,
        theirs: Option<Held>,
    ) -> Result<u64, CopyFail> {
        let mine = self
            .store
            .object_info(oid)
            .await
            .map_err(|e| e.to_string())?;
        let same = match (&mine, &theirs) {
            (Some(m), Some(t)) => m.version == t.version && m.deleted == t.deleted,
            (None, None) => true,
            _ => false,
        };
        if same {
            return Ok(0);
        }
        if mine.is_none() {
            let msg = PeerMsg::Purge {
                device: dev,
                pg: self.id,
                term,
                oid,
            };
            ask(ctx, map, dev, &msg).await?;
            return Ok(0);
        }
        let (meta, data) = match self.store.read_object(oid).await {
            Ok(image) => ImageMeta::of(image),
            // This copy is bad: the serving members', else those of the complete devices
            // peering found (a member of an older interval back up), one of which then
            // replaces it. Without a good copy the backfill cannot go past the object.
            Err(e) if e.is_bad_copy() => {
                let version = mine.map_or(Version::NONE, |m| m.version);
                let devs: Vec<DeviceId> = {
                    let st = self.st.lock();
                    let Some(p) = st.primary.as_ref() else {
                        return Err(format!("{} is no longer the primary", self.dev).into());
                    };
                    let members: Vec<DeviceId> = p.members.iter().map(|m| m.dev).collect();
                    let targets: Vec<DeviceId> = p.targets.iter().map(|t| t.member.dev).collect();
                    search_order(&members, &p.sources, self.dev, &targets)
                };
                match self
                    .good_image(ctx, map, term, &devs, &[self.dev], oid, version)
                    .await
                {
                    Ok(found) => found,
                    Err(e) => {
                        return Err(CopyFail {
                            unfound: e.none_anywhere,
                            why: format!("{oid}: {e}"),
                        });
                    }
                }
            }
            Err(e) => return Err(e.to_string().into()),
        };
        let bytes = data.len() as u64;
        self.put(ctx, map, dev, term, oid, meta, data).await?;
        ctx.recovery.rate.record(1, bytes);
        let mut st = self.st.lock();
        if let Some(p) = st.primary.as_mut() {
            p.recovered_objects += 1;
            p.recovered_bytes += bytes;
        }
        Ok(bytes)
    }

    /// No device the backfill asked holds a good copy of `oid` (this one's and some others'
    /// fail their checksums, the rest hold another version or none): the object is unfound
    /// (status lists it; the operator may give it up with `basalt pg mark-unfound-lost`, after
    /// which the backfill goes past it). Its reads fail on the bad copies; a client's write of
    /// it is taken and takes it off the list (`primary.rs::write_as`). The backfill stops at it
    /// and tries again after a wait, as for any failure.
    fn unfound_in_backfill(&self, p: &mut super::Primary, oid: ObjectId, why: &str) {
        if p.unfound.insert(oid, why.to_string()).is_none() {
            tracing::error!(pg = %self.id, %oid, "unfound: {why}; the backfill stops at it until a good copy is found or it is declared lost");
        }
    }

    /// Persists the target's backfill state (and lets it accept the term's writes).
    async fn mark_target(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        term: Term,
        dev: DeviceId,
        cursor: Option<ObjectId>,
    ) -> Result<(), String> {
        let info = MemberInfo {
            les: term.interval,
            last_complete: Version::NONE,
            backfill: Some(Backfill { term, cursor }),
            activated: term.interval,
            suspect: false,
        };
        let msg = PeerMsg::Activate {
            device: dev,
            pg: self.id,
            term,
            info,
            readable: false,
        };
        match ask(ctx, map, dev, &msg).await? {
            PeerAnswer::Done => Ok(()),
            other => Err(format!("{dev} answered {other:?}")),
        }
    }
}

/// Why copying one object to a backfill target failed.
struct CopyFail {
    /// No device asked holds a good copy (each holds a bad one, another version or none).
    unfound: bool,
    why: String,
}

impl From<String> for CopyFail {
    fn from(why: String) -> CopyFail {
        CopyFail {
            unfound: false,
            why,
        }
    }
}

/// Where backfill looks for a good copy of an object its own copy holds bad: the serving
/// members, then the other complete devices peering found, then the backfill targets (one
/// done, or a former member placed here again, may hold the object at that very version:
/// only a copy at the version asked for that verifies is taken, `repair.rs::Pg::search`),
/// then its own copy last (copies bad in different blocks merge: `merge.rs`). Found by the
/// cluster simulation, seed 531956: a PG shrunk to one copy, that copy went bad, and the
/// backfill of its second target stopped at the object for good although the first target,
/// just completed, held it good.
fn search_order(
    members: &[DeviceId],
    sources: &[DeviceId],
    me: DeviceId,
    targets: &[DeviceId],
) -> Vec<DeviceId> {
    let mut devs: Vec<DeviceId> = Vec::new();
    for &d in members.iter().chain(sources).chain(targets) {
        if d != me && !devs.contains(&d) {
            devs.push(d);
        }
    }
    devs.push(me);
    devs
}

/// Why the up set must not become the acting set although it is complete: it would leave the
/// PG served by fewer devices than serve it now and fewer than the pool's copies (placement
/// found no device for the other copies: a device marked out with no replacement, a node
/// drained from a cluster too small). The serving copies stay where they are (Ceph keeps them
/// in its acting set likewise) until placement finds room; the PG stays remapped.
fn undersized_move(
    map: &ClusterMap,
    entry: &basalt_placement::PgMap,
    pg: basalt_types::PgId,
) -> Option<String> {
    let replicas = map
        .pools
        .get(&pg.pool)
        .map_or(0, |p| usize::from(p.replicas));
    let serving = map.serving(entry).count();
    let up = entry.up.len();
    (up < serving && up < replicas).then(|| {
        format!(
            "the up set {:?} has {up} of the pool's {replicas} copies, {serving} serve now",
            entry.up
        )
    })
}

/// The last object both pages cover: `None` when both pages are the last of their listings
/// (everything after the cursor is in them).
fn page_bound(
    mine_last: Option<ObjectId>,
    mine_len: usize,
    theirs_last: Option<ObjectId>,
    theirs_len: usize,
) -> Option<ObjectId> {
    let m = (mine_len == PAGE).then_some(mine_last).flatten();
    let t = (theirs_len == PAGE).then_some(theirs_last).flatten();
    match (m, t) {
        (None, None) => None,
        (Some(a), None) | (None, Some(a)) => Some(a),
        (Some(a), Some(b)) => Some(a.min(b)),
    }
}

impl Pg {
    /// Writes this term's ready report again while the PG's newest map still waits for it (the
    /// acting set is not yet the up set the report names, in the same interval): the leader
    /// deletes every report it considered, and a late report of an ended term (another node's,
    /// on a lagging map) may have replaced this one at the PG's key and been dropped.
    pub(super) async fn report_again(&self, ctx: &Arc<Ctx>, generation: u64) -> Result<(), String> {
        let record = {
            let st = self.st.lock();
            match st.primary.as_ref().and_then(|p| p.reported.clone()) {
                Some(r) if st.generation == generation => r,
                _ => return Ok(()),
            }
        };
        let map = ctx.maps.map();
        let (entry, _) = entry_of(&map, self.id)?;
        if entry.acting == record.up
            || entry.up != record.up
            || Some(entry.since) != record.interval
        {
            return Ok(());
        }
        tracing::info!(pg = %self.id, up = ?record.up, "still remapped: reporting ready again");
        let again = PgReadyRecord {
            interval: record.interval,
            ..PgReadyRecord::new(self.id, map.epoch, record.up.clone())
        };
        ctx.catalog
            .put_pg_ready(&again)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_types::{PoolId, VolumeId};

    fn o(i: u64) -> ObjectId {
        ObjectId::new(PoolId(1), VolumeId(1), i)
    }

    #[test]
    fn a_bad_copy_is_looked_for_on_members_then_on_complete_devices_then_on_targets() {
        let d = DeviceId;
        // Serving member 3; devices 3, 5 (a member of an older interval back up) and the
        // targets 7 and 8 (empty, so complete) complete by peering; target 9 done; this
        // device is 1: the targets come after every complete device, its own copy last.
        let order = search_order(
            &[d(3)],
            &[d(1), d(3), d(5), d(7), d(8)],
            d(1),
            &[d(9), d(7), d(8)],
        );
        assert_eq!(order, vec![d(3), d(5), d(7), d(8), d(9), d(1)]);
        // Alone, with no other complete device: a target, then its own copy.
        assert_eq!(search_order(&[], &[d(1)], d(1), &[d(7)]), vec![d(7), d(1)]);
    }

    #[test]
    fn a_page_bound_never_skips_objects() {
        // Both listings ended: everything is covered.
        assert_eq!(page_bound(Some(o(5)), 3, Some(o(9)), 10), None);
        // Only the primary's page is full: objects past its last may follow on its side.
        assert_eq!(page_bound(Some(o(5)), PAGE, Some(o(9)), 10), Some(o(5)));
        // Both full: the smaller last object bounds the step.
        assert_eq!(page_bound(Some(o(5)), PAGE, Some(o(3)), PAGE), Some(o(3)));
        assert_eq!(page_bound(None, 0, Some(o(3)), PAGE), Some(o(3)));
    }
}
